"""Run a run's processes as one group: wait for all, and kill the whole group when one fails,
the timeout passes or the driver is interrupted, so no rank is left waiting for a dead peer.

The group is also tied to the driver's life: on Linux every job asks the kernel for SIGTERM
when the driver dies (``PR_SET_PDEATHSIG``), even by SIGKILL, which no handler of the driver
sees. torchrun and mpirun then stop their ranks as they do on Ctrl-C, so a killed sweep leaves
no rank behind to write into a run directory that the resumed sweep is redoing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any, Protocol

from qbench.launch import rank_server
from qbench.records.store import STDERR_LOG, STDOUT_LOG

POLL_S = 0.05
GRACE_S = 10.0  # for launchers to stop their ranks after SIGTERM
PARENT_DEATH_SIGNAL = signal.SIGTERM  # torchrun and mpirun stop their ranks on it; SIGKILL cannot
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
Job = tuple[list[str], dict[str, str]]  # argv, environment


class Proc(Protocol):
    """A started job: a ``subprocess.Popen``, or a rank the rank server forked."""

    pid: int
    returncode: int | Any  # as typeshed types Popen's

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...


def run_jobs(jobs: list[Job], run_dir: Path, timeout: float) -> tuple[str, int | None]:
    """Start ``jobs`` in one process group, logs in run_dir; status ok / failed / timeout."""
    with open(run_dir / STDOUT_LOG, "wb") as out, open(run_dir / STDERR_LOG, "wb") as err:
        procs: list[Proc] = []
        try:
            start(jobs, procs, out, err)
            return wait_all(procs, timeout)
        finally:
            kill_group(procs)


def start(jobs: list[Job], procs: list[Proc], out: IO[bytes], err: IO[bytes]) -> None:
    """One process group for all: the first job leads it, so one killpg reaches every rank.
    A job whose program is ``rank_server.FORKED`` is a rank forked by the rank server."""
    for argv, env in jobs:
        # process_group=0: a new group led by the first job, not the terminal's foreground
        # group, so Ctrl-C reaches only the driver, which then kills the group.
        group = procs[0].pid if procs else 0
        if argv[0] == rank_server.FORKED:
            forked = rank_server.spawn(argv, env, out, err, group, die_with_parent)
            if forked is not None:
                procs.append(forked)
                continue
        child = subprocess.Popen(
            rank_server.exec_argv(argv), stdout=out, stderr=err, env=env, process_group=group,
            preexec_fn=die_with_parent(),
        )  # fmt: skip
        procs.append(child)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get PARENT_DEATH_SIGNAL when this process dies.

    Linux only (None elsewhere: children outlive a killed driver there). The signal survives
    the exec of the job (torchrun, mpirun, ``ip netns exec``: none is set-user-ID); it is sent
    when the thread that started the child ends, so call this from the thread that waits.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = _libc()
    if libc is None:
        return None
    parent = os.getpid()

    def preexec() -> None:  # runs in the child, between fork and exec
        libc.prctl(_PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: no signal will come
            os._exit(128 + PARENT_DEATH_SIGNAL)

    return preexec


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """This process's libc with prctl, looked up in the parent (not between fork and exec)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the symbols already loaded: libc's among them
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return libc


def wait_all(procs: list[Proc], timeout: float) -> tuple[str, int | None]:
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None:
            return "failed", failed  # the others may wait for it forever: killed by the caller
        if all(c == 0 for c in codes):
            return "ok", 0
        if time.monotonic() > deadline:
            return "timeout", None
        time.sleep(POLL_S)


def exit_clock(procs: list[Proc]) -> dict[int, float]:
    """Index -> when (monotonic) each process ended, filled in by a thread that waits on it.

    Polling sees a crashed rank and the peer it took down as ended together; their exit times
    tell which went first. Read ``returncode`` of the processes in the dict, and never reap
    them another way (``poll``) before they are in it, or their times come late."""
    ended: dict[int, float] = {}

    def wait(i: int, p: Proc) -> None:
        p.wait()
        ended[i] = time.monotonic()

    for i, p in enumerate(procs):
        threading.Thread(target=wait, args=(i, p), daemon=True).start()
    return ended


def kill_group(procs: list[Proc]) -> None:
    """SIGTERM first: torchrun starts its workers in sessions of their own, out of our group's
    reach, and only tears them down itself when it can handle a signal (mpirun likewise); then
    SIGKILL whatever is left after GRACE_S."""
    if not procs:
        return
    _signal_group(procs[0].pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
    _signal_group(procs[0].pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@contextmanager
def sigterm_as_interrupt(*, replace: bool = False) -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt inside the block, so the caller's clean-up (cancel the
    Slurm jobs, delete the network namespaces, mark the runs interrupted) runs as on Ctrl-C.

    By default only where SIGTERM has no handler yet and in the main thread (the only one that
    may set one): the sweep driver installs its own with ``replace``, and it stays in charge
    around the launchers it calls. The previous handler is restored when the block ends.
    """
    if not replace:
        main = threading.current_thread() is threading.main_thread()
        if not main or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            yield
            return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
