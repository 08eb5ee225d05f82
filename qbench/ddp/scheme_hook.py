"""qbench's compressors as a DDP communication hook: each bucket through a flat scheme's exchange.

DDP hands a bucket to the hook as soon as backward has computed its last gradient. The hook
queues it for a communication thread (the CPU stand-in for a CUDA communication stream) and
returns a future at once, so backward goes on computing earlier layers meanwhile. The thread
takes buckets in the order DDP hands them over (the same on every rank, which keeps the
collectives matched) and runs, on each segment of the bucket, exactly the code of the flat
scheme (``qbench.aggregate``: reduce-broadcast, allgather or integer-allreduce): encode, the
collectives, decode of the mean into the bucket. Then it completes the future, and DDP copies the
bucket back into the gradients. So payloads, wire bytes, error feedback and unbiasedness are the
flat scheme's, per bucket.

Segments: the tensors of a bucket that share a compressor under the layer policy (seed 002
sends small tensors in fp32, ``qbench.spec.layers``) are exchanged together, gathered into one
vector when they are not adjacent; each segment keeps its own aggregator, and with it its own
error-feedback residuals, for as long as DDP keeps the bucket (DDP rebuilds its buckets once,
after the first iteration, in gradient-ready order; the aggregators are then built anew for
the new buckets). A segment keeps the size of each of its tensors, so per-tensor compressors
(top-k, adaptive, ...) encode every tensor on its own, as the flat schemes do.

Random draws are keyed by the bucket's offset in the hand-over order, so no two buckets of a
step share draws.

The thread's lifetime: it starts with the first bucket and stops, after the bucket it is
exchanging, on :meth:`SchemeHookState.close`, when the state is garbage collected (DDP drops
its hook state with the model) and at interpreter exit. Stopping fails the buckets still queued
instead of exchanging them (no collective starts during teardown) and waits at most
``JOIN_TIMEOUT_S`` for the one in flight. The thread is a daemon all the same: Python joins
non-daemon threads before the exit hooks run, so a user who never closes the state would hang
at exit.

At exit there is one more wait (:func:`_at_exit`, at most ``EXIT_GRACE_S``). A finished gloo
collective is released by gloo's own worker thread, and releasing it drops the Python objects it
holds (its tensors), for which that thread must take the GIL. When the main thread has already
begun finalizing the interpreter, taking the GIL ends the thread inside a C++ frame, which
aborts the process ("terminate called without an active exception", SIGABRT, after training
had finished; pytorch/pytorch#190489). A script's last collectives complete just before it
exits, so the race is common, with or without qbench (docs/ddp.md has the measurements). The
exit hook releases the GIL for a moment, so that gloo's threads finish while the interpreter is
alive.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from qbench import aggregate
from qbench.comm.base import Comm
from qbench.compress import from_spec
from qbench.ddp.timeline import BucketTimeline
from qbench.timing import PhaseTimer

JOIN_TIMEOUT_S = 10.0
"""How long stopping waits for the bucket in flight. A normal end finds the thread idle (DDP has
waited for every bucket in backward), so this bounds only teardown after a failure, where a
peer may never answer: exit must not wait for gloo's own 30-minute timeout."""

EXIT_GRACE_S = 0.2
"""How long the exit hook hands the GIL to torch's communication threads (module docstring).
Paid once per process that exchanged a bucket, and only at exit."""

SpecFor = Callable[[torch.Tensor], dict[str, Any]]
"""The compressor spec (``{name: ..., ...}``) for one parameter of a bucket."""


@dataclass(frozen=True)
class Segment:
    """The tensors of a bucket that share a compressor: buffer ranges, exchanged as one."""

    ranges: tuple[tuple[int, int], ...]
    spec: dict[str, Any]
    sizes: tuple[int, ...] = ()
    """Element count of each tensor, in exchange order (per-tensor compressors encode each on
    its own; adjacent ranges are merged, tensors are not)."""

    @property
    def numel(self) -> int:
        return sum(b - a for a, b in self.ranges)

    def gather(self, buffer: torch.Tensor) -> torch.Tensor:
        """The segment's values as one vector (a view when they are contiguous)."""
        if len(self.ranges) == 1:
            a, b = self.ranges[0]
            return buffer[a:b]
        return torch.cat([buffer[a:b] for a, b in self.ranges])

    def scatter(self, values: torch.Tensor, buffer: torch.Tensor) -> None:
        pos = 0
        for a, b in self.ranges:
            view = buffer[a:b]
            if values.data_ptr() + pos * values.element_size() != view.data_ptr():
                view.copy_(values[pos : pos + b - a])
            pos += b - a


def segments(params: list[torch.Tensor], spec_for: SpecFor) -> list[Segment]:
    """The bucket's tensors grouped by compressor, in order of first appearance. DDP orders a
    bucket by when gradients become ready, so weights and biases alternate; exchanging each
    run of equal specs separately would multiply the messages, so each group is gathered into
    one vector, as the flat schemes lay out one slice per group."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    specs: dict[str, dict[str, Any]] = {}
    sizes: dict[str, list[int]] = {}
    pos = 0
    for p in params:
        spec = spec_for(p)
        key = repr(sorted(spec.items()))
        specs[key] = spec
        sizes.setdefault(key, []).append(p.numel())
        group = ranges.setdefault(key, [])
        if group and group[-1][1] == pos:
            group[-1] = (group[-1][0], pos + p.numel())
        else:
            group.append((pos, pos + p.numel()))
        pos += p.numel()
    return [Segment(tuple(r), specs[k], tuple(sizes[k])) for k, r in ranges.items()]


@dataclass
class _Job:
    index: int
    buffer: torch.Tensor
    plan: list[tuple[Segment, aggregate.Aggregator]]
    step: int
    future: torch.futures.Future[torch.Tensor]
    ready_event: Any = None  # torch.cuda.Event on GPU: the bucket is complete on the device


@dataclass
class SchemeHookState:
    """State handed to DDP with :func:`scheme_hook` (see the module docstring)."""

    scheme: str
    comm: Comm
    seed: int
    spec_for: SpecFor
    scheme_params: dict[str, Any] = field(default_factory=dict)
    timeline: BucketTimeline = field(default_factory=BucketTimeline)
    step: int = 0
    payload_bytes: int = 0
    level_bytes: dict[str, float] = field(default_factory=dict)
    """Per-iteration metrics the buckets' aggregators offer, summed (hierarchical's bytes per
    level)."""
    grad_bytes: int = 0
    t_encode: float = 0.0
    t_decode: float = 0.0
    _plans: dict[tuple[int, ...], list[tuple[Segment, aggregate.Aggregator]]] = field(
        default_factory=dict, repr=False
    )
    _offset: int = 0
    _jobs: queue.Queue[_Job | None] = field(default_factory=queue.Queue, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _stopper: weakref.finalize[..., SchemeHookState] | None = field(default=None, repr=False)

    _sent_at_reset: int = 0

    def reset(self) -> None:
        """Start a new iteration's measurements (also done when bucket 0 of a step arrives)."""
        self.timeline.reset()
        self.payload_bytes = self.grad_bytes = 0
        self.t_encode = self.t_decode = 0.0
        self.level_bytes = {}
        self._sent_at_reset = self.comm.bytes_sent

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank put on the wire since the step began (qbench.comm.base)."""
        return self.comm.bytes_sent - self._sent_at_reset

    def close(self) -> None:
        """Stop the communication thread (module docstring). Optional: it also stops when the
        state is collected and at exit; a later bucket starts a new one."""
        if self._stopper is not None:
            self._stopper()
        self._thread = self._stopper = None

    def submit(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        if bucket.index() == 0:  # a new step: the counters hold the last step's until now
            self._offset = 0
            self.reset()
        job = _Job(bucket.index(), buffer, self._plan(bucket), self.step, torch.futures.Future())
        if buffer.is_cuda:
            job.ready_event = torch.cuda.Event()
            job.ready_event.record()
        self.timeline.hand_over(job.index, buffer.numel())
        self.grad_bytes += 4 * buffer.numel()
        if bucket.is_last():
            self.step += 1
        self._start()
        self._jobs.put(job)
        return job.future

    def _plan(self, bucket: dist.GradBucket) -> list[tuple[Segment, aggregate.Aggregator]]:
        params = list(bucket.parameters())
        key = (bucket.index(), *(id(p) for p in params))
        if key not in self._plans:
            self._plans[key] = [(s, self._aggregator(s)) for s in segments(params, self.spec_for)]
        self._offset += bucket.buffer().numel()
        return self._plans[key]

    def _aggregator(self, seg: Segment) -> aggregate.Aggregator:
        compressor = from_spec(seg.spec, seed=self.seed)
        return aggregate.build(
            self.scheme, self.comm, compressor, seg.numel,
            offset=self._offset + seg.ranges[0][0], params=self.scheme_params,
            tensors=seg.sizes or None,
        )  # fmt: skip

    def _start(self) -> None:
        if self._thread is None:
            # The thread holds only a weak reference, so the state can be collected.
            self._thread = threading.Thread(
                target=_serve, args=(self._jobs, weakref.ref(self)), name="qbench-ddp-comm",
                daemon=True,
            )  # fmt: skip
            self._thread.start()
            self._stopper = weakref.finalize(self, _stop, self._jobs, self._thread)
            _LIVE[id(self)] = self
            _STARTED.set()

    def _exchange(self, job: _Job, stream: Any) -> Any:
        """Run one bucket through the scheme; returns the CUDA stream to reuse (None on CPU)."""
        if job.ready_event is not None:
            stream = stream or torch.cuda.Stream(device=job.buffer.device)
            with torch.cuda.stream(stream):
                stream.wait_event(job.ready_event)
                self._run(job)
            stream.synchronize()  # the mean is in the bucket before DDP reads it
        else:
            self._run(job)
        self.timeline.done(job.index)
        return stream

    def _run(self, job: _Job) -> None:
        timer = PhaseTimer(job.buffer.device)
        timer.start()
        for seg, agg in job.plan:
            mean = agg.aggregate(seg.gather(job.buffer), job.step, timer)
            seg.scatter(mean, job.buffer)
            self.payload_bytes += agg.payload_bytes
            for k, v in agg.metrics().items():  # hierarchical: bytes per level, summed
                self.level_bytes[k] = self.level_bytes.get(k, 0.0) + v
            self.timeline.add_payload(job.index, agg.payload_bytes)
        self.t_encode += timer.totals["encode"]
        self.t_decode += timer.totals["decode"]


def _serve(jobs: queue.Queue[_Job | None], state_ref: weakref.ref[SchemeHookState]) -> None:
    """The communication thread: buckets in hand-over order until the sentinel ``None``."""
    stream = None
    while (job := jobs.get()) is not None:
        state = state_ref()
        try:
            if state is None:
                raise RuntimeError(_CLOSED)
            stream = state._exchange(job, stream)
            job.future.set_result(job.buffer)
        except BaseException as e:  # the training loop re-raises it from DDP's wait
            job.future.set_exception(e)  # type: ignore[arg-type]  # torch's stub
        del state, job  # hold neither while waiting, or the state could never be collected


_CLOSED = "qbench DDP hook closed: the bucket was not exchanged"


def _stop(jobs: queue.Queue[_Job | None], thread: threading.Thread) -> None:
    """Fail the queued buckets, stop the thread after the bucket in flight and wait for it,
    at most ``JOIN_TIMEOUT_S`` (module docstring)."""
    while True:
        try:
            job = jobs.get_nowait()
        except queue.Empty:
            break
        if job is not None:
            job.future.set_exception(RuntimeError(_CLOSED))  # type: ignore[arg-type]
    jobs.put(None)
    if thread is threading.current_thread():  # the thread dropped the last reference itself
        return
    thread.join(JOIN_TIMEOUT_S)
    if thread.is_alive():
        warnings.warn(
            f"qbench DDP hook: the communication thread was still exchanging a bucket after "
            f"{JOIN_TIMEOUT_S:g} s; going on without it",
            RuntimeWarning,
            stacklevel=1,
        )


_LIVE: weakref.WeakValueDictionary[int, SchemeHookState] = weakref.WeakValueDictionary()
"""Every state whose thread started, by ``id`` (a dataclass is not hashable): what the exit
hook stops."""
_STARTED = threading.Event()
"""Set once a hook thread has started in this process."""


def _at_exit() -> None:
    """Stop every live state's thread, then, if any hook thread ever ran in this process (its
    state may be gone, its last collectives not), let torch's communication threads take the
    GIL while the interpreter is still alive (module docstring)."""
    for state in list(_LIVE.values()):
        state.close()
    if _STARTED.is_set():
        time.sleep(EXIT_GRACE_S)  # sleeping releases the GIL to gloo's worker threads


atexit.register(_at_exit)


def scheme_hook(
    state: SchemeHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket through ``state.scheme``'s exchange (module doc)."""
    return state.submit(bucket)


# DDP checks a hook's annotations as objects; `from __future__ import annotations` made them
# strings, so give DDP the real ones.
scheme_hook.__annotations__.update(
    {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
)
