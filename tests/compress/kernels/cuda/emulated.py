"""Fixtures the emulated CUDA kernel tests share, a pytest plug-in of tests/conftest.py (none is
autouse: the GPU and NVRTC tests need neither compiler). A file opts in with
``pytestmark = pytest.mark.usefixtures("emulated_kernels", "restore_switches")``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch

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


Tensors = list[torch.Tensor]


def _bytes(t: torch.Tensor, nan_as_one: bool) -> torch.Tensor:
    t = t.detach().contiguous()
    if nan_as_one and t.dtype == torch.float32:
        t = torch.where(t.isnan(), torch.tensor(float("nan")), t)
    return t.view(torch.uint8)


def assert_same(want: Tensors, got: Tensors, where: object, nan_as_one: bool = False) -> None:
    """The same tensors: dtype, shape and bytes, -0.0 included. ``nan_as_one``: every float NaN
    as one pattern (a GPU returns its one canonical NaN where x86 keeps a payload, so NaN
    results of the C loops and the kernels differ in their bits)."""
    assert len(want) == len(got), where
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (where, i)
        assert torch.equal(_bytes(g, nan_as_one), _bytes(w, nan_as_one)), (where, i)


def three_ways(
    fn: Callable[..., Tensors], *args: Any, mode: str = "emulate", nan_as_one: bool = False
) -> tuple[Tensors, Tensors]:
    """fn(*args)'s tensors from the torch reference and the C kernels, which must agree (the
    C ones returned), and from the emulated CUDA kernels under ``mode``, for the caller to
    compare with C's."""
    with native.backend("torch"):
        ref = fn(*args)
    with native.backend("native"):
        with cuda_emulate.emulation("off"):
            want = fn(*args)
        with cuda_emulate.emulation(mode):
            got = fn(*args)
    assert_same(ref, want, ("torch vs C", args[0] if args else None), nan_as_one)
    return want, got
