"""The driver's side of the rank server (``qbench.run.rank_server``): CPU ranks forked from one
process that imported torch and the worker once, instead of each rank importing them again.

A launch's jobs say they want this with :data:`FORKED` as their program (``qbench.launch.local``
writes it for CPU ranks it starts itself); ``qbench.launch.procs.start`` then calls
:func:`spawn`, which returns a :class:`Forked` that the launch code waits on and kills as it
does a ``subprocess.Popen`` (or None: start :func:`exec_argv` instead). The server starts on
first use, or earlier with :func:`warm` so that its imports overlap the driver's own work, and
ends with the driver (its stdin closes; it and its ranks are also signalled when the driver is
killed, as exec'd ranks are). It serves every later sweep of the same driver process (the
Python API's, a notebook's) that gives its ranks the same environment and directory; a sweep
that gives others starts a new one, since the server's imports may have read them.

``QBENCH_RANK_START=exec`` turns it off: every rank is its own ``python -m qbench.run.worker``,
as before; ``benchmarks/isolation.py --rank-start`` measures the two side by side. If the
server cannot be started or dies, ranks are exec'd and the sweep goes on.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

Preexec = Callable[[], Callable[[], None] | None]  # qbench.launch.procs.die_with_parent

FORKED = "<qbench rank server>"  # argv[0] of a job whose rank is forked (:func:`forked_argv`)
WORKER = ["-m", "qbench.run.worker"]  # every rank's program (``qbench.launch.local`` too)
SERVER = ["-m", "qbench.run.rank_server"]
START_ENV = "QBENCH_RANK_START"  # "exec": no server
TITLE_SPACE = 4096  # room in the server's argv for a rank's command line (``ps`` shows it)
RUN_TIME_ENV = frozenset({"QBENCH_FAULT", "QBENCH_SLOW_START", "QBENCH_ASYNC_DELAY", "QBENCH_DATA"})
"""Variables a rank reads when its run starts, never while importing: a server started with
other values of them serves the launch all the same (each rank gets the launch's own).
``QBENCH_DATA``: where a run reads its dataset (``qbench.catalog.datasets``), which the tests
of real data and of missing data change from one sweep to the next."""


def enabled() -> bool:
    return os.environ.get(START_ENV, "fork") != "exec"


def forked_argv(command: list[str]) -> list[str]:
    """The job that forks the rank ``command`` starts: ``python -m qbench.run.worker ARGS``,
    or that inside ``ip netns exec NAME`` (an emulated host). ``command`` itself is what runs
    where the server is off or failed (:func:`exec_argv`)."""
    _parse(command)  # the server runs only these
    return [FORKED, *command]


def exec_argv(argv: list[str]) -> list[str]:
    """The command that runs a job's rank as its own process."""
    return argv[1:] if argv[0] == FORKED else argv


def _parse(command: list[str]) -> tuple[str | None, list[str]]:
    """(network namespace or None, the worker's args) of a :func:`forked_argv` command."""
    ns = None
    if command[1:3] == ["netns", "exec"]:  # `ip` by whatever path
        ns, command = command[3], command[4:]
    if command[:1] != [sys.executable] or command[1:3] != WORKER:
        raise ValueError(f"the rank server runs only {sys.executable} -m qbench.run.worker: "
                         f"{command}")  # fmt: skip
    return ns, command[3:]


class Forked:
    """A rank forked by the server, with the part of ``subprocess.Popen`` the launch code uses:
    ``pid``, ``returncode``, ``poll()`` and ``wait()``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()


class _Server:
    """One server process and the thread that reads its answers."""

    def __init__(self, env: dict[str, str], die_with_parent: Preexec) -> None:
        self.made_for = _made_for(env)
        self.proc = subprocess.Popen(
            [sys.executable, *SERVER, " " * TITLE_SPACE], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=env, start_new_session=True, preexec_fn=die_with_parent(),
        )  # fmt: skip
        self.ready = threading.Event()
        self.lock = threading.Lock()  # one request at a time: its answer is the next pid
        self.pids: list[int] = []
        self.pid_came = threading.Condition()
        self.ranks: dict[int, Forked] = {}
        self.early: dict[int, int] = {}  # exits read before their Forked was made
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            doc = json.loads(line)
            with self.pid_came:
                if "ready" in doc:
                    self.ready.set()
                elif "pid" in doc:
                    self.pids.append(doc["pid"])
                elif doc["exit"] in self.ranks:
                    self.ranks.pop(doc["exit"])._end(doc["code"])
                else:
                    self.early[doc["exit"]] = doc["code"]
                self.pid_came.notify_all()
        with self.pid_came:  # the server is gone: its ranks died with it (PDEATHSIG)
            for rank in self.ranks.values():
                rank._end(-15)
            self.ranks.clear()
            self.ready.set()
            self.pid_came.notify_all()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, request: dict[str, Any]) -> Forked:
        assert self.proc.stdin is not None
        with self.lock:
            self.ready.wait()
            if not self.alive():
                raise OSError("the rank server is not running")
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            with self.pid_came:
                while not self.pids and self.alive():
                    self.pid_came.wait(1.0)
                if not self.pids:
                    raise OSError("the rank server ended before it forked the rank")
                rank = Forked(self.pids.pop(0))
                if rank.pid in self.early:
                    rank._end(self.early.pop(rank.pid))
                else:
                    self.ranks[rank.pid] = rank
            return rank

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_server: _Server | None = None
_start_lock = threading.Lock()


def warm(env: dict[str, str], die_with_parent: Preexec) -> None:
    """Have a server for a launch whose ranks get ``env`` (its imports take seconds: start it
    before the launch needs it), if it is on: the running one where it was started for the same
    ``env`` and directory, else a new one. It gets SIGTERM when this process dies
    (``die_with_parent``), and its ranks when it does."""
    _start(env, die_with_parent, same_as_before=True)


def _start(env: dict[str, str], die_with_parent: Preexec, same_as_before: bool) -> None:
    global _server
    with _start_lock:
        if not enabled():
            return
        if _server is not None and _server.alive():
            if not same_as_before or _server.made_for == _made_for(env):
                return
            _server.close()
        _server = _Server(env, die_with_parent)


def _made_for(env: dict[str, str]) -> tuple[dict[str, str], str]:
    """What a server's imports may have read: the environment but :data:`RUN_TIME_ENV`, and
    the directory."""
    return {k: v for k, v in env.items() if k not in RUN_TIME_ENV}, os.getcwd()


def spawn(
    argv: list[str], env: dict[str, str], out: IO[bytes], err: IO[bytes], pgid: int,
    die_with_parent: Preexec,
) -> Forked | None:  # fmt: skip
    """The rank of the :func:`forked_argv` job ``argv`` forked by the server (started here if
    need be) in process group ``pgid`` (0: a new one led by it), its output appended to the
    files of ``out`` and ``err``; None where the server is off or failed: exec it instead."""
    if not enabled():
        return None
    ns, args = _parse(argv[1:])
    request = {"args": args, "env": env, "cwd": os.getcwd(), "stdout": out.name,
               "stderr": err.name, "pgid": pgid, "netns": ns}  # fmt: skip
    _start(env, die_with_parent, same_as_before=False)  # a rank's env: the launch warmed it
    assert _server is not None
    try:
        return _server.spawn(request)
    except OSError as e:
        print(f"qbench: {e}; starting the rank as its own process", file=sys.stderr)
        return None


def close() -> None:
    """End the server (at the driver's exit, or when a test wants a fresh one); the next spawn
    starts a new one."""
    global _server
    with _start_lock:
        if _server is not None:
            _server.close()
            _server = None


atexit.register(close)  # the server ends with the driver (a no-op where none started)
