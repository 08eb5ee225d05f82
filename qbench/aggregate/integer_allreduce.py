"""Integer allreduce of codes on shared scales (beyond the papers): one collective, no decode /
re-encode in the middle. QSGD's levels as below; FP8 with blocks, MX and NVFP4 the same way with
their values in units of the format's smallest value (``qbench.compress.integer_sum``, which
holds each codec's integer view).

Per step, for QSGD with L = 2^(bits-1) - 1 and the compressor's ``bits`` and ``bucket_size``:

1. every rank computes the max |x| of each bucket of its gradient (encode) and the ranks agree on
   the per-bucket scale s = max over ranks with one small float32 MAX allreduce (comm);
2. each value becomes a signed integer q in [-L, L] by unbiased stochastic rounding of x L / s,
   drawn from qbench.compress.kernels.rng keyed by (seed, step, rank, stream 0) and the global
   element index, as qsgd does (encode);
3. ONE allreduce sums the integers (comm) on the narrowest integer dtype that cannot overflow:
   |sum| <= K L (see ``sum_dtype``);
4. value = s * (sum / (K L)) (decode): E[value] = mean of x over ranks, and K ranks at +-s give
   exactly +-s.

Byte accounting is honest: the integers travel as int8 / int16 / int32 values, so e.g. bits 4
still costs a byte per value (the sum needs headroom that packed 4-bit codes do not have);
``payload_bytes`` = the integer buffer plus the float32 scales. The qsgd ``layout`` is a wire
format and does not apply (levels are symmetric integers); ``norm`` must be max (the matrix
excludes l2, whose scale could not bound the sum), and bits >= 2 (bits 1 leaves no magnitude
level). Groups the layer policy keeps in full precision (compressor none) take a plain fp32
allreduce.

``overlap: C`` (C > 1) splits the gradient into C bucket-aligned chunks and pipelines them:
chunk c+1 is quantized while chunk c's integer allreduce is in flight, and chunk c is
dequantized while chunk c+1's is. Where a block's scale depends on that block alone (QSGD, FP8
blocks, MX: ``IntegerSum.blockwise``), each chunk's scales are agreed on in the pipeline too,
the MAX of chunk c+1's statistics issued ahead of chunk c's integers, so only the first chunk's
statistics wait on the link; NVFP4's tensor scale needs every block first, so it agrees on all
scales before the first chunk. The integers are the same as without overlap (same draws, same
scales); only the phases interleave, so the run is recorded in mode ``overlap`` (iteration time
only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from qbench.aggregate.allreduce import fp32_mean
from qbench.aggregate.base import Aggregator, split_ranges
from qbench.catalog.schemes.traffic import integer_sum_bytes
from qbench.comm.base import Comm, Pending
from qbench.compress import Compressor, Key, integer_sum
from qbench.compress.none import NoCompression
from qbench.timing import PhaseTimer

# Integer dtypes each backend can SUM, narrowest first. Gloo rejects int16 ("Invalid scalar
# type") and NCCL has no 16-bit integer type; MPI (MPI_SHORT) sums all three.
_DTYPES = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def sum_dtype(world_size: int, top: int, backend: str) -> torch.dtype:
    """Narrowest integer dtype the backend sums in which K values in [-top, top] cannot overflow
    (widths per backend: qbench.catalog.schemes.traffic.INTEGER_SUM_BYTES)."""
    width = integer_sum_bytes(backend, world_size, top)
    if width is None:
        raise ValueError(
            f"integer-allreduce: {world_size} ranks x level {top} = {world_size * top} "
            "overflows int32; use fewer qsgd bits"
        )
    return _DTYPES[width]


class IntegerAllReduce(Aggregator):
    name = "integer-allreduce"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, overlap: int = 1,
        *, tensors: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        self.fp32 = isinstance(compressor, NoCompression)
        if self.fp32:
            return
        view = integer_sum.for_compressor(compressor)
        if view is None:
            why = compressor.spec.entry.integer_levels(compressor.spec.params)
            raise ValueError(f"integer-allreduce cannot sum {compressor.label}: {why}")
        self.view = view
        self.block = view.block
        self.dtype = sum_dtype(comm.world_size, view.top, comm.backend)
        nblocks = -(-numel // self.block)
        self.payload_bytes = numel * torch.empty(0, dtype=self.dtype).element_size() + 4 * nblocks
        self.chunks = [(a, b) for a, b in split_ranges(numel, overlap, self.block) if b > a] or [
            (0, numel)
        ]
        self.overlapped = len(self.chunks) > 1

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        if self.fp32:
            return fp32_mean(self.comm, grad, timer)
        key = Key(seed=self.compressor.seed, step=step, rank=self.comm.rank, stream=0)
        if self.overlapped and self.view.blockwise:
            self._pipelined(grad, key, None)
            timer.mark("comm")  # interleaved phases: the worker keeps only the iteration time
            return grad
        stats = self.view.local_scales(grad)
        timer.mark("encode")
        self.comm.allreduce_(stats, op="max")
        timer.mark("comm")
        scales = self.view.share(stats)
        if self.overlapped:
            self._pipelined(grad, key, scales)
            timer.mark("comm")
            return grad
        q = self.view.encode(grad, scales, key, self.offset, self.dtype)
        timer.mark("encode")
        self.comm.allreduce_(q)
        timer.mark("comm")
        self.view.decode(q, scales, self.comm.world_size, grad)
        timer.mark("decode")
        return grad

    def _pipelined(self, grad: torch.Tensor, key: Key, shared: torch.Tensor | None) -> None:
        """Two chunks in flight: chunk c+1 is quantized while chunk c is summed, and chunk c
        dequantized while chunk c+1 is. A chunk's scales: its blocks of ``shared`` (agreed on
        for the whole gradient first), or, for blockwise views (``shared`` None), its own MAX,
        issued before the previous chunk's integers so that it has arrived by the time the
        chunk before that has been summed (every rank issues in the same order)."""

        def scales_of(i: int) -> Callable[[], torch.Tensor]:
            a, b = self.chunks[i]
            if shared is not None:
                first = a // self.block
                mine = shared[first : first - (-(b - a) // self.block)]
                return lambda: mine
            pending = self.comm.iallreduce_(self.view.local_scales(grad[a:b]), op="max")
            return lambda: self.view.share(pending.wait())

        def finish(scales: torch.Tensor, out: torch.Tensor, pending: Pending) -> None:
            self.view.decode(pending.wait(), scales, self.comm.world_size, out)

        next_scales = scales_of(0)
        in_flight: list[tuple[torch.Tensor, torch.Tensor, Pending]] = []
        for i, (a, b) in enumerate(self.chunks):
            scales = next_scales()
            if i + 1 < len(self.chunks):
                next_scales = scales_of(i + 1)
            q = self.view.encode(grad[a:b], scales, key, self.offset + a, self.dtype)
            in_flight.append((scales, grad[a:b], self.comm.iallreduce_(q)))
            if len(in_flight) > 1:
                finish(*in_flight.pop(0))
        finish(*in_flight.pop())
