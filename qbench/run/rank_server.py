"""The rank server: a process that imports torch and the worker once, then forks ranks from it.

usage: python -m qbench.run.rank_server [PADDING]   (``qbench.launch.rank_server`` starts it;
PADDING, spaces, reserves room for the ranks' command lines)

Starting a rank costs seconds of CPU before it does anything: importing torch, pandas and
qbench (about 4 s a process on a 2-core machine, more than a small run's measured iterations).
A sweep of many rank groups pays that for every rank of every launch. This server pays it once
per sweep: each rank of a launch on this host's CPU is a ``fork`` of it, which starts in
milliseconds with every module already imported, then runs ``qbench.run.worker`` as an exec'd
rank would (its own environment, working directory, logs, process group and argv).

Only CPU ranks are forked (``qbench.launch.local``, and ``qbench.launch.shaped``'s flat star,
where the child enters its emulated host's network namespace as ``ip netns exec`` would, by
``setns``; the rank reads nothing of the ``/sys`` and ``/etc/netns`` views that ``ip`` also
remounts): a CUDA context does not survive a fork,
and although importing torch creates none, a GPU rank gains little (its CUDA and NCCL start-up
dominates) for that risk. The server starts no threads, so the fork copies no lock held by one;
``OMP_NUM_THREADS=1`` (the ranks' own setting, ``qbench.launch.local.worker_env``) keeps
OpenBLAS from starting its pool at import.

Protocol, one JSON object per line: the driver writes ``{"args", "env", "cwd", "stdout",
"stderr", "pgid", "netns"}`` on stdin (``netns``: a namespace name or null); the server answers
``{"pid": N}`` for each, and ``{"exit": N, "code": C}`` when rank N ends (C as
``subprocess.Popen.returncode``: -SIGNAL when killed). It says ``{"ready": true}`` once its
imports are done, and exits when stdin closes.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import select
import signal
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# What every rank imports (the worker, torch, pandas for its parts) and what most runs load
# lazily: the models, the codecs (the C kernels' library among them), the aggregation schemes,
# and torch._dynamo, which torch imports when the first optimizer is made (2.5-2.8 s of a rank's
# first run on a 2-core machine, measured with PYTHONPROFILEIMPORTTIME).
PRELOAD = ("qbench.run.worker", "qbench.models", "qbench.compress", "qbench.aggregate",
           "qbench.run.loops.ddp", "pyarrow.parquet", "torch._dynamo")  # fmt: skip
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15  # <linux/prctl.h>
_CLONE_NEWNET = 0x40000000  # <sched.h>
NETNS_DIR = "/var/run/netns"  # where `ip netns add` pins a namespace by name


def main() -> int:
    for name in PRELOAD:
        importlib.import_module(name)
    import torch  # what PRELOAD loaded; the module itself loads none (tests/invoke.py imports it)

    if torch.cuda.is_initialized():  # a fork would carry a CUDA context no child can use
        raise SystemExit("qbench.run.rank_server: CUDA was initialized by an import")
    # The imports' objects stay for the server's life: frozen, no rank's collection scans
    # them, nor writes to their pages, which the fork shares with the server (copy on write)
    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the wakeup fd
    _send({"ready": True})
    buffered = b""
    while True:
        readable, _, _ = select.select([0, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap()
        if 0 in readable:
            chunk = os.read(0, 65536)
            if not chunk:
                return 0  # the driver closed stdin (or died): the ranks die with it (PDEATHSIG)
            buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                _send({"pid": _fork(json.loads(line), (wake_r, wake_w))})


def _send(doc: dict[str, Any]) -> None:
    os.write(1, (json.dumps(doc) + "\n").encode())


def _reap() -> None:
    for pid, code in ended():
        _send({"exit": pid, "code": code})


def ended() -> Iterator[tuple[int, int]]:
    """(pid, exit code as ``subprocess.Popen.returncode`` gives it) of each child of this
    process that has ended, reaped; stops when no other has ended yet."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def _fork(request: dict[str, Any], server_fds: tuple[int, int]) -> int:
    server = os.getpid()
    pid = os.fork()
    if pid:
        # here as well as in the child, as shells do: the driver asks for the next rank in
        # this group as soon as it has this pid, which may be before the child ran at all
        with contextlib.suppress(OSError):  # a child already gone set its own group first
            os.setpgid(pid, request["pgid"] or pid)
        return pid
    code = 1
    try:  # the child: never returns into the server's loop
        _become_rank(request, server, server_fds)
        code = _run(request["args"])
    finally:
        os._exit(code)


def _become_rank(request: dict[str, Any], server: int, server_fds: tuple[int, int]) -> None:
    """What an exec'd rank would have: its process group, death with its parent, default
    signal handling, its logs on fds 1 and 2, its environment, directory and argv."""
    os.setpgid(0, request["pgid"])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != server:  # the server died before prctl: no signal would come
        os._exit(128 + signal.SIGTERM)
    if request.get("netns"):
        fd = os.open(f"{NETNS_DIR}/{request['netns']}", os.O_RDONLY)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {request['netns']}")
        os.close(fd)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in server_fds:
        os.close(fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    null = os.open(os.devnull, os.O_RDONLY)
    for target, fd in ((0, null), (1, os.open(request["stdout"], flags, 0o644)),
                       (2, os.open(request["stderr"], flags, 0o644))):  # fmt: skip
        os.dup2(fd, target)
        os.close(fd)
    # unbuffered, as PYTHONUNBUFFERED=1 makes an exec'd rank: its lines reach the log in order
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = ["qbench.run.worker", *request["args"]]
    _retitle([sys.executable, "-m", "qbench.run.worker", *request["args"]], libc)


def _retitle(argv: list[str], libc: ctypes.CDLL) -> None:
    """What ``ps`` and ``/proc/PID/cmdline`` show: the command an exec'd rank would have had,
    written over the server's own argv (the kernel reads it from that memory; Python keeps its
    own copy; the padding the driver gives the server makes room), and the thread name ``top``
    shows, ``qbench rank N``."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: stat fields 48 and 49
    text = "\0".join(argv).encode()[: end - start - 1]
    ctypes.memmove(start, text + b"\0" * (end - start - len(text)), end - start)
    name = f"qbench rank {os.environ.get('RANK', '?')}".encode()[:15]
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def _run(args: list[str]) -> int:
    """``python -m qbench.run.worker ARGS`` in this process: its exit code, its traceback on
    stderr when it raises, and the interpreter's exit handlers run, as at a normal exit."""
    from qbench.run import worker  # PRELOAD's: importing this module loads no torch

    try:
        code: Any = worker.main(args)
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return exit_status(code)


def exit_status(code: object) -> int:
    """A process's exit status for ``sys.exit(code)``: None is 0, an int itself, anything else
    printed to stderr (as Python does) and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
