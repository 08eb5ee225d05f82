"""The pipelined integer allreduce (``overlap: C``): the same result as one allreduce, bit for
bit, and, for codecs whose block scales are blockwise, each chunk's scale MAX issued in the
pipeline ahead of the previous chunk's integers (qbench.aggregate.integer_allreduce)."""

from __future__ import annotations

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


def _aggregate(spec: str, overlap: int) -> tuple[list[torch.Tensor], list[list[tuple[str, int]]]]:
    def rank_main(comm: ThreadComm) -> tuple[torch.Tensor, list[tuple[str, int]]]:
        assert isinstance(comm, RecordingComm)
        agg = aggregate.build(
            "integer-allreduce", comm, from_spec(spec), N, params={"overlap": overlap}
        )
        g = torch.randn(N, generator=torch.Generator().manual_seed(comm.rank)) * (comm.rank + 1)
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
