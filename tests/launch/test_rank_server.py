"""The rank server (qbench.run.rank_server, driven by qbench.launch.rank_server): a forked rank
gets what an exec'd one would (environment, directory, logs, process group, exit code, death
with the server), and the launch falls back to exec'd ranks where the server is off or gone."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qbench.launch import local, procs, rank_server
from qbench.spec.runspec import RunSpec

pytestmark = pytest.mark.slow  # each test starts a server: a process that imports torch


@pytest.fixture(autouse=True)
def _fresh_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(rank_server.START_ENV, raising=False)
    rank_server.close()
    yield
    rank_server.close()


def _logs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "out.log", tmp_path / "err.log"


def _start(tmp_path: Path, jobs: list[procs.Job]) -> list[procs.Proc]:
    out, err = _logs(tmp_path)
    started: list[procs.Proc] = []
    with open(out, "wb") as o, open(err, "wb") as e:
        procs.start(jobs, started, o, e)
    return started


def _sleeping_plan(tmp_path: Path) -> Path:
    """A plan whose ranks sleep before they join (QBENCH_SLOW_START), so they can be looked at."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"configs": []}))
    return plan


def _worker(plan: Path) -> list[str]:
    return [sys.executable, *rank_server.WORKER, str(plan)]


def _env(**extra: str) -> dict[str, str]:
    return {**local.worker_env(), "QBENCH_SLOW_START": "60", **extra}


def test_forked_ranks_share_a_process_group_and_have_their_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _sleeping_plan(tmp_path)
    monkeypatch.chdir(tmp_path)
    ranks = _start(tmp_path, [(rank_server.forked_argv(_worker(plan)), _env(RANK=str(r)))
                              for r in range(2)])  # fmt: skip
    try:
        assert all(isinstance(p, rank_server.Forked) for p in ranks)
        leader = ranks[0].pid
        assert [os.getpgid(p.pid) for p in ranks] == [leader, leader]  # one killpg ends both
        assert [os.readlink(f"/proc/{p.pid}/cwd") for p in ranks] == [str(tmp_path)] * 2
        assert [p.poll() for p in ranks] == [None, None]
        for r, p in enumerate(ranks):  # what ps shows, as for an exec'd rank
            deadline = time.monotonic() + 20  # retitled right after the fork
            while Path(f"/proc/{p.pid}/comm").read_text().strip() != f"qbench rank {r}":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            assert cmdline == [os.fsencode(a) for a in _worker(plan)]
    finally:
        procs.kill_group(ranks)
    assert [p.returncode for p in ranks] == [-signal.SIGTERM, -signal.SIGTERM]


def test_a_rank_gets_the_jobs_environment_not_the_servers(tmp_path: Path) -> None:
    """The server started with QBENCH_SLOW_START=60 in its environment; a rank whose job has
    none does not sleep: it fails at once, as ``python -m qbench.run.worker PLAN`` of an empty
    plan would, exit 1, its tagged line (with its RANK) and traceback in its log."""
    rank_server.warm(_env(), procs.die_with_parent)
    env = {k: v for k, v in _env(RANK="7").items() if k != "QBENCH_SLOW_START"}
    ranks = _start(tmp_path, [(rank_server.forked_argv(_worker(_sleeping_plan(tmp_path))), env)])
    assert ranks[0].wait(timeout=40) == 1
    err = _logs(tmp_path)[1].read_text()
    assert "qbench worker rank 7 failed: IndexError" in err
    assert "Traceback (most recent call last)" in err


def test_ranks_die_with_the_server_and_the_next_launch_starts_a_new_one(tmp_path: Path) -> None:
    plan = _sleeping_plan(tmp_path)
    ranks = _start(tmp_path, [(rank_server.forked_argv(_worker(plan)), _env())])
    server = rank_server._server
    assert server is not None
    server.proc.kill()  # as when the driver is killed: the server goes, its ranks with it
    assert ranks[0].wait(timeout=30) in (-signal.SIGTERM, -signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{ranks[0].pid}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{ranks[0].pid}").exists()
    job = (rank_server.forked_argv(_worker(plan)), _env(QBENCH_SLOW_START="0"))
    later = _start(tmp_path, [job])
    assert isinstance(later[0], rank_server.Forked) and rank_server._server is not server
    assert later[0].wait(timeout=60) == 1


def test_a_server_that_cannot_start_leaves_ranks_execd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(rank_server, "SERVER", ["-c", "import sys; sys.exit(3)"])
    ranks = _start(tmp_path, [(rank_server.forked_argv(_worker(_sleeping_plan(tmp_path))),
                               _env(QBENCH_SLOW_START="0", RANK="3"))])  # fmt: skip
    assert not isinstance(ranks[0], rank_server.Forked)
    assert ranks[0].wait(timeout=60) == 1
    assert "qbench worker rank 3 failed: IndexError" in _logs(tmp_path)[1].read_text()
    assert "starting the rank as its own process" in capfd.readouterr().err


def test_local_groups_fork_cpu_ranks_only_and_exec_is_a_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.launch.test_group import _specs

    spec = _specs(world_size=2)[0]
    cuda = RunSpec.from_dict({**spec.to_dict(), "device": "cuda"})
    assert cuda.placement.device_kind == "cuda"

    def programs(s: RunSpec) -> list[str]:
        with local.Local().group_jobs(s, tmp_path / "plan.json") as jobs:
            return [argv[0] for argv, _ in jobs]

    assert programs(spec) == [rank_server.FORKED] * 2
    assert programs(cuda) == [sys.executable] * 2  # a CUDA context does not survive a fork
    monkeypatch.setenv(rank_server.START_ENV, "exec")
    assert programs(spec) == [sys.executable] * 2


def test_a_forked_rank_of_an_emulated_host_runs_in_its_network_namespace(tmp_path: Path) -> None:
    """As ``ip netns exec NAME`` puts an exec'd rank there (the flat star of emulated links)."""
    from qbench.errors import UserError
    from qbench.launch import netns, shaped
    from qbench.spec.network import Link, Topology

    try:
        netns.check_available()
    except UserError as e:
        pytest.skip(f"emulated hosts need network namespaces: {e}")
    topo = Topology(2, 1, Link(1e9, "1gbit"))
    program = _worker(_sleeping_plan(tmp_path))
    with shaped.shaped_jobs("gloo", topo, program, prefix=f"qbt{os.getpid()}", fork=True) as jobs:
        ranks = _start(tmp_path, jobs)
        try:
            assert all(isinstance(p, rank_server.Forked) for p in ranks)
            names = [rank_server._parse(argv[1:])[0] for argv, _ in jobs]
            assert len(set(names)) == 2
            for p, name in zip(ranks, names, strict=True):
                inode = os.stat(f"/var/run/netns/{name}").st_ino  # where `ip netns add` pins it
                deadline = time.monotonic() + 20  # the child enters it right after the fork
                while os.stat(f"/proc/{p.pid}/ns/net").st_ino != inode:
                    assert time.monotonic() < deadline and p.poll() is None, p.poll()
                    time.sleep(0.05)
        finally:
            procs.kill_group(ranks)


def test_a_later_launch_with_the_same_environment_keeps_the_server(tmp_path: Path) -> None:
    """The server outlives a sweep: a later launch of this process whose ranks get the same
    environment and directory uses it; another environment gets a new one, the old one ends
    (its imports may have read the environment it was started with)."""
    rank_server.warm(_env(), procs.die_with_parent)
    first = rank_server._server
    assert first is not None
    rank_server.warm(_env(), procs.die_with_parent)
    assert rank_server._server is first and first.alive()
    # what a rank reads only when its run starts does not matter (each rank gets its own)
    later = _env(QBENCH_FAULT="1:2:raise", QBENCH_SLOW_START="3", QBENCH_DATA=str(tmp_path))
    rank_server.warm(later, procs.die_with_parent)
    assert rank_server._server is first and first.alive()
    rank_server.warm(_env(QBENCH_COMPRESS_BACKEND="torch"), procs.die_with_parent)
    assert rank_server._server is not first and not first.alive()
