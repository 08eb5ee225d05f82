"""Compiled compressor kernels: which path runs, and the CPU one (C, loaded with ctypes).

Paths, chosen per tensor by :func:`kernels_for`:

- CPU tensor: ``kernels/cpu/qbench_cpu.c``, built on first use with the system C compiler
  (``$CC``, else ``cc`` / ``gcc`` / ``clang``) into a cache directory keyed by a hash of the
  sources, the compiler, its flags and the CPU (``-march=native``), then loaded with ctypes;
- CUDA tensor: ``kernels/*.cu`` through CuPy, see ``qbench.compress.kernels.cuda``; CPU tensors too
  when ``QBENCH_CUDA=emulate`` (or ``racecheck``) asks for the CUDA kernels on CPU threads;
- otherwise, or when the backend is ``torch``: the torch reference in each compressor module.

All paths produce byte-identical payloads (tests/compress/kernels/test_native.py,
tests/compress/kernels/cuda/test_cuda.py). A path that cannot be built falls back silently to
torch; :func:`why_unavailable` says why, and
:func:`build_error` tells a broken build (a compiler is here) from a missing compiler.

The backend is ``auto`` (compiled when possible), ``torch`` (always the reference) or
``native`` (compiled or an error): :func:`set_backend`, the :func:`backend` context manager, or
the environment variable ``QBENCH_COMPRESS_BACKEND``.

Threads: each C function runs on one thread; a call on a large tensor is cut into ranges of
whole buckets that run at once on a small pool (ctypes releases the GIL during a foreign call),
as many as torch's intra-op threads (:func:`threads`). The draws are keyed by element index and
each range is passed its offset, so the bytes do not depend on the thread count.

Why one module: the ctypes signatures, the build flags and ABI_VERSION must change together
with ``kernels/cpu/qbench_cpu.c``; split apart they drift. Only the integer view's three C calls
live apart, in ``units`` (this package's one submodule).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import os
import platform
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from qbench.catalog import toolchain
from qbench.compress.base import Key
from qbench.compress.kernels import rng
from qbench.compress.kernels.abi import (
    Kernels,
    LowFloatEncoded,
    LowFloatFormat,
    QsgdFormat,
    cache_dir,
    decode_target,
    feedback,
    kernel_dir,
    restored,
)
from qbench.compress.kernels.buckets import levels_nbytes, num_buckets
from qbench.compress.kernels.native import units
from qbench.errors import UserError

BACKENDS = ("auto", "torch", "native")
ENV_BACKEND = toolchain.BACKEND_ENV

ABI_VERSION = 3  # kernels/cpu/qbench_cpu.c: QB_ABI_VERSION
_SOURCES = ("cpu/qbench_cpu.c", "qsgd_math.h", "qbench_rng.h", "lowfloat_math.h")
# -ffp-contract=off: one rounding per operation, as torch does (no fused multiply-add);
# never -ffast-math, which also flushes denormals process-wide.
_FLAGS = ("-O3", "-funroll-loops", "-std=c99", "-ffp-contract=off", "-fno-math-errno")
_SHARED = ("-fPIC", "-shared")
_ARCH_FLAGS = ("-march=native",)  # built where it runs; dropped if the compiler refuses it


# -- backend switch -------------------------------------------------------------------------------
_backend: str | None = None  # None: read the environment variable on first use


def set_backend(name: str) -> None:
    """Select ``auto``, ``torch`` or ``native`` for every compressor of this process."""
    global _backend
    _backend = _check_backend(name, "set_backend")


def get_backend() -> str:
    if _backend is None:
        return _check_backend(os.environ.get(ENV_BACKEND, "auto"), ENV_BACKEND)
    return _backend


@contextlib.contextmanager
def backend(name: str) -> Iterator[None]:
    """Run a block with another backend (tests, benchmarks), restoring the previous one."""
    with restored(globals(), "_backend"):
        set_backend(name)
        yield


def _check_backend(name: str, where: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{where}: backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    return name


def kernels_for(t: torch.Tensor) -> Kernels | None:
    """The compiled path for tensors on t's device, or None for the torch reference.

    Raises RuntimeError when the backend is ``native`` and no compiled path can run.
    """
    mode = get_backend()
    if mode == "torch":
        return None
    kernels, reason = _compiled_for(t.device)
    if kernels is None and mode == "native":
        raise RuntimeError(f"compressor backend 'native': no compiled path on {t.device}: {reason}")
    return kernels


def can_accumulate(out: torch.Tensor, numel: int, device: torch.device) -> bool:
    """True when the kernels can add a decode into ``out``, or write it there (else the generic
    ``out.add_`` / ``out.copy_``)."""
    plain = out.dtype == torch.float32 and out.is_contiguous() and out.device == device
    return plain and out.dim() == 1 and out.numel() == numel


def decode_kernels(t: torch.Tensor, out: torch.Tensor | None, numel: int) -> Kernels | None:
    """The compiled path that decodes a payload holding ``t`` (fresh values when ``out`` is
    None), or None for the codec's generic decode: the torch reference, or an ``out`` the kernels
    cannot take."""
    kernels = kernels_for(t)
    if kernels is None or not (out is None or can_accumulate(out, numel, t.device)):
        return None
    return kernels


def _compiled_for(device: torch.device) -> tuple[Kernels | None, str]:
    if device.type == "cpu":
        emulated = _emulated_cuda()
        if emulated is not None:
            return emulated, ""
        return (CPU, "") if available() else (None, why_unavailable())
    if device.type == "cuda":
        from qbench.compress.kernels import cuda

        return (cuda.CUDA, "") if cuda.available() else (None, cuda.why_unavailable())
    return None, f"no compiled kernels for {device.type} tensors"


def _emulated_cuda() -> Kernels | None:
    """The CUDA path for CPU tensors when QBENCH_CUDA asks for the emulator, else None."""
    from qbench.compress.kernels import cuda
    from qbench.compress.kernels.cuda import emulate

    wanted = emulate.mode()
    if wanted == "off":
        return None
    reason = cuda.emulator_unavailable()
    if reason:  # asked for by name: running the C loops instead would hide that
        env = emulate.ENV_CUDA
        fix = (
            f"{toolchain.CXX_FIX}, or unset"
            if toolchain.find_cxx_compiler() is None
            else "or unset"
        )
        raise UserError(f"{env}={wanted}: {reason}; {fix} {env}")
    return cuda.CUDA


# -- sources and build ----------------------------------------------------------------------------
def _compiler() -> str:
    found = toolchain.find_c_compiler()
    if found is None:
        raise RuntimeError(f"no C compiler found ($CC, {', '.join(toolchain.C_COMPILERS)})")
    return found


def _cpu_signature() -> str:
    """The CPU the code is built for: -march=native code may not run on another one."""
    lines = []
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith(("model name", "flags", "Features")):
                lines.append(line)
            if len(lines) >= 2:
                break
    return platform.machine() + "".join(lines)


def _library_name(kdir: Path, cc: str) -> str:
    """The cached library's file name: a hash of everything the binary depends on."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    digest = hashlib.sha256()
    for source in _SOURCES:
        digest.update((kdir / source).read_bytes())
    for text in (cc, version, *_FLAGS, *_SHARED, *_ARCH_FLAGS, _cpu_signature(), str(ABI_VERSION)):
        digest.update(text.encode())
    return f"qbench_cpu-{digest.hexdigest()[:20]}.so"


def _build(kdir: Path) -> Path:
    """Compile the CPU library unless the cache has it; returns the .so path."""
    cc = _compiler()
    name = _library_name(kdir, cc)
    for directory in (cache_dir(), Path(tempfile.gettempdir()) / f"qbench-{os.getuid()}"):
        if (directory / name).is_file():
            return directory / name
        with contextlib.suppress(OSError):  # a read-only cache: build in a private temp dir
            directory.mkdir(parents=True, exist_ok=True)
            if os.access(directory, os.W_OK):
                break
    target = directory / name
    errors = []
    for arch in (_ARCH_FLAGS, ()):
        # A private temporary name, then an atomic rename: ranks building at once never see a
        # half-written library, and the last rename wins with identical content.
        fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp", dir=target.parent)
        os.close(fd)
        cmd = [cc, *_FLAGS, *_SHARED, *arch, "-I", str(kdir), str(kdir / _SOURCES[0]), "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode == 0:
            os.replace(tmp, target)
            return target
        os.unlink(tmp)
        errors.append(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()[-500:]}")
    raise RuntimeError("; ".join(errors))


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_reason: str | None = None  # None: not tried yet


def _load() -> ctypes.CDLL | None:
    global _lib, _reason
    with _lock:
        if _reason is None:
            try:
                _lib = _open(_build(kernel_dir()))
                _reason = ""
            except Exception as exc:  # any failure means "use torch", with the reason kept
                _lib, _reason = None, f"{type(exc).__name__}: {exc}"
        return _lib


def _open(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    p, i64, i32, u32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint32
    signatures = {
        "qb_qsgd_encode": [p, i64, i64, i32, i32, i32, u32, u32, p, p],
        "qb_qsgd_decode": [p, p, i64, i64, i32, i32, p, i32],
        "qb_onebit_encode": [p, p, p, i32, i64, i64, p, p],
        "qb_onebit_decode": [p, p, i64, i64, p, i32],
        "qb_abi_version": [],
        "qb_uniform_fill": [u32, u32, i64, p],
        "qb_int_quantize": [p, p, i64, i64, i32, u32, u32, p, i32],
        "qb_int_dequantize": [p, p, i64, i64, i32, p, i32],
        "qb_bucket_absmax": [p, i64, i64, p],
        "qb_lowfloat_encode": [p, p, p, i32, i64, i32, i32, i64, i32, u32, u32, p, p, p],
        "qb_lowfloat_decode": [p, p, p, i64, i32, i32, i64, p, i32],
        "qb_lf_units_divisors": [p, i64, i32, i32, p],
        "qb_lf_units_encode": [p, p, i64, i32, i64, i32, u32, u32, p, i32],
        "qb_lf_units_decode": [p, i32, p, i64, i32, i64, i32, p],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = None if name == "qb_uniform_fill" else ctypes.c_int
    if lib.qb_abi_version() != ABI_VERSION:
        raise RuntimeError(f"{path}: ABI {lib.qb_abi_version()}, expected {ABI_VERSION}")
    _check_draws(lib)
    return lib


def _check_draws(lib: ctypes.CDLL) -> None:
    """The C hash must reproduce rng.uniform_reference bit for bit (offsets past 2^32 included)."""
    key = Key(seed=3, step=11, rank=2, stream=1)
    for offset in (0, 2**32 - 5):
        want = rng.uniform_reference(key, offset, 64)
        got = torch.empty(64)
        lib.qb_uniform_fill(rng.key_hash(key), offset & rng.MASK32, 64, got.data_ptr())
        if not torch.equal(got, want):
            raise RuntimeError("the C counter hash differs from qbench.compress.kernels.rng")


def uniform_fill() -> Callable[[int, int, int, int], None] | None:
    """The C fill of draws.uniform (key_hash, offset mod 2^32, numel, out pointer), or None
    when the torch backend is forced or the library cannot be built."""
    if get_backend() == "torch":
        return None
    lib = _load()
    return None if lib is None else lib.qb_uniform_fill


def int_kernels() -> ctypes.CDLL | None:
    """The library for integer-allreduce's quantize / dequantize loops, or None (torch path)."""
    return None if get_backend() == "torch" else _load()


def available() -> bool:
    """True when the CPU library is built and loaded (builds it on the first call)."""
    return _load() is not None


def why_unavailable() -> str:
    """Why the CPU library cannot be used ('' when it can)."""
    _load()
    return _reason or ""


def build_error() -> str:
    """Why the CPU library failed although a C compiler is here: a compile or load error, or
    the load-time check of the random hash ('' when it works, and when there is no compiler,
    the one reason that is not a bug in the kernels or the toolchain). qbench falls back to
    torch either way; the test suite fails on this one (tests/compiled.py)."""
    reason = why_unavailable()
    return reason if reason and toolchain.find_c_compiler() is not None else ""


# -- the CPU path ---------------------------------------------------------------------------------
def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None and t.numel() else None


_NONFINITE = 3  # qb_lowfloat_encode: a gradient value is NaN or inf


def _check(rc: int, what: str) -> None:
    if rc:
        raise RuntimeError(
            f"{what}: native kernel failed with code {rc} (1: bad arguments, 2: OOM)"
        )


# Buffers this large are always fresh mmap()s in glibc (above its largest malloc threshold): every
# 4 KiB page of one faults on first write, which costs more than the decode itself, so they are
# marked for transparent huge pages (2 MiB, one fault each). Advice only: failures are ignored.
_HUGE_MIN_BYTES = 32 << 20
_MADV_HUGEPAGE = 14  # <sys/mman.h>
_libc: ctypes.CDLL | None = None


def _empty(numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    t = torch.empty(numel, dtype=dtype)
    nbytes = t.numel() * t.element_size()
    if nbytes >= _HUGE_MIN_BYTES and sys.platform == "linux":
        global _libc
        _libc = _libc or ctypes.CDLL(None, use_errno=True)
        start = (t.data_ptr() + 4095) & ~4095
        _libc.madvise(
            ctypes.c_void_p(start), ctypes.c_size_t(t.data_ptr() + nbytes - start), _MADV_HUGEPAGE
        )
    return t


# -- threads --------------------------------------------------------------------------------------
SPLIT_MIN = 1 << 18
"""Values per range below which a call is not cut: less work than that does not pay for handing
it to another thread (tests lower it to split small tensors)."""
RANGES_PER_THREAD = 4
"""Ranges per thread, taken from a shared queue: a thread slowed by other work (torch's OpenMP
threads spin for milliseconds after a parallel op) takes fewer, instead of holding up the call."""

_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid that made it, pool)
_pool_lock = threading.Lock()


def threads() -> int:
    """Threads one kernel call may use: torch's intra-op threads. A CPU rank runs with one
    (``qbench.run.lifecycle.connect``: one rank per core), ``qbench bench kernels --threads N``
    with N, a plain process with torch's default (the cores)."""
    return torch.get_num_threads()


def _ranges(n: int, align: int) -> list[tuple[int, int]]:
    """[start, stop) ranges cutting n values, starts multiples of ``align``: one when n is small
    or one thread is asked for."""
    t = threads()
    parts = min(t * RANGES_PER_THREAD, n // SPLIT_MIN)
    if t == 1 or parts <= 1:
        return [(0, n)]
    step = -(-n // (parts * align)) * align
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def _executor() -> ThreadPoolExecutor:
    """The pool, made on first use; a forked child makes its own (the parent's threads are not
    in it)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(thread_name_prefix="qbench-kernels"))
        return _pool[1]


def _split(n: int, align: int, call: Callable[[int, int], int], what: str) -> None:
    """call(start, stop) for each range of n values, on this thread and threads() - 1 of the
    pool, each taking the next range until none is left; checks every return code."""
    ranges = _ranges(n, align)
    if len(ranges) == 1:  # the common case: no queue, no pool
        _check(call(0, n), what)
        return
    todo: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
    for r in ranges:
        todo.put(r)

    def drain() -> list[int]:
        codes = []
        while not todo.empty():
            with contextlib.suppress(queue.Empty):  # another thread took the last one
                codes.append(call(*todo.get_nowait()))
        return codes

    helpers = min(threads(), todo.qsize()) - 1
    futures = [_executor().submit(drain) for _ in range(helpers)]
    for rc in drain() + [rc for f in futures for rc in f.result()]:
        _check(rc, what)


def _align(bucket_size: int) -> int:
    """Range starts on bucket boundaries that are also byte boundaries of the packed codes."""
    return math.lcm(bucket_size, 8)


def _at(address: int | None, offset: int) -> int | None:
    """A buffer's address plus a byte offset; None (no buffer) stays None."""
    return None if address is None else address + offset


class _CPUKernels:
    """ctypes calls into kernels/cpu/qbench_cpu.c; inputs made contiguous, outputs allocated
    (a decode's ``out``: added into, or written when ``accumulate`` is False). QSGD and 1bitSGD
    split large tensors over :func:`threads`; FP8 / MX / NVFP4 stay on one thread (NVFP4's tensor
    scale and the error feedback's all-or-nothing NaN check span the whole tensor)."""

    def qsgd_encode(
        self, grad: torch.Tensor, fmt: QsgdFormat, *, key_hash: int, offset: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lib, x, n = _library(), grad.contiguous(), grad.numel()
        levels, scales = fmt.outputs(n, _empty)
        bits, bucket_size = fmt.bits, fmt.bucket_size
        codec = (*fmt.codec, fmt.norm_code, key_hash)  # the same for every range
        x_at, levels_at, scales_at = x.data_ptr(), levels.data_ptr(), scales.data_ptr()

        def encode(a: int, b: int) -> int:  # values [a, b): their draws, codes and scales
            outs = (levels_at + levels_nbytes(a, bits), scales_at + 4 * (a // bucket_size))
            offset_a = (offset + a) & rng.MASK32
            return int(lib.qb_qsgd_encode(x_at + 4 * a, b - a, *codec, offset_a, *outs))

        _split(n, _align(bucket_size), encode, "qsgd encode")
        return levels, scales

    def qsgd_decode(
        self, levels: torch.Tensor, scales: torch.Tensor, numel: int, fmt: QsgdFormat, *,
        out: torch.Tensor | None, accumulate: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        lib, (out, add) = _library(), decode_target(out, numel, accumulate, _empty)
        lv, sc, out_at = levels.contiguous(), scales.contiguous(), out.data_ptr()
        bits, bucket_size, codec = fmt.bits, fmt.bucket_size, fmt.codec

        def decode(a: int, b: int) -> int:
            ins = (lv.data_ptr() + levels_nbytes(a, bits), sc.data_ptr() + 4 * (a // bucket_size))
            return int(lib.qb_qsgd_decode(*ins, b - a, *codec, out_at + 4 * a, int(add)))

        _split(numel, _align(bucket_size), decode, "qsgd decode")
        return out

    def onebit_encode(
        self, grad: torch.Tensor, residual: torch.Tensor | None, *, bucket_size: int, ef: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        lib, g, n = _library(), grad.contiguous(), grad.numel()
        signs = _empty((n + 7) // 8, torch.uint8)
        means = _empty(2 * num_buckets(n, bucket_size))
        residual, new_residual = feedback(residual, ef, lambda: _empty(n))
        r_in, r_out = _ptr(residual), _ptr(new_residual)

        def encode(a: int, b: int) -> int:  # values [a, b): their residuals, signs and means
            ins = (g.data_ptr() + 4 * a, _at(r_in, 4 * a), _at(r_out, 4 * a), int(ef))
            outs = (signs.data_ptr() + a // 8, means.data_ptr() + 8 * (a // bucket_size))
            return int(lib.qb_onebit_encode(*ins, b - a, bucket_size, *outs))

        _split(n, _align(bucket_size), encode, "onebit encode")
        return signs, means, new_residual

    def onebit_decode(
        self, signs: torch.Tensor, means: torch.Tensor, numel: int, *, bucket_size: int,
        out: torch.Tensor | None, accumulate: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        lib, (out, add) = _library(), decode_target(out, numel, accumulate, _empty)
        s, m, out_at = signs.contiguous(), means.contiguous(), out.data_ptr()

        def decode(a: int, b: int) -> int:
            ins = (s.data_ptr() + a // 8, m.data_ptr() + 8 * (a // bucket_size))
            return int(lib.qb_onebit_decode(*ins, b - a, bucket_size, out_at + 4 * a, int(add)))

        _split(numel, _align(bucket_size), decode, "onebit decode")
        return out

    def lowfloat_encode(
        self, grad: torch.Tensor, residual: torch.Tensor | None, fmt: LowFloatFormat, *,
        ef: bool, key_hash: int, offset: int,
    ) -> LowFloatEncoded | None:  # fmt: skip
        lib, g, n = _library(), grad.contiguous(), grad.numel()
        codes, scales, tensor_scale = fmt.outputs(n, _empty)
        residual, new_residual = feedback(residual, ef, lambda: _empty(n))
        rc = lib.qb_lowfloat_encode(
            *(_ptr(g), _ptr(residual), _ptr(new_residual), int(ef), n, *fmt.enums, fmt.block),
            *(int(fmt.stochastic), key_hash, offset & rng.MASK32),
            *(_ptr(codes), _ptr(scales), _ptr(tensor_scale)),
        )
        if rc == _NONFINITE:
            return None
        _check(rc, f"{fmt.kind} encode")
        return LowFloatEncoded(codes, scales, tensor_scale, new_residual)

    def lowfloat_decode(
        self, codes: torch.Tensor, scales: torch.Tensor, tensor_scale: torch.Tensor | None,
        numel: int, fmt: LowFloatFormat, *, out: torch.Tensor | None, accumulate: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        lib, (out, add) = _library(), decode_target(out, numel, accumulate, _empty)
        c, s = codes.contiguous(), scales.contiguous()
        t = tensor_scale.contiguous() if tensor_scale is not None else None
        args = (numel, *fmt.enums, fmt.block)
        rc = lib.qb_lowfloat_decode(_ptr(c), _ptr(s), _ptr(t), *args, _ptr(out), int(add))
        _check(rc, f"{fmt.kind} decode")
        return out

    def units_divisors(self, amax: torch.Tensor, fmt: LowFloatFormat) -> torch.Tensor:
        return units.divisors(_library(), amax, fmt)

    def units_encode(
        self, x: torch.Tensor, divisors: torch.Tensor, fmt: LowFloatFormat, key_hash: int,
        offset: int, dtype: torch.dtype,
    ) -> torch.Tensor:  # fmt: skip
        return units.encode(_library(), x, divisors, fmt, key_hash, offset, dtype)

    def units_decode(
        self, sums: torch.Tensor, divisors: torch.Tensor, fmt: LowFloatFormat, world_size: int,
        out: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        return units.decode(_library(), sums, divisors, fmt, world_size, out)


def _library() -> ctypes.CDLL:
    lib = _load()
    if lib is None:
        raise RuntimeError(f"native CPU kernels unavailable: {why_unavailable()}")
    return lib


CPU: Kernels = _CPUKernels()
