"""Codecs whose values, on a scale the ranks share, are integers that add up exactly: the
integer allreduce's view of a compressor (qbench.aggregate.integer_allreduce, and the
``integer`` order of ``qbench bench numerics``).

The protocol, per slice of a gradient cut into blocks (``block`` values share a statistic):

1. ``local_scales(x)``: each block's statistic (max |x|), float32;
2. the ranks combine them with an elementwise MAX (one small allreduce), and ``share`` turns the
   result into each block's float32 scale, the same on every rank;
3. ``encode(x, scales, key, offset, dtype)``: integers q with |q| <= ``top`` (a rank's largest),
   stochastic draws keyed like the codec's by (key, global element index ``offset``...);
4. one allreduce sums them (no overflow: the caller picks a dtype for K x top);
5. ``decode(sums, scales, world_size, out)``: the mean, float32.

* QSGD (bits >= 2, norm max, contiguous buckets): levels in [-L, L], L = 2^(bits-1) - 1, of x L
  / s for the shared bucket max s; mean = s sum / (K L). The C kernels do both ends on CPU.
* FP8 with blocks, MX, NVFP4 (``qbench.compress.lowfloat``): every value of an element format is
  an integer number of its smallest positive value u (E2M1: 0.5, so 6 is 12 units; E4M3: 2^-9,
  so 448 is 229376 units), so on shared block scales d the codes sum exactly as integers: mean =
  u d sum / K. E5M2 needs 33 bits and is refused (catalog ``integer_levels``). Both ends run
  in the C loops on CPU and the CUDA kernels on GPU (``Kernels.units_encode`` /
  ``units_decode``), identical to the torch reference kept here.
"""

from __future__ import annotations

from typing import Any

import torch

from qbench.compress import blockscale as bs
from qbench.compress.base import Compressor, Key
from qbench.compress.kernels import native
from qbench.compress.kernels.abi import LowFloatFormat
from qbench.compress.kernels.buckets import buckets as _buckets
from qbench.compress.kernels.draws import uniform
from qbench.compress.kernels.rng import MASK32, key_hash
from qbench.compress.lowfloat import ScaledFloat
from qbench.compress.qsgd import QSGD


class IntegerSum:
    """One codec's integer view (see the module docstring)."""

    top: int
    block: int
    blockwise = True
    """Each block's shared scale depends on that block's statistics only, so a slice's scales
    can be agreed on alone (NVFP4's tensor scale takes the max over every block: False)."""

    def local_scales(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def share(self, scales: torch.Tensor) -> torch.Tensor:
        """The per-block scales every rank uses, from the ranks' MAX of ``local_scales``."""
        return scales

    def encode(
        self, x: torch.Tensor, scales: torch.Tensor, key: Key, offset: int, dtype: torch.dtype
    ) -> torch.Tensor:
        raise NotImplementedError

    def decode(
        self, sums: torch.Tensor, scales: torch.Tensor, world_size: int, out: torch.Tensor
    ) -> torch.Tensor:
        raise NotImplementedError


def for_compressor(comp: Compressor) -> IntegerSum | None:
    """The integer view of ``comp``, or None when its catalog entry says it has none
    (``integer_levels``: the reason)."""
    if comp.spec.entry.integer_levels(comp.spec.params) is not None:
        return None
    if isinstance(comp, QSGD):
        return QSGDLevels(comp)
    if isinstance(comp, ScaledFloat):
        return FloatUnits(comp)
    return None


class QSGDLevels(IntegerSum):
    """QSGD's levels on the shared bucket max."""

    def __init__(self, comp: QSGD) -> None:
        self.top, self.block = comp.spec.entry.integer_grid(comp.spec.params)

    def local_scales(self, x: torch.Tensor) -> torch.Tensor:
        """max |x| per bucket: one C pass on CPU, torch elsewhere (same values)."""
        lib = native.int_kernels() if x.device.type == "cpu" else None
        if lib is None:
            return _buckets(x, self.block).abs().amax(dim=1)
        return _absmax_native(lib, x, self.block)

    def encode(
        self, x: torch.Tensor, scales: torch.Tensor, key: Key, offset: int, dtype: torch.dtype
    ) -> torch.Tensor:
        lib = native.int_kernels() if x.device.type == "cpu" else None
        if lib is None:
            u = uniform(key, offset, x.numel(), x.device)
            return quantize(x, scales, u, self.top, self.block).to(dtype)
        return _quantize_native(lib, x, scales, self.top, self.block, key, offset, dtype)

    def decode(
        self, sums: torch.Tensor, scales: torch.Tensor, world_size: int, out: torch.Tensor
    ) -> torch.Tensor:
        denom = self.top * world_size
        lib = native.int_kernels() if out.device.type == "cpu" else None
        if lib is None:
            return dequantize(sums, scales, denom, self.block, out)
        return _dequantize_native(lib, sums, scales, denom, self.block, out)


class FloatUnits(IntegerSum):
    """A block-scaled float format's values in units of its smallest positive value."""

    def __init__(self, comp: ScaledFloat) -> None:
        self.comp = comp
        self.scaling = comp.scaling
        element = self.scaling.element
        self.unit = float(element.finite[1])  # the smallest positive (subnormal) value
        units = (element.table / self.unit).nan_to_num(0.0)
        signed = torch.cat([units, -units]).round().to(torch.int64)
        self.units = signed  # by code, sign bit included
        # (FP8 with one scale per tensor, NVFP4 with per-tensor scales: refused by the catalog's
        # integer_levels, so the block is never 0 here)
        self.top, self.block = comp.spec.entry.integer_grid(comp.spec.params)
        assert self.top == int(units[torch.isfinite(element.table)].max()), "catalog disagrees"
        self.blockwise = self.scaling.kind != "nvfp4"
        stochastic = comp.rounding == "stochastic"
        self.kernel_format = LowFloatFormat(self.scaling.kind, element.name, self.block, stochastic)

    def local_scales(self, x: torch.Tensor) -> torch.Tensor:
        """max |x| per block: one C pass on CPU float32, torch elsewhere (same values)."""
        float32 = x.device.type == "cpu" and x.dtype == torch.float32
        lib = native.int_kernels() if float32 else None
        if lib is None:
            return bs.blocks(x, self.block).abs().amax(dim=1)
        return _absmax_native(lib, x, self.block)

    # The compiled paths (qb_lf_units_* of kernels/cpu/qbench_cpu.c and kernels/lowfloat.cu, on
    # lowfloat_math.h's scales and element rounding) where native.kernels_for picks one, else
    # the torch reference (the *_torch methods); the divisors, integers and means are identical.
    def share(self, scales: torch.Tensor) -> torch.Tensor:
        kernels = native.kernels_for(scales) if scales.dtype == torch.float32 else None
        if kernels is None:
            return self.share_torch(scales)
        return kernels.units_divisors(scales, self.kernel_format)

    def encode(
        self, x: torch.Tensor, scales: torch.Tensor, key: Key, offset: int, dtype: torch.dtype
    ) -> torch.Tensor:
        plain = x.dtype == scales.dtype == torch.float32 and x.device == scales.device
        kernels = native.kernels_for(x) if plain else None
        if kernels is None:
            return self.encode_torch(x, scales, key, offset, dtype)
        return kernels.units_encode(x, scales, self.kernel_format, key_hash(key), offset, dtype)

    def decode(
        self, sums: torch.Tensor, scales: torch.Tensor, world_size: int, out: torch.Tensor
    ) -> torch.Tensor:
        plain = scales.dtype == torch.float32 and not sums.is_floating_point()
        plain = plain and native.can_accumulate(out, sums.numel(), sums.device)
        kernels = native.kernels_for(sums) if plain and scales.device == sums.device else None
        if kernels is None:
            return self.decode_torch(sums, scales, world_size, out)
        return kernels.units_decode(sums, scales, self.kernel_format, world_size, out)

    def share_torch(self, scales: torch.Tensor) -> torch.Tensor:
        """The reference of share."""
        return self.scaling.divisors(*self.scaling.scales(scales))

    def encode_torch(
        self, x: torch.Tensor, scales: torch.Tensor, key: Key, offset: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """The reference of encode."""
        rows = bs.blocks(x, self.block)
        divisor = scales[:, None]
        t = rows / torch.where(divisor > 0, divisor, torch.ones_like(divisor))
        draws = self.comp.draws(x, key, offset)
        codes = self.scaling.element.encode(t, draws).reshape(-1)[: x.numel()]
        units = self.units.to(x.device)[codes.long()]
        # a block whose shared scale is 0 holds only zeros on every rank
        return units.to(dtype)

    def decode_torch(
        self, sums: torch.Tensor, scales: torch.Tensor, world_size: int, out: torch.Tensor
    ) -> torch.Tensor:
        """The reference of decode."""
        # float64: a sum of K values of up to 229376 units can pass float32's 2^24; one rounding.
        # A tensor divisor: CUDA torch multiplies by the reciprocal of a Python number.
        k = torch.full((1,), float(world_size), dtype=torch.float64, device=scales.device)
        per_unit = (scales.double() * self.unit / k).repeat_interleave(self.block)
        return out.copy_(sums.double() * per_unit[: sums.numel()])


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


def _absmax_native(lib: Any, x: torch.Tensor, block: int) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty(-(-x.numel() // block))
    rc = lib.qb_bucket_absmax(x.data_ptr(), x.numel(), block, out.data_ptr())
    if rc != 0:
        raise RuntimeError(f"qb_bucket_absmax failed ({rc})")
    return out


# Compiled twins of quantize / dequantize (kernels/cpu/qbench_cpu.c): same float32 operations in
# the same order, so the integers are identical (tests/aggregate/test_schemes_dist.py compares
# them).
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
