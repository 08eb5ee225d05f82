"""FSDP2's two collectives, timed, and qbench's codecs inside them.

FSDP2 (``fully_shard``) calls one all-gather per block before its forward (and again before
its backward when it resharded) and one reduce-scatter per block once backward has produced
the block's gradients; ``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``
replace them. Every FSDP run of qbench goes through these classes, so the plain and the
compressed runs are measured the same way:

* :class:`TimedAllGather` / :class:`TimedReduceScatter`: torch's own collectives in FSDP's
  dtypes (fp32, or the 16-bit ``reduce_dtype`` of the 16-bit baselines), asynchronous where
  FSDP asks for it, bytes counted with ``qbench.catalog.schemes.collectives``;
* :class:`CompressedReduceScatter` (ZeRO++'s qgZ, torchft's pattern): each rank encodes the K
  shards of its block gradient (shard j for rank j; error feedback per shard), one all-to-all,
  and each rank decodes the K payloads of its shard and sums them in fp32;
* :class:`CompressedAllGather` (ZeRO++'s qwZ): each rank encodes its parameter shard, one
  all-gather of the payloads, every rank decodes every shard (its own too, so that all ranks
  compute with the same weights) into FSDP's gathered buffer.

:class:`CommLog` keeps one iteration's account: per collective the spans from call to
completion (their union is the total communication time), the time the training thread was
held (in a synchronous call or in ``Work.wait``: the exposed time), the bytes this rank sent,
its encoded gradient's bytes and the codecs' time. Host clocks: on a GPU a stream-ordered call
holds the host for no time, so exposed time there is what the host waited, not the device
(as ``qbench.ddp.timeline`` says of DDP).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from qbench.catalog.schemes.collectives import all_gather_bytes, reduce_scatter_bytes
from qbench.comm.base import Comm
from qbench.compress.base import Compressor, all_finite, nonfinite_kind
from qbench.ddp.timeline import union_length

KINDS = ("all_gather", "reduce_scatter")
# torch 2.14 renamed them (the old names warn); older releases, e.g. a GPU image's, lack the new
_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
FIRST_STREAM = 2
"""Random streams of the codecs' draws: 0 and 1 are the flat schemes' (send, owner); block b
of FSDP draws from stream FIRST_STREAM + b, so no two blocks share draws."""


@dataclass
class CommLog:
    """One iteration's communication account, shared by a model's FSDP collectives."""

    step: int = 0
    spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    held: float = 0.0
    """Seconds the training thread spent in calls and waits: the exposed communication."""
    sent: dict[str, int] = field(default_factory=dict)
    payload_bytes: int = 0
    """Bytes of this rank's gradient as sent: its encoded shards (its own included), or the
    block gradients in FSDP's reduce dtype."""
    codec: float = 0.0
    found: tuple[str, str] | None = None
    """The first block gradient holding a NaN or inf this step (zeroed before it was sent)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def begin(self, step: int) -> None:
        with self._lock:
            self.step, self.held, self.payload_bytes, self.codec = step, 0.0, 0, 0.0
            self.spans = {k: [] for k in KINDS}
            self.sent = dict.fromkeys(KINDS, 0)
            self.found = None

    def span(self, kind: str, start: float, end: float) -> None:
        with self._lock:
            self.spans.setdefault(kind, []).append((start, end))

    def total(self, kind: str | None = None) -> float:
        """Seconds with at least one collective (of ``kind``) in flight, overlaps once."""
        with self._lock:
            kinds = KINDS if kind is None else (kind,)
            spans = [s for k in kinds for s in self.spans.get(k, [])]
        return union_length(spans)

    def bytes_sent(self, kind: str | None = None) -> int:
        return sum(n for k, n in self.sent.items() if kind is None or k == kind)

    def check(self, grads: torch.Tensor, block: str) -> None:
        """Zero a block gradient holding a NaN or inf before it is sent (as DDP's buckets are,
        ``qbench.ddp.finite``): the run's ``nonfinite`` policy then fails or skips the step."""
        if not all_finite(grads):
            if self.found is None:
                self.found = (block, nonfinite_kind(grads))
            grads.zero_()


class _Allocate:
    """FSDP asks each collective for its buffers; plain tensors, as torch's default does."""

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class _Timed(_Allocate):
    """Time a collective from its call to its completion; the training thread is held for the
    call and for any ``wait`` on the work it returns."""

    def __init__(self, log: CommLog, kind: str) -> None:
        self.log, self.kind = log, kind

    def _finish(self, work: dist.Work, start: float, async_op: bool) -> dist.Work | None:
        log, kind = self.log, self.kind
        timed = _on_completion(work, lambda: log.span(kind, start, time.perf_counter()))
        span = None if timed else (kind, start)  # else its end is when the wait returns
        if async_op:
            log.held += time.perf_counter() - start
            return _HeldWork(work, log, span)
        work.wait()  # on a GPU this orders FSDP's stream after the collective: no host wait
        end = time.perf_counter()
        log.held += end - start
        if span:
            log.span(kind, start, end)
        return None


def _on_completion(work: dist.Work, note: Any) -> bool:
    """Call ``note`` when the collective completes; False where the backend's work has no
    future (gloo's reduce-scatter), so the caller takes the end of its wait instead."""
    try:
        future = work.get_future()
    except RuntimeError:
        return False
    future.add_done_callback(lambda _: note())
    return True


class _HeldWork(dist.Work):
    """The work FSDP waits on later, its wait charged to the exposed communication."""

    def __init__(self, inner: dist.Work, log: CommLog, span: tuple[str, float] | None) -> None:
        super().__init__()
        self.inner, self.log, self.span = inner, log, span

    def wait(self, timeout: Any = None) -> bool:
        start = time.perf_counter()
        done = self.inner.wait() if timeout is None else self.inner.wait(timeout)
        end = time.perf_counter()
        self.log.held += end - start
        if self.span:
            self.log.span(self.span[0], self.span[1], end)
            self.span = None
        return bool(done)

    def is_completed(self) -> bool:
        return bool(self.inner.is_completed())

    def get_future(self) -> torch.futures.Future[Any]:
        return self.inner.get_future()


class TimedAllGather(_Timed, AllGather):
    def __init__(self, log: CommLog) -> None:
        super().__init__(log, "all_gather")

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
        group: dist.ProcessGroup, async_op: bool = False,
    ) -> dist.Work | None:  # fmt: skip
        start = time.perf_counter()
        k = group.size()
        self.log.sent[self.kind] += all_gather_bytes(_nbytes(input_tensor), k)
        work = _GATHER(output_tensor, input_tensor, group=group, async_op=True)
        assert work is not None
        return self._finish(work, start, async_op)


class TimedReduceScatter(_Timed, ReduceScatter):
    def __init__(self, log: CommLog, block: str) -> None:
        super().__init__(log, "reduce_scatter")
        self.block = block

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
        group: dist.ProcessGroup, op: Any, async_op: bool = False,
    ) -> dist.Work | None:  # fmt: skip
        start = time.perf_counter()
        self.log.check(input_tensor, self.block)
        self.log.payload_bytes += _nbytes(input_tensor)  # the gradient in FSDP's reduce dtype
        self.log.sent[self.kind] += reduce_scatter_bytes(_nbytes(input_tensor), group.size())
        work = _SCATTER(output_tensor, input_tensor, op=op, group=group, async_op=True)
        assert work is not None
        return self._finish(work, start, async_op)


class CompressedReduceScatter(_Allocate, ReduceScatter):
    """qgZ: shards encoded, one all-to-all, each rank decodes its shard's K payloads and sums
    them in fp32. ``block``: the block's index (its random stream and error-feedback slots)."""

    def __init__(self, log: CommLog, comm: Comm, codec: Compressor, block: int) -> None:
        self.log, self.comm, self.codec, self.block = log, comm, codec, block
        self._acc: torch.Tensor | None = None

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
        group: dist.ProcessGroup, op: Any, async_op: bool = False,
    ) -> dist.Work | None:  # fmt: skip
        start = time.perf_counter()
        k, n = _sizes(group, self.comm, input_tensor, output_tensor)
        self.log.check(input_tensor, f"block {self.block}")
        shards = input_tensor.float().view(k, n)
        t0 = time.perf_counter()
        sends = [self._encode(shards[j], j, n) for j in range(k)]
        self.log.codec += time.perf_counter() - t0
        received, sizes = self._exchange(sends)
        t0 = time.perf_counter()
        acc = self._sum(received, sizes, n)
        self.log.codec += time.perf_counter() - t0
        output_tensor.copy_(acc.div_(k) if _averages(op) else acc)
        end = time.perf_counter()
        self.log.span("reduce_scatter", start, end)
        self.log.held += end - start
        return None

    def _encode(self, shard: torch.Tensor, j: int, n: int) -> torch.Tensor:
        payload = self.codec.encode(
            shard.contiguous(), step=self.log.step, rank=self.comm.rank,
            stream=FIRST_STREAM + self.block, offset=j * n, name=f"rs{self.block}.{j}",
        )  # fmt: skip
        self.log.payload_bytes += payload.nbytes
        return payload.to_wire()

    def _exchange(self, sends: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        counts = [w.numel() for w in sends]
        k, rank = self.comm.world_size, self.comm.rank
        # every shard has n values: a fixed-size codec's payloads are all alike
        fixed = self.codec.fixed_size
        recv = [counts[rank]] * k if fixed else self.comm.alltoall_sizes(counts, sends[0].device)
        before = self.comm.bytes_sent
        got = self.comm.alltoallv(torch.cat(sends), counts, recv)
        self.log.sent["reduce_scatter"] += self.comm.bytes_sent - before
        return got, recv

    def _sum(self, received: torch.Tensor, sizes: list[int], n: int) -> torch.Tensor:
        # One accumulator per block, reused: a fresh large buffer costs page faults every step.
        if self._acc is None or self._acc.numel() != n or self._acc.device != received.device:
            self._acc = torch.empty(n, dtype=torch.float32, device=received.device)
        acc = self._acc.zero_()
        pos = 0
        for size in sizes:
            self.codec.decode(self.codec.from_wire(received[pos : pos + size], n), out=acc)
            pos += size
        return acc


class CompressedAllGather(_Allocate, AllGather):
    """qwZ: each rank's parameter shard encoded once, the payloads all-gathered, every shard
    decoded on every rank (its own too) into FSDP's gathered buffer."""

    def __init__(self, log: CommLog, comm: Comm, codec: Compressor, block: int) -> None:
        self.log, self.comm, self.codec, self.block = log, comm, codec, block

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
        group: dist.ProcessGroup, async_op: bool = False,
    ) -> dist.Work | None:  # fmt: skip
        start = time.perf_counter()
        k, n = _sizes(group, self.comm, output_tensor, input_tensor)
        if not input_tensor.is_floating_point():
            raise ValueError(
                f"all_gather codec: block {self.block} gathers {input_tensor.dtype} (parameters "
                "of several dtypes in one block); give the block one floating dtype"
            )
        t0 = time.perf_counter()
        own = self.codec.encode(
            input_tensor.float(), step=self.log.step, rank=self.comm.rank,
            stream=FIRST_STREAM + self.block, offset=self.comm.rank * n,
            name=f"ag{self.block}",
        ).to_wire()  # fmt: skip
        self.log.codec += time.perf_counter() - t0
        n_own, fixed = own.numel(), self.codec.fixed_size
        sizes = [n_own] * k if fixed else self.comm.allgather_sizes(n_own, own.device)
        before = self.comm.bytes_sent
        gathered = self.comm.allgatherv(own, sizes)
        self.log.sent["all_gather"] += self.comm.bytes_sent - before
        t0 = time.perf_counter()
        self._decode_all(gathered, sizes, output_tensor.view(k, n))
        self.log.codec += time.perf_counter() - t0
        end = time.perf_counter()
        self.log.span("all_gather", start, end)
        self.log.held += end - start
        return None

    def _decode_all(self, gathered: torch.Tensor, sizes: list[int], out: torch.Tensor) -> None:
        pos, n = 0, out.shape[1]
        for j, size in enumerate(sizes):
            values = self.codec.decode(self.codec.from_wire(gathered[pos : pos + size], n))
            out[j].copy_(values)
            pos += size


def _sizes(
    group: dist.ProcessGroup, comm: Comm, whole: torch.Tensor, shard: torch.Tensor
) -> tuple[int, int]:
    """(K, values per shard); FSDP's group must be the communicator's ranks."""
    k = group.size()
    if k != comm.world_size or whole.numel() != k * shard.numel():
        raise ValueError(
            f"FSDP collective over {k} ranks ({whole.numel()} values, shard {shard.numel()}); "
            f"qbench's communicator has {comm.world_size}: shard over the default group"
        )
    return k, shard.numel()


def _averages(op: Any) -> bool:
    """FSDP asks for the mean (AVG) of fp32 and bf16 gradients, else a SUM it divides itself."""
    if op == dist.ReduceOp.AVG:
        return True
    if op == dist.ReduceOp.SUM:
        return False
    raise ValueError(f"compressed reduce-scatter sums or averages; FSDP asked for {op}")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
