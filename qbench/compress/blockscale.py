"""Scaled low-precision floats: FP8 with an fp32 scale, the OCP Microscaling (MX) formats and
NVFP4, on the element formats of ``qbench.compress.minifloat``.

Values are cut into blocks (zero-padded at the end); each block gets a scale from its max |x|
and every value is stored as the element code of x / scale:

* FP8 (E4M3, E5M2): scale = max |x| / the format's largest value, kept as float32, per block
  of ``block`` values or one for the whole input (``block`` 0), so the block's max maps onto the
  largest value and nothing saturates (Micikevicius et al., "FP8 Formats for Deep Learning").
* MX (MXFP8 E4M3 / E5M2, MXFP6 E3M2 / E2M3, MXFP4 E2M1): blocks of 32 share one E8M0 scale
  X = 2^(floor(log2 max|x|) - emax) (OCP MX v1.0, section 6.3; ``minifloat.mx_scale_exponent``),
  which leaves max |x| / X in [2^emax, 2^(emax+1)): the largest values of a block saturate.
* NVFP4: blocks of 16 E2M1 values, an E4M3 scale per block and one fp32 scale s = max|x| /
  (448 x 6) for the whole input (at least 2^-126, the smallest normal float32, so that it never
  underflows to 0; 1 for all zeros), so that every block scale max|block| / 6 / s fits E4M3; the
  block scale is rounded to E4M3 (nearest), which may put a block's top one step over 6: it
  saturates.

All scale arithmetic is float32, one operation at a time, so that compiled twins (kernels/)
reproduce it bit for bit; the element rounding is exact (``minifloat.Format.encode``).

``amax`` can be given instead of taken from the values: ranks that agree on a shared per-block
max |x| first (a MAX allreduce) encode on the same scales, so their codes add up as integers
(``qbench.compress.integer_sum``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qbench.compress import minifloat as mf

MX_BLOCK = 32
NVFP4_BLOCK = 16
NVFP4_RANGE = 448.0 * 6.0  # largest E4M3 block scale x largest E2M1 value
NVFP4_MIN_TENSOR = torch.finfo(torch.float32).tiny  # 2^-126, the smallest normal float32


@dataclass(frozen=True)
class Blocks:
    """A block-scaled tensor: element codes (one per uint8, padded to whole blocks), the
    per-block scales as the wire carries them, and NVFP4's tensor scale."""

    codes: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor | None = None


@dataclass(frozen=True)
class Scaling:
    """How one format scales its blocks: ``kind`` fp8, mx or nvfp4, the element format, the
    block length (0: one block for the whole input)."""

    kind: str
    element: mf.Format
    block: int

    def block_of(self, numel: int) -> int:
        return self.block or max(numel, 1)

    def scales(self, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The wire scales of blocks with max |x| ``amax`` (float32), and NVFP4's tensor scale."""
        # divisions by tensors: CUDA torch multiplies by the reciprocal of a Python number,
        # which can differ from C's true division in the last bit
        if self.kind == "fp8":
            return amax / torch.full_like(amax, self.element.max_normal), None
        if self.kind == "mx":
            return mf.mx_scale_exponent(amax, self.element), None
        top = amax.max() if amax.numel() else amax.new_zeros(())
        # At least the smallest normal float32: below max |x| ~ 3.2e-35 the tensor scale would be
        # subnormal, and below ~1.9e-42 0, giving every block of zeros 0 / 0, the E4M3 NaN scale
        # (issue 44). Transformer Engine likewise caps its encode scale 2688 / max at FLT_MAX.
        # The floor keeps every block scale max|block| / 6 / s within E4M3's 448; a block with
        # max under 6 x 2^-136 (float32 dust) gets scale 0, exact zeros. 0 or NaN: 1.
        exact = top / torch.full_like(top, NVFP4_RANGE)
        tensor = torch.where(top > 0, exact.clamp(min=NVFP4_MIN_TENSOR), torch.ones_like(top))
        six = torch.full_like(amax, mf.E2M1.max_normal)
        return mf.E4M3.encode(amax / six / tensor.reshape(1)), tensor.reshape(1)

    def divisors(self, scales: torch.Tensor, tensor: torch.Tensor | None) -> torch.Tensor:
        """Each block's scale as float32 (what its element values are multiplied by)."""
        if self.kind == "fp8":
            return scales
        if self.kind == "mx":
            return mf.e8m0_value(scales).float()
        assert tensor is not None
        return mf.E4M3.decode(scales) * tensor


def fp8(fmt: mf.Format, block: int = 0) -> Scaling:
    return Scaling("fp8", fmt, block)


def mx(fmt: mf.Format) -> Scaling:
    return Scaling("mx", fmt, MX_BLOCK)


NVFP4 = Scaling("nvfp4", mf.E2M1, NVFP4_BLOCK)


def blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x`` flat, float32, zero-padded to whole blocks, one block per row."""
    flat = x.detach().reshape(-1).float()
    pad = -flat.numel() % block
    return torch.cat([flat, flat.new_zeros(pad)]).view(-1, block)


def encode(
    x: torch.Tensor, scaling: Scaling, draws: torch.Tensor | None = None,
    amax: torch.Tensor | None = None,
) -> Blocks:  # fmt: skip
    """``x`` block-scaled; ``draws`` (uniform in [0, 1), one per value, padded with zeros)
    round stochastically; ``amax``: shared per-block max |x| instead of ``x``'s own."""
    rows = blocks(x, scaling.block_of(x.numel()))
    if amax is None:
        amax = rows.abs().amax(dim=1)
    scales, tensor = scaling.scales(amax)
    divisor = scaling.divisors(scales, tensor)[:, None]
    # a block whose scale is 0 (all zeros, or too small for E4M3 in NVFP4) decodes as zeros
    safe = torch.where(divisor > 0, divisor, torch.ones_like(divisor))
    # (FP8: the fp32 rounding of max / scale can land a hair over the largest value; the
    # element encoding saturates it)
    return Blocks(scaling.element.encode(rows / safe, draws), scales, tensor)


def decode(enc: Blocks, scaling: Scaling, numel: int) -> torch.Tensor:
    """The float32 values of ``numel`` block-scaled values (an MX NaN scale: the block is NaN)."""
    divisor = scaling.divisors(enc.scales, enc.tensor_scale)[:, None]
    values = scaling.element.decode(enc.codes).view(-1, scaling.block_of(numel))
    return (values * divisor).reshape(-1)[:numel]
