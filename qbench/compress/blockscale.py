"""Block-scaled formats: the OCP Microscaling (MX) formats and NVFP4, on the element formats of
``qbench.compress.minifloat``.

* MX (MXFP8 E4M3 / E5M2, MXFP6 E3M2 / E2M3, MXFP4 E2M1): blocks of 32 values share one E8M0
  scale X = 2^(floor(log2 max|x|) - emax) (``minifloat.mx_scale_exponent``); each value is
  stored as the element code of x / X, saturating. A block holding NaN or inf gets the NaN
  scale and decodes as NaN (the specification's rule); a block of zeros the smallest scale.
* NVFP4: blocks of 16 E2M1 values, each block with an E4M3 scale, the tensor with one fp32
  scale: s = max|x| / (448 x 6) over the tensor, so that every block scale max|block| / 6 / s
  fits E4M3 (at most 448); the block scale is rounded to E4M3 (nearest), the elements encode
  x / (block scale x s).

Values are padded with zeros to whole blocks; the element codes are returned unpacked (one per
uint8; ``qbench.compress.bitpack`` packs them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qbench.compress import minifloat as mf

MX_BLOCK = 32
NVFP4_BLOCK = 16
NVFP4_RANGE = 448.0 * 6.0  # largest E4M3 block scale x largest E2M1 value


@dataclass(frozen=True)
class Blocks:
    """A block-scaled tensor: element codes, per-block scale codes, and NVFP4's tensor scale."""

    codes: torch.Tensor
    scales: torch.Tensor
    tensor_scale: float = 1.0


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    flat = x.detach().reshape(-1).float()
    pad = -flat.numel() % block
    return torch.cat([flat, flat.new_zeros(pad)]).view(-1, block)


def mx_encode(
    x: torch.Tensor, fmt: mf.Format, draws: torch.Tensor | None = None, block: int = MX_BLOCK
) -> Blocks:
    """``x`` in MX blocks of ``fmt``; ``draws`` (one per padded value) round stochastically."""
    blocks = _blocks(x, block)
    scales = mf.mx_scale_exponent(blocks.abs().amax(dim=1), fmt)
    value = mf.e8m0_value(scales).nan_to_num(nan=1.0).float()[:, None]
    return Blocks(fmt.encode(blocks / value, draws), scales)


def mx_decode(enc: Blocks, fmt: mf.Format, numel: int) -> torch.Tensor:
    """The float32 values of an MX-encoded tensor of ``numel`` values."""
    scale = mf.e8m0_value(enc.scales).float()[:, None]  # NaN scale: the whole block is NaN
    return (fmt.decode(enc.codes) * scale).reshape(-1)[:numel]


def nvfp4_encode(x: torch.Tensor, draws: torch.Tensor | None = None) -> Blocks:
    """``x`` in NVFP4: E2M1 elements in blocks of 16, E4M3 block scales, one fp32 scale."""
    blocks = _blocks(x, NVFP4_BLOCK)
    amax = float(blocks.abs().max()) if blocks.numel() else 0.0
    tensor = amax / NVFP4_RANGE if amax > 0 else 1.0
    scales = mf.E4M3.encode(blocks.abs().amax(dim=1) / mf.E2M1.max_normal / tensor)
    value = (mf.E4M3.decode(scales) * tensor)[:, None]
    safe = value.where(value > 0, torch.ones_like(value))  # a block of zeros stays zeros
    return Blocks(mf.E2M1.encode(blocks / safe, draws), scales, tensor)


def nvfp4_decode(enc: Blocks, numel: int) -> torch.Tensor:
    scale = mf.E4M3.decode(enc.scales)[:, None] * enc.tensor_scale
    return (mf.E2M1.decode(enc.codes) * scale).reshape(-1)[:numel]
