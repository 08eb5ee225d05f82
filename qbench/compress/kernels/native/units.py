"""The C ends of the integer view of FP8 / MX / NVFP4 (``qbench.compress.integer_sum``'s
``FloatUnits``): ``qb_lf_units_divisors`` / ``_encode`` / ``_decode`` of kernels/cpu/qbench_cpu.c on
the library ``qbench.compress.kernels.native`` loads (and declares the signatures of). Apart from
the package's ``__init__`` only to keep its size in check; one thread per call, as a rank runs.
"""

from __future__ import annotations

import ctypes

import torch

from qbench.compress.kernels.abi import LowFloatFormat
from qbench.compress.kernels.rng import MASK32


def divisors(lib: ctypes.CDLL, amax: torch.Tensor, fmt: LowFloatFormat) -> torch.Tensor:
    """Each block's float32 divisor from amax (float32), the ranks' MAX of its max |x|."""
    a = amax.contiguous()
    out = torch.empty(a.numel())
    _check(lib.qb_lf_units_divisors(a.data_ptr(), a.numel(), *fmt.enums, out.data_ptr()),
           "qb_lf_units_divisors")  # fmt: skip
    return out


def encode(
    lib: ctypes.CDLL, x: torch.Tensor, divisors: torch.Tensor, fmt: LowFloatFormat,
    key_hash: int, offset: int, dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """The integers of x (float32) on its blocks' divisors (float32), as ``dtype``."""
    x, d = x.contiguous(), divisors.contiguous()
    q = torch.empty(x.numel(), dtype=dtype)
    args = (x.numel(), fmt.element_code, fmt.block, int(fmt.stochastic), key_hash, offset & MASK32)
    rc = lib.qb_lf_units_encode(x.data_ptr(), d.data_ptr(), *args, q.data_ptr(), q.element_size())
    _check(rc, "qb_lf_units_encode")
    return q


def decode(
    lib: ctypes.CDLL, sums: torch.Tensor, divisors: torch.Tensor, fmt: LowFloatFormat,
    world_size: int, out: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """The means of world_size ranks' summed integers, written to out (float32, contiguous)."""
    s, d = sums.contiguous(), divisors.contiguous()
    shape = (s.numel(), fmt.element_code, fmt.block, world_size)
    rc = lib.qb_lf_units_decode(
        s.data_ptr(), s.element_size(), d.data_ptr(), *shape, out.data_ptr()
    )
    _check(rc, "qb_lf_units_decode")
    return out


def _check(rc: int, what: str) -> None:
    if rc:
        raise RuntimeError(f"{what} failed with code {rc} (1: bad arguments)")
