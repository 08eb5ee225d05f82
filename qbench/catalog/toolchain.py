"""What the compiled kernels need from this machine (no torch): the C compilers tried, in
order, and which compressors and schemes call the kernels. ``qbench.compress.kernels.native`` builds
with the compiler found here; the sweep's pre-flight (``qbench.launch.preflight``) checks for
it before any run starts, since a run without one silently measures the slower torch codecs.
The CUDA emulator (``qbench.compress.kernels.cuda.emulate``) builds kernels/*.cu with the C++
compiler found here.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any

C_COMPILERS = ("cc", "gcc", "clang")
"""Tried in this order after ``$CC``."""
BACKEND_ENV = "QBENCH_COMPRESS_BACKEND"
"""``auto`` (compiled when possible), ``torch`` (always the reference) or ``native``."""
COMPILED_COMPRESSORS = frozenset({"qsgd", "onebit", "fixedpoint", "adaptive"})
"""Codecs whose CPU encode / decode or random draws run in ``kernels/cpu/qbench_cpu.c``."""
COMPILED_SCHEMES = frozenset({"integer-allreduce"})
"""Schemes with loops of their own in the C library (quantize / dequantize)."""
CXX_COMPILERS = ("c++", "g++", "clang++")
"""Tried in this order after ``$CXX``, for the CUDA emulator."""
FIX = (
    "install a C compiler (Debian: apt-get install gcc), or set QBENCH_COMPRESS_BACKEND=torch "
    "to measure the slower torch codecs instead"
)
CXX_FIX = "install a C++ compiler (Debian: apt-get install g++), or set CXX to one"


def find_c_compiler(env: Mapping[str, str] | None = None) -> str | None:
    """The compiler the kernels are built with: ``$CC``, else the first of C_COMPILERS on
    PATH; None when there is none."""
    return _first_found(env, "CC", C_COMPILERS)


def find_cxx_compiler(env: Mapping[str, str] | None = None) -> str | None:
    """The C++ compiler of the CUDA emulator: ``$CXX``, else the first of CXX_COMPILERS on
    PATH; None when there is none."""
    return _first_found(env, "CXX", CXX_COMPILERS)


def _first_found(
    env: Mapping[str, str] | None, variable: str, names: tuple[str, ...]
) -> str | None:
    env = os.environ if env is None else env
    for name in [env.get(variable, ""), *names]:
        path = shutil.which(name, path=env.get("PATH")) if name else None
        if path:
            return path
    return None


def uses_compiled(
    compressors: list[dict[str, Any]], scheme: str, params: Mapping[str, Any]
) -> bool:
    """Whether a run with these compressors (its own and the layer overrides), scheme and
    scheme parameters calls the compiled kernels on CPU tensors. Compressors inside the
    scheme's parameters count too (async-ps ``down: {name: qsgd}``)."""
    nested = [v for v in params.values() if isinstance(v, dict) and "name" in v]
    names = {str(c.get("name")) for c in (*compressors, *nested)}
    return bool(names & COMPILED_COMPRESSORS) or scheme in COMPILED_SCHEMES


def compiled_wanted(env: Mapping[str, str] | None = None) -> bool:
    """False when the torch reference is forced (no compiler needed)."""
    env = os.environ if env is None else env
    return env.get(BACKEND_ENV, "auto") != "torch"
