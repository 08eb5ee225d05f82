"""The integer allreduce's set-up and bookkeeping, one process (tests/threadcomm.py): the sum
dtype per backend and its refusal, the compressors it refuses, the bytes it reports, its chunks,
the plain fp32 path, the seed keying its draws, the order the pipeline waits in, and the
pipelined NVFP4 scales on the torch reference (qbench.aggregate.integer_allreduce)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from qbench.aggregate.integer_allreduce import IntegerAllReduce, sum_dtype
from qbench.comm.base import Pending
from qbench.compress import from_spec
from qbench.compress.kernels import native
from qbench.timing import PhaseTimer
from tests.threadcomm import ThreadComm, run_ranks


class MpiComm(ThreadComm):
    backend = "mpi"  # MPI sums int16 too (gloo does not)


def _timer() -> PhaseTimer:
    timer = PhaseTimer(torch.device("cpu"))
    timer.start()
    return timer


def _ints(rank: int, n: int) -> torch.Tensor:
    return torch.randint(-8, 9, (n,), generator=torch.Generator().manual_seed(7 + rank)).float()


# -- the sum's dtype ----------------------------------------------------------------------------
def test_the_narrowest_dtype_each_backend_sums() -> None:
    # 2 ranks x level 63 = 126 fits int8; x 127 = 254 does not: int16 on MPI, int32 on gloo
    assert sum_dtype(2, 63, "gloo") == torch.int8
    assert sum_dtype(2, 127, "mpi") == torch.int16
    assert sum_dtype(2, 127, "gloo") == torch.int32


def test_a_sum_past_int32_is_refused_saying_so() -> None:
    # 65536 x 32768 = 2^31 > 2^31 - 1
    with pytest.raises(ValueError) as e:
        sum_dtype(65536, 32768, "mpi")
    assert str(e.value) == (
        "integer-allreduce: 65536 ranks x level 32768 = 2147483648 overflows int32; "
        "use fewer qsgd bits"
    )


# -- construction -------------------------------------------------------------------------------
def test_a_compressor_without_integer_levels_is_refused_saying_why() -> None:
    comp = from_spec({"name": "qsgd", "bits": 4, "norm": "l2"})
    with pytest.raises(ValueError) as e:
        run_ranks(1, lambda comm: IntegerAllReduce(comm, comp, 100))
    assert str(e.value) == (
        "integer-allreduce cannot sum qsgd-4b-b512-l2: it scales buckets by the max |x| over "
        "ranks, got qsgd norm l2; use `norm: max`"
    )


def test_defaults_offset_and_tensors() -> None:
    comp = from_spec({"name": "qsgd", "bits": 2, "bucket_size": 128})

    def rank_main(comm: ThreadComm) -> tuple[IntegerAllReduce, IntegerAllReduce]:
        return IntegerAllReduce(comm, comp, 1000), IntegerAllReduce(
            comm, comp, 1000, 5, tensors=[400, 600]
        )

    [(plain, placed)] = run_ranks(1, rank_main)
    assert (plain.numel, plain.offset, plain.tensors) == (1000, 0, (1000,))
    assert plain.chunks == [(0, 1000)] and plain.overlapped is False  # overlap 1: one chunk
    assert (placed.numel, placed.offset, placed.tensors) == (1000, 5, (400, 600))
    with pytest.raises(ValueError) as e:
        run_ranks(1, lambda comm: IntegerAllReduce(comm, comp, 10, tensors=[3, 4]))
    assert str(e.value) == "integer-allreduce: tensors [3, 4] do not add up to 10"


@pytest.mark.parametrize(
    ("bits", "comm", "per_value"),
    [(2, ThreadComm, 1),  # 2 x level 1 fits int8
     (8, ThreadComm, 4),  # 2 x 127 = 254: int32 on gloo
     (8, MpiComm, 2)],  # int16 on MPI
)  # fmt: skip
def test_payload_is_the_integers_plus_a_float32_scale_per_bucket(
    bits: int, comm: type[ThreadComm], per_value: int
) -> None:
    """1000 values in buckets of 128: 8 buckets (the last one short), 4 B of scale each."""
    comp = from_spec({"name": "qsgd", "bits": bits, "bucket_size": 128})
    aggs = run_ranks(2, lambda c: IntegerAllReduce(c, comp, 1000), comm)
    for agg in aggs:
        assert agg.payload_bytes == 1000 * per_value + 8 * 4
        assert agg.dtype == {1: torch.int8, 2: torch.int16, 4: torch.int32}[per_value]


@pytest.mark.parametrize(
    ("n", "overlap", "chunks"),
    [(200, 4, [(0, 128), (128, 200)]),  # 2 buckets for 4 chunks: the empty ones dropped
     (1000, 2, [(0, 512), (512, 1000)])],  # 8 buckets: 4 and 4
)  # fmt: skip
def test_chunks_are_whole_buckets_and_never_empty(
    n: int, overlap: int, chunks: list[tuple[int, int]]
) -> None:
    comp = from_spec({"name": "qsgd", "bits": 2, "bucket_size": 128})
    [agg] = run_ranks(1, lambda c: IntegerAllReduce(c, comp, n, overlap=overlap))
    assert agg.chunks == chunks and agg.overlapped is True


# -- aggregate ----------------------------------------------------------------------------------
def test_no_compression_is_a_plain_fp32_mean() -> None:
    """compressor none: one fp32 allreduce, divided by K; the phases comm and decode."""
    n = 300
    want = (_ints(0, n) + _ints(1, n) + _ints(2, n) + _ints(3, n)) / 4  # quarters: exact

    def rank_main(comm: ThreadComm) -> tuple[torch.Tensor, dict[str, float], int]:
        agg = IntegerAllReduce(comm, from_spec("none"), n)
        timer = _timer()
        out = agg.aggregate(_ints(comm.rank, n), 0, timer)
        return out, timer.totals, agg.payload_bytes

    for out, totals, payload in run_ranks(4, rank_main):
        assert torch.equal(out, want)
        assert totals["comm"] > 0 and totals["decode"] > 0 and totals["encode"] == 0
        assert payload == 4 * n


def test_the_runs_seed_keys_the_draws() -> None:
    """QSGD 2-bit rounds 1000 values stochastically: another seed, other draws."""
    n = 1000
    grads = [torch.linspace(-1, 1, n) * (r + 1) / 3 for r in range(2)]

    def mean(seed: int) -> torch.Tensor:
        comp = from_spec({"name": "qsgd", "bits": 2, "bucket_size": 128}, seed=seed)

        def rank_main(comm: ThreadComm) -> torch.Tensor:
            agg = IntegerAllReduce(comm, comp, n)
            return agg.aggregate(grads[comm.rank].clone(), 3, _timer())

        return run_ranks(2, rank_main)[0]

    assert torch.equal(mean(1), mean(1))
    assert not torch.equal(mean(1), mean(2))


class WaitLog(ThreadComm):
    """Logs every non-blocking allreduce as issued and as waited on: (event, op, number)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.events: list[tuple[str, str, int]] = []
        self.count = {"max": 0, "sum": 0}

    def iallreduce_(self, tensor: torch.Tensor, op: str = "sum") -> Pending:
        i = self.count[op]
        self.count[op] += 1
        self.events.append(("issue", op, i))
        self.allreduce_(tensor, op)

        def wait() -> torch.Tensor:
            self.events.append(("wait", op, i))
            return tensor

        return Pending(wait)


def test_the_pipeline_finishes_chunks_in_the_order_it_issued_them() -> None:
    """3 chunks of QSGD (blockwise): chunk c+1's MAX goes out before chunk c's integers, and
    chunk c's integers are waited on (decoded) before chunk c+1's."""
    comp = from_spec({"name": "qsgd", "bits": 2, "bucket_size": 128})

    def rank_main(comm: ThreadComm) -> list[tuple[str, str, int]]:
        assert isinstance(comm, WaitLog)
        agg = IntegerAllReduce(comm, comp, 384, overlap=3)
        agg.aggregate(torch.linspace(-1, 1, 384), 0, _timer())
        return comm.events

    want = [
        ("issue", "max", 0), ("wait", "max", 0), ("issue", "max", 1), ("issue", "sum", 0),
        ("wait", "max", 1), ("issue", "max", 2), ("issue", "sum", 1), ("wait", "sum", 0),
        ("wait", "max", 2), ("issue", "sum", 2), ("wait", "sum", 1), ("wait", "sum", 2),
    ]  # fmt: skip
    for events in run_ranks(2, rank_main, WaitLog):
        assert events == want


def _nvfp4(overlap: int, grad: torch.Tensor) -> torch.Tensor:
    """One rank's NVFP4 integer allreduce of ``grad`` (one rank: the scale slicing is the
    same for any K), on the torch reference."""
    comp = from_spec("nvfp4:scope=global", seed=4)

    def rank_main(comm: ThreadComm) -> torch.Tensor:
        agg = IntegerAllReduce(comm, comp, grad.numel(), overlap=overlap)
        return agg.aggregate(grad.clone(), 2, _timer())

    with native.backend("torch"):
        return run_ranks(1, rank_main)[0]


@pytest.fixture(scope="module")
def nvfp4_warm() -> None:
    """The torch reference's first NVFP4 call builds its tables: done in set-up, so that the
    test's own time stays below the C-loop cases of test_integer_pipeline.py (mutmut runs a
    mutant's tests fastest first and stops at the first failure; a C loop reading past short
    scales crashes the process instead of failing)."""
    _nvfp4(1, torch.ones(16))


def test_pipelined_nvfp4_scales_on_the_torch_reference(nvfp4_warm: None) -> None:
    """NVFP4 agrees on every block's scale first; each chunk then takes exactly its blocks'
    scales (the torch reference checks their count, the C loops cannot). 16-value blocks:
    96 values in 3 chunks of 2 blocks each."""
    grad = torch.randn(96, generator=torch.Generator().manual_seed(0))
    assert torch.equal(_nvfp4(3, grad), _nvfp4(1, grad))
