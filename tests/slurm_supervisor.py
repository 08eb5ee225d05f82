"""The supervisor of tests/slurm_cluster.py's daemons, a process of its own
(``python tests/slurm_supervisor.py DIR``: the commands of DIR/daemons.json).

It is a child subreaper: slurmd double-forks a slurmstepd per job, which would otherwise end up a
zombie of PID 1 (containers often have no init that reaps). It reaps them all; on SIGTERM, or
when a daemon fails to start or exits, it stops its daemons and every process they left behind.
A daemon gone is said on stderr (DIR/supervisor.log), and the exit code is then 1, so that the
tests fail naming it (``slurm_cluster.start_failure``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from qbench.run.rank_server import ended

STOP_GRACE_S = 10.0

_PR_SET_CHILD_SUBREAPER = 36


def supervise(root: Path) -> int:
    """Start the daemons in order, reap every child (adopted ones too) until SIGTERM or until a
    daemon fails to start or exits (a cluster short of one is broken: said on stderr, exit
    code 1), then stop the daemons and whatever processes they left behind, and reap those."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    daemons: list[subprocess.Popen[bytes]] = []
    commands, failed = json.loads((root / "daemons.json").read_text()), ""
    for i, argv in enumerate(commands):
        if stopping:
            break
        out = open(root / f"{Path(argv[0]).name}.out", "wb")  # noqa: SIM115 (lives as long)
        try:
            daemons.append(subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL))
        except OSError as e:
            failed = f"{Path(argv[0]).name} could not start: {e}"
            break
        if i == 0:  # munged: its socket before slurmctld / slurmd authenticate
            deadline = time.monotonic() + 15
            while not (root / "munge.sock").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    reaped: dict[int, int] = {}  # pid -> exit code of every child reaped
    while not (stopping or failed):
        _reap(reaped)
        failed = _exited(commands, daemons, reaped)
        time.sleep(0.1)
    if failed:
        print(failed, file=sys.stderr, flush=True)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [*(d.pid for d in reversed(daemons)), *_descendants_of_cluster(root)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            _reap()
            if all(d.poll() is not None for d in daemons) and not _children():
                break
            time.sleep(0.05)
    _reap()
    return 1 if failed else 0


def _exited(
    commands: list[list[str]], daemons: list[subprocess.Popen[bytes]], reaped: dict[int, int]
) -> str:
    """Which daemons have exited, and with what code ("" while all run). :func:`_reap` takes
    their status before Popen can, so the codes are read from what it reaped."""
    return "; ".join(f"{Path(commands[i][0]).name} exited with code {reaped[d.pid]}"
                     for i, d in enumerate(daemons) if d.pid in reaped)  # fmt: skip


def _reap(reaped: dict[int, int] | None = None) -> None:
    """Reap every child that has ended (adopted ones too), noting their exit codes."""
    for pid, code in ended():
        if reaped is not None:
            reaped[pid] = code


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
            if fields.get("PPid", "").strip() == me and not fields.get("State", "").startswith("Z"):
                out.append(int(status.parent.name))
    return out


def _descendants_of_cluster(root: Path) -> list[int]:
    """Processes started by this cluster's daemons (slurmstepd, job steps): their environment
    names this cluster's slurm.conf."""
    marker = f"SLURM_CONF={root / 'slurm.conf'}".encode()
    out = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        if pid == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in environ.read_bytes().split(b"\0"):
                out.append(pid)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/slurm_supervisor.py DIR")
    sys.exit(supervise(Path(sys.argv[1])))
