"""A broken kernel fails the suite; only a missing compiler skips (tests/compiled.py).

Each case copies kernels/ into a temporary directory, plants one bug there, points qbench at the
copy (``QBENCH_KERNELS``, with a build cache of its own: ``QBENCH_CACHE``, ``TMPDIR``) and runs a
few kernel tests in a pytest subprocess, which must fail with the compiler's or the load-time
check's message; without any compiler the same tests must skip, saying so. Before
tests/compiled.py the broken cases skipped as "unavailable" and the suite passed (issue 31: a
wrong hash constant gave 282 passed, 140 skipped, exit 0).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qbench.compress.kernels import native
from qbench.launch import machine
from tests.paths import ROOT

# A few tests of each kind, by node id (a renamed one makes pytest exit 4, failing the case)
NATIVE = ["tests/compress/kernels/test_native.py::test_qsgd_strided_input"]
INTEGER = ["tests/compress/kernels/test_integer_native.py::test_native_floor_on_exact_grid_points"]
EMULATED = [
    "tests/compress/kernels/cuda/test_cuda_emulate.py"
    "::test_onebit_nan_inf_and_a_strided_residual_match_c"
]
RACECHECK = ["tests/compress/kernels/cuda/test_cuda_racecheck.py::test_a_correct_reduction_passes"]

# (file under kernels/, text there, its broken replacement, the tests run, what they must print:
# None for the compiler's diagnostic at the planted line, "file:line:")
BUGS = {
    # one multiplier of the C hash: compiles, and the draws check at load time must catch it
    "hash-constant": (
        "qbench_rng.h", "x *= 0x7feb352dU;", "x *= 0x7feb352eU;", [*NATIVE, *INTEGER],
        "the C counter hash differs from qbench.compress.kernels.rng",
    ),
    # a missing semicolon in each compiled source: the compiler's error, file and line
    "c-syntax": (
        "cpu/qbench_cpu.c", "{ return QB_ABI_VERSION; }", "{ return QB_ABI_VERSION }", NATIVE,
        None,
    ),
    "cuda-syntax": (
        "onebit.cu", "if (!ef) return grad[e];", "if (!ef) return grad[e]", EMULATED,
        None,
    ),
    "emulator-runtime-syntax": (
        "emulate/cuda_emu_runtime.cpp", "emu::kernels().size());", "emu::kernels().size())",
        RACECHECK, None,
    ),
}  # fmt: skip


def _run(tests: list[str], tmp: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in env.items() if k not in ("QBENCH_CUDA", "QBENCH_COMPRESS_BACKEND")}
    env |= {"QBENCH_CACHE": str(tmp / "cache"), "TMPDIR": str(tmp / "tmp")}
    (tmp / "tmp").mkdir(exist_ok=True)
    argv = ["-m", "pytest", *tests, "-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0"]
    argv += ["-rfEs", "-o", "addopts=", "--basetemp", str(tmp / "pytest")]
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=560
    )  # fmt: skip


def _planted(tmp: Path, source: str, text: str, broken: str) -> tuple[Path, str]:
    """The copy of kernels/ with the bug, and the bug's place as a compiler names it."""
    kernels = tmp / "kernels"
    shutil.copytree(native.kernel_dir(), kernels, ignore=shutil.ignore_patterns("build"))
    path = kernels / source
    original = path.read_text()
    assert original.count(text) == 1, f"{source} no longer holds {text!r} once: update this test"
    path.write_text(original.replace(text, broken))
    line = original[: original.index(text)].count("\n") + 1
    return kernels, f"{path.name}:{line}:"


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS)
def test_a_planted_bug_fails_the_kernel_tests(bug: str, tmp_path: Path) -> None:
    source, text, broken, tests, message = BUGS[bug]
    kernels, place = _planted(tmp_path, source, text, broken)
    proc = _run(tests, tmp_path, {**os.environ, "QBENCH_KERNELS": str(kernels)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]  # 1: tests failed (not 0, not a usage error)
    assert (message or place) in out, out[-4000:]
    assert " passed" not in out.splitlines()[-1] and " skipped" not in out.splitlines()[-1]


@pytest.mark.slow
def test_without_a_compiler_the_kernel_tests_skip_saying_so(tmp_path: Path) -> None:
    empty = tmp_path / "bin"  # PATH: no cc, gcc, clang, c++, g++ or clang++
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "CC": "", "CXX": ""}
    proc = _run([*NATIVE, *RACECHECK], tmp_path, env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "no C compiler for the C kernels: install a C compiler" in out, out[-4000:]
    assert "no C++ compiler found" in out and "apt-get install g++" in out, out[-4000:]
    assert " skipped" in out.splitlines()[-1] and " passed" not in out.splitlines()[-1]


def test_info_tells_a_broken_build_from_a_missing_compiler(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_reason", "RuntimeError: `cc ...` failed: qsgd.c:1: error")
    monkeypatch.setenv("CC", "/bin/true")  # a compiler is here
    assert native.build_error() == "RuntimeError: `cc ...` failed: qsgd.c:1: error"
    assert machine._native_status() == (
        "broken: RuntimeError: `cc ...` failed: qsgd.c:1: error (torch fallback)"
    )
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler anywhere
    assert native.build_error() == ""
    assert machine._native_status() == (
        "unavailable: RuntimeError: `cc ...` failed: qsgd.c:1: error (torch fallback)"
    )
