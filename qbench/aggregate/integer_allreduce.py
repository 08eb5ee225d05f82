"""Integer allreduce of QSGD levels on shared scales (beyond the papers): one collective, no
decode / re-encode in the middle.

Per step, with L = 2^(bits-1) - 1 and the qsgd compressor's ``bits`` and ``bucket_size``:

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

``overlap: C`` (C > 1) splits the gradient into C bucket-aligned chunks after the scale
agreement and pipelines them: chunk c+1 is quantized while chunk c's integer allreduce is in
flight, and chunk c is dequantized while chunk c+1's is. The integers are the same as without
overlap (same draws, same scales); only the phases interleave, so the run is recorded in mode
``overlap`` (iteration time only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from qbench.aggregate.base import Aggregator, split_ranges
from qbench.catalog.schemes import integer_sum_bytes
from qbench.comm import Comm
from qbench.comm.base import Pending
from qbench.compress import Compressor, Key, native
from qbench.compress._buckets import buckets as _buckets
from qbench.compress.draws import uniform
from qbench.compress.none import NoCompression
from qbench.compress.qsgd import QSGD
from qbench.compress.rng import MASK32, key_hash
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
        if (
            not isinstance(compressor, QSGD) or compressor.bits < 2 or compressor.norm != "max"
            or compressor.align != "contiguous"
        ):  # fmt: skip
            raise ValueError(
                "integer-allreduce needs qsgd with bits >= 2, norm max and align contiguous, "
                f"got {compressor.label}"
            )
        self.top = (1 << (compressor.bits - 1)) - 1
        self.bucket_size = compressor.bucket_size
        self.dtype = sum_dtype(comm.world_size, self.top, comm.backend)
        nbuckets = -(-numel // self.bucket_size)
        self.payload_bytes = numel * torch.empty(0, dtype=self.dtype).element_size() + 4 * nbuckets
        self.chunks = [
            (a, b) for a, b in split_ranges(numel, overlap, self.bucket_size) if b > a
        ] or [(0, numel)]
        self.overlapped = len(self.chunks) > 1

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        k = self.comm.world_size
        if self.fp32:
            self.comm.allreduce_(grad)
            timer.mark("comm")
            grad.div_(k)
            timer.mark("decode")
            return grad
        scales = self._scales(grad)
        timer.mark("encode")
        self.comm.allreduce_(scales, op="max")
        timer.mark("comm")
        key = Key(seed=self.compressor.seed, step=step, rank=self.comm.rank, stream=0)
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

    def _scales(self, grad: torch.Tensor) -> torch.Tensor:
        """max |x| per bucket: one C pass on CPU, torch elsewhere (same values)."""
        lib = native.int_kernels() if grad.device.type == "cpu" else None
        if lib is None:
            return _buckets(grad, self.bucket_size).abs().amax(dim=1)
        x = grad.contiguous()
        out = torch.empty(-(-x.numel() // self.bucket_size))
        rc = lib.qb_bucket_absmax(x.data_ptr(), x.numel(), self.bucket_size, out.data_ptr())
        if rc != 0:
            raise RuntimeError(f"qb_bucket_absmax failed ({rc})")
        return out

    def _quantize(self, x: torch.Tensor, scales: torch.Tensor, key: Key, at: int) -> torch.Tensor:
        """Integers of ``x``, the part of the slice starting at element ``at`` (bucket-aligned)."""
        first = at // self.bucket_size
        s = scales[first : first - (-x.numel() // self.bucket_size)]
        lib = native.int_kernels() if x.device.type == "cpu" else None
        if lib is None:
            u = uniform(key, self.offset + at, x.numel(), x.device)
            return quantize(x, s, u, self.top, self.bucket_size).to(self.dtype)
        return _quantize_native(
            lib, x, s, self.top, self.bucket_size, key, self.offset + at, self.dtype
        )

    def _dequantize(
        self, q: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, at: int
    ) -> None:
        first = at // self.bucket_size
        s = scales[first : first - (-q.numel() // self.bucket_size)]
        denom = self.top * self.comm.world_size
        lib = native.int_kernels() if out.device.type == "cpu" else None
        if lib is None:
            dequantize(q, s, denom, self.bucket_size, out)
        else:
            _dequantize_native(lib, q, s, denom, self.bucket_size, out)


def quantize(
    x: torch.Tensor, scales: torch.Tensor, u: torch.Tensor, top: int, bucket_size: int
) -> torch.Tensor:
    """Integers (int32) q with E[q] = x * top / s per bucket, |q| <= top; u uniform in [0, 1)."""
    # An all-zero bucket (s = 0 on every rank) divides by 1 and rounds 0 to 0.
    safe = torch.where(scales > 0, scales, 1.0).unsqueeze(1)
    t = (_buckets(x, bucket_size) / safe * top).reshape(-1)[: x.numel()]
    low = torch.floor(t)
    # floor(t) + [u < t - floor(t)] is up with probability exactly the fraction (to the 2^-24
    # grid of u); floor(t + u) would round t + u to float32 first and bias large levels.
    q = low + (u < t - low).to(t.dtype)
    return q.clamp_(-top, top).to(torch.int32)


def dequantize(
    sums: torch.Tensor, scales: torch.Tensor, denom: int, bucket_size: int, out: torch.Tensor
) -> torch.Tensor:
    """out = s * (sum / denom) per bucket, written into ``out`` (float32, sums' length)."""
    # A tensor divisor: CUDA multiplies by the reciprocal of a Python-number divisor, and
    # denom * (1 / denom) need not be 1; a true division makes sum == denom give exactly s.
    divisor = torch.full((1,), float(denom), device=sums.device)
    ratio = _buckets(sums.to(torch.float32) / divisor, bucket_size)
    values = (ratio * scales.unsqueeze(1)).reshape(-1)[: sums.numel()]
    return out.copy_(values)


# Compiled twins of quantize / dequantize (kernels/cpu/qbench_cpu.c): same float32 operations in
# the same order, so the integers are identical (tests/test_schemes_dist.py compares them).
def _quantize_native(
    lib: Any, x: torch.Tensor, scales: torch.Tensor, top: int, bucket_size: int, key: Key,
    offset: int, dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    x, s = x.contiguous(), scales.contiguous()
    q = torch.empty(x.numel(), dtype=dtype)
    args = (x.data_ptr(), s.data_ptr(), x.numel(), bucket_size, top, key_hash(key))
    rc = lib.qb_int_quantize(*args, offset & MASK32, q.data_ptr(), q.element_size())
    if rc != 0:
        raise RuntimeError(f"qb_int_quantize failed ({rc})")
    return q


def _dequantize_native(
    lib: Any, sums: torch.Tensor, scales: torch.Tensor, denom: int, bucket_size: int,
    out: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    target = out if out.is_contiguous() else torch.empty_like(out)
    args = (sums.data_ptr(), scales.contiguous().data_ptr(), sums.numel(), bucket_size, denom)
    rc = lib.qb_int_dequantize(*args, target.data_ptr(), sums.element_size())
    if rc != 0:
        raise RuntimeError(f"qb_int_dequantize failed ({rc})")
    return target if target is out else out.copy_(target)
