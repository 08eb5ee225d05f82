"""The training loops of replayed runs (``compute: replay``, ``qbench.run.replay``): the flat
loop and DDP's, with the model's work slept through and everything else as in the real loops
(``qbench.run.loops.flat``, ``qbench.run.loops.ddp``), whose records they write. Every iteration
hands the scheme the rank's first-batch gradient: the bytes are a real run's only for payloads
whose size the shapes set, the only ones the planner lets replay (``qbench.spec.rules``)."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import cast

import torch
from torch import nn

from qbench import comm
from qbench.compress import Compressor
from qbench.ddp.finite import finite_hook
from qbench.run import replay
from qbench.run.loops.ddp import DDPRun
from qbench.run.loops.flat import Run
from qbench.run.replay import codec as replay_codec
from qbench.spec.codec_times import CodecTimes
from qbench.spec.runspec import RunSpec
from qbench.timing import Pacing, PhaseTimer

NAN = float("nan")  # a replayed run has no loss: its model does not learn


def _own_gradient(run: Run | DDPRun) -> None:
    """This rank's real gradient, of its own first batch, into the parameters' .grad."""
    x, y = run.data.batch(0)
    replay.gradient(run.named, run.loss_fn(run.model(x), y))


class ReplayRun(Run):
    """The flat loop: backward's end after the timeline's forward and backward, then this
    rank's gradient through the scheme, then the optimizer step's time; with ``codec_time``,
    each codec call lasts the replayed time (``qbench.run.replay.codec``)."""

    pacing: Pacing

    def __init__(self, spec: RunSpec, cm: comm.Comm, parts: Path) -> None:
        self.pacing = Pacing()
        super().__init__(spec, cm)
        _own_gradient(self)
        self.grad = self.flat.clone()  # rank 0's measurement below changes .grad
        self.timeline = replay.shared(self, parts)
        self.draws = replay.Draws(self.timeline, spec.measurement.seed, cm.rank)
        self._step_s = 0.0

    def iteration(self, it: int, timer: PhaseTimer) -> None:
        forward, backward, self._step_s = self.draws.next()
        self.comm.bytes_sent = 0
        timer.start()
        begun = time.perf_counter()
        replay.sleep_until(begun + forward + backward)
        self.flat.copy_(self.grad)  # what backward would have left there
        timer.mark("compute")
        stepped = self.guard.check(it, self.flat, timer)
        if stepped:
            self._step(it, timer)
        self._losses.append(torch.tensor(NAN))
        self._record(it, timer, skipped=not stepped)

    def _optimizer_step(self) -> None:
        replay.sleep_until(time.perf_counter() + self._step_s)

    def _codec(self, compressor: Compressor) -> Compressor:
        if not self.spec.clock.codec_time or compressor.name == "none":
            return compressor
        times = _codec_times(self.spec.clock.codec_time)
        wrapped = replay_codec.ReplayedCodec(compressor, times, self.spec.clock, self.pacing)
        return cast(Compressor, wrapped)  # the scheme calls only what the wrapper passes on

    def _record(self, it: int, timer: PhaseTimer, skipped: bool = False) -> None:
        super()._record(it, timer, skipped)
        if self.spec.clock.codec_time:
            self.rows[-1]["codec_overrun"] = float(self.pacing.overruns)
            self.pacing.overruns = 0


@functools.cache
def _codec_times(path: str) -> CodecTimes:
    """One read of the file for all of a run's layer groups."""
    return CodecTimes.read(path)


class ReplayDDPRun(DDPRun):
    """DDP's loop without DDP: after the forward's time, each of DDP's buckets (its rebuilt
    assignment for this run's ``bucket_cap_mb``) goes to the run's hook at the instant its last
    gradient was ready in the timeline, in bucket order as DDP's reducer hands them over; the
    loop waits for every bucket at backward's end, as ``backward()`` does."""

    def __init__(self, spec: RunSpec, cm: comm.Comm, parts: Path) -> None:
        super().__init__(spec, cm)
        _own_gradient(self)
        self.grads = {n: p.grad.detach().clone() for n, p in self.named.items()
                      if p.grad is not None}  # fmt: skip
        self.timeline = replay.shared(self, parts)
        ready = {p.name: p.ready_s for p in self.timeline.params}
        cap = float(self.options["bucket_cap_mb"])
        self.buckets = [(names, max(ready[n] for n in names))
                        for names in replay.ddp_buckets(self.timeline, cap)]  # fmt: skip
        self.draws = replay.Draws(self.timeline, spec.measurement.seed, cm.rank)
        self._step_s = 0.0

    def _wrap(self) -> None:
        return None  # the hook is called by the loop below, not by DDP's reducer

    def iteration(self, it: int, timer: PhaseTimer) -> None:
        forward, backward, self._step_s = self.draws.next()
        stretch = backward / self.timeline.backward_s  # this backward's pace, every bucket
        self.comm.bytes_sent = 0
        self.state.reset()
        timer.start()
        replay.sleep_until(time.perf_counter() + forward)
        timer.mark("compute")
        forward_end = timer.last_mark
        begun = time.perf_counter()
        futures = []
        for i, (names, ready_s) in enumerate(self.buckets):
            replay.sleep_until(begun + ready_s * stretch)
            bucket = GradBucket(i, i == len(self.buckets) - 1, [self.named[n] for n in names],
                                [self.grads[n] for n in names])  # fmt: skip
            futures.append(finite_hook(self.finite, bucket))  # type: ignore[arg-type]
        replay.sleep_until(begun + backward)
        for f in futures:
            f.wait()
        timer.mark("comm")
        self._after_backward(it, timer, forward_end, torch.tensor(NAN))

    def _step(self) -> None:
        replay.sleep_until(time.perf_counter() + self._step_s)


class GradBucket:
    """What DDP's reducer hands a communication hook (the methods of
    ``torch.distributed.GradBucket`` that qbench's and torch's hooks call), holding copies of
    the replayed gradients in one flat buffer, as a bucket does."""

    def __init__(
        self, index: int, last: bool, params: list[nn.Parameter], grads: list[torch.Tensor]
    ) -> None:
        self._index, self._last, self._params = index, last, params
        self._buffer = torch.cat([g.reshape(-1) for g in grads])
        self._grads, pos = [], 0
        for g in grads:
            self._grads.append(self._buffer[pos : pos + g.numel()].view_as(g))
            pos += g.numel()

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer.copy_(tensor)

    def gradients(self) -> list[torch.Tensor]:
        return self._grads

    def parameters(self) -> list[nn.Parameter]:
        return self._params
