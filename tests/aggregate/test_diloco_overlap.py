"""Streaming DiLoCo's exchange behind the inner steps (qbench.aggregate.diloco on the helper of
qbench.comm.background), on ranks that are threads: it runs while the loop steps on, its models
are those of the exchange run at once bit for bit, its bytes land on the merge's step, and the
run's last step waits for what is still in flight. Each test names the bug it catches."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from qbench import aggregate
from qbench.catalog.schemes.collectives import allreduce_bus_bytes
from qbench.comm import background
from qbench.comm.background import Background
from qbench.compress import from_spec
from qbench.timing import PhaseTimer
from tests.aggregate.test_diloco import OUTER, TENSORS, THETA0, N, _grad
from tests.threadcomm import ThreadComm, run_ranks

K = 3


class Counting(ThreadComm):
    """ThreadComm whose allreduce counts its bytes as the real backends do."""

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        self.bytes_sent += allreduce_bus_bytes(tensor.numel() * tensor.element_size(), K)
        super().allreduce_(tensor, op)


class AtOnce(Counting):
    """A backend that cannot run a second thread's collectives: exchanges run when they start."""

    threads = False


_run = Background._run


def _gated(self: Background, task: Any) -> Any:
    """A helper's task starts only once its rank's loop has taken the optimizer step after the
    first exchange started (``STEPPED``): an exchange run in the loop's own thread never gets
    there, and one behind it sees the parameters move on before it reads anything."""
    assert threading.current_thread().name == "qbench-background"  # what a debugger shows
    CALLED.add(self.comm.rank)
    assert STEPPED[self.comm.rank].wait(20), "the exchange ran in the loop's own thread"
    return _run(self, task)


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Background, "_run", _gated)


STEPPED: dict[int, threading.Event] = {}
CALLED: set[int] = set()


def _train(
    comm: type[ThreadComm], params: dict[str, Any], steps: int, comp: dict[str, Any]
) -> list[dict[str, Any]]:
    """Per rank: its parameters after every step, the bytes and payload each step counted."""
    STEPPED.clear()
    STEPPED.update({r: threading.Event() for r in range(K)})
    CALLED.clear()

    def fn(cm: ThreadComm) -> dict[str, Any]:
        theta = THETA0.clone()
        agg = aggregate.build(
            "streaming-diloco", cm, from_spec(comp), N, params=params, tensors=TENSORS
        )
        agg.begin(theta)
        opt = torch.optim.SGD([theta], lr=0.05, momentum=0.9)
        timer = PhaseTimer(torch.device("cpu"))
        out: dict[str, Any] = {"theta": [], "bytes": [], "payload": [], "hidden": [],
                               "launched": None}  # fmt: skip
        try:
            for step in range(steps):
                timer.start()
                before = cm.bytes_sent
                theta.grad = agg.aggregate(_grad(cm.rank, theta), step, timer)
                opt.step()
                if out["launched"] is not None:
                    STEPPED[cm.rank].set()
                agg.after_step(theta.data, step, timer)
                if out["launched"] is None and agg._pending:
                    out["launched"] = step
                out["theta"].append(theta.detach().clone())
                out["bytes"].append(cm.bytes_sent - before)
                out["payload"].append(agg.payload_bytes)
                out["hidden"].append(agg.hidden_s)
                _settle(agg, out)
            agg.finish(theta.data)  # what the flat loop does once the last step is recorded
            _settle(agg, out)
            out["final"] = theta.detach().clone()
            out["helper clock"] = None if agg.behind is None else dict(agg._helper_timer.totals)
            out["left"] = dict(agg._pending)
        finally:
            agg.close()
        return out

    return run_ranks(K, fn, comm_type=comm)


def _settle(agg: Any, out: dict[str, Any]) -> None:
    """The flat loop's: the bytes of exchanges that ran behind it, on the steps that began them."""
    for step, sent, payload in agg.late:
        out["bytes"][step] += sent
        out["payload"][step] += payload
    agg.late.clear()


STREAMING = {"H": 4, "fragments": 2, "delay": 2, "alpha": 0.5, **OUTER}
CODECS = [
    {"name": "none"},
    {"name": "qsgd", "bits": 2, "bucket_size": 8, "error_feedback": True},
    {"name": "mx", "element": "e2m1"},
]


@pytest.mark.usefixtures("gated")
@pytest.mark.parametrize("comp", CODECS, ids=lambda c: c["name"])
def test_behind_the_inner_steps_the_models_are_those_of_the_exchange_at_once(
    comp: dict[str, Any],
) -> None:
    """The helper's first exchange runs only after the loop's next optimizer step, so a
    pseudo-gradient read from the live parameters (not a snapshot) or an outer step out of
    order would change the models; with error feedback the residual must pass from round to
    round on the helper as it does at once. Fails on any of these: bit for bit, every rank,
    every step."""
    exchange = "allreduce" if comp["name"] == "none" else "reduce-broadcast"
    params = {**STREAMING, "exchange": exchange}
    behind = _train(Counting, params, 15, comp)
    at_once = _train(AtOnce, params, 15, comp)
    assert set() == CALLED  # AtOnce ran last: no helper
    for r in range(K):
        for step in range(15):
            assert torch.equal(behind[r]["theta"][step], at_once[r]["theta"][step]), (r, step)
        assert torch.equal(behind[r]["final"], at_once[r]["final"]), r
        assert behind[r]["bytes"] == at_once[r]["bytes"] and sum(behind[r]["bytes"]) > 0
        assert behind[r]["payload"] == at_once[r]["payload"] and sum(behind[r]["payload"]) > 0


@pytest.mark.usefixtures("gated")
def test_the_exchange_runs_on_the_helper_while_the_loop_steps_on() -> None:
    """A helper's task waits for an optimizer step that an exchange run in the loop's own thread
    would block, so this fails (the wait's assertion) unless the exchange runs behind; every
    rank's helper took part."""
    _train(Counting, STREAMING, 9, {"name": "none"})
    assert set(range(K)) == CALLED


@pytest.mark.usefixtures("gated")
def test_bytes_count_where_the_exchange_started_and_the_end_leaves_none_in_flight() -> None:
    """H 4, 2 fragments (23 and 14 values), delay 2, 15 steps: the exchanges start after steps
    4, 6, 8, 10, 12, 14 (1-based), run behind the next two and are merged after them; their
    bytes count on the steps that started them, as when they run at once, so that a window of
    whole rounds holds its own exchanges. The one started on step 14 is merged after the loop
    (``finish``). Fails when bytes count where the exchange is merged, are lost, or the run
    ends with an exchange in flight or never merged."""
    got = _train(Counting, STREAMING, 15, {"name": "none"})
    first, second = 23, 14
    bus = 2 * (K - 1) / K * 4  # bytes a value costs in a ring allreduce (allreduce_bus_bytes)
    want = {4: first, 6: second, 8: first, 10: second, 12: first, 14: second}
    merged = {s + 2 for s in want}
    for r in range(K):
        sent = {s + 1: round(b / bus) for s, b in enumerate(got[r]["bytes"]) if b}
        assert sent == want
        payload = {s + 1: p // 4 for s, p in enumerate(got[r]["payload"]) if p}
        assert payload == want
        assert got[r]["left"] == {}
        # only a merge's step has hidden time; the helper's clock restarts with each exchange
        assert all(h == 0.0 for s, h in enumerate(got[r]["hidden"]) if s + 1 not in merged)
        assert 0.0 < sum(got[r]["helper clock"].values()) < 20.0
        # the merge of step 14's fragment moved the model after the last recorded step
        assert not torch.equal(got[r]["final"], got[r]["theta"][-1])


def test_a_failed_task_raises_where_waited_for_and_one_in_flight_never_blocks_close() -> None:
    """A task that raises hands its exception to whoever waits for it (the merge, which fails
    the run); a helper closed with a task still in flight (a run that failed while its peers'
    exchange never came) returns at once instead of waiting forever. Fails when an exception is
    swallowed on the helper or close joins a blocked thread."""
    release = threading.Event()

    def fn(cm: ThreadComm) -> tuple[str, bool]:
        helper = background.helper(cm)
        assert helper is not None and helper.comm.parent is None  # its bytes: the caller's
        failed = helper.submit(lambda: 1 / 0, torch.device("cpu"))
        with pytest.raises(ZeroDivisionError):
            failed.result(timeout=20)
        blocked = helper.submit(lambda: release.wait(20), torch.device("cpu"))
        assert background.helper(cm) is helper  # shared by everything that asks meanwhile
        helper.close()  # returns: the blocked task is left to the process's end
        closed = helper.closed and not blocked.done()
        again = background.helper(cm)  # a next run on the same ranks starts a new one
        assert again is not None and again is not helper
        again.close()
        release.set()
        done = blocked.result(timeout=20)
        assert done.value is True and 0 < done.seconds < 20 and done.bytes_sent == 0
        return type(failed.exception()).__name__, closed

    assert run_ranks(1, fn, comm_type=Counting) == [("ZeroDivisionError", True)]


EXITS = """
import threading, torch
from qbench.comm.background import Background
from tests.threadcomm import ThreadComm, _Shared

helper = Background(ThreadComm(_Shared(1), 0, 1))
helper.submit(threading.Event().wait, torch.device("cpu"))  # never returns
helper.close()
print("closed", flush=True)
"""


def test_a_rank_whose_exchange_never_returns_still_exits() -> None:
    """A rank that failed while its exchange waits for peers that are gone must end (its
    records are written, the launcher sees its exit code): the helper is a daemon thread.
    Fails when the process waits for the helper at exit."""
    import subprocess
    import sys

    from tests.paths import ROOT

    done = subprocess.run(
        [sys.executable, "-c", EXITS], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == "closed\n", done.stderr[-2000:]


def test_the_wait_is_exposed_and_what_ran_before_it_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exchange that ran 0.5 s and was waited for 0.2 s hid 0.3 s; one of 0.1 s waited for
    0.2 s hid nothing (not a negative); the two add up on their step, whose wait is `comm`, and
    their bytes and payload go to the steps that began them. Fails on a hidden time that is
    assigned instead of added, taken with the wrong sign, floored above 0, or counts the wait."""
    from concurrent.futures import Future

    from qbench.aggregate import diloco

    clock = iter([10.0, 10.2, 20.0, 20.2])
    monkeypatch.setattr(diloco, "time", type("Clock", (), {"perf_counter": lambda: next(clock)}))

    def fn(cm: ThreadComm) -> Any:
        agg = aggregate.build(
            "streaming-diloco", cm, from_spec({"name": "none"}), N, params=STREAMING,
            tensors=TENSORS,
        )  # fmt: skip
        timer = PhaseTimer(torch.device("cpu"))
        timer.start()
        for began, seconds in ((3, 0.5), (5, 0.1)):
            item: Future[Any] = Future()
            item.set_result(background.Done(diloco.Exchanged(torch.ones(2), 7), 100, seconds))
            agg._wait(began, item, timer)
        agg.close()
        return agg.hidden_s, agg.late, timer.totals["comm"] > 0

    ((hidden, late, exposed),) = run_ranks(1, fn, comm_type=Counting)
    assert hidden == pytest.approx(0.3) and exposed
    assert late == [(3, 100, 7), (5, 100, 7)]
