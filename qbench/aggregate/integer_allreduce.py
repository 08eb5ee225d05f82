"""Integer allreduce of codes on shared scales (beyond the papers): one collective, no decode /
re-encode in the middle. QSGD's levels as below; FP8 with blocks, MX and NVFP4 the same way with
their values in units of the format's smallest value (``qbench.compress.integer_sum``, which
holds each codec's integer view).

Per step, for QSGD with L = 2^(bits-1) - 1 and the compressor's ``bits`` and ``bucket_size``:

1. every rank computes the max |x| of each bucket of its gradient (encode) and the ranks agree on
   the per-bucket scale s = max over ranks with one small float32 MAX allreduce (comm);
2. each value becomes a signed integer q in [-L, L] by unbiased stochastic rounding of x L / s,
   drawn from qbench.compress.rng keyed by (seed, step, rank, stream 0) and the global element
   index, as qsgd does (encode);
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

from collections.abc import Sequence

import torch

from qbench.aggregate.base import Aggregator, split_ranges
from qbench.catalog.schemes import integer_sum_bytes
from qbench.comm import Comm
from qbench.comm.base import Pending
from qbench.compress import Compressor, Key, integer_sum
from qbench.compress.none import NoCompression
from qbench.timing import PhaseTimer

# Integer dtypes each backend can SUM, narrowest first. Gloo rejects int16 ("Invalid scalar
# type") and NCCL has no 16-bit integer type; MPI (MPI_SHORT) sums all three.
_DTYPES = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def sum_dtype(world_size: int, top: int, backend: str) -> torch.dtype:
    """Narrowest integer dtype the backend sums in which K values in [-top, top] cannot overflow
    (widths per backend: qbench.catalog.schemes.INTEGER_SUM_BYTES)."""
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
        k = self.comm.world_size
        if self.fp32:
            self.comm.allreduce_(grad)
            timer.mark("comm")
            grad.div_(k)
            timer.mark("decode")
            return grad
        key = Key(seed=self.compressor.seed, step=step, rank=self.comm.rank, stream=0)
        if self.overlapped and self.view.blockwise:
            self._pipelined(grad, key)
            timer.mark("comm")  # interleaved phases: the worker keeps only the iteration time
            return grad
        stats = self.view.local_scales(grad)
        timer.mark("encode")
        self.comm.allreduce_(stats, op="max")
        timer.mark("comm")
        scales = self.view.share(stats)
        if not self.overlapped:
            q = self._quantize(grad, scales, key, 0)
            timer.mark("encode")
            self.comm.allreduce_(q)
            timer.mark("comm")
            self._dequantize(q, scales, grad, 0)
            timer.mark("decode")
            return grad
        in_flight: list[tuple[int, torch.Tensor, Pending]] = []
        chunks: list[tuple[int, int] | None] = [*self.chunks, None]
        for chunk in chunks:
            if chunk is not None:
                start, end = chunk
                q = self._quantize(grad[start:end], scales, key, start)
                in_flight.append((start, grad[start:end], self.comm.iallreduce_(q)))
            if len(in_flight) > 1 or (chunk is None and in_flight):
                at, out, pending = in_flight.pop(0)
                self._dequantize(pending.wait(), scales, out, at)
        timer.mark("comm")  # interleaved phases: the worker keeps only the iteration time
        return grad

    def _pipelined(self, grad: torch.Tensor, key: Key) -> None:
        """Blockwise scales: chunk c+1's MAX is issued before chunk c's integers, so it has
        arrived by the time chunk c-1's sum has (every rank issues in the same order)."""
        k = self.comm.world_size

        def agree(i: int) -> Pending:
            a, b = self.chunks[i]
            return self.comm.iallreduce_(self.view.local_scales(grad[a:b]), op="max")

        pending_stats = agree(0)
        in_flight: list[tuple[torch.Tensor, torch.Tensor, Pending]] = []
        for i, (a, b) in enumerate(self.chunks):
            scales = self.view.share(pending_stats.wait())
            if i + 1 < len(self.chunks):
                pending_stats = agree(i + 1)
            q = self.view.encode(grad[a:b], scales, key, self.offset + a, self.dtype)
            in_flight.append((scales, grad[a:b], self.comm.iallreduce_(q)))
            if len(in_flight) > 1:
                s, out, pending = in_flight.pop(0)
                self.view.decode(pending.wait(), s, k, out)
        s, out, pending = in_flight.pop()
        self.view.decode(pending.wait(), s, k, out)

    def _blocks_of(self, scales: torch.Tensor, at: int, numel: int) -> torch.Tensor:
        """The scales of the blocks of ``numel`` values from element ``at`` (block-aligned)."""
        first = at // self.block
        return scales[first : first - (-numel // self.block)]

    def _quantize(self, x: torch.Tensor, scales: torch.Tensor, key: Key, at: int) -> torch.Tensor:
        """Integers of ``x``, the part of the slice starting at element ``at`` (block-aligned)."""
        s = self._blocks_of(scales, at, x.numel())
        return self.view.encode(x, s, key, self.offset + at, self.dtype)

    def _dequantize(
        self, q: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, at: int
    ) -> None:
        s = self._blocks_of(scales, at, q.numel())
        self.view.decode(q, s, self.comm.world_size, out)
