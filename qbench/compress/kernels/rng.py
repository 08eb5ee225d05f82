"""Counter-based random draws for stochastic rounding.

Every draw is a pure function of (seed, step, rank, stream, element index): no generator state,
so a run is reproducible, a range of a vector draws the same numbers as the whole vector, and the
CPU (torch), fused C++ and CUDA paths agree bit for bit. The same arithmetic is written in C in
``kernels/qbench_rng.h``; keep the two in step.

The mixer is "lowbias32" (Chris Wellons' hash-prospector), a 32-bit integer finaliser with good
avalanche; a draw is ``lowbias32(index * GOLDEN + key_hash)``, and its top 24 bits give a float32
uniform in [0, 1) exactly.
"""

from __future__ import annotations

import torch

from qbench.compress.base import Key

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B1
_M1 = 0x7FEB352D
_M2 = 0x846CA68B
_INV_2_24 = 1.0 / (1 << 24)


def lowbias32(x: int) -> int:
    """Scalar lowbias32 on Python ints (used for the per-encode key hash)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * _M1) & MASK32
    x ^= x >> 15
    x = (x * _M2) & MASK32
    x ^= x >> 16
    return x


def key_hash(key: Key) -> int:
    """Fold a Key into one 32-bit value; each field is mixed so nearby keys decorrelate."""
    h = lowbias32(key.stream)
    h = lowbias32(h ^ (key.rank & MASK32))
    h = lowbias32(h ^ (key.step & MASK32))
    return lowbias32(h ^ (key.seed & MASK32))


def _lowbias32_tensor(x: torch.Tensor) -> torch.Tensor:
    # int64 arithmetic: products of two 32-bit values wrap modulo 2**64, whose low 32 bits are
    # exactly the uint32 product, so masking after each multiply reproduces C's uint32 maths.
    x = x ^ (x >> 16)
    x = (x * _M1) & MASK32
    x = x ^ (x >> 15)
    x = (x * _M2) & MASK32
    return x ^ (x >> 16)


def uniform_reference(
    key: Key, offset: int, numel: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The draws in plain torch: the definition the compiled paths must reproduce."""
    idx = torch.arange(offset, offset + numel, dtype=torch.int64, device=device)
    x = (idx * GOLDEN + key_hash(key)) & MASK32
    bits = _lowbias32_tensor(x) >> 8
    return bits.to(torch.float32) * _INV_2_24
