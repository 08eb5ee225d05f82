"""The CUDA path: kernels/qsgd.cu, onebit.cu and lowfloat.cu through CuPy, zero-copy with torch.

Sources are compiled with NVRTC on first use (``cupy.RawModule``), per device. Tensors cross
over through DLPack (no copy) and kernels run on torch's current stream of the tensor's device,
so they are ordered with the surrounding torch work without synchronising. Selected by
``qbench.compress.kernels.native.kernels_for`` for CUDA tensors; ``available()`` is False, with
``why_unavailable()`` saying why, when CuPy is missing (``pip install 'qbench[cuda12]'`` or
``'qbench[cuda13]'``), no GPU is visible or the sources do not compile. Under
``QBENCH_CUDA=emulate`` CPU tensors take this path too, run by
``qbench.compress.kernels.cuda.emulate``.

Why one module: every launch reads one set of launch settings (``_GROUP_THREADS``,
``_MAX_BLOCKS``, which the tests shrink to exercise the grid-stride loops) and goes through one
``_launch``; each codec's method lays out its arguments next to the others', in the order its
.cu kernels declare them. Which kernel a call takes is ``paths``.

The package's submodules: ``args`` (the arguments marshalled as CuPy passes them, checked
against the kernels' parameters), ``emulate`` (the kernels on CPU threads), ``racecheck`` (its
race detector), ``nvrtc`` (the sources compiled to PTX without a GPU), ``paths`` (the
one-pass vector kernels or the general ones) and ``coverage`` (the
kernels' line coverage under the emulator, ``python -m qbench.compress.kernels.cuda.coverage``).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np
import torch

from qbench.compress.kernels.abi import (
    Empty,
    Kernels,
    LowFloatEncoded,
    LowFloatFormat,
    QsgdFormat,
    decode_target,
    feedback,
    kernel_dir,
)
from qbench.compress.kernels.buckets import num_buckets, tree_width
from qbench.compress.kernels.cuda import emulate, paths

_SOURCES = {
    "qsgd.cu": (
        *("qb_qsgd_encode_vec", "qb_qsgd_decode_vec"),  # one pass, 16-byte accesses
        *("qb_qsgd_encode_fused", "qb_qsgd_scales", "qb_qsgd_quantize", "qb_qsgd_decode"),  # any
    ),
    "onebit.cu": (
        *("qb_onebit_encode_fused", "qb_onebit_decode_vec"),  # one pass, 16-byte accesses
        *("qb_onebit_means", "qb_onebit_signs", "qb_onebit_decode"),  # any bucket or alignment
    ),
    "lowfloat.cu": (
        *("qb_lf_amax", "qb_lf_encode_vec", "qb_lf_decode_vec"),  # one pass, 16-byte accesses
        *("qb_lf_maxes", "qb_lf_top", "qb_lf_scales", "qb_lf_quantize", "qb_lf_decode"),  # any
        *("qb_lf_units_divisors", "qb_lf_units_encode", "qb_lf_units_decode"),  # integer view
    ),
}
# What CuPy's RawModule is given beside -I kernels/ (nvrtc.py compiles with the same, no GPU).
NVRTC_OPTIONS = ("-std=c++17",)
_LF_RUN = 64  # kernels/lowfloat.cu: QB_LF_RUN, values per thread of qb_lf_maxes
_LF_AMAX_GROUPS = 4  # groups of 8 values per thread of qb_lf_amax: fewer blocks, fewer atomics
_GROUP_THREADS = 256  # threads per block of the one-thread-per-8-values kernels
_QSGD_BATCHES = 2  # batches of buckets per block of qb_qsgd_encode_vec: its setup paid once
_MAX_BLOCKS = 1 << 16  # grid-stride loops cover the rest
_NULL = np.uint64(0)

_lock = threading.Lock()
_functions: dict[tuple[int, str], Any] = {}  # (device index, kernel name) -> cupy RawKernel
_reason: str | None = None  # None: not tried yet; "" when available


def available() -> bool:
    """True when CuPy, a CUDA device and compiled kernels are there (compiles on first call)."""
    return not why_unavailable()


def why_unavailable() -> str:
    """Why the CUDA path cannot be used ('' when it can)."""
    global _reason
    with _lock:
        if _reason is None:
            try:
                _compile(torch.cuda.current_device() if torch.cuda.is_available() else 0)
                _reason = ""
            except Exception as exc:  # any failure means "use torch", with the reason kept
                _reason = f"{type(exc).__name__}: {exc}"
        return _reason


def _compile(device: int) -> None:
    try:
        import cupy
    except ImportError as exc:
        raise RuntimeError(
            f"CuPy is not installed ({exc}); install `qbench[cuda12]` or `qbench[cuda13]`"
        ) from None
    if not torch.cuda.is_available() or cupy.cuda.runtime.getDeviceCount() == 0:
        raise RuntimeError("no CUDA device is visible")
    kdir = kernel_dir()
    with cupy.cuda.Device(device):
        for source, names in _SOURCES.items():
            module = cupy.RawModule(
                code=(kdir / source).read_text(), options=(*NVRTC_OPTIONS, f"-I{kdir}")
            )
            for name in names:
                _functions[device, name] = module.get_function(name)


def _kernel(device: torch.device, name: str) -> Any:
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        if (index, name) not in _functions:
            _compile(index)
        return _functions[index, name]


def _launch(
    device: torch.device, name: str, blocks: int, threads: int, args: tuple[Any, ...], smem: int
) -> None:
    """Run one kernel on torch's current stream; tensors in args cross via DLPack.

    CPU tensors come here only under QBENCH_CUDA=emulate / racecheck: the same launch then runs
    in the emulator (qbench.compress.kernels.cuda.emulate), which reads the arguments as the
    driver would.
    """
    grid = max(1, min(blocks, _MAX_BLOCKS))
    if device.type == "cpu":
        emulate.launch(_SOURCES, name, grid, threads, args, smem)
        return
    import cupy

    fn = _kernel(device, name)
    stream = torch.cuda.current_stream(device)
    with cupy.cuda.Device(device.index), cupy.cuda.ExternalStream(stream.cuda_stream):
        converted = tuple(cupy.from_dlpack(a) if isinstance(a, torch.Tensor) else a for a in args)
        fn((grid,), (threads,), converted, shared_mem=smem)


def emulator_unavailable() -> str:
    """Why QBENCH_CUDA=emulate cannot run these kernels on CPU tensors ('' when it can)."""
    return emulate.why_unavailable(_SOURCES)


def emulator_build_error() -> str:
    """The emulator's compile error when a C++ compiler is here ('' when it builds, or when
    there is no compiler: then it is only unavailable)."""
    return emulate.build_error(_SOURCES)


def _bucket_threads(per_bucket: int) -> int:
    """Threads of a one-block-per-bucket kernel: a power of two in [32, 256]."""
    return min(max(tree_width(per_bucket), 32), 256)


def _group_blocks(numel: int) -> int:
    return -(-((numel + 7) // 8) // _GROUP_THREADS)


def _empty(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A buffer the kernels fill. On the CPU, where only the emulator runs them, its bytes are
    0xff: a byte no thread writes then fails the byte-for-byte tests, where torch.empty could
    hand back memory that still holds the right answer from the C loops' last call."""
    if device.type == "cpu":
        return torch.full((numel * dtype.itemsize,), 0xFF, dtype=torch.uint8).view(dtype)
    return torch.empty(numel, dtype=dtype, device=device)


def _on(device: torch.device) -> Empty:
    """The allocator of output buffers on ``device``."""
    return functools.partial(_empty, device=device)


def _i64(x: int) -> np.int64:
    return np.int64(x)


def _i32(x: int) -> np.int32:
    return np.int32(x)


def _u32(x: int) -> np.uint32:
    return np.uint32(x & 0xFFFFFFFF)


def _ptr_or_null(t: torch.Tensor | None) -> Any:
    return t if t is not None and t.numel() else _NULL


class _CUDAKernels:
    """CuPy launches of kernels/*.cu; inputs made contiguous, outputs allocated with torch."""

    def qsgd_encode(
        self, grad: torch.Tensor, fmt: QsgdFormat, *, key_hash: int, offset: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, n, dev = grad.contiguous(), grad.numel(), grad.device
        levels, scales = fmt.outputs(n, _on(dev))
        if n == 0:
            return levels, scales
        bucket, bits, layout = _qsgd(fmt)
        norm, key = _i32(fmt.norm_code), (_u32(key_hash), _u32(offset))
        args: tuple[Any, ...]
        lanes = paths.qsgd_lanes(fmt, x, levels)
        if lanes:  # one pass, 8 values per thread in registers, `lanes` threads per bucket
            threads, nb = max(lanes, _GROUP_THREADS), scales.numel()
            args = (x, _i64(n), bucket, _i64(nb), bits, layout, norm, *key)
            args += (_i32(lanes.bit_length() - 1), levels, scales)
            smem = 32 * threads if lanes > 32 else 0  # 2 x 4 floats per thread between warps
            blocks = -(-nb // (threads // lanes * _QSGD_BATCHES))
            _launch(dev, "qb_qsgd_encode_vec", blocks, threads, args, smem)
            return levels, scales
        if fmt.bucket_size % 8 == 0:  # groups of 8 codes stay inside a bucket: one fused pass
            threads = _bucket_threads(fmt.bucket_size // 8)
            args = (x, _i64(n), bucket, bits, layout, norm, *key, levels, scales)
            _launch(dev, "qb_qsgd_encode_fused", scales.numel(), threads, args, 4 * threads)
            return levels, scales
        threads = _bucket_threads(fmt.bucket_size)
        args = (x, _i64(n), bucket, norm, scales)
        _launch(dev, "qb_qsgd_scales", scales.numel(), threads, args, 4 * threads)
        args = (x, scales, _i64(n), bucket, bits, layout, *key, levels)
        _launch(dev, "qb_qsgd_quantize", _group_blocks(n), _GROUP_THREADS, args, 0)
        return levels, scales

    def qsgd_decode(
        self, levels: torch.Tensor, scales: torch.Tensor, numel: int, fmt: QsgdFormat, *,
        out: torch.Tensor | None, accumulate: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        out, add = decode_target(out, numel, accumulate, _on(scales.device))
        if numel:
            packed = levels.contiguous()
            args: tuple[Any, ...] = (packed, scales.contiguous(), _i64(numel))
            args += (*_qsgd(fmt), out, _i32(add))
            if fmt.bucket_size % 8 == 0 and paths.aligned(16, packed, out):  # 8 floats per thread
                name, smem = "qb_qsgd_decode_vec", 32 * _GROUP_THREADS
            else:
                name, smem = "qb_qsgd_decode", 0
            _launch(scales.device, name, _group_blocks(numel), _GROUP_THREADS, args, smem)
        return out

    def onebit_encode(
        self, grad: torch.Tensor, residual: torch.Tensor | None, *, bucket_size: int, ef: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        g, n, dev = grad.contiguous(), grad.numel(), grad.device
        signs = _empty((n + 7) // 8, torch.uint8, dev)
        means = _empty(2 * num_buckets(n, bucket_size), torch.float32, dev)
        residual, new_residual = feedback(residual, ef, lambda: _residual(n, g))
        if n == 0:
            return signs, means, new_residual
        r_in, r_out = _ptr_or_null(residual), _ptr_or_null(new_residual)
        args: tuple[Any, ...]
        if paths.onebit_one_pass(bucket_size, g, residual, new_residual):
            args = (g, r_in, r_out, _i32(ef), _i64(n), _i64(bucket_size), means, signs)
            per_block = _GROUP_THREADS * 8 // tree_width(bucket_size)  # a bucket: w / 8 lanes
            blocks = -(-(means.numel() // 2) // per_block)
            _launch(dev, "qb_onebit_encode_fused", blocks, _GROUP_THREADS, args, 0)
            return signs, means, new_residual
        threads = _bucket_threads(bucket_size)
        args = (g, r_in, _i32(ef), _i64(n), _i64(bucket_size), means)
        _launch(dev, "qb_onebit_means", means.numel() // 2, threads, args, 8 * threads)
        args = (g, r_in, r_out, _i32(ef), means, _i64(n), _i64(bucket_size), signs)
        _launch(dev, "qb_onebit_signs", _group_blocks(n), _GROUP_THREADS, args, 0)
        return signs, means, new_residual

    def onebit_decode(
        self, signs: torch.Tensor, means: torch.Tensor, numel: int, *, bucket_size: int,
        out: torch.Tensor | None, accumulate: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        out, add = decode_target(out, numel, accumulate, _on(means.device))
        if numel:
            args: tuple[Any, ...] = (signs.contiguous(), means.contiguous(), _i64(numel))
            args += (_i64(bucket_size), out, _i32(add))
            vec = bucket_size % 8 == 0 and out.data_ptr() % 16 == 0  # a group in one bucket
            name = "qb_onebit_decode_vec" if vec else "qb_onebit_decode"
            _launch(means.device, name, _group_blocks(numel), _GROUP_THREADS, args, 0)
        return out

    def lowfloat_encode(
        self, grad: torch.Tensor, residual: torch.Tensor | None, fmt: LowFloatFormat, *,
        ef: bool, key_hash: int, offset: int,
    ) -> LowFloatEncoded | None:  # fmt: skip
        g, n, dev = grad.contiguous(), grad.numel(), grad.device
        codes, scales, tensor_scale = fmt.outputs(n, _on(dev))
        # The new residual never overwrites the old one: a NaN or inf in grad is known only once
        # every launch has run (one sync, at the end), and must leave the caller's as it was.
        r_in = residual.contiguous() if ef and residual is not None else None
        enc = LowFloatEncoded(codes, scales, tensor_scale, _residual(n, g) if ef else None)
        if n == 0:
            if tensor_scale is not None:
                tensor_scale.fill_(1.0)  # blockscale: the scale of no values
            return enc
        words = torch.zeros(2, dtype=torch.int32, device=dev)  # NaN / inf seen; the largest max
        key = (_u32(key_hash), _u32(offset))
        shift = paths.lf_encode_shift(fmt.block, n)
        if shift is not None and paths.aligned(16, g, r_in, enc.residual, codes):
            _lf_encode_vec(g, r_in, fmt, shift, key, words, enc)
        else:
            _lf_encode_general(g, r_in, fmt, key, words, enc)
        return None if words[0].item() else enc  # the reference refuses a NaN or inf

    def lowfloat_decode(
        self, codes: torch.Tensor, scales: torch.Tensor, tensor_scale: torch.Tensor | None,
        numel: int, fmt: LowFloatFormat, *, out: torch.Tensor | None, accumulate: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        out, add = decode_target(out, numel, accumulate, _on(scales.device))
        if numel:
            c = codes.contiguous()
            ts = _ptr_or_null(tensor_scale.contiguous() if tensor_scale is not None else None)
            args: tuple[Any, ...] = (c, scales.contiguous(), ts, _i64(numel), *_enums(fmt))
            shift = paths.lf_decode_shift(fmt.block, numel)
            if shift is not None and paths.aligned(8, c) and paths.aligned(16, out):
                name, args = "qb_lf_decode_vec", (*args, _i32(shift), out, _i32(add))
            else:
                name, args = "qb_lf_decode", (*args, _i64(fmt.block), out, _i32(add))
            _launch(scales.device, name, _group_blocks(numel), _GROUP_THREADS, args, 0)
        return out

    def units_divisors(self, amax: torch.Tensor, fmt: LowFloatFormat) -> torch.Tensor:
        nblocks, dev = amax.numel(), amax.device
        divisors = _empty(nblocks, torch.float32, dev)
        if nblocks:
            maxes = amax.contiguous()
            words = torch.zeros(2, dtype=torch.int32, device=dev)  # words[1]: the largest
            if fmt.kind == "nvfp4":  # amax >= 0: its bits order as the floats
                threads = _bucket_threads(nblocks)
                args: tuple[Any, ...] = (maxes.view(torch.int32), _i64(nblocks), words)
                _launch(dev, "qb_lf_top", -(-nblocks // threads), threads, args, 4 * threads)
            args = (maxes, _i64(nblocks), *_enums(fmt), words, divisors)
            grid = -(-nblocks // _GROUP_THREADS)
            _launch(dev, "qb_lf_units_divisors", grid, _GROUP_THREADS, args, 0)
        return divisors

    def units_encode(
        self, x: torch.Tensor, divisors: torch.Tensor, fmt: LowFloatFormat, key_hash: int,
        offset: int, dtype: torch.dtype,
    ) -> torch.Tensor:  # fmt: skip
        n, dev = x.numel(), x.device
        q = _empty(n, dtype, dev)
        if n:
            args: tuple[Any, ...] = (x.contiguous(), divisors.contiguous(), _i64(n))
            args += (*_units(fmt), _u32(key_hash), _u32(offset), q, _i32(q.element_size()))
            grid = -(-n // _GROUP_THREADS)
            _launch(dev, "qb_lf_units_encode", grid, _GROUP_THREADS, args, 0)
        return q

    def units_decode(
        self, sums: torch.Tensor, divisors: torch.Tensor, fmt: LowFloatFormat, world_size: int,
        out: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        n = sums.numel()
        if n:
            element, block, _ = _units(fmt)
            width = _i32(sums.element_size())
            args: tuple[Any, ...] = (sums.contiguous(), width, divisors.contiguous(), _i64(n))
            args += (element, block, _i32(world_size), out)
            grid = -(-n // _GROUP_THREADS)
            _launch(out.device, "qb_lf_units_decode", grid, _GROUP_THREADS, args, 0)
        return out


# The formats' parameters as the .cu kernels declare them: CuPy passes each argument with its
# own type's size, so an int32 parameter needs an np.int32 (cuda.args).
def _qsgd(fmt: QsgdFormat) -> tuple[np.int64, np.int32, np.int32]:
    """bucket_size, bits, layout: what every qsgd.cu kernel takes, in this order."""
    bucket_size, bits, layout = fmt.codec
    return _i64(bucket_size), _i32(bits), _i32(layout)


def _enums(fmt: LowFloatFormat) -> tuple[np.int32, np.int32]:
    """The kind and the element, as lowfloat.cu numbers them."""
    kind, element = fmt.enums
    return _i32(kind), _i32(element)


def _lf_encode_vec(
    g: torch.Tensor, r_in: torch.Tensor | None, fmt: LowFloatFormat, shift: int,
    key: tuple[np.uint32, np.uint32], words: torch.Tensor, enc: LowFloatEncoded,
) -> None:  # fmt: skip
    """The fast path: qb_lf_encode_vec, one pass, after qb_lf_amax's pass for the tensor's max
    where a scale needs it (NVFP4's tensor scale, FP8's one scale per tensor)."""
    n, dev, r = g.numel(), g.device, _ptr_or_null(r_in)
    if fmt.kind == "nvfp4" or shift < 0:
        blocks = -(-n // (8 * _LF_AMAX_GROUPS * _GROUP_THREADS))
        smem = 4 * (_GROUP_THREADS // 32)  # an int32 per warp
        _launch(dev, "qb_lf_amax", blocks, _GROUP_THREADS, (g, r, _i64(n), words), smem)
    args: tuple[Any, ...] = (g, r, _ptr_or_null(enc.residual), _i64(n), *_enums(fmt))
    args += (_i32(shift), _i32(fmt.stochastic), *key, words, enc.scales)
    args += (_ptr_or_null(enc.tensor_scale),)
    _launch(dev, "qb_lf_encode_vec", _group_blocks(n), _GROUP_THREADS, (*args, enc.codes), 0)


def _lf_encode_general(
    g: torch.Tensor, r_in: torch.Tensor | None, fmt: LowFloatFormat,
    key: tuple[np.uint32, np.uint32], words: torch.Tensor, enc: LowFloatEncoded,
) -> None:  # fmt: skip
    """Any alignment and block: the block maxima (qb_lf_maxes), NVFP4's top (qb_lf_top), the
    scales (qb_lf_scales), then the codes and residuals (qb_lf_quantize)."""
    n, dev, nblocks, block = g.numel(), g.device, enc.scales.numel(), _i64(fmt.block)
    maxes = torch.zeros(nblocks, dtype=torch.int32, device=dev)
    r, ts = _ptr_or_null(r_in), _ptr_or_null(enc.tensor_scale)
    args: tuple[Any, ...] = (g, r, _i64(n), block, maxes, words)
    _launch(dev, "qb_lf_maxes", -(-n // _LF_RUN // _GROUP_THREADS), _GROUP_THREADS, args, 0)
    if fmt.kind == "nvfp4":
        threads = _bucket_threads(nblocks)
        args = (maxes, _i64(nblocks), words)
        _launch(dev, "qb_lf_top", -(-nblocks // threads), threads, args, 4 * threads)
    args = (maxes, _i64(nblocks), *_enums(fmt), words, enc.scales, ts)
    _launch(dev, "qb_lf_scales", -(-nblocks // _GROUP_THREADS), _GROUP_THREADS, args, 0)
    r_out, ef = _ptr_or_null(enc.residual), _i32(enc.residual is not None)
    args = (g, r, r_out, ef, _i64(n), *_enums(fmt), block, _i32(fmt.stochastic), *key)
    args += (enc.scales, ts, enc.codes)
    _launch(dev, "qb_lf_quantize", _group_blocks(n), _GROUP_THREADS, args, 0)


def _units(fmt: LowFloatFormat) -> tuple[np.int32, np.int64, np.int32]:
    """The integer view's kernel arguments: element, block, stochastic."""
    return _i32(fmt.element_code), _i64(fmt.block), _i32(fmt.stochastic)


def _residual(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A fresh buffer for error feedback's new residual, shaped as the gradient."""
    return _empty(numel, torch.float32, like.device).view(like.shape)


CUDA: Kernels = _CUDAKernels()
