"""One synchronisation policy for the timed loop (phase timer).

Breakdown mode: before reading the clock at a phase boundary we wait for the device
(``torch.cuda.synchronize``) so each phase owns exactly the work it launched. On CPU the clock
alone is enough. The timer only adds floats; it never allocates or checks in the loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

PHASES = ("compute", "encode", "comm", "decode", "step")
STRETCHED = ("encode", "decode")  # the codecs' phases, which time dilation stretches


def _sync_for(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


class Pacing:
    """Shared by replayed codec calls (``qbench.run.replay.codec``) and the timer: the seconds
    of the current phase that such calls already gave their dilated length (the timer stretches
    only the rest), and the calls whose real work outlasted their replayed time.

    ``paced_s`` is each thread's own: a codec call on a helper thread (Streaming DiLoCo's
    exchange behind the inner steps) paces that thread's phase, never the loop's."""

    def __init__(self) -> None:
        self._mine = threading.local()
        self.overruns = 0

    @property
    def paced_s(self) -> float:
        return float(getattr(self._mine, "paced_s", 0.0))

    @paced_s.setter
    def paced_s(self, value: float) -> None:
        self._mine.paced_s = value


class PhaseTimer:
    """Accumulates seconds per phase within one iteration: ``mark(phase)`` closes a phase."""

    def __init__(
        self,
        device: torch.device,
        stretch: Callable[[float], float] | None = None,
        pacing: Pacing | None = None,
    ) -> None:
        """``stretch``: time dilation, the run's clock (``qbench.spec.parts.Replay.stretched``;
        None: undilated): each encode and decode phase is padded by a sleep to the length the
        clock stretches it to, so that codecs slow down with the links and the replayed
        compute, and reports that undo the dilation see their real time;
        ``pacing``: less what replayed codec calls already paced (and reset at every mark)."""
        self._device = device
        self._sync = _sync_for(device)
        self._pacing = pacing or Pacing()
        self._stretch = stretch or float
        self._stretched = STRETCHED if stretch else ()  # decided once, not per mark
        self.totals = dict.fromkeys(PHASES, 0.0)
        self._start = self._last = self._excluded = 0.0

    def fork(self) -> PhaseTimer:
        """A timer for a helper thread: this one's dilation and pacing, but it waits only for
        the helper's own CUDA stream, so that its marks never wait for the loop's kernels."""
        timer = PhaseTimer(self._device, self._stretch if self._stretched else None, self._pacing)
        if self._device.type == "cuda":
            timer._sync = lambda: torch.cuda.current_stream().synchronize()
        return timer

    def start(self) -> None:
        self._sync()
        for k in self.totals:
            self.totals[k] = 0.0
        self._excluded = self._pacing.paced_s = 0.0
        self._start = self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        """Charge the time since the previous mark (or start) to ``phase``."""
        self._sync()
        now = time.perf_counter()
        if phase in self._stretched:
            unpaced = max(0.0, now - self._last - self._pacing.paced_s)
            time.sleep(self._stretch(unpaced) - unpaced)
            now = time.perf_counter()
        self._pacing.paced_s = 0.0
        self.totals[phase] += now - self._last
        self._last = now

    def skip(self) -> None:
        """Leave the time since the last mark out of every phase and of the iteration
        (instrumentation that is not part of training, e.g. the telemetry copy)."""
        self._sync()
        now = time.perf_counter()
        self._excluded += now - self._last
        self._last = now

    @property
    def last_mark(self) -> float:
        """The clock (``time.perf_counter``) at the last mark or start, after the device wait:
        loops that also take instants from elsewhere (DDP's buckets) line them up with it."""
        return self._last

    def elapsed(self) -> float:
        return self._last - self._start - self._excluded
