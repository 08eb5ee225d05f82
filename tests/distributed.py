"""Launch a small program on K local ranks; fail loudly, never hang.

gloo ranks are forked from a process that imported torch, torch._dynamo and qbench once per
test worker (multiprocessing's fork server), with the variables torchrun would give them
(``local.direct_rank_env``, plus a ``MASTER_PORT`` for programs that call
``init_process_group`` themselves): what these tests check is the programs' collectives, not
how a process starts, and an exec'd rank costs about 8 s of CPU on a 2-core machine before it
does anything. The program runs as ``python PROG ARGS`` would (``__main__``, its argv, its exit
handlers), its output in one log. Launches as users make them are tested where that is the
subject: torchrun in tests/ddp/test_ddp_exit.py's README script and process isolation's sweeps,
mpirun here (``mpi``), and the sweeps' own launchers elsewhere.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from multiprocessing.context import ForkServerContext
from pathlib import Path

from qbench.launch import local

TIMEOUT_S = 120
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "qbench.comm", "qbench.aggregate",
           "qbench.compress", "qbench.ddp", "tests.distributed"]  # fmt: skip


def launch(backend: str, world_size: int, argv: list[str], timeout: float = TIMEOUT_S) -> None:
    """Run ``python argv...`` on ``world_size`` ranks; raise with the output if it fails."""
    if backend == "gloo":
        _forked(world_size, argv, timeout)
        return
    if backend == "mpi":
        cmd = [local.find_mpirun(), "-np", str(world_size), "--oversubscribe", "--bind-to", "none",
               sys.executable, *argv]  # fmt: skip
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(world_size), *argv]  # fmt: skip
    try:
        proc = subprocess.run(
            cmd, env=local.worker_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{backend} x{world_size} hung for {timeout} s: {cmd}") from e
    if proc.returncode != 0:
        raise AssertionError(
            f"{backend} x{world_size} exit {proc.returncode}:\n{proc.stderr[-3000:]}"
        )


@functools.cache
def _fork_server() -> ForkServerContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _forked(world_size: int, argv: list[str], timeout: float) -> None:
    ctx = _fork_server()
    with tempfile.TemporaryDirectory(prefix="qbench-test-launch-") as tmp:
        base = local.worker_env()
        base.pop("PYTEST_CURRENT_TEST", None)
        base.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(local.free_port())})
        logs = [Path(tmp) / f"rank-{r}.log" for r in range(world_size)]
        ranks = [
            ctx.Process(target=_run, args=(argv, env, str(log)), daemon=True)
            for r, log in enumerate(logs)
            for env in [local.direct_rank_env(base, r, world_size, Path(tmp) / "store")]
        ]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join(max(timeout, 1.0))
        hung = [p for p in ranks if p.exitcode is None]
        for p in hung:
            p.kill()
            p.join()
        text = "\n".join(f"-- rank {r}:\n{log.read_text()[-3000:]}"
                         for r, log in enumerate(logs) if log.exists())  # fmt: skip
        if hung:
            raise AssertionError(f"gloo x{world_size} hung for {timeout} s: {argv}\n{text}")
        failed = [(r, p.exitcode) for r, p in enumerate(ranks) if p.exitcode != 0]
        if failed:
            raise AssertionError(f"gloo x{world_size} exit {failed}: {argv}\n{text}")


def _run(argv: list[str], env: dict[str, str], log: str) -> None:
    """A rank, in the forked process: ``python argv...`` with ``env``, output to ``log``."""
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.argv = list(argv)
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # what a normal exit runs; multiprocessing's child skips them
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def here(name: str) -> str:
    return str(Path(__file__).parent / name)
