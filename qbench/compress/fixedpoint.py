"""Fixed-point stochastic rounding of communicated values (Lu et al., seed 000).

Section 3 defines the quantizer: Q(x) = delta * (floor(x / delta) + 1) with probability
x / delta - floor(x / delta), else delta * floor(x / delta), so E[Q(x)] = x. Section 5.2
(Table 2) sweeps the width over 16, 10, 8, 6 and 4 bits and never states delta. With ``bits``
bits the codes are two's complement integers q in [-2^(bits-1), 2^(bits-1) - 1], so a fixed
delta only suits tensors of a known scale; ``delta: auto`` (the default) picks, per tensor
(``scope: layer``; ``global``: per encode call, over a layer group or an owner range), the
smallest power of two 2^e such that max |x| <= (2^(bits-1) - 1) * 2^e, so nothing is clipped
and the grid is as fine as the width allows (fixed-point formats with 2^-FL steps, as in
Gupta et al., whom the seed cites). Values outside the range are clipped to its ends, where
rounding is no longer unbiased.

Wire: "levels", exactly ceil(n * bits / 8) bytes for every width: bits <= 8 bit-packed; bits
9..15 planar (the low byte of every code, then the high bits - 8 bits of every code bit-packed:
n + ceil(n (bits - 8) / 8) bytes); bits 16 one int16 per value. Then, with ``delta: auto`` only,
"exponent" (int16[1], e).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch

from qbench.compress.base import Compressor, Key, Payload, require_finite
from qbench.compress.kernels import bitpack
from qbench.compress.kernels.draws import uniform


class FixedPoint(Compressor):
    name: ClassVar[str] = "fixedpoint"
    # Parameters (documented and validated in qbench.catalog.compressors):
    bits: int
    delta: float | Literal["auto"]
    scope: Literal["layer", "global"]

    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        low, high = _range(self.bits)
        if self.delta == "auto":
            top = float(grad.abs().max()) if grad.numel() else 0.0
            exponent = _auto_exponent(top, high)
            t = _times_pow2(grad, -exponent)
        else:
            t = grad / self.delta
        u = uniform(key, offset, grad.numel(), grad.device)
        q = _stochastic_round(t.clamp(low, high), u).clamp_(low, high).to(torch.int32)
        buffers = {"levels": _pack(q, self.bits)}
        if self.delta == "auto":
            buffers["exponent"] = torch.tensor([exponent], dtype=torch.int16, device=grad.device)
        # A NaN came out as 0 and an inf as the end of the range (with auto, on a step of 1):
        # refused, never sent. max |x| (auto) is NaN or inf exactly when a value is.
        require_finite(self.name, grad, top if self.delta == "auto" else None, offset)
        return Payload(numel=grad.numel(), buffers=buffers)

    def _decode(self, payload: Payload) -> torch.Tensor:
        q = _unpack(payload.buffers["levels"], self.bits, payload.numel).to(torch.float32)
        if self.delta == "auto":
            return _times_pow2(q, int(payload.buffers["exponent"].item()))
        return q * self.delta


def _range(bits: int) -> tuple[int, int]:
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _auto_exponent(top: float, high: int) -> int:
    """Smallest e with top <= high * 2^e (0 for an all-zero or non-finite tensor)."""
    if not 0 < top < math.inf:
        return 0
    e = math.ceil(math.log2(top / high))
    # log2 is inexact near powers of two; ldexp comparisons are exact.
    while math.ldexp(high, e) < top:
        e += 1
    while math.ldexp(high, e - 1) >= top:
        e -= 1
    return e


def _times_pow2(x: torch.Tensor, e: int) -> torch.Tensor:
    """x * 2^e, exact; two factors, since 2^e alone can fall outside float32's normal range."""
    first = min(max(e, -126), 127)
    return x * (2.0**first) * (2.0 ** (e - first))


def _stochastic_round(t: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """floor(t) + 1 with probability t - floor(t) (u uniform in [0, 1)), else floor(t)."""
    low = torch.floor(t)
    return low + (u < t - low).to(t.dtype)


def _pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    if bits == 16:
        return q.to(torch.int16)
    codes = q.to(torch.int32) & ((1 << bits) - 1)  # two's complement in `bits` bits
    if bits <= 8:
        return bitpack.pack(codes, bits)
    low = (codes & 0xFF).to(torch.uint8)  # planar: low bytes, then the packed high bits
    return torch.cat([low, bitpack.pack(codes >> 8, bits - 8)])


def _unpack(levels: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    if bits == 16:
        return levels.to(torch.int32)
    if bits <= 8:
        codes = bitpack.unpack(levels, bits, numel).to(torch.int32)
    else:
        low = levels[:numel].to(torch.int32)
        high = bitpack.unpack(levels[numel:], bits - 8, numel).to(torch.int32)
        codes = low | (high << 8)
    return torch.where(codes >= 1 << (bits - 1), codes - (1 << bits), codes)
