"""What every compiled kernel path shares, below all of them: where the kernel sources and the
build cache are, the C enums, and the ``Kernels`` interface a path offers the compressors.
``native`` (C on CPU), ``cuda`` (CuPy) and ``cuda_emulate`` (the CUDA kernels on CPU threads)
import it; it imports none of them, so the paths do not import each other in a circle.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple, Protocol

import torch

ENV_CACHE = "QBENCH_CACHE"
ENV_KERNELS = "QBENCH_KERNELS"
LAYOUTS = {"intervals": 0, "sign": 1}  # kernels/qsgd_math.h: QB_LAYOUT_*
NORMS = {"max": 0, "l2": 1}  # QB_NORM_*
LOWFLOAT_KINDS = {"fp8": 0, "mx": 1, "nvfp4": 2}  # kernels/lowfloat_math.h: QB_LF_FP8 ...
LOWFLOAT_ELEMENTS = {"e4m3": 0, "e5m2": 1, "e3m2": 2, "e2m3": 3, "e2m1": 4}  # QB_LF_E4M3 ...


class LowFloatEncoded(NamedTuple):
    """A compiled FP8 / MX / NVFP4 encode (``qbench.compress.lowfloat``): the packed codes, the
    block scales, NVFP4's tensor scale (else None) and, with error feedback, the new residual."""

    codes: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor | None
    residual: torch.Tensor | None


class UnitsView(NamedTuple):
    """The integer view of an FP8 / MX / NVFP4 codec as the kernels take it
    (``qbench.compress.integer_sum.FloatUnits``): each value of a block, divided by the block's
    shared float32 divisor, rounded to the element format and sent as an integer number of the
    format's smallest positive value."""

    kind: str
    element: str
    block: int
    stochastic: bool


class Kernels(Protocol):
    """What a compiled path offers the compressors; arguments are checked by the caller. A
    decode returns fresh values when ``out`` is None, else adds them into ``out`` (``accumulate``)
    or writes them there (``accumulate=False``: a preallocated buffer, nothing read from it)."""

    def qsgd_encode(
        self,
        grad: torch.Tensor,
        *,
        bits: int,
        bucket_size: int,
        layout: str,
        norm: str,
        key_hash: int,
        offset: int,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def qsgd_decode(
        self,
        levels: torch.Tensor,
        scales: torch.Tensor,
        numel: int,
        *,
        bits: int,
        bucket_size: int,
        layout: str,
        out: torch.Tensor | None,
        accumulate: bool = True,
    ) -> torch.Tensor: ...

    def onebit_encode(
        self, grad: torch.Tensor, residual: torch.Tensor | None, *, bucket_size: int, ef: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]: ...

    def onebit_decode(
        self,
        signs: torch.Tensor,
        means: torch.Tensor,
        numel: int,
        *,
        bucket_size: int,
        out: torch.Tensor | None,
        accumulate: bool = True,
    ) -> torch.Tensor: ...

    def lowfloat_encode(
        self,
        grad: torch.Tensor,
        residual: torch.Tensor | None,
        *,
        kind: str,
        element: str,
        block: int,
        stochastic: bool,
        ef: bool,
        key_hash: int,
        offset: int,
    ) -> LowFloatEncoded | None:
        """None when grad holds a NaN or an inf (the residual is then left as it was)."""
        ...

    def lowfloat_decode(
        self,
        codes: torch.Tensor,
        scales: torch.Tensor,
        tensor_scale: torch.Tensor | None,
        numel: int,
        *,
        kind: str,
        element: str,
        block: int,
        out: torch.Tensor | None,
        accumulate: bool = True,
    ) -> torch.Tensor: ...

    def units_divisors(self, amax: torch.Tensor, view: UnitsView) -> torch.Tensor:
        """Each block's float32 divisor from ``amax``, the ranks' MAX of its max |x|."""
        ...

    def units_encode(
        self, x: torch.Tensor, divisors: torch.Tensor, view: UnitsView, key_hash: int,
        offset: int, dtype: torch.dtype,
    ) -> torch.Tensor:  # fmt: skip
        """The integers (``dtype``) of ``x``'s values on its blocks' ``divisors``; draws keyed by
        ``key_hash`` and the element index ``offset`` + i."""
        ...

    def units_decode(
        self, sums: torch.Tensor, divisors: torch.Tensor, view: UnitsView, world_size: int,
        out: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """The mean of ``world_size`` ranks' integers summed in ``sums``, written to ``out``
        (float32, contiguous, ``sums``' length) and returned."""
        ...


def kernel_dir() -> Path:
    """Where the kernel sources are: $QBENCH_KERNELS, the source tree, or the installed copy."""
    candidates = [Path(p) for p in [os.environ.get(ENV_KERNELS)] if p]
    candidates += [
        Path(__file__).resolve().parents[3] / "kernels",  # source tree / editable install
        Path(sys.prefix) / "share" / "qbench" / "kernels",  # setup.cfg data_files
    ]
    for d in candidates:
        if (d / "qbench_rng.h").is_file():
            return d
    raise FileNotFoundError(
        "qbench kernel sources not found in " + ", ".join(str(d) for d in candidates)
    )


def cache_dir() -> Path:
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "qbench"
