"""The phase timer's time dilation (qbench.timing: ``stretch`` and ``Pacing``) on a virtual clock,
each sleep and total written out by hand: an encode or decode phase of t seconds, of which
replayed codec calls already paced p, is padded by a sleep of (stretch - 1) * max(0, t - p);
every other phase, and every phase at stretch 1, by none; each mark forgets what was paced."""

from __future__ import annotations

import pytest
import torch

from qbench import timing
from qbench.spec.parts import Replay
from qbench.timing import Pacing, PhaseTimer
from tests.fake_clock import FakeClock

CPU = torch.device("cpu")


def _timer(
    monkeypatch: pytest.MonkeyPatch, stretch: float, pacing: Pacing | None = None
) -> tuple[PhaseTimer, FakeClock]:
    clock = FakeClock(now=10.0)  # far from 0: a sign error on the clock's reading shows
    monkeypatch.setattr(timing, "time", clock)
    timer = PhaseTimer(CPU, stretch=Replay(dilation=stretch).stretch, pacing=pacing)
    timer.start()
    return timer, clock


def test_a_new_pacing_has_paced_nothing_and_seen_no_overrun() -> None:
    pacing = Pacing()
    assert (pacing.paced_s, pacing.overruns) == (0.0, 0)
    assert isinstance(pacing.paced_s, float) and isinstance(pacing.overruns, int)


def test_stretch_three_pads_an_encode_of_two_seconds_by_four(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timer, clock = _timer(monkeypatch, 3.0)
    clock.advance(2.0)
    clock.sleeps.clear()
    timer.mark("encode")
    assert clock.sleeps == [4.0]  # (3 - 1) x 2
    assert timer.totals["encode"] == 6.0 and clock.now == 16.0
    assert timer.last_mark == 16.0  # the clock after the padding
    clock.advance(0.5)
    clock.sleeps.clear()
    timer.mark("decode")
    assert clock.sleeps == [1.0] and timer.totals["decode"] == 1.5


def test_only_the_codecs_phases_are_stretched(monkeypatch: pytest.MonkeyPatch) -> None:
    timer, clock = _timer(monkeypatch, 3.0)
    for phase in ("compute", "comm", "step"):
        clock.advance(1.0)
        clock.sleeps.clear()
        timer.mark(phase)
        assert clock.sleeps == [] and timer.totals[phase] == 1.0
    assert timer.elapsed() == 3.0


def test_stretch_one_never_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    timer, clock = _timer(monkeypatch, 1.0)
    clock.advance(2.0)
    clock.sleeps.clear()
    timer.mark("encode")
    assert clock.sleeps == [] and timer.totals["encode"] == 2.0


def test_what_replayed_calls_paced_is_not_padded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    pacing = Pacing()
    timer, clock = _timer(monkeypatch, 3.0, pacing)
    clock.advance(2.0)
    pacing.paced_s = 0.5  # of the 2 s, 0.5 s were a replayed call already dilated
    clock.sleeps.clear()
    timer.mark("encode")
    assert clock.sleeps == [3.0]  # (3 - 1) x (2 - 0.5)
    assert timer.totals["encode"] == 5.0 and pacing.paced_s == 0.0
    # paced more than the phase lasted (a call's rounding): a sleep of 0, not a negative one
    clock.advance(1.0)
    pacing.paced_s = 1.5
    clock.sleeps.clear()
    timer.mark("decode")
    assert clock.sleeps == [0.0] and timer.totals["decode"] == 1.0 and pacing.paced_s == 0.0


def test_every_mark_forgets_what_was_paced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Also an unstretched phase's: the next encode starts with nothing paced."""
    pacing = Pacing()
    timer, clock = _timer(monkeypatch, 3.0, pacing)
    clock.advance(1.0)
    pacing.paced_s = 0.25
    timer.mark("comm")
    assert pacing.paced_s == 0.0
    clock.advance(1.0)
    clock.sleeps.clear()
    timer.mark("encode")
    assert clock.sleeps == [2.0] and timer.totals["encode"] == 3.0


def test_a_helper_threads_pacing_and_marks_are_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Streaming DiLoCo's exchange runs on a helper thread with a fork of the loop's timer: what
    the helper's replayed calls paced is not the loop's to skip (nor the loop's marks the
    helper's to forget), and the fork stretches as the loop's timer does. Fails when
    ``paced_s`` is one value for every thread or the fork drops the dilation."""
    import threading

    pacing = Pacing()
    timer, clock = _timer(monkeypatch, 3.0, pacing)
    helper = timer.fork()
    seen: list[float] = []

    def work() -> None:
        helper.start()
        pacing.paced_s = 0.5
        clock.advance(2.0)
        helper.mark("encode")  # (3 - 1) x (2 - 0.5): paced on this thread only
        seen.append(pacing.paced_s)

    pacing.paced_s = 0.25  # the loop's own, before the helper ran
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert pacing.paced_s == 0.25 and seen == [0.0]
    assert helper.totals["encode"] == 5.0 and timer.totals["encode"] == 0.0
