"""Whether the tests of the compiled kernels run here: skip without a compiler, fail when broken.

qbench falls back to torch when its kernels cannot be built; its tests must not. The kernel
tests skip only where the compiler they need is not installed, saying so and how to get one.
Where it is installed, kernels that do not compile or load, or that fail the load-time check
of the C random hash against ``qbench.compress.kernels.rng``, fail every such test with the
compiler's or the check's message. The rule itself is qbench's (``native.build_error``,
``cuda.emulator_build_error``); ``tests/compress/kernels/test_broken_kernels.py`` plants broken
sources and requires these tests to fail.

Called from a module's autouse fixture, so a failure is reported per test, not as a collection
error that would stop the rest of the suite.
"""

from __future__ import annotations

from typing import NoReturn

import pytest

from qbench.catalog import toolchain
from qbench.compress.kernels import cuda, native


def require_c_kernels() -> None:
    """The C kernels (kernels/cpu/qbench_cpu.c) are built and loaded, or the test skips (no C
    compiler) or fails (a compiler, and an error)."""
    if not native.why_unavailable():
        return
    broken = native.build_error()
    if broken:
        pytest.fail(f"the C kernels do not build or load: {broken}", pytrace=False)
    pytest.skip(f"no C compiler for the C kernels: {toolchain.FIX}")


def require_emulator() -> None:
    """The CUDA kernels build in the emulator (kernels/*.cu as host C++), or the test skips (no
    C++ compiler) or fails (a compiler, and an error)."""
    if not cuda.emulator_unavailable():
        return
    broken = cuda.emulator_build_error()
    if broken:
        pytest.fail(f"the emulated CUDA kernels do not build: {broken}", pytrace=False)
    no_compiler(cuda.emulator_unavailable())


def emulator_failed(exc: Exception) -> NoReturn:
    """A build of the emulator raised ``exc``: skip without a C++ compiler, else fail with it."""
    if toolchain.find_cxx_compiler() is not None:  # the rule of cuda.emulate.build_error
        pytest.fail(f"the CUDA emulator does not build: {exc}", pytrace=False)
    no_compiler(str(exc))


def no_compiler(reason: str) -> NoReturn:
    pytest.skip(f"{reason}; {toolchain.CXX_FIX}")
