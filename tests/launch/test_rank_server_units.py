"""The rank server's parts that need no server process (qbench.launch.rank_server, the driver's
side, and qbench.run.rank_server, the server's): which commands it runs, the requests and answers
of its line protocol, what restarts it, a forked rank's exit status; the server's loop, a rank's
set-up and its title each in one ``os.fork`` of this process (milliseconds: no import), never
the server a launch starts (tests/launch/test_rank_server.py, marked slow, starts real ones)."""

from __future__ import annotations

import gc
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import qbench.run
from qbench.launch import rank_server as driver
from qbench.run import rank_server as server

PY = sys.executable
WORKER = [PY, "-m", "qbench.run.worker"]


# -- which commands the server runs (driver side) ------------------------------------------


def test_the_server_is_on_unless_the_setting_says_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QBENCH_RANK_START", raising=False)
    assert driver.enabled() is True
    for value, on in (("exec", False), ("fork", True), ("", True), ("EXEC", True)):
        monkeypatch.setenv("QBENCH_RANK_START", value)
        assert driver.enabled() is on, value


def test_a_worker_command_is_forked_as_is() -> None:
    command = [*WORKER, "plan.json", "--x"]
    assert driver.forked_argv(command) == ["<qbench rank server>", *command]
    assert driver._parse(command) == (None, ["plan.json", "--x"])
    assert driver._parse(WORKER) == (None, [])


def test_a_worker_inside_ip_netns_exec_names_its_namespace() -> None:
    command = ["/sbin/ip", "netns", "exec", "qb1h0", *WORKER, "plan.json"]
    assert driver._parse(command) == ("qb1h0", ["plan.json"])
    assert driver.forked_argv(command) == ["<qbench rank server>", *command]
    # `ip` by any path, but the words must be "netns exec" in that order
    assert driver._parse(["ip", "netns", "exec", "n", *WORKER]) == ("n", [])


@pytest.mark.parametrize(
    "command",
    [
        ["/usr/bin/python3-other", "-m", "qbench.run.worker", "p"],  # another interpreter
        [PY, "-m", "qbench.run.other", "p"],
        [PY, "-c", "qbench.run.worker", "p"],
        [PY, "qbench/run/worker.py"],
        ["ip", "exec", "netns", "n", *WORKER],  # not `netns exec`: not a namespace
        [PY],
    ],
)
def test_the_server_runs_only_the_worker(command: list[str]) -> None:
    with pytest.raises(ValueError) as e:
        driver.forked_argv(command)
    assert str(e.value) == f"the rank server runs only {PY} -m qbench.run.worker: {command}"


def test_inside_a_namespace_too_it_runs_only_the_worker() -> None:
    """The message shows the command ``ip netns exec NAME`` runs."""
    with pytest.raises(ValueError) as e:
        driver.forked_argv(["ip", "netns", "exec", "n", PY, "-m", "qbench.run.rank_server"])
    inner = [PY, "-m", "qbench.run.rank_server"]
    assert str(e.value) == f"the rank server runs only {PY} -m qbench.run.worker: {inner}"


def test_exec_argv_drops_the_forked_marker_only() -> None:
    command = [*WORKER, "plan.json"]
    assert driver.exec_argv(["<qbench rank server>", *command]) == command
    assert driver.exec_argv(command) == command
    assert driver.exec_argv(["<qbench rank server>"]) == []


def test_made_for_leaves_out_what_a_rank_reads_at_run_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"PATH": "/bin", "QBENCH_FAULT": "1", "QBENCH_SLOW_START": "2", "QBENCH_ASYNC_DELAY": "3",
           "QBENCH_DATA": "/d", "QBENCH_COMPRESS_BACKEND": "torch"}  # fmt: skip
    assert driver._made_for(env) == (
        {"PATH": "/bin", "QBENCH_COMPRESS_BACKEND": "torch"},
        str(tmp_path),
    )


# -- a forked rank as the launch code sees it ----------------------------------------------


def test_a_forked_rank_polls_none_until_it_ends() -> None:
    rank = driver.Forked(41)
    assert (rank.pid, rank.poll(), rank.returncode) == (41, None, None)
    rank._end(-15)
    assert (rank.poll(), rank.returncode, rank.wait(), rank.wait(timeout=0)) == (-15, -15, -15, -15)


def test_waiting_on_a_running_rank_times_out_as_popen_does() -> None:
    rank = driver.Forked(7)
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        rank.wait(timeout=0.05)
    assert time.monotonic() - t0 >= 0.05
    assert (e.value.cmd, e.value.timeout) == ("rank 7", 0.05)
    with pytest.raises(subprocess.TimeoutExpired) as e:
        rank.wait(timeout=0)
    assert (e.value.cmd, e.value.timeout) == ("rank 7", 0.0)


# -- the driver's end of the protocol, against a stand-in server process -------------------


class _Lines:
    """The server's stdout: the lines a test puts, one at a time; None ends it."""

    def __init__(self) -> None:
        self.q: queue.Queue[bytes | None] = queue.Queue()

    def __iter__(self) -> Iterator[bytes]:
        while (line := self.q.get()) is not None:
            yield line

    def put(self, doc: dict[str, Any] | None) -> None:
        self.q.put(None if doc is None else (json.dumps(doc) + "\n").encode())


class _Stdin(io.BytesIO):
    closed_by_test = False

    def close(self) -> None:
        self.closed_by_test = True  # keep the written bytes readable


class _Proc:
    """A stand-in for the server's Popen: records its arguments; ``codes`` are what each
    ``poll()`` returns (the last repeats)."""

    made: ClassVar[list[_Proc]] = []

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        self.argv, self.kwargs = argv, kwargs
        self.stdin = _Stdin()
        self.stdout = _Lines()
        self.codes: list[int | None] = [None]
        self.waited: list[float | None] = []
        self.killed = False
        self.hangs = False
        _Proc.made.append(self)

    def poll(self) -> int | None:
        return self.codes.pop(0) if len(self.codes) > 1 else self.codes[0]

    def wait(self, timeout: float | None = None) -> int:
        self.waited.append(timeout)
        if self.hangs:
            raise subprocess.TimeoutExpired("server", timeout or 0)
        return 0

    def kill(self) -> None:
        self.killed = True


def _preexec() -> None:
    pass


@pytest.fixture
def fake_popen(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[_Proc]]:
    _Proc.made = []
    monkeypatch.setattr(driver.subprocess, "Popen", _Proc)
    yield _Proc.made
    for proc in _Proc.made:
        proc.stdout.put(None)  # end each reading thread


def _wait_for(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.002)


def test_the_server_process_is_started_for_the_launchs_environment(
    fake_popen: list[_Proc], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"A": "1", "QBENCH_DATA": "/d"}
    before = set(threading.enumerate())
    s = driver._Server(env, lambda: _preexec)
    (proc,) = fake_popen
    assert proc.argv == [PY, "-m", "qbench.run.rank_server", " " * 4096]
    assert proc.kwargs == {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "env": env,
                           "start_new_session": True, "preexec_fn": _preexec}  # fmt: skip
    assert s.made_for == ({"A": "1"}, str(tmp_path))
    assert (s.pids, s.ranks, s.early) == ([], {}, {})
    assert not s.ready.is_set() and s.alive()
    # its reader is a daemon thread: a driver that exits with a server still up does not wait
    # for it (atexit, which closes the server, runs only after the other threads end)
    readers = [t for t in threading.enumerate() if t not in before]
    assert len(readers) == 1 and readers[0].daemon
    proc.stdout.put({"ready": True})
    assert s.ready.wait(5)


def _ready_server(fake_popen: list[_Proc]) -> tuple[driver._Server, _Proc]:
    s = driver._Server({}, lambda: None)
    proc = fake_popen[-1]
    proc.stdout.put({"ready": True})
    assert s.ready.wait(5)
    return s, proc


def test_a_request_gets_the_next_pid_and_its_exit_ends_the_rank(fake_popen: list[_Proc]) -> None:
    s, proc = _ready_server(fake_popen)
    proc.stdout.put({"pid": 42})
    rank = s.spawn({"args": ["p"], "pgid": 0})
    assert proc.stdin.getvalue() == b'{"args": ["p"], "pgid": 0}\n'
    assert rank.pid == 42 and rank.poll() is None and s.ranks == {42: rank} and s.pids == []
    proc.stdout.put({"exit": 42, "code": 3})
    assert rank.wait(5) == 3
    _wait_for(lambda: not s.ranks)


def test_an_exit_read_before_its_pid_ends_the_rank_at_once(fake_popen: list[_Proc]) -> None:
    s, proc = _ready_server(fake_popen)
    proc.stdout.put({"exit": 43, "code": -9})  # the rank ended before the driver saw its pid
    proc.stdout.put({"pid": 43})
    _wait_for(lambda: s.pids == [43])
    assert s.early == {43: -9}
    rank = s.spawn({})
    assert rank.poll() == -9 and s.early == {} and s.ranks == {}
    proc.stdout.put({"pid": 44})  # another pid's early exit is kept for its own rank
    proc.stdout.put({"exit": 45, "code": 0})
    _wait_for(lambda: s.early == {45: 0})
    later = s.spawn({})
    assert later.pid == 44 and later.poll() is None and s.ranks == {44: later}


def test_the_ranks_of_a_server_that_ends_end_with_sigterm(fake_popen: list[_Proc]) -> None:
    s, proc = _ready_server(fake_popen)
    proc.stdout.put({"pid": 50})
    rank = s.spawn({})
    proc.stdout.put(None)
    assert rank.wait(5) == -15
    _wait_for(lambda: not s.ranks)


def test_a_server_that_ends_before_it_is_ready_lets_spawn_fail(fake_popen: list[_Proc]) -> None:
    s = driver._Server({}, lambda: None)
    proc = fake_popen[-1]
    proc.codes = [1]
    proc.stdout.put(None)
    with pytest.raises(OSError) as e:
        s.spawn({})
    assert str(e.value) == "the rank server is not running"
    assert proc.stdin.getvalue() == b""


def test_a_server_that_ends_before_the_pid_lets_spawn_fail(fake_popen: list[_Proc]) -> None:
    s, proc = _ready_server(fake_popen)
    proc.codes = [None, 1]  # alive when asked, gone before it answered
    t0 = time.monotonic()
    with pytest.raises(OSError) as e:
        s.spawn({"args": []})
    assert time.monotonic() - t0 < 0.9  # not one wait of 1 s for the pid: it is gone
    assert str(e.value) == "the rank server ended before it forked the rank"
    assert proc.stdin.getvalue() == b'{"args": []}\n'


def test_a_server_gone_without_a_word_is_noticed_within_a_second(
    fake_popen: list[_Proc],
) -> None:
    """Its stdout still open (nothing wakes the asker): spawn looks at the process again each
    second, and fails on the first look that finds it gone."""
    s, proc = _ready_server(fake_popen)
    proc.codes = [None, None, 1]  # alive when asked and at the first look, gone at the second
    t0 = time.monotonic()
    with pytest.raises(OSError) as e:
        s.spawn({})
    assert 0.9 < time.monotonic() - t0 < 1.9
    assert str(e.value) == "the rank server ended before it forked the rank"


def test_a_pid_that_comes_late_is_waited_for(fake_popen: list[_Proc]) -> None:
    s, proc = _ready_server(fake_popen)
    got: list[driver.Forked] = []
    asker = threading.Thread(target=lambda: got.append(s.spawn({})))
    asker.start()
    _wait_for(lambda: proc.stdin.getvalue() != b"")
    time.sleep(0.05)
    assert got == []
    proc.stdout.put({"pid": 60})
    asker.join(5)
    assert [r.pid for r in got] == [60]


def test_closing_the_server_closes_its_stdin_and_waits_else_kills(fake_popen: list[_Proc]) -> None:
    s, proc = _ready_server(fake_popen)
    s.close()
    assert proc.stdin.closed_by_test and proc.waited == [10] and not proc.killed
    s, proc = _ready_server(fake_popen)
    proc.hangs = True
    s.close()
    assert proc.waited == [10] and proc.killed


# -- starting, reusing and ending the driver's one server ----------------------------------


class _FakeServer:
    made: ClassVar[list[_FakeServer]] = []

    def __init__(self, env: dict[str, str], die_with_parent: Any) -> None:
        self.env, self.die_with_parent = env, die_with_parent
        self.made_for = driver._made_for(env)
        self.running = True
        self.requests: list[dict[str, Any]] = []
        self.fail: str | None = None
        _FakeServer.made.append(self)

    def alive(self) -> bool:
        return self.running

    def close(self) -> None:
        self.running = False

    def spawn(self, request: dict[str, Any]) -> driver.Forked:
        self.requests.append(request)
        if self.fail:
            raise OSError(self.fail)
        return driver.Forked(99)


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> list[_FakeServer]:
    _FakeServer.made = []
    monkeypatch.delenv("QBENCH_RANK_START", raising=False)
    monkeypatch.setattr(driver, "_Server", _FakeServer)
    monkeypatch.setattr(driver, "_server", None)
    return _FakeServer.made


def test_warm_starts_one_server_and_keeps_it_for_the_same_environment(
    servers: list[_FakeServer],
) -> None:
    driver.warm({"A": "1"}, _preexec)
    driver.warm({"A": "1", "QBENCH_SLOW_START": "5"}, _preexec)  # read at run time only
    assert len(servers) == 1 and driver._server is servers[0]
    assert servers[0].env == {"A": "1"} and servers[0].die_with_parent is _preexec
    driver.warm({"A": "2"}, _preexec)  # another environment: a new server, the old one ends
    assert len(servers) == 2 and driver._server is servers[1] and not servers[0].running
    servers[1].running = False  # died: the next warm starts another
    driver.warm({"A": "2"}, _preexec)
    assert len(servers) == 3 and driver._server is servers[2]


def test_warm_does_nothing_where_the_server_is_off(
    servers: list[_FakeServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QBENCH_RANK_START", "exec")
    driver.warm({}, _preexec)
    assert servers == [] and driver._server is None


def test_close_ends_the_server_and_the_next_use_starts_one(servers: list[_FakeServer]) -> None:
    driver.close()  # none yet: nothing to do
    driver.warm({}, _preexec)
    driver.close()
    assert driver._server is None and not servers[0].running
    driver.warm({}, _preexec)
    assert len(servers) == 2 and driver._server is servers[1]


def _log(name: str) -> Any:
    return types.SimpleNamespace(name=name)  # what spawn reads of an open log file


def test_spawn_sends_the_whole_request_to_the_running_server(
    servers: list[_FakeServer], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    driver.warm({"A": "1"}, _preexec)
    argv = driver.forked_argv(["ip", "netns", "exec", "h1", *WORKER, "plan.json"])
    rank = driver.spawn(argv, {"A": "2", "RANK": "1"}, _log("o.log"), _log("e.log"), 7, _preexec)
    assert isinstance(rank, driver.Forked) and rank.pid == 99
    # the launch warmed the server: a rank's own environment does not restart it
    assert len(servers) == 1
    assert servers[0].requests == [
        {
            "args": ["plan.json"],
            "env": {"A": "2", "RANK": "1"},
            "cwd": str(tmp_path),
            "stdout": "o.log",
            "stderr": "e.log",
            "pgid": 7,
            "netns": "h1",
        }
    ]


def test_spawn_starts_a_server_where_none_runs(servers: list[_FakeServer]) -> None:
    argv = driver.forked_argv([*WORKER, "p"])
    driver.spawn(argv, {"B": "1"}, _log("o"), _log("e"), 0, _preexec)
    assert len(servers) == 1 and servers[0].env == {"B": "1"}
    assert servers[0].die_with_parent is _preexec
    assert servers[0].requests[0]["netns"] is None and servers[0].requests[0]["pgid"] == 0


def test_spawn_returns_none_where_the_server_is_off_or_fails(
    servers: list[_FakeServer],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = driver.forked_argv([*WORKER, "p"])
    driver.warm({}, _preexec)
    servers[0].fail = "the rank server is not running"
    assert driver.spawn(argv, {}, _log("o"), _log("e"), 0, _preexec) is None
    assert capsys.readouterr().err == (
        "qbench: the rank server is not running; starting the rank as its own process\n"
    )
    monkeypatch.setenv("QBENCH_RANK_START", "exec")
    assert driver.spawn(argv, {}, _log("o"), _log("e"), 0, _preexec) is None
    assert len(servers[0].requests) == 1  # not asked


# -- the server's side: answers, reaping, exit status --------------------------------------


def test_exit_status_is_what_sys_exit_would_give(capsys: pytest.CaptureFixture[str]) -> None:
    assert server.exit_status(None) == 0
    assert server.exit_status(0) == 0
    assert server.exit_status(3) == 3
    assert capsys.readouterr().err == ""
    assert server.exit_status("bad plan") == 1
    assert capsys.readouterr().err == "bad plan\n"


def test_ended_reaps_every_child_that_ended_and_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    answers = [(11, 3 << 8), (12, int(signal.SIGKILL)), (0, 0), (13, 0)]

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        calls.append((pid, options))
        return answers.pop(0)

    monkeypatch.setattr(server.os, "waitpid", waitpid)
    assert list(server.ended()) == [(11, 3), (12, -9)]
    assert calls == [(-1, os.WNOHANG)] * 3

    def no_children(pid: int, options: int) -> tuple[int, int]:
        raise ChildProcessError

    monkeypatch.setattr(server.os, "waitpid", no_children)
    assert list(server.ended()) == []


def test_reap_answers_one_line_per_ended_rank(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(server, "ended", lambda: iter([(11, 3), (12, -15)]))
    server._reap()
    assert capfd.readouterr().out == '{"exit": 11, "code": 3}\n{"exit": 12, "code": -15}\n'


def _fake_worker(
    monkeypatch: pytest.MonkeyPatch, main: Callable[[list[str]], Any]
) -> tuple[Any, list[int]]:
    """A stand-in qbench.run.worker (no torch to import) and the exit handlers' runs."""
    worker: Any = types.ModuleType("qbench.run.worker")
    worker.main = main
    monkeypatch.setitem(sys.modules, "qbench.run.worker", worker)
    monkeypatch.setattr(qbench.run, "worker", worker, raising=False)
    ran: list[int] = []
    monkeypatch.setattr(server.atexit, "_run_exitfuncs", lambda: ran.append(1))
    return worker, ran


def test_run_gives_the_workers_exit_status_and_runs_the_exit_handlers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[list[str]] = []

    def main(args: list[str]) -> int | None:
        seen.append(args)
        return 2 if args == ["two"] else None

    worker, ran = _fake_worker(monkeypatch, main)
    assert server._run(["ok"]) == 0 and seen == [["ok"]]
    assert server._run(["two"]) == 2
    assert ran == [1, 1]
    worker.main = lambda args: sys.exit(4)
    assert server._run([]) == 4
    worker.main = lambda args: sys.exit("bad plan")
    assert server._run([]) == 1 and ran == [1, 1, 1, 1]
    assert capsys.readouterr().err == "bad plan\n"


def test_run_prints_the_traceback_of_a_worker_that_raises(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def main(args: list[str]) -> int:
        raise KeyboardInterrupt  # a BaseException too: still exit 1, not the server's loop

    _, ran = _fake_worker(monkeypatch, main)
    assert server._run(["x"]) == 1 and ran == [1]
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):\n")
    assert err.endswith("KeyboardInterrupt\n")


def test_fork_in_the_server_puts_the_rank_in_its_group(monkeypatch: pytest.MonkeyPatch) -> None:
    groups: list[tuple[int, int]] = []
    monkeypatch.setattr(server.os, "fork", lambda: 321)
    monkeypatch.setattr(server.os, "setpgid", lambda pid, pgid: groups.append((pid, pgid)))
    assert server._fork({"pgid": 0}, (5, 6)) == 321  # a new group led by the rank
    assert server._fork({"pgid": 77}, (5, 6)) == 321
    assert groups == [(321, 321), (321, 77)]

    def gone(pid: int, pgid: int) -> None:
        raise PermissionError("the child already set its own")

    monkeypatch.setattr(server.os, "setpgid", gone)
    assert server._fork({"pgid": 0}, (5, 6)) == 321


class _Exit(Exception):
    pass


def test_fork_in_the_child_becomes_the_rank_and_exits_with_its_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[Any] = []

    def _exit(code: int) -> None:
        raise _Exit(code)

    monkeypatch.setattr(server.os, "fork", lambda: 0)
    monkeypatch.setattr(server.os, "_exit", _exit)
    monkeypatch.setattr(server, "_become_rank", lambda *a: calls.append(("become", *a)))

    def run(args: list[str]) -> int:
        calls.append(("run", args))
        return 5

    monkeypatch.setattr(server, "_run", run)
    request = {"pgid": 0, "args": ["plan.json"]}
    with pytest.raises(_Exit) as e:
        server._fork(request, (5, 6))
    assert e.value.args == (5,)
    assert calls == [("become", request, os.getpid(), (5, 6)), ("run", ["plan.json"])]

    def broken(*a: Any) -> None:
        raise OSError("setns")

    monkeypatch.setattr(server, "_become_rank", broken)
    calls.clear()
    with pytest.raises(_Exit) as e:
        server._fork(request, (5, 6))
    assert e.value.args == (1,) and calls == []  # never into the server's loop


# -- in a fork of this process: the server's loop, a rank's set-up, its title ---------------


def _fork(body: Callable[[], int]) -> int:
    """A fork of this process that runs ``body`` and exits with what it returns (70 if it
    raises: the child never returns into pytest)."""
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG: never
            code = body()  # outlive the test (a mutant that never returns, a killed run)
        finally:
            os._exit(code)
    return pid


def _exit_code(pid: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while not (done := os.waitpid(pid, os.WNOHANG))[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the child hung")
        time.sleep(0.005)
    return os.waitstatus_to_exitcode(done[1])


def _fake_torch(monkeypatch: pytest.MonkeyPatch, cuda: bool) -> None:
    torch: Any = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_initialized=lambda: cuda)
    monkeypatch.setitem(sys.modules, "torch", torch)


def _arg_room() -> int:
    """Bytes of this process's argv area, arg_start to arg_end (``/proc/PID/stat`` fields 48
    and 49): what ``/proc/self/cmdline`` shows once the area ends in a NUL (a process title
    set by setproctitle, as pytest-xdist's workers have, may run on past it)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[46]) - int(fields[45])


def _serve(to_server: tuple[int, int], from_server: tuple[int, int]) -> int:
    """The server's main() on these pipes as its stdin and stdout; 40 + its return value."""
    os.dup2(to_server[0], 0)
    os.dup2(from_server[1], 1)
    for fd in (*to_server, *from_server):
        os.close(fd)
    return 40 + server.main()


def test_the_server_loop_answers_ready_each_pid_and_each_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """main() with nothing heavy to preload and a _fork whose 'rank' exits at once with the
    code its request names: the driver reads ready, a pid per request (requests split across
    writes or sharing one), each rank's exit (SIGCHLD wakes the loop), and the server exits 0
    when its stdin closes."""
    monkeypatch.setattr(server, "PRELOAD", ("json", "qbench.run"))
    _fake_torch(monkeypatch, cuda=False)

    def fork(request: dict[str, Any], fds: tuple[int, int]) -> int:
        pid = os.fork()
        if pid == 0:
            os._exit(request["code"])
        return pid

    monkeypatch.setattr(server, "_fork", fork)
    to_server, from_server = os.pipe(), os.pipe()
    child = _fork(lambda: _serve(to_server, from_server))
    os.close(to_server[0])
    os.close(from_server[1])
    with os.fdopen(from_server[0], "rb") as answers, os.fdopen(to_server[1], "wb") as ask:
        assert json.loads(answers.readline()) == {"ready": True}
        ask.write(b'{"code": 3}\n{"co')
        ask.flush()
        time.sleep(0.05)
        ask.write(b'de": 4}\n')
        ask.flush()
        docs = [json.loads(answers.readline()) for _ in range(4)]
        pids = [d["pid"] for d in docs if list(d) == ["pid"]]
        exits = {d["exit"]: d["code"] for d in docs if list(d) == ["exit", "code"]}
        assert len(pids) == 2 and exits == {pids[0]: 3, pids[1]: 4}
        assert docs.index({"pid": pids[0]}) < docs.index({"exit": pids[0], "code": 3})
        ask.close()
        assert answers.read() == b""
    assert _exit_code(child) == 40


def test_the_server_refuses_to_fork_after_an_import_started_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "PRELOAD", ())
    _fake_torch(monkeypatch, cuda=True)

    def body() -> int:
        try:
            server.main()
        except SystemExit as e:
            return (
                10 if e.code == "qbench.run.rank_server: CUDA was initialized by an import" else 11
            )
        return 12

    assert _exit_code(_fork(body)) == 10


def _request(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    request = {"pgid": 0, "netns": None, "stdout": str(tmp_path / "out.log"),
               "stderr": str(tmp_path / "err.log"), "env": {"RANK": "5", "X": "y"},
               "cwd": str(tmp_path), "args": ["plan.json", "-v"]}  # fmt: skip
    return {**request, **changes}


def test_a_rank_gets_its_group_logs_environment_directory_and_argv(tmp_path: Path) -> None:
    (tmp_path / "out.log").write_text("before\n")
    result = tmp_path / "r.json"
    request = _request(tmp_path)
    server_fds = os.pipe()
    parent = os.getpid()

    def body() -> int:
        import ctypes

        room = _arg_room()
        signal.signal(signal.SIGCHLD, lambda *_: None)  # as the server has them
        wake = os.pipe()
        os.set_blocking(wake[1], False)
        signal.set_wakeup_fd(wake[1])
        os.umask(0)
        elsewhere = os.pipe()
        os.dup2(elsewhere[0], 0)  # what the server's stdin was: not the rank's
        server._become_rank(request, parent, server_fds)
        closed = []
        for fd in server_fds:
            try:
                os.fstat(fd)
            except OSError:
                closed.append(fd)
        sig = ctypes.c_int(0)
        ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
        print("to the log")
        print("to the error log", file=sys.stderr)
        sys.stdout = sys.stderr = io.StringIO()  # the rank's own streams go (a worker's may)
        gc.collect()  # the log files' fds 1 and 2 stay open
        fds_open = [os.fstat(1).st_size > 0, os.fstat(2).st_size > 0]
        cmdline = Path("/proc/self/cmdline").read_bytes()
        result.write_text(json.dumps({
            "pgid": os.getpgid(0), "pid": os.getpid(), "env": dict(os.environ),
            "cwd": os.getcwd(), "argv": sys.argv, "closed": closed, "deathsig": sig.value,
            "stdin": os.readlink("/proc/self/fd/0"), "wakeup": signal.set_wakeup_fd(-1),
            "sigchld": signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL,
            "room": room, "cmdline": cmdline.decode(), "fds_open": fds_open,
            "comm": Path("/proc/self/comm").read_text(),
        }))  # fmt: skip
        return 0

    assert _exit_code(_fork(body)) == 0
    r = json.loads(result.read_text())
    assert r["pgid"] == r["pid"]  # pgid 0: a group led by the rank
    assert r["env"] == {"RANK": "5", "X": "y"} and r["cwd"] == str(tmp_path)
    assert r["argv"] == ["qbench.run.worker", "plan.json", "-v"]
    assert r["closed"] == list(server_fds) and r["deathsig"] == signal.SIGTERM
    assert r["stdin"] == os.devnull and r["sigchld"] is True and r["wakeup"] == -1
    # what ps shows: the exec'd rank's command line, cut to the room the server's argv has
    title = f"{PY}\0-m\0qbench.run.worker\0plan.json\0-v"[: r["room"] - 1]
    assert r["cmdline"] == title + "\0" * (r["room"] - len(title))
    assert r["comm"] == "qbench rank 5\n" and r["fds_open"] == [True, True]
    assert (tmp_path / "out.log").read_text() == "before\nto the log\n"  # appended
    assert (tmp_path / "err.log").read_text() == "to the error log\n"
    assert (tmp_path / "err.log").stat().st_mode & 0o777 == 0o644
    for fd in server_fds:
        os.close(fd)


def test_a_ranks_new_logs_are_read_write_for_the_user_read_for_others(tmp_path: Path) -> None:
    parent = os.getpid()

    def body() -> int:
        os.umask(0)
        server._become_rank(_request(tmp_path), parent, os.pipe())
        return 0

    assert _exit_code(_fork(body)) == 0
    modes = [(tmp_path / f).stat().st_mode & 0o777 for f in ("out.log", "err.log")]
    assert modes == [0o644, 0o644]


def test_a_rank_in_a_group_joins_it(tmp_path: Path) -> None:
    result = tmp_path / "r"
    parent = os.getpid()

    def lead() -> int:
        time.sleep(5)
        return 0

    leader = _fork(lead)  # a group of its own, as the first rank leads
    os.setpgid(leader, leader)

    def body() -> int:
        server._become_rank(_request(tmp_path, pgid=leader), parent, os.pipe())
        result.write_text(str(os.getpgid(0)))
        return 0

    try:
        assert _exit_code(_fork(body)) == 0
        assert result.read_text() == str(leader)
    finally:
        os.kill(leader, signal.SIGKILL)
        os.waitpid(leader, 0)


def test_a_rank_whose_server_died_before_it_set_its_death_signal_exits(tmp_path: Path) -> None:
    # the parent it sees is this process, not the "server" (pid 1) it names: 128 + SIGTERM
    def body() -> int:
        server._become_rank(_request(tmp_path), 1, os.pipe())
        return 0

    child = _fork(body)
    assert _exit_code(child) == 143
    assert not (tmp_path / "out.log").exists()


def test_a_rank_of_an_unknown_namespace_fails_before_it_runs(tmp_path: Path) -> None:
    request = _request(tmp_path, netns="qbench-no-such-ns")
    parent = os.getpid()

    def body() -> int:
        try:
            server._become_rank(request, parent, os.pipe())
        except FileNotFoundError as e:
            return 10 if e.filename == "/var/run/netns/qbench-no-such-ns" else 11
        return 12

    assert _exit_code(_fork(body)) == 10
    assert not (tmp_path / "out.log").exists()


def test_a_long_title_is_cut_to_the_room_the_server_has(tmp_path: Path) -> None:
    result = tmp_path / "r"

    def body() -> int:
        import ctypes

        room = _arg_room()
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"a) b) c"), 0, 0, 0)  # ')' in /proc stat
        os.environ["RANK"] = "123456789"
        server._retitle(["x" * (room + 50)], ctypes.CDLL(None))
        after = Path("/proc/self/cmdline").read_bytes()
        comm = Path("/proc/self/comm").read_text()
        result.write_text(json.dumps([room, after.decode(), comm]))
        return 0

    assert _exit_code(_fork(body)) == 0
    room, after, comm = json.loads(result.read_text())
    assert after == "x" * (room - 1) + "\0"  # the room of the old argv, less its final NUL
    assert comm == "qbench rank 123\n"  # the kernel keeps 15 characters


def test_the_forked_parts_fail_early_on_a_bad_call_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests above run main(), _become_rank and _retitle in forks; called here too, with
    what makes each fail before it changes anything, so that mutmut, which learns which tests
    reach a function in this process only, runs those tests against their mutants."""
    monkeypatch.setattr(server, "PRELOAD", ("qbench_no_such_module",))
    with pytest.raises(ModuleNotFoundError):
        server.main()
    with pytest.raises(KeyError):
        server._become_rank({}, os.getpid(), (-1, -1))  # no pgid: nothing set yet
    with pytest.raises(TypeError):
        server._retitle(None, None)  # type: ignore[arg-type]
