"""Fixtures the emulated CUDA kernel tests share, a pytest plug-in of tests/conftest.py (none is
autouse: the GPU and NVRTC tests need neither compiler). A file opts in with
``pytestmark = pytest.mark.usefixtures("emulated_kernels", "restore_switches")``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from qbench.compress.kernels import native
from qbench.compress.kernels.cuda import emulate as cuda_emulate
from tests import compiled

Launch = tuple[str, int, int, int]
"""One emulated launch: (kernel, grid, block, shared memory bytes)."""


@pytest.fixture(scope="module")
def emulated_kernels() -> None:
    """Each skips without its compiler (C, C++); a broken build fails."""
    compiled.require_c_kernels()
    compiled.require_emulator()


@pytest.fixture
def restore_switches() -> Iterator[None]:
    """The compiled-kernel backend and the emulator's mode as the test found them."""
    backend, mode = native._backend, cuda_emulate._mode
    yield
    native._backend, cuda_emulate._mode = backend, mode


@pytest.fixture
def _spied(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Launch], list[str]]:
    """Every emulated launch of the test as it happens: (launches, their kernels' names)."""
    seen: list[Launch] = []
    names: list[str] = []
    real = cuda_emulate.launch

    def spy(
        sources: cuda_emulate.Sources, name: str, grid: int, block: int, args: Sequence[object],
        smem: int,
    ) -> None:  # fmt: skip
        seen.append((name, grid, block, smem))
        names.append(name)
        real(sources, name, grid, block, args, smem)

    monkeypatch.setattr(cuda_emulate, "launch", spy)
    return seen, names


@pytest.fixture
def launches(_spied: tuple[list[Launch], list[str]]) -> list[Launch]:
    """The test's emulated launches, in order."""
    return _spied[0]


@pytest.fixture
def launched(_spied: tuple[list[Launch], list[str]]) -> list[str]:
    """The names of the test's emulated launches, in order."""
    return _spied[1]
