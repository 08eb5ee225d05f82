"""The CUDA sources compiled by NVRTC to PTX, on a machine without a GPU or CuPy.

CuPy compiles kernels/*.cu with NVRTC on a GPU's first use; the emulator compiles the same
sources as C++ against a host shim. The two disagree on what exists without an #include: the
host compiler sees the C library (``int8_t``, ``memcpy``), NVRTC sees none of it. A kernel that
builds under the emulator can therefore fail on a lent device, which is how a `width == 1`
branch using ``int8_t`` cost a GPU check on 2026-11-29 (docs/results/gpu.md). NVRTC is a
compiler library, not a driver: with the ``nvidia-cuda-nvrtc`` wheel (the ``dev`` extra) the
sources compile here with the options CuPy is given, for the architectures we are lent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
import sys
from pathlib import Path

from qbench.compress.kernels.abi import kernel_dir

# sm_90: H100 / H200, the devices this project is lent; sm_80 keeps A100s honest.
ARCHITECTURES = ("compute_80", "compute_90")
INSTALL = "pip install nvidia-cuda-nvrtc (the dev extra: pip install -e '.[dev]')"
_ENTRY = re.compile(r"^\.(?:visible\s+)?\.entry\s+(\w+)\s*\(", re.M)


class CompileError(RuntimeError):
    """NVRTC refused a source; the message holds its log."""


def _candidates() -> list[str]:
    """Where the library may be: the pip wheels' folders (CUDA 13, then 12), then the system."""
    found = []
    for site in map(Path, sys.path):
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"):
            found += sorted(str(p) for p in (site / sub).glob("libnvrtc.so*"))
    system = ctypes.util.find_library("nvrtc")
    return found + ([system] if system else [])


@functools.cache
def library() -> ctypes.CDLL | None:
    """libnvrtc, or None when neither a wheel nor the system has it."""
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def why_unavailable() -> str:
    """Why the sources cannot be compiled here ('' when they can)."""
    return "" if library() is not None else f"NVRTC is not installed; {INSTALL}"


def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise CompileError(f"{what}: {lib.nvrtcGetErrorString(rc).decode()}")


def _read(lib: ctypes.CDLL, prog: ctypes.c_void_p, size_fn: str, get_fn: str) -> str:
    size = ctypes.c_size_t()
    _check(lib, getattr(lib, size_fn)(prog, ctypes.byref(size)), size_fn)
    buf = ctypes.create_string_buffer(size.value)
    _check(lib, getattr(lib, get_fn)(prog, buf), get_fn)
    return buf.value.decode(errors="replace")


def compile_ptx(source: str, arch: str) -> str:
    """One source of kernels/ as CuPy compiles it (same options, its includes), to PTX."""
    lib = library()
    if lib is None:
        raise CompileError(why_unavailable())
    from qbench.compress.kernels.cuda import NVRTC_OPTIONS

    kdir = kernel_dir()
    options = [*NVRTC_OPTIONS, f"-I{kdir}", f"--gpu-architecture={arch}"]
    argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
    prog = ctypes.c_void_p()
    code = (kdir / source).read_text().encode()
    _check(
        lib,
        lib.nvrtcCreateProgram(ctypes.byref(prog), code, source.encode(), 0, None, None),
        "nvrtcCreateProgram",
    )
    try:
        rc = lib.nvrtcCompileProgram(prog, len(options), argv)
        if rc:
            log = _read(lib, prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
            raise CompileError(f"{source} ({arch}) does not compile under NVRTC:\n{log}")
        return _read(lib, prog, "nvrtcGetPTXSize", "nvrtcGetPTX")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def entries(ptx: str) -> list[str]:
    """The kernels a PTX text defines."""
    return _ENTRY.findall(ptx)
