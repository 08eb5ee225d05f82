"""What every compiled kernel path shares, below all of them: where the kernel sources and the
build cache are, the C enums, the wire formats as the kernels take them (``QsgdFormat``,
``LowFloatFormat``: one value per format, which knows its enum numbers and output buffers, so
that no path repeats that marshalling), the ``Kernels`` interface a path offers the compressors
with the payload check its callers make, and what the paths do alike (a decode's target, error
feedback's residuals, a switch set for one block). ``native`` (C on CPU), ``cuda`` (CuPy) and
``cuda.emulate`` (the CUDA kernels on CPU threads) import it; it imports none of them, so the
paths do not import each other in a circle.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch

from qbench.catalog.wire import ELEMENTS, packed_nbytes
from qbench.compress.kernels.buckets import levels_nbytes, num_buckets

ENV_CACHE = "QBENCH_CACHE"
ENV_KERNELS = "QBENCH_KERNELS"
LAYOUTS = {"intervals": 0, "sign": 1}  # kernels/qsgd_math.h: QB_LAYOUT_*
NORMS = {"max": 0, "l2": 1}  # QB_NORM_*
LOWFLOAT_KINDS = {"fp8": 0, "mx": 1, "nvfp4": 2}  # kernels/lowfloat_math.h: QB_LF_FP8 ...
LOWFLOAT_ELEMENTS = {"e4m3": 0, "e5m2": 1, "e3m2": 2, "e2m3": 3, "e2m1": 4}  # QB_LF_E4M3 ...

Empty = Callable[[int, torch.dtype], torch.Tensor]
"""A path's allocator of output buffers: that many values of that dtype, on its device."""


class QsgdFormat(NamedTuple):
    """A QSGD wire format (``qbench.compress.qsgd``): bits per code, values per bucket (one scale
    each), the levels' layout (``intervals`` or ``sign``) and the bucket norm (``max`` or ``l2``,
    read by encodes only)."""

    bits: int
    bucket_size: int
    layout: str
    norm: str

    @property
    def codec(self) -> tuple[int, int, int]:
        """bucket_size, bits and the layout's QB_LAYOUT_*: what every QSGD kernel takes, in
        this order."""
        return self.bucket_size, self.bits, LAYOUTS[self.layout]

    @property
    def norm_code(self) -> int:
        return NORMS[self.norm]

    def outputs(self, numel: int, empty: Empty) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh buffers for the levels (bit-packed codes) and scales of ``numel`` values."""
        levels = empty(levels_nbytes(numel, self.bits), torch.uint8)
        return levels, empty(num_buckets(numel, self.bucket_size), torch.float32)


class LowFloatFormat(NamedTuple):
    """An FP8 / MX / NVFP4 wire format (``qbench.compress.lowfloat``): the scaling kind, the
    element format, the values per block (one scale each) and whether encodes round
    stochastically. Also the integer view of such a codec (``qbench.compress.integer_sum``'s
    ``FloatUnits``): each value of a block, divided by the block's shared float32 divisor,
    rounded to the element format and sent as an integer number of its smallest positive value."""

    kind: str
    element: str
    block: int
    stochastic: bool

    @property
    def enums(self) -> tuple[int, int]:
        """The kind's QB_LF_FP8 ... and the element's QB_LF_E4M3 ..., in this order."""
        return LOWFLOAT_KINDS[self.kind], LOWFLOAT_ELEMENTS[self.element]

    @property
    def element_code(self) -> int:
        return LOWFLOAT_ELEMENTS[self.element]

    def outputs(
        self, numel: int, empty: Empty
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Fresh buffers for the packed codes, the block scales (float32 for FP8, else one E8M0
        or E4M3 byte) and NVFP4's float32 tensor scale (else None) of ``numel`` values."""
        codes = empty(packed_nbytes(numel, ELEMENTS[self.element][0]), torch.uint8)
        scale_type = torch.float32 if self.kind == "fp8" else torch.uint8
        scales = empty(num_buckets(numel, self.block), scale_type)
        return codes, scales, empty(1, torch.float32) if self.kind == "nvfp4" else None


class LowFloatEncoded(NamedTuple):
    """A compiled FP8 / MX / NVFP4 encode (``qbench.compress.lowfloat``): the packed codes, the
    block scales, NVFP4's tensor scale (else None) and, with error feedback, the new residual."""

    codes: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor | None
    residual: torch.Tensor | None


class Kernels(Protocol):
    """What a compiled path offers the compressors; arguments are checked by the caller. A
    decode returns fresh values when ``out`` is None, else adds them into ``out`` (``accumulate``)
    or writes them there (``accumulate=False``: a preallocated buffer, nothing read from it)."""

    def qsgd_encode(
        self, grad: torch.Tensor, fmt: QsgdFormat, *, key_hash: int, offset: int
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def qsgd_decode(
        self, levels: torch.Tensor, scales: torch.Tensor, numel: int, fmt: QsgdFormat, *,
        out: torch.Tensor | None, accumulate: bool = True,
    ) -> torch.Tensor: ...  # fmt: skip

    def onebit_encode(
        self, grad: torch.Tensor, residual: torch.Tensor | None, *, bucket_size: int, ef: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]: ...

    def onebit_decode(
        self, signs: torch.Tensor, means: torch.Tensor, numel: int, *, bucket_size: int,
        out: torch.Tensor | None, accumulate: bool = True,
    ) -> torch.Tensor: ...  # fmt: skip

    def lowfloat_encode(
        self, grad: torch.Tensor, residual: torch.Tensor | None, fmt: LowFloatFormat, *,
        ef: bool, key_hash: int, offset: int,
    ) -> LowFloatEncoded | None:  # fmt: skip
        """None when grad holds a NaN or an inf (the residual is then left as it was)."""
        ...

    def lowfloat_decode(
        self, codes: torch.Tensor, scales: torch.Tensor, tensor_scale: torch.Tensor | None,
        numel: int, fmt: LowFloatFormat, *, out: torch.Tensor | None, accumulate: bool = True,
    ) -> torch.Tensor: ...  # fmt: skip

    def units_divisors(self, amax: torch.Tensor, fmt: LowFloatFormat) -> torch.Tensor:
        """Each block's float32 divisor from ``amax``, the ranks' MAX of its max |x|."""
        ...

    def units_encode(
        self, x: torch.Tensor, divisors: torch.Tensor, fmt: LowFloatFormat, key_hash: int,
        offset: int, dtype: torch.dtype,
    ) -> torch.Tensor:  # fmt: skip
        """The integers (``dtype``) of ``x``'s values on its blocks' ``divisors``; draws keyed by
        ``key_hash`` and the element index ``offset`` + i."""
        ...

    def units_decode(
        self, sums: torch.Tensor, divisors: torch.Tensor, fmt: LowFloatFormat, world_size: int,
        out: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """The mean of ``world_size`` ranks' integers summed in ``sums``, written to ``out``
        (float32, contiguous, ``sums``' length) and returned."""
        ...


def check_payload(
    codec: str, numel: int, codes: tuple[str, torch.Tensor], scales: tuple[str, torch.Tensor],
    want: tuple[int, int],
) -> None:  # fmt: skip
    """Refuse a payload of (name, uint8 codes) and (name, float32 scales) whose counts are not
    ``want`` or whose buffers are on two devices: the kernels would read past its end."""
    (a, x), (b, y) = codes, scales
    got = (x.numel(), y.numel())
    if got != want or x.dtype != torch.uint8 or y.dtype != torch.float32:
        raise ValueError(
            f"{codec}: payload of {numel} values needs {want[0]} uint8 {a} and {want[1]} "
            f"float32 {b}, got {got[0]} {x.dtype} and {got[1]} {y.dtype}"
        )
    if x.device != y.device:
        raise ValueError(f"{codec}: {a} on {x.device} but {b} on {y.device}")


def decode_target(
    out: torch.Tensor | None, numel: int, accumulate: bool, empty: Empty
) -> tuple[torch.Tensor, bool]:
    """Where a decode writes and whether it adds there: ``out`` as asked, else a fresh buffer
    (written, since it holds nothing)."""
    if out is None:
        return empty(numel, torch.float32), False
    return out, accumulate


def feedback(
    residual: torch.Tensor | None, ef: bool, fresh: Callable[[], torch.Tensor]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Error feedback's residuals: the old one to read (contiguous; None: none yet) and the
    buffer for the new one, the old one itself when it is a plain buffer (updated in place, no
    new buffer per step), else ``fresh()``. (None, None) without error feedback: the kernels
    then read no residual."""
    if not ef:
        return None, None
    plain = residual is not None and residual.is_contiguous()
    new = residual if plain else fresh()
    return (residual.contiguous() if residual is not None else None), new


@contextlib.contextmanager
def restored(namespace: dict[str, Any], name: str) -> Iterator[None]:
    """Put ``namespace[name]`` back as it was when the block ends: a module's process-wide
    switch (``globals()``: the compressor backend, the CUDA emulation mode) set for one block."""
    previous = namespace[name]
    try:
        yield
    finally:
        namespace[name] = previous


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
