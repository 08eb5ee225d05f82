"""A virtual clock for the timing tests of time dilation and replay (qbench.timing,
qbench.run.replay, replay_codec, replay_loops): it moves only when slept on, so a test can
assert a phase's exact length, both bounds, with no room for a busy machine's noise to hide a
wrong factor (real sleeps overshoot by milliseconds, as large as the effects under test)."""

from __future__ import annotations

from typing import Any

import pytest

MODULES = ("qbench.timing", "qbench.run.replay", "qbench.run.replay.codec",
           "qbench.run.replay.loops")  # fmt: skip
"""The modules whose ``time`` the clock stands in for: every sleep and clock read of the
timer, the replayed compute and the replayed codec calls."""


class FakeClock:
    """``time``'s clock and sleep: ``perf_counter`` and ``monotonic`` read ``now``, which only
    ``sleep`` (or ``advance``) moves; ``sleeps`` lists every sleep asked for."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")  # as time.sleep does
        self.sleeps.append(seconds)
        self.now += seconds

    advance = sleep  # work that took this long, in a test's words


def install(monkeypatch: pytest.MonkeyPatch, clock: FakeClock | None = None) -> FakeClock:
    """Put ``clock`` (a new one by default) in place of ``time`` in :data:`MODULES`."""
    import importlib

    clock = clock or FakeClock()
    for name in MODULES:
        module: Any = importlib.import_module(name)
        monkeypatch.setattr(module, "time", clock)
    return clock
