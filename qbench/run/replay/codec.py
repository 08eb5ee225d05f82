"""Replayed codec time (``codec_time:`` with ``compute: replay``): each encode and decode call
of the flat loop runs the real codec, so the payload, its bytes and the error feedback are this
machine's, then sleeps until the call has lasted what the same compressor took at that size on
the device that measured the ``qbench bench kernels --json`` file (e.g. a GPU), times the run's
dilation. A call whose real codec is slower than that cannot be shortened: it is counted as an
overrun (the records' ``codec_overrun``) and the report says how often, since such a run stands
for a slower device than the file's. Compressors the file lacks keep their own time, stretched
by the dilation as without ``codec_time:``; the phase timer stretches the rest of a codec phase
(an fp32 group's division by K, say) and leaves the paced calls alone (``qbench.timing.Pacing``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from qbench.compress import Compressor, Payload
from qbench.run.replay import sleep_until
from qbench.spec.codec_times import CodecTimes
from qbench.spec.parts import Replay
from qbench.timing import Pacing


class ReplayedCodec:
    """A compressor whose ``encode`` and ``decode`` last the replayed time; everything else is
    the wrapped compressor's (attributes are looked up on it)."""

    def __init__(self, inner: Compressor, times: CodecTimes, clock: Replay, pacing: Pacing) -> None:
        self._inner, self._times, self._clock, self._pacing = inner, times, clock, pacing
        self._replayed = times.has(inner.label)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _last(self, begun: float, op: str, numel: int) -> None:
        took = time.perf_counter() - begun
        if self._replayed:
            target = self._clock.stretched(self._times.seconds(self._inner.label, op, numel))
            if took > target:
                self._pacing.overruns += 1
        else:
            target = self._clock.stretched(took)
        sleep_until(begun + target)
        self._pacing.paced_s += time.perf_counter() - begun  # the timer must not stretch it again

    def twin(self) -> ReplayedCodec:
        """The wrapped compressor's twin (``Compressor.twin``), its calls paced as these."""
        return ReplayedCodec(self._inner.twin(), self._times, self._clock, self._pacing)

    def encode(self, grad: torch.Tensor, **kwargs: Any) -> Payload:
        begun = time.perf_counter()
        payload = self._inner.encode(grad, **kwargs)
        if grad.is_cuda:  # the kernels run asynchronously: time them, not their launch
            torch.cuda.synchronize(grad.device)
        self._last(begun, "encode", grad.numel())
        return payload

    def decode(self, payload: Payload, out: torch.Tensor | None = None) -> torch.Tensor:
        begun = time.perf_counter()
        values = self._inner.decode(payload, out)
        if values.is_cuda:
            torch.cuda.synchronize(values.device)
        self._last(begun, "decode", payload.numel)
        return values
