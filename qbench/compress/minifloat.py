"""The element formats of FP8 (OCP 8-bit floating point) and the OCP Microscaling (MX) formats:
E4M3, E5M2, E3M2 and E2M3 (MXFP6), E2M1 (MXFP4, NVFP4), and the E8M0 block scale.

Each element format is sign-magnitude: 1 sign bit, ``exp`` exponent bits with ``bias``, ``man``
mantissa bits; exponent 0 holds the subnormals (no implicit 1). What the top codes mean differs:

* E5M2 is IEEE-like: exponent all ones is infinity (mantissa 0) or NaN;
* E4M3 has no infinity: only S.1111.111 is NaN, so its largest normal is 1.75 x 2^8 = 448;
* the FP6 and FP4 formats have neither: every code is a finite number (E3M2 up to 28, E2M3 up
  to 7.5, E2M1 up to 6).

Encoding works on the table of a format's non-negative values by code (positive codes are in
increasing order of value), so one routine serves every format: round to nearest, ties to the
even code (an even mantissa), or stochastically between the two neighbours with probability
proportional to closeness (unbiased); magnitudes above the largest finite value saturate to it
(the MX specification's conversion; OCP FP8's saturating mode), NaN stays NaN where the format
has one. Codes are uint8 with the sign at bit ``exp + man``.

E8M0 (the MX block scale) is 2^(e - 127) for e in 0..254; 255 is NaN. An MX block of values x
gets the scale X = 2^(floor(log2(max |x|)) - emax), emax the exponent of the element format's
largest normal, so that max |x| / X lands in [2^emax, 2^(emax+1)) and the elements saturate
above the largest normal (OCP MX specification v1.0, section 6.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class Format:
    name: str
    exp: int
    man: int
    bias: int
    specials: str
    """``ieee`` (inf and NaN in the top exponent), ``nan`` (only all ones is NaN) or ``none``."""

    @property
    def bits(self) -> int:
        return 1 + self.exp + self.man

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exp + self.man)

    def magnitude(self, code: int) -> float:
        """The value of a non-negative code (sign bit clear), NaN or inf where special."""
        e, m = code >> self.man, code & ((1 << self.man) - 1)
        top = (1 << self.exp) - 1
        if self.specials == "ieee" and e == top:
            return math.inf if m == 0 else math.nan
        if self.specials == "nan" and e == top and m == (1 << self.man) - 1:
            return math.nan
        if e == 0:
            return m / (1 << self.man) * 2.0 ** (1 - self.bias)
        return (1 + m / (1 << self.man)) * 2.0 ** (e - self.bias)

    @cached_property
    def table(self) -> torch.Tensor:
        """Every non-negative code's value, float64, by code."""
        return torch.tensor([self.magnitude(c) for c in range(self.sign_bit)], dtype=torch.float64)

    @cached_property
    def finite(self) -> torch.Tensor:
        """The finite non-negative values, in code order (a prefix of the codes)."""
        return self.table[torch.isfinite(self.table)]

    @property
    def max_normal(self) -> float:
        return float(self.finite[-1])

    @property
    def emax(self) -> int:
        """The exponent of the largest normal value (MX's emax_elem)."""
        return math.floor(math.log2(self.max_normal))

    def encode(self, x: torch.Tensor, draws: torch.Tensor | None = None) -> torch.Tensor:
        """Codes of ``x`` (uint8): nearest, ties to even; with ``draws`` (uniform in [0, 1), one
        per value) stochastic between the neighbours. Saturating; NaN to the NaN code where the
        format has one (else to the largest finite value, as the MX block scale marks NaN)."""
        mag = x.detach().abs().double().flatten()
        grid = self.finite.to(mag.device)
        clipped = mag.clamp(max=grid[-1].item())
        lo = (torch.searchsorted(grid, clipped, right=True) - 1).clamp(0, len(grid) - 1)
        hi = (lo + 1).clamp(max=len(grid) - 1)
        low, high = grid[lo], grid[hi]
        gap = (high - low).clamp(min=torch.finfo(torch.float64).tiny)
        frac = ((clipped - low) / gap).where(hi > lo, torch.zeros_like(clipped))
        if draws is None:
            up = (frac > 0.5) | ((frac == 0.5) & (lo % 2 == 1))  # a tie goes to the even code
        else:
            up = draws.flatten().double().to(mag.device) < frac
        code = torch.where(up, hi, lo)
        nan = torch.isnan(mag)
        if nan.any():
            code = torch.where(nan, self._nan_code(len(grid) - 1), code)
        sign = (x.detach().flatten() < 0) | ((x.detach().flatten() == 0) & x.signbit().flatten())
        return (code + sign.long() * self.sign_bit).to(torch.uint8).view(x.shape)

    def _nan_code(self, largest: int) -> int:
        nans = torch.isnan(self.table).nonzero()
        return int(nans[0]) if len(nans) else largest

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """float32 values of ``codes``."""
        c = codes.long()
        mag = self.table.to(codes.device)[c & (self.sign_bit - 1)]
        return torch.where(c & self.sign_bit != 0, -mag, mag).float()


E4M3 = Format("e4m3", 4, 3, 7, "nan")
E5M2 = Format("e5m2", 5, 2, 15, "ieee")
E3M2 = Format("e3m2", 3, 2, 3, "none")
E2M3 = Format("e2m3", 2, 3, 1, "none")
E2M1 = Format("e2m1", 2, 1, 1, "none")
FORMATS = {f.name: f for f in (E4M3, E5M2, E3M2, E2M3, E2M1)}

E8M0_BIAS = 127
E8M0_NAN = 255


def mx_scale_exponent(amax: torch.Tensor, fmt: Format) -> torch.Tensor:
    """The E8M0 code of each MX block's scale, from the block's max |x| (float32): floor(log2
    amax) - emax, within E8M0's range (2^-127 .. 2^127); a block of zeros gets the smallest
    scale, a block holding NaN or inf the NaN scale. floor(log2) is frexp's exponent - 1, exact
    for every float32 (subnormals too), as C's frexpf gives it."""
    amax = amax.float()
    _, exponent = torch.frexp(amax.where(amax > 0, torch.ones_like(amax)))
    code = (exponent.long() - 1 - fmt.emax + E8M0_BIAS).clamp(0, 2 * E8M0_BIAS)
    code = code.where(amax > 0, torch.zeros_like(code))
    return code.where(torch.isfinite(amax), torch.full_like(code, E8M0_NAN)).to(torch.uint8)


def e8m0_value(codes: torch.Tensor) -> torch.Tensor:
    """float64 values of E8M0 codes (NaN for 255)."""
    c = codes.double()
    return torch.where(c == E8M0_NAN, torch.full_like(c, math.nan), torch.exp2(c - E8M0_BIAS))
