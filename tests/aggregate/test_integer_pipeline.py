"""The pipelined integer allreduce (``overlap: C``): the same result as one allreduce, bit for
bit, and, for codecs whose block scales are blockwise, each chunk's scale MAX issued in the
pipeline ahead of the previous chunk's integers (qbench.aggregate.integer_allreduce)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qbench import aggregate
from qbench.compress import from_spec
from qbench.timing import PhaseTimer
from tests.threadcomm import ThreadComm, run_ranks

K, N = 3, 5000  # N: not a multiple of any block, so the last chunk is short


class RecordingComm(ThreadComm):
    """Records every allreduce as issued: ("max" | "sum", numel). (The base class's
    iallreduce_ completes at once through allreduce_, so issue order is what is recorded.)"""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.issued: list[tuple[str, int]] = []

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        self.issued.append((op, tensor.numel()))
        super().allreduce_(tensor, op)


def _grad(rank: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(rank)) * (rank + 1)


def _aggregate(spec: str, overlap: int) -> tuple[list[torch.Tensor], list[list[tuple[str, int]]]]:
    def rank_main(comm: ThreadComm) -> tuple[torch.Tensor, list[tuple[str, int]]]:
        assert isinstance(comm, RecordingComm)
        agg = aggregate.build(
            "integer-allreduce", comm, from_spec(spec), N, params={"overlap": overlap}
        )
        g = _grad(comm.rank)
        timer = PhaseTimer(torch.device("cpu"))
        timer.start()
        return agg.aggregate(g, 7, timer), comm.issued

    out = run_ranks(K, rank_main, RecordingComm)
    return [o for o, _ in out], [i for _, i in out]


SPECS = ["qsgd:bits=4,bucket_size=128", "mx", "fp8:block_size=128", "nvfp4:scope=global"]


@pytest.mark.parametrize("spec", SPECS)
def test_pipelined_equals_one_allreduce_bit_for_bit(spec: str) -> None:
    one, _ = _aggregate(spec, 1)
    piped, _ = _aggregate(spec, 4)
    for a, b in zip(one, piped, strict=True):
        assert torch.equal(a, b)
    assert all(torch.equal(one[0], o) for o in one[1:])  # every rank holds the same mean


@pytest.mark.parametrize("spec", SPECS[:3])
def test_blockwise_scales_travel_in_the_pipeline(spec: str) -> None:
    """Chunk c+1's MAX goes out before chunk c's integers; only chunk 0's is up front."""
    _, issued = _aggregate(spec, 4)
    ops = [op for op, _ in issued[0]]
    assert ops == ["max", "max", "sum", "max", "sum", "max", "sum", "sum"]
    assert all(i == issued[0] for i in issued)  # every rank issues in the same order
    maxes = [n for op, n in issued[0] if op == "max"]
    sums = [n for op, n in issued[0] if op == "sum"]
    assert sum(sums) == N and len(maxes) == 4 and sum(maxes) < N  # a statistic per block


def test_nvfp4_agrees_on_every_scale_first() -> None:
    """Its tensor scale is the max over all blocks: one MAX before the first chunk."""
    _, issued = _aggregate("nvfp4:scope=global", 4)
    assert [op for op, _ in issued[0]] == ["max", "sum", "sum", "sum", "sum"]


# -- against an fp64 numpy reference (issue 44 item 9) -------------------------------------------
# What the mean must be, from the formats' definitions alone: each block's scale d from the
# ranks' shared max |x| (QSGD s / L; MX 2^(floor(log2 max) - emax); FP8 max / 448 in float32);
# each rank's value x / d onto the format's grid, saturating at its largest value: the nearer
# neighbour (either at a tie), or with stochastic rounding one of the two neighbours; the mean is
# d times the sum of the grid values over K.
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
E4M3 = np.unique(np.concatenate([
    np.arange(8) / 8 * 2.0**-6,  # subnormals
    *[(1 + np.arange(8) / 8) * 2.0 ** (e - 7) for e in range(1, 16)],
]))[:-1]  # fmt: skip  # e = 15, m = 7 is NaN: 448 is the largest


def _qsgd(amax: np.ndarray) -> np.ndarray:
    return amax.astype(np.float64) / 7  # 4 bits: L = 7 levels


def _mx(amax: np.ndarray) -> np.ndarray:
    return 2.0 ** (np.floor(np.log2(amax.astype(np.float64))) - 2)  # E2M1: emax 2


def _fp8(amax: np.ndarray) -> np.ndarray:
    return amax / np.float32(448)  # float32, as the wire's scale


REFERENCES = {  # spec: (block, scale of the block's shared max, grid, stochastic)
    "qsgd:bits=4,bucket_size=128": (128, _qsgd, np.arange(8.0), True),
    "mx": (32, _mx, E2M1, False),
    "mx:rounding=stochastic": (32, _mx, E2M1, True),
    "fp8:block_size=128": (128, _fp8, E4M3, False),
    "fp8:block_size=128,rounding=stochastic": (128, _fp8, E4M3, True),
}


def _neighbours(y: np.ndarray, grid: np.ndarray, stochastic: bool) -> tuple[np.ndarray, ...]:
    """(low, high): the grid values each y may round to, signed, low <= high."""
    a = np.minimum(np.abs(y), grid[-1])  # saturate
    i = np.searchsorted(grid, a, side="right") - 1
    lo, hi = grid[i], grid[np.minimum(i + 1, grid.size - 1)]
    hi = np.where(lo == a, lo, hi)
    if not stochastic:  # the nearer one; both at a tie
        lo, hi = np.where(hi - a < a - lo, hi, lo), np.where(a - lo < hi - a, lo, hi)
    sign = np.sign(y)
    return np.minimum(sign * lo, sign * hi), np.maximum(sign * lo, sign * hi)


@pytest.mark.parametrize("overlap", [1, 4])
@pytest.mark.parametrize("spec", list(REFERENCES))
def test_the_mean_is_the_formats_grid_sum_on_shared_scales(spec: str, overlap: int) -> None:
    block, scale, grid, stochastic = REFERENCES[spec]
    got = _aggregate(spec, overlap)[0][0].numpy().astype(np.float64)
    xs = np.stack([_grad(r).numpy() for r in range(K)])  # float32
    pad = -N % block
    amax = np.abs(np.pad(xs, ((0, 0), (0, pad)))).reshape(K, -1, block).max(axis=(0, 2))
    d = np.repeat(scale(amax), block)[:N]
    y = xs / d  # FP8: float32 / float32, as the codec divides; QSGD and MX in fp64
    lo, hi = _neighbours(y.astype(np.float64), grid, stochastic)
    d = d.astype(np.float64)
    low, high = d * lo.sum(0) / K, d * hi.sum(0) / K
    tol = 2.0**-21 * (np.abs(high) + d * grid[1])  # float32 decode
    assert np.all(got >= low - tol) and np.all(got <= high + tol)
    units = got * K / (d * grid[1])  # a sum of grid values: whole units of the grid's first
    assert np.all(np.abs(units - np.rint(units)) <= 2.0**-20 * np.abs(units) + 1e-3)
    if stochastic:  # it drew: not every value at its nearer neighbour
        nearest = d * _neighbours(y.astype(np.float64), grid, False)[0].sum(0) / K
        assert np.mean(np.abs(got - nearest) > tol) > 0.1
    else:
        assert np.mean(low == high) > 0.99  # ties are rare: nearly every value is pinned
