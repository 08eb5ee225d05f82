"""Never lose data: a killed driver or rank leaves every completed run intact, the resumed sweep
redoes only what is missing, and the results equal an uninterrupted sweep's.

Also the two guards behind it: launched jobs die with the driver (qbench.launch.procs), and one
results directory takes one sweep at a time (qbench.records.lock).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from qbench.errors import UserError
from qbench.records.lock import LOCK_FILE, sweep_lock
from tests import invoke

# ---- the sweep every kill test runs: 4 quick runs, w1 before w2 -----------------------------

SCENARIO = """\
name: resume
model: mlp
world_size: [1, 2]
backend: gloo
compressor: [none, {name: qsgd, bits: 4}]
warmup: 1
iterations: 3
timeout: 120
"""
RUNS = 4
ROWS_PER_RANK = 1 + 3  # warmup + iterations
# Columns that fixed seeds make identical between sweeps on gloo (times are not).
DETERMINISTIC = ["run_id", "rank", "iteration", "warmup", "loss", "bytes_sent", "payload_bytes",
                 "grad_bytes"]  # fmt: skip
WAIT_S = 300.0  # generous: the runs slow down a lot on a loaded 2-core machine (CI)


def _argv(scenario: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "qbench.cli", "sweep", str(scenario), "--out", str(out), *extra]


def _sweep(scenario: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return invoke.run(_argv(scenario, out, *extra), capture_output=True, text=True, timeout=300)


def _start(scenario: Path, out: Path, *extra: str, env: dict[str, str] | None = None):
    return subprocess.Popen(
        _argv(scenario, out, *extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _records(out: Path) -> dict[str, dict]:
    recs = {}
    for p in out.glob("*/run.json"):
        try:
            recs[p.parent.name] = json.loads(p.read_text())
        except (OSError, ValueError):  # never: writes are atomic (a failure here is a bug)
            raise AssertionError(f"{p} is unreadable: half written?") from None
    return recs


def _statuses(out: Path) -> dict[str, str]:
    return {k: r["status"] for k, r in _records(out).items()}


def _wait(what: str, cond: Callable[[], object], driver: subprocess.Popen[str] | None = None):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if driver is not None and driver.poll() is not None:
            raise AssertionError(
                f"sweep ended (exit {driver.returncode}) before {what}: "
                f"{driver.stderr.read()[-2000:] if driver.stderr else ''}"
            )
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _procs_mentioning(text: str) -> dict[int, str]:
    """Live processes whose command line contains ``text`` (our tmp dir: no one else's)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and _alive(int(entry.name)):
            found[int(entry.name)] = cmd
    return found


def _descendants(root: int) -> set[int]:
    """Live descendants of ``root``, from the parent pids in /proc/*/stat (cheap to read, unlike
    every process's command line, which can stall behind a busy process's memory lock)."""
    parents = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _workers(driver: subprocess.Popen[str]) -> dict[int, str]:
    """The driver's ranks (not their launcher) and their command lines."""
    out = {}
    for pid in _descendants(driver.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "qbench.run.worker" in cmd and "torch.distributed.run" not in cmd:
            out[pid] = cmd
    return out


def _rank_of(pid: int) -> int | None:
    """RANK from the process's environment; a rank the rank server forked (whose environ is
    the server's) names itself ``qbench rank N`` instead (``ps -o comm``)."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        if comm.startswith("qbench rank ") and comm[12:].isdigit():
            return int(comm[12:])
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [e.split(b"=", 1)[1] for e in env if e.startswith(b"RANK=")]
    return int(ranks[0]) if ranks else None


def _assert_nothing_left(tmp: Path) -> None:
    """No launcher or rank of ours survives: they die with the driver (PR_SET_PDEATHSIG)."""
    deadline = time.monotonic() + 15
    while (left := _procs_mentioning(str(tmp))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"


def _frames(out: Path) -> dict[str, pd.DataFrame]:
    return {
        p.parent.name: pd.read_parquet(p).sort_values(["rank", "iteration"], ignore_index=True)
        for p in out.glob("*/iterations.parquet")
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, pd.DataFrame]]:
    """The scenario file and the results of one uninterrupted sweep."""
    tmp = tmp_path_factory.mktemp("reference")
    scenario = tmp / "s.yaml"
    scenario.write_text(SCENARIO)
    proc = _sweep(scenario, tmp / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = _statuses(tmp / "out")
    assert len(statuses) == RUNS and set(statuses.values()) == {"ok"}, statuses
    return scenario, _frames(tmp / "out")


def _assert_same_as_reference(out: Path, ref: dict[str, pd.DataFrame]) -> None:
    """Every run ok, once, complete, and equal to the uninterrupted sweep where deterministic."""
    recs = _records(out)
    assert sorted(recs) == sorted(ref), "not the same set of run ids"
    assert {r["status"] for r in recs.values()} == {"ok"}, {k: r["status"] for k, r in recs.items()}
    run_dirs = sorted(
        p.name for p in out.iterdir() if p.is_dir() and p.name not in ("report", ".groups")
    )
    assert run_dirs == sorted(ref), "one run directory per run id, nothing else"
    sweep = json.loads((out / "sweep.json").read_text())
    assert sorted(sweep["runs"]) == sorted(ref)
    frames = _frames(out)
    for run_id, frame in frames.items():
        ws = recs[run_id]["spec"]["world_size"]
        assert len(frame) == ws * ROWS_PER_RANK, f"{run_id}: {len(frame)} rows"
        assert not frame.duplicated(["rank", "iteration"]).any(), f"{run_id}: duplicated rows"
        assert sorted(frame["rank"].unique()) == list(range(ws))
        parts = sorted(p.name for p in (out / run_id / "parts").glob("*.parquet"))
        assert parts == [f"rank-{r}.parquet" for r in range(ws)], parts
        pd.testing.assert_frame_equal(
            frame[DETERMINISTIC], ref[run_id][DETERMINISTIC], check_exact=True, obj=run_id
        )


def _kill(driver: subprocess.Popen[str]) -> None:
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)
    assert driver.stderr is not None
    driver.stderr.close()


# ---- kill and resume -----------------------------------------------------------------------


@pytest.mark.slow
def test_driver_killed_between_runs_resumes(reference, tmp_path: Path) -> None:
    scenario, ref = reference
    out = tmp_path / "out"
    driver = _start(scenario, out)
    try:
        # While it runs, a second driver on the same directory is refused (one line, exit 2).
        _wait("the first run", lambda: _statuses(out), driver)
        second = _sweep(scenario, out)
        assert second.returncode == 2, second.stderr
        assert "Traceback" not in second.stderr
        assert second.stderr.strip().splitlines()[-1] == (
            f"qbench: error: results directory {out} is in use by another qbench sweep "
            f"(pid {driver.pid}); wait for it or use another --out"
        )
        _wait("2 ok runs", lambda: list(_statuses(out).values()).count("ok") == 2, driver)
    finally:
        _kill(driver)
    statuses = _statuses(out)
    assert list(statuses.values()).count("ok") == 2
    assert set(statuses.values()) <= {"ok", "running"}, statuses  # the next may have begun
    kept = {k: (out / k / "iterations.parquet").read_bytes() for k, s in statuses.items()
            if s == "ok"}  # fmt: skip
    _assert_nothing_left(tmp_path)

    proc = _sweep(scenario, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{RUNS} runs (2 already done)" in proc.stdout + proc.stderr
    for run_id, data in kept.items():  # completed runs are skipped, their files untouched
        assert (out / run_id / "iterations.parquet").read_bytes() == data
    _assert_same_as_reference(out, ref)
    _assert_nothing_left(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["group", "process"])
def test_driver_killed_during_a_run_resumes(reference, isolation: str, tmp_path: Path) -> None:
    """The last run hangs (rank 0 at its second iteration, QBENCH_FAULT) so that the driver is
    surely killed while that run's two ranks are up; the resumed sweep (no fault) redoes it."""
    scenario, ref = reference
    out = tmp_path / "out"
    (last,) = [k for k in ref if "-w2-" in k and "qsgd" in k]  # matrix order: w1, then w2
    driver = _start(scenario, out, "--isolation", isolation,
                    env={"QBENCH_FAULT": f"0:1:hang@{last}"})  # fmt: skip

    def last_run_training() -> bool:
        statuses = _statuses(out)
        running = [k for k, s in statuses.items() if s == "running"]
        # a rank's command line names its run's spec.json, or in group mode the w2 group's plan
        return (
            list(statuses.values()).count("ok") == RUNS - 1
            and running == [last]
            and len({p for p, c in _workers(driver).items() if "-w2-" in c}) == 2
        )

    try:
        _wait("the last run's two ranks", last_run_training, driver)
        time.sleep(0.5)  # rank 1 may still be writing its host file
    finally:
        _kill(driver)
    assert _statuses(out)[last] == "running"
    _assert_nothing_left(tmp_path)  # the ranks died with the driver: nothing writes any more
    # A hung rank writes no rows; orphaned ranks would have left parts for the next attempt.
    assert not list((out / last / "parts").glob("rank-*.parquet"))
    assert not (out / last / "iterations.parquet").exists()

    proc = _sweep(scenario, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{RUNS} runs ({RUNS - 1} already done)" in proc.stdout + proc.stderr
    _assert_same_as_reference(out, ref)
    _assert_nothing_left(tmp_path)


@pytest.mark.slow
def test_rank_killed_mid_run_is_recorded_then_redone(reference, tmp_path: Path) -> None:
    scenario, ref = reference
    out = tmp_path / "out"
    driver = _start(scenario, out)
    victim = None

    def rank1_of_a_w2_run() -> int | None:
        for pid, cmd in _workers(driver).items():
            if "-w2-" in cmd and _rank_of(pid) == 1:
                return pid
        return None

    try:
        victim = _wait("a rank 1", rank1_of_a_w2_run, driver)
        # at once: a w2 run takes 0.1-0.2 s here, and a fresh clone's sweep once finished it
        # within the 0.3 s this test used to wait, so the kill hit no run
        os.kill(victim, signal.SIGKILL)
        driver.wait(timeout=WAIT_S * 2)  # the sweep goes on with the other runs
    finally:
        if driver.poll() is None:
            _kill(driver)
    assert driver.returncode == 1, driver.stderr.read() if driver.stderr else ""
    statuses = _statuses(out)
    failed = [k for k, s in statuses.items() if s != "ok"]
    assert len(statuses) == RUNS and len(failed) == 1, statuses
    rec = _records(out)[failed[0]]
    assert rec["status"] == "failed" and "-w2-" in failed[0]
    assert rec["exit_code"] not in (None, 0)
    assert rec["stderr_tail"] and rec["error"]
    assert rec["error"].startswith("rank 1 of 2"), rec["error"]
    _assert_nothing_left(tmp_path)

    proc = _sweep(scenario, out, "--retry-failed")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_same_as_reference(out, ref)
    _assert_nothing_left(tmp_path)


# ---- launched jobs die with the driver -----------------------------------------------------

PARENT = textwrap.dedent("""\
    import subprocess, sys, time
    from qbench.launch import procs
    children = []
    procs.start([(["sleep", "60"], {"PATH": "/usr/bin:/bin"})], children,
                subprocess.DEVNULL, subprocess.DEVNULL)
    print(children[0].pid, flush=True)
    time.sleep(60)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_job_dies_when_its_driver_is_sigkilled() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True
    )  # fmt: skip
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        time.sleep(0.3)
        assert _alive(child), "the job must live as long as its driver"
        parent.kill()  # SIGKILL: no handler of the parent runs
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the job outlived its SIGKILLed driver"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
        parent.stdout.close()


def test_job_started_normally_still_runs_to_completion(tmp_path: Path) -> None:
    from qbench.launch import procs

    status = procs.run_jobs([(["true"], {"PATH": "/usr/bin:/bin"})], tmp_path, timeout=30)
    assert status == ("ok", 0)
    status = procs.run_jobs([(["false"], {"PATH": "/usr/bin:/bin"})], tmp_path, timeout=30)
    assert status == ("failed", 1)


# ---- one sweep per results directory -------------------------------------------------------

HOLDER = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from qbench.records.lock import sweep_lock
    with sweep_lock(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(60)
""")


def _holder(root: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)], stdout=subprocess.PIPE, text=True
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_lock_refuses_a_second_sweep_with_one_line(tmp_path: Path) -> None:
    root = tmp_path / "results"
    holder = _holder(root)
    try:
        with pytest.raises(UserError) as err, sweep_lock(root):
            pytest.fail("acquired a lock another process holds")
        msg = str(err.value)
        assert msg == (
            f"results directory {root} is in use by another qbench sweep (pid {holder.pid}); "
            "wait for it or use another --out"
        )
        assert "\n" not in msg
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


def test_lock_is_released_when_its_holder_is_sigkilled(tmp_path: Path) -> None:
    root = tmp_path / "results"
    holder = _holder(root)
    holder.kill()
    holder.wait()
    assert holder.stdout is not None
    holder.stdout.close()
    assert (root / LOCK_FILE).exists()  # the file stays; the lock went with the process
    with sweep_lock(root):
        assert (root / LOCK_FILE).read_text().strip() == str(os.getpid())


def test_lock_is_exclusive_within_one_process_and_reusable(tmp_path: Path) -> None:
    with (
        sweep_lock(tmp_path),
        pytest.raises(UserError, match=f"pid {os.getpid()}"),
        sweep_lock(tmp_path),
    ):
        pass
    with sweep_lock(tmp_path):  # released on exit, also after the error above
        pass
    with pytest.raises(RuntimeError), sweep_lock(tmp_path):
        raise RuntimeError("boom")
    with sweep_lock(tmp_path):  # and after an exception inside the block
        pass


def test_lock_creates_the_results_directory(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"
    with sweep_lock(root):
        assert root.is_dir()


def test_lock_on_an_unwritable_directory_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="cannot be written"), sweep_lock(tmp_path / "file"):
        pass
