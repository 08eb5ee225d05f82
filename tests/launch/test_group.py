"""Warm rank groups (``isolation: group``): one launch runs many runs, each recorded exactly as
if launched alone; a run that fails or hangs fails only itself.

The driver's side is tested here with a stand-in rank program (no torch, a fraction of a
second per launch) that follows the worker's contract: for each run of the plan, write the
rank's part, then the done marker. The real ranks (torch, gloo, mpi) are the slow tests at the
bottom.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from qbench.errors import UserError
from qbench.launch import group, local, runfiles, sweep
from qbench.launch.launcher import Launch
from qbench.records.schema import WORKER_FAILED
from qbench.records.store import ResultStore
from qbench.spec import matrix as matrix_mod
from qbench.spec import scenario as scenario_mod
from qbench.spec.runspec import RunSpec
from tests import invoke

BASE = """
name: g
model: mlp
world_size: 1
backend: gloo
compressor: [none, {name: qsgd, bits: 8}, {name: qsgd, bits: 4}, {name: qsgd, bits: 2}]
warmup: 1
iterations: 2
"""


def _specs(text: str = BASE, **sets: object) -> list[RunSpec]:
    text = scenario_mod.with_overrides(text, "t", [f"{k}={json.dumps(v)}" for k, v in sets.items()])
    return matrix_mod.expand(scenario_mod.loads(text, "t")).runs


# ---- rank groups ------------------------------------------------------------------------------


def test_groups_share_a_launch_only_when_ranks_start_the_same_way() -> None:
    specs = _specs(world_size=[1, 2], backend=["gloo", "mpi"])
    found = group.groups(specs)
    assert len(found) == 4
    for members in found:
        assert len({group.key(s) for s in members}) == 1
        order = [specs.index(s) for s in members]
        assert order == sorted(order)  # matrix order within a group
    assert sorted(s.run_id for g in found for s in g) == sorted(s.run_id for s in specs)
    firsts = [specs.index(g[0]) for g in found]
    assert firsts == sorted(firsts)  # groups in the order of their first run


def test_links_and_devices_split_groups() -> None:
    a = _specs(network=[{"bandwidth": "1gbit"}, {"bandwidth": "100mbit"}])
    assert len(group.groups(a)) == 2
    cpu = _specs()[0]
    assert group.key(cpu.replaced(device="cuda")) != group.key(cpu)


def test_isolation_is_a_checked_scenario_key() -> None:
    assert scenario_mod.loads(BASE, "t").isolation == "auto"
    text = BASE + "isolation: process\n"
    assert scenario_mod.loads(text, "t").isolation == "process"
    with pytest.raises(UserError) as err:
        scenario_mod.loads(BASE + "isolation: thread\n", "t")
    assert "isolation" in str(err.value) and "\n" not in str(err.value)


def test_isolation_keeps_run_ids() -> None:
    ids = [s.run_id for s in _specs()]
    assert [s.run_id for s in _specs(isolation="process")] == ids


def test_a_local_group_meets_in_a_fresh_file_not_at_a_port(tmp_path: Path) -> None:
    """A port picked for rank 0 can be taken by any other process before rank 0 binds it
    (EADDRINUSE, a failed run); a group on this host needs none: its ranks meet in a file,
    new for each launch and gone after it."""
    from qbench.comm import INIT_METHOD_ENV

    spec = _specs(world_size=2)[0]
    methods = []
    for _ in range(2):
        with local.Local().group_jobs(spec, tmp_path / "plan.json") as jobs:
            assert [env["RANK"] for _, env in jobs] == ["0", "1"]
            assert not any("MASTER_PORT" in env or "MASTER_ADDR" in env for _, env in jobs)
            found = {env[INIT_METHOD_ENV] for _, env in jobs}
            assert len(found) == 1 and next(iter(found)).startswith("file:///")
            store = Path(next(iter(found)).removeprefix("file://"))
            assert store.parent.is_dir() and not store.exists()  # made by the ranks
        assert not store.parent.exists()
        methods.append(store)
    assert methods[0] != methods[1]


# ---- the driver, with a stand-in rank program -------------------------------------------------

FAKE_RANK = textwrap.dedent("""\
    import json, os, sys, time
    from pathlib import Path
    import pandas as pd
    plan = json.loads(Path(sys.argv[1]).read_text())
    (Path(sys.argv[1]).parent / "ready.json").write_text("{}")  # joined: runs are timed now
    fault = os.environ.get("FAKE_FAULT", "")  # INDEX:exit|raise|hang
    for config in plan["configs"]:
        spec = Path(config["spec"])
        parts = spec.parent / "parts"
        parts.mkdir(exist_ok=True)
        if fault and int(fault.split(":")[0]) == config["index"]:
            mode = fault.split(":")[1]
            if mode == "hang":
                time.sleep(3600)
            if mode == "raise":
                print("qbench worker rank 0 failed: RuntimeError: boom", file=sys.stderr,
                      flush=True)
                sys.exit(1)
            os._exit(3)
        pd.DataFrame({"run_id": [config["run_id"]], "rank": [0], "iteration": [0],
                      "t_iteration": [0.01]}).to_parquet(parts / "rank-0.parquet")
        (parts / "done.json").write_text(json.dumps({"run_id": config["run_id"]}))
        time.sleep(0.05)
""")


@pytest.fixture
def fake_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every launch runs FAKE_RANK on the plan; the argv of each launch is recorded."""
    program = tmp_path / "fake_rank.py"
    program.write_text(FAKE_RANK)
    launches: list[list[str]] = []

    @contextmanager
    def jobs(
        self: local.Local, spec: RunSpec, plan: Path
    ) -> Iterator[list[tuple[list[str], dict[str, str]]]]:
        argv = [sys.executable, str(program), str(plan)]
        launches.append([s["run_id"] for s in json.loads(plan.read_text())["configs"]])
        yield [(argv, dict(os.environ))]

    monkeypatch.setattr(local.Local, "group_jobs", jobs)
    return launches


def _run(tmp_path: Path, specs: list[RunSpec]) -> tuple[dict[str, str], list[tuple[str, bool]]]:
    store = ResultStore(tmp_path / "out")
    prov = runfiles.Provenance({"hostname": "h"}, {}, None)
    summary = sweep.SweepSummary(out=store.root, total=len(specs))
    ticks: list[tuple[str, bool]] = []
    group.run_groups(specs, store, prov, summary,
                     lambda s, rec: ticks.append((s.run_id, rec is None)),
                     Launch(isolation="group"))  # fmt: skip
    return summary.statuses, ticks


def test_one_launch_runs_the_group_and_records_each_run(fake_ranks, tmp_path: Path) -> None:
    specs = _specs()
    statuses, ticks = _run(tmp_path, specs)
    assert statuses == {s.run_id: "ok" for s in specs}
    assert fake_ranks == [[s.run_id for s in specs]]  # one launch
    # progress per run: started, then finished, in order
    assert ticks == [(s.run_id, started) for s in specs for started in (True, False)]
    store = ResultStore(tmp_path / "out")
    for i, spec in enumerate(specs):
        rec = store.read_record(spec.run_id)
        assert rec is not None and rec.status == "ok" and rec.isolation == "group"
        assert rec.group == {"launch": specs[0].run_id, "position": i, "index": i,
                             "size": len(specs)}  # fmt: skip
        assert rec.duration_s is not None and rec.duration_s < 30
        assert len(pd.read_parquet(store.iterations_path(spec.run_id))) == 1
    assert store.group_plan(specs[0].run_id).exists()


@pytest.mark.parametrize("mode", ["exit", "raise"])
def test_a_failing_run_fails_alone_and_the_group_goes_on(
    mode: str, fake_ranks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAULT", f"1:{mode}")
    specs = _specs()
    statuses, _ = _run(tmp_path, specs)
    bad = specs[1].run_id
    assert statuses == {s.run_id: "failed" if s.run_id == bad else "ok" for s in specs}
    # relaunched for the runs after the failed one
    assert fake_ranks == [[s.run_id for s in specs], [s.run_id for s in specs[2:]]]
    rec = ResultStore(tmp_path / "out").read_record(bad)
    assert rec is not None and rec.exit_code not in (None, 0) and rec.error
    assert (
        rec.error
        == {  # the rank the driver saw fail: each rank is a process of its own
            "raise": "rank 0 of 1 exited with code 1: RuntimeError: boom",
            "exit": "rank 0 of 1 exited with code 3 (no Python exception: crashed or killed)",
        }[mode]
    )


def test_a_hung_run_times_out_alone(fake_ranks, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_FAULT", "2:hang")
    monkeypatch.setattr(group.procs, "GRACE_S", 1.0)
    specs = _specs(timeout=2)
    statuses, _ = _run(tmp_path, specs)
    assert statuses == {s.run_id: "timeout" if s is specs[2] else "ok" for s in specs}
    rec = ResultStore(tmp_path / "out").read_record(specs[2].run_id)
    assert rec is not None and rec.error.startswith("timed out after 2 s")
    assert 2 <= (rec.duration_s or 0) < 10  # its own clock, not the group's
    assert fake_ranks[-1] == [specs[3].run_id]


def test_a_launch_that_dies_before_the_first_run_fails_that_run_only(
    fake_ranks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAULT", "0:exit")
    specs = _specs()
    statuses, _ = _run(tmp_path, specs)
    assert [statuses[s.run_id] for s in specs] == ["failed", "ok", "ok", "ok"]
    assert len(fake_ranks) == 2


@dataclasses.dataclass
class _Ended:
    returncode: int


TAG = WORKER_FAILED


@pytest.mark.parametrize(
    ("log", "codes", "exit_order", "cause"),
    [
        # rank 1 raised; rank 0, taken down by it, finished its teardown first (CI saw this)
        (
            f"{TAG} 1 failed: NonFiniteGradient: nan\n{TAG} 0 failed: RuntimeError: closed\n",
            [1, 1],
            [0, 1],
            1,
        ),
        # rank 1 crashed without a word: the first to end is the cause, not the first tagged
        (f"{TAG} 0 failed: RuntimeError: closed\n", [1, 3], [1, 0], 1),
        # a rank 10's line is not rank 1's
        (f"{TAG} 10 failed: RuntimeError: x\n", [0, 1] + [0] * 8 + [1], [1, 10], 1),
        # no tagged line at all: the exit clock decides
        ("", [3, 3], [1, 0], 1),
    ],
)
def test_the_cause_is_the_rank_that_failed_first_not_the_first_to_exit(
    log: str, codes: list[int], exit_order: list[int], cause: int
) -> None:
    ranks = [_Ended(c) for c in codes]
    ended = {r: float(t) for t, r in enumerate(exit_order)}
    assert group._cause(ranks, ended, log) == cause


# ---- a rank's side: logs per run --------------------------------------------------------------


def test_rank_output_goes_to_the_runs_own_logs(tmp_path: Path) -> None:
    """File descriptors 1 and 2 (C libraries too) point at the run's logs while it runs."""
    code = textwrap.dedent(f"""\
        import os, sys
        from pathlib import Path
        from qbench.run.group import _logs
        for name in ("a", "b"):
            d = Path({str(tmp_path)!r}) / name
            d.mkdir()
            with _logs(d):
                print("py out", name)
                print("py err", name, file=sys.stderr)
                os.write(1, b"fd out\\n")
        print("after")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "after\n"
    for name in ("a", "b"):
        assert (tmp_path / name / "stdout.log").read_text() == f"py out {name}\nfd out\n"
        assert (tmp_path / name / "stderr.log").read_text() == f"py err {name}\n"


# ---- real ranks (torch): slow ---------------------------------------------------------------

DETERMINISTIC = ["run_id", "rank", "iteration", "warmup", "loss", "bytes_sent", "payload_bytes",
                 "grad_bytes"]  # fmt: skip


def _sweep(scenario: str, out: Path, *extra: str, env: dict[str, str] | None = None):
    path = out.parent / f"{out.name}.yaml"
    path.write_text(scenario)
    argv = [sys.executable, "-m", "qbench.cli", "sweep", str(path), "--out", str(out), *extra]
    return invoke.run(argv, capture_output=True, text=True, timeout=600,
                   env={**os.environ, **(env or {})})  # fmt: skip


def _records(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/run.json")}


SAME = """
name: same
model: mlp
world_size: 2
backend: [gloo, mpi]
scheme: [auto, ddp]
compressor: [none, {name: qsgd, bits: 4, bucket_size: 512}]
exclude: [{scheme: ddp, compressor: qsgd}, {scheme: auto, compressor: none}]
warmup: 1
iterations: 3
timeout: 300
"""


@pytest.mark.slow
def test_a_group_records_what_separate_launches_record(tmp_path: Path) -> None:
    """Same run ids, rows, losses and bytes (fixed seeds) as one launch per run; run.json says
    which mode produced each run; every rank's memory is recorded after its run."""
    procs_ = {m: _sweep(SAME, tmp_path / m, "--isolation", m) for m in ("process", "group")}
    for mode, proc in procs_.items():
        assert proc.returncode == 0, f"{mode}: {proc.stderr[-3000:]}"
    recs = {m: _records(tmp_path / m) for m in procs_}
    assert sorted(recs["group"]) == sorted(recs["process"]) and len(recs["group"]) == 3
    assert {r["isolation"] for r in recs["process"].values()} == {"process"}
    assert {r["isolation"] for r in recs["group"].values()} == {"group"}
    assert all(r["group"] is None for r in recs["process"].values())
    launches = {r["group"]["launch"] for r in recs["group"].values()}
    assert len(launches) == 2  # gloo and mpi
    for run_id in recs["group"]:
        frames = [
            pd.read_parquet(tmp_path / m / run_id / "iterations.parquet").sort_values(
                ["rank", "iteration"], ignore_index=True
            )[DETERMINISTIC]
            for m in ("process", "group")
        ]
        assert len(frames[0]) == 2 * 4
        pd.testing.assert_frame_equal(frames[0], frames[1], check_exact=True, obj=run_id)
        ranks = json.loads((tmp_path / "group" / run_id / "machine.json").read_text())["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert all(r["rss_mb"] > 0 and r["isolation"] == "group" for r in ranks)


FAULTS = """
name: faults
model: mlp
world_size: 2
backend: BACKEND
compressor: [none, {name: qsgd, bits: 8}, {name: qsgd, bits: 4}]
warmup: 1
iterations: 5
timeout: TIMEOUT
"""


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "mode"), [("gloo", "exit"), ("mpi", "raise")])
def test_a_failing_configuration_fails_alone(backend: str, mode: str, tmp_path: Path) -> None:
    """Rank 1 dies (or raises) in the group's second run: that run fails naming the rank, the
    group is launched again for the third."""
    text = FAULTS.replace("BACKEND", backend).replace("TIMEOUT", "300")
    proc = _sweep(text, tmp_path / "r", env={"QBENCH_FAULT": f"1:2:{mode}@1"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    recs = sorted(_records(tmp_path / "r").values(), key=lambda r: r["group"]["index"])
    assert [r["status"] for r in recs] == ["ok", "failed", "ok"]
    error = recs[1]["error"]
    assert error.startswith("rank 1 of 2 exited with code"), error
    if mode == "raise":
        assert "RuntimeError: injected fault at iteration 2" in error
    else:
        assert "no Python exception" in error
    assert recs[1]["stderr_tail"]
    assert recs[2]["group"]["launch"] != recs[0]["group"]["launch"]  # relaunched for the rest
    rows = pd.read_parquet(tmp_path / "r" / recs[2]["run_id"] / "iterations.parquet")
    assert len(rows) == 2 * 6


@pytest.mark.slow
def test_a_failing_configuration_fails_alone_across_emulated_nodes(tmp_path: Path) -> None:
    """The same on two emulated nodes (a rank per network namespace, issue 33): the group of
    the two nodes loses rank 1 in its second run, that run fails alone, the group is launched
    again (its namespaces rebuilt) for the third, and the sweep leaves no namespace behind."""
    from qbench.launch import netns

    try:
        netns.check_available()
    except UserError as e:
        pytest.skip(f"emulated nodes need network namespaces: {e}")
    text = FAULTS.replace("BACKEND", "gloo").replace("TIMEOUT", "300") + "network: {nodes: 2}\n"
    (tmp_path / "r.yaml").write_text(text)
    argv = [sys.executable, "-m", "qbench.cli", "sweep", str(tmp_path / "r.yaml"), "--out",
            str(tmp_path / "r")]  # fmt: skip
    driver = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "QBENCH_FAULT": "1:2:exit@1"})  # fmt: skip
    _, stderr = driver.communicate(timeout=600)
    assert driver.returncode == 1, stderr[-3000:]
    recs = sorted(_records(tmp_path / "r").values(), key=lambda r: r["group"]["index"])
    assert [r["status"] for r in recs] == ["ok", "failed", "ok"]
    assert recs[1]["error"].startswith("rank 1 of 2 exited with code"), recs[1]["error"]
    assert recs[2]["group"]["launch"] != recs[0]["group"]["launch"]
    assert all("-w2n2-" in r["run_id"] for r in recs)  # the run ids of a two-node run
    # namespaces are named after the process that made them; other tests may hold their own
    assert [n for n in netns.list_namespaces() if n.startswith(f"qb-{driver.pid}-")] == []


@pytest.mark.slow
def test_a_hung_configuration_times_out_alone(tmp_path: Path) -> None:
    """Rank 1 hangs in the second run: its timeout (counted from the first run's end) kills
    the group, that run is marked timeout, the third runs in a new launch. Each launch takes
    longer to start than the timeout (as beside CI's other slow tests, where a relaunch once
    timed out its first run): a launch's first run is timed from when its ranks are ready.
    The timeout is 20 s, though a run takes under a second alone: beside replay-scale's quick
    sweep (16 ranks at a time on 2 cores) CI once saw the relaunch's 5-iteration run take 20 s,
    when each rank still imported torch._dynamo in its first run (the rank server imports it
    now, before it forks the ranks). The test sleeps through 2 starts and a timeout, so each
    second of the timeout costs the suite 3."""
    text = FAULTS.replace("BACKEND", "gloo").replace("TIMEOUT", "20")
    env = {"QBENCH_FAULT": "1:2:hang@1", "QBENCH_SLOW_START": "21"}
    proc = _sweep(text, tmp_path / "r", env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    recs = sorted(_records(tmp_path / "r").values(), key=lambda r: r["group"]["index"])
    assert [r["status"] for r in recs] == ["ok", "timeout", "ok"]
    assert recs[1]["error"].startswith("timed out after 20 s")
    assert 20 <= recs[1]["duration_s"] < 40
    assert recs[2]["group"]["launch"] != recs[0]["group"]["launch"]


def test_a_launch_that_does_not_start_times_out_saying_so() -> None:
    """Before its ranks are ready a launch has the startup limit (or the timeout if longer),
    and the line says the ranks did not start; once ready, the run's own timeout."""
    from qbench.launch.group import STARTUP_S, _timed_out

    assert _timed_out(20, STARTUP_S - 1, up=False) is None
    assert "did not start within 300 s" in _timed_out(20, STARTUP_S + 1, up=False)
    assert "did not start within 900 s" in _timed_out(900, 901, up=False)
    assert _timed_out(900, 899, up=False) is None
    assert _timed_out(20, 19, up=True) is None
    assert _timed_out(20, 21, up=True) == ""  # the record's usual "timed out after 20 s"


MEMORY = """
name: memory
model: resnet20
world_size: 1
backend: gloo
scheme: [auto, ddp]
compressor: [none, {name: qsgd, bits: 8}, {name: qsgd, bits: 4}, {name: qsgd, bits: 2},
             {name: onebit}]
exclude: [{scheme: ddp, compressor: [qsgd, onebit]}]
warmup: 1
iterations: 3
repeats: 2
"""


def _rss_growth(out: Path, env: dict[str, str] | None = None) -> tuple[float, list[float]]:
    """Median growth of rank 0's resident memory per run over the second pass of MEMORY."""
    proc = _sweep(MEMORY, out, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = sorted(_records(out).values(), key=lambda r: r["group"]["index"])
    assert len(recs) == 12 and len({r["group"]["launch"] for r in recs}) == 1
    rss = [
        json.loads((out / r["run_id"] / "machine.json").read_text())["ranks"][0]["rss_mb"]
        for r in recs
    ]
    growth = [after - before for before, after in itertools.pairwise(rss[5:])]
    return statistics.median(growth), rss


@pytest.mark.slow
def test_memory_does_not_grow_along_a_group(tmp_path: Path) -> None:
    """Each run's objects are released before the next: the six configurations run twice in
    one group (repeats interleave), and over the second pass the rank's resident memory does
    not grow run by run: the median growth per run is under 2 MiB. Memory may step up once
    (a kernel library loaded, DDP's reducer first built, the allocator taking a new arena:
    steps of 17-23 MiB at one run, then flat, were seen); a leak grows with every run, and one
    leaked ResNet-20 run (model, optimizer, gradients, codec buffers) holds more than 2 MiB."""
    growth, rss = _rss_growth(tmp_path / "r")
    assert growth < 2.0, rss


@pytest.mark.slow
def test_memory_check_catches_a_planted_leak(tmp_path: Path) -> None:
    """The check above can fail: rank 0 keeping 16 MiB in every run (QBENCH_FAULT's ``leak``)
    grows its memory by about that much per run, far over the 2 MiB allowed. (With 8 MiB it
    did not show once in six tries, probably because the allocator served it from memory the
    last run had freed but kept resident: a leak shows once it outgrows that.)"""
    growth, rss = _rss_growth(tmp_path / "r", env={"QBENCH_FAULT": "0:1:leak"})
    assert growth > 6.0, rss
