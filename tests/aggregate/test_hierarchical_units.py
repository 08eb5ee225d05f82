"""The hierarchical scheme's wiring, one process (tests/threadcomm.py): which rank owns which
part, what each level sends (by hand), what ``payload_bytes`` and ``metrics`` report, and the
levels a node of one rank or a single node skip. Gradients hold small integers, so every mean
over 2 or 4 ranks is exact in fp32 and a result can be compared bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from qbench.aggregate.allgather import AllGather
from qbench.aggregate.hierarchical import Hierarchical
from qbench.aggregate.reduce_broadcast import ReduceBroadcast
from qbench.compress import from_spec
from qbench.timing import PhaseTimer
from tests.threadcomm import ThreadComm, run_ranks

QSGD = {"name": "qsgd", "bits": 2, "bucket_size": 128}


def _ints(rank: int, n: int) -> torch.Tensor:
    """Integers in [-8, 8], other ones on every rank."""
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randint(-8, 9, (n,), generator=g).float()


def _mean(k: int, n: int) -> torch.Tensor:
    """The exact mean over k ranks (sums of small integers, halved: exact)."""
    return torch.stack([_ints(r, n) for r in range(k)]).double().mean(0).float()


def _timer() -> PhaseTimer:
    timer = PhaseTimer(torch.device("cpu"))
    timer.start()
    return timer


def _on_ranks(
    monkeypatch: pytest.MonkeyPatch, k: int, g: int, make: Callable[[ThreadComm], Hierarchical],
    steps: int = 1,
) -> list[dict[str, Any]]:  # fmt: skip
    """Per rank: the aggregator, metrics before the first call, and results and metrics of each
    of ``steps`` calls on the rank's integer gradient."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(g))

    def rank_main(comm: ThreadComm) -> dict[str, Any]:
        agg = make(comm)
        out: dict[str, Any] = {"agg": agg, "fresh": agg.metrics(), "out": [], "metrics": []}
        out["payload"] = []
        for step in range(steps):
            grad = _ints(comm.rank, agg.numel)
            out["out"].append(agg.aggregate(grad, step, _timer()).clone())
            out["metrics"].append(agg.metrics())
            out["payload"].append(agg.payload_bytes)
        return out

    return run_ranks(k, rank_main)


# -- 2 nodes x 2 ranks, lanes between nodes (the defaults) ---------------------------------------
def test_defaults_split_into_lanes_and_count_each_level_by_hand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """n = 1000 fp32 values, no compression: local rank i owns [500 i, 500 i + 500).
    inside (per call): the 500 values of the peer's part (2000 B), then the own 500 to the
    peer (2000 B): 4000 B. between (reduce-broadcast of 500 values over 2 nodes): the other
    owner's 250 values (1000 B), then the own 250 to the other (1000 B): 2000 B."""
    n = 1000
    res = _on_ranks(monkeypatch, 4, 2, lambda c: Hierarchical(c, from_spec("none"), n), steps=2)
    for rank, r in enumerate(res):
        agg = r["agg"]
        assert agg.offset == 0 and agg.tensors == (n,)
        assert agg.parts == [(0, 500), (500, 1000)]
        assert type(agg.cast).__name__ == "NoCompression"
        assert type(agg.between) is ReduceBroadcast
        lane = 500 * (rank % 2)
        assert (agg.between.numel, agg.between.offset) == (500, lane)
        assert r["fresh"] == {"bytes_intra": 0.0, "bytes_inter": 0.0}
        for step in range(2):  # the second call counts its own bytes only
            assert r["metrics"][step] == {"bytes_intra": 4000.0, "bytes_inter": 2000.0}
            # G x this rank's 500 values on the inter-node wire: the whole gradient, 4000 B
            assert r["payload"][step] == 2 * 500 * 4
            assert torch.equal(r["out"][step], _mean(4, n))


def test_an_offset_and_tensors_reach_every_level(monkeypatch: pytest.MonkeyPatch) -> None:
    """offset 7, tensors [300, 701], QSGD with buckets restarting at every tensor (128 values):
    the bucket starts are 0, 128, 256 | 300, 428, 556, ...; the lane boundary is the last
    start at or before 1001 / 2 = 500: 428 (a contiguous grid would give 384). Lane 0 is made
    of the whole first tensor and 128 values of the second; lane 1 of the 573 left."""
    n, comp = 1001, from_spec({**QSGD, "align": "tensor"}, seed=5)

    def make(c: ThreadComm) -> Hierarchical:
        return Hierarchical(c, comp, n, 7, tensors=[300, 701])

    res = _on_ranks(monkeypatch, 4, 2, make)
    for rank, r in enumerate(res):
        agg = r["agg"]
        assert agg.offset == 7 and agg.tensors == (300, 701)
        assert agg.parts == [(0, 428), (428, 1001)]
        lane = rank % 2
        assert agg.between.offset == 7 + (0, 428)[lane]
        assert agg.between.tensors == ((300, 128), (573,))[lane]
        assert agg.cast.seed == 5  # the intra codec keyed by the run's seed


def test_the_intra_codec_is_keyed_by_rank_and_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every intra-node encode names this rank and the slice's offset (a stochastic intra codec
    would otherwise draw alike on every rank of a node)."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    n = 64

    def rank_main(comm: ThreadComm) -> list[dict[str, Any]]:
        agg = Hierarchical(comm, from_spec("none", seed=3), n, 11, intra="bf16")
        calls: list[dict[str, Any]] = []
        encode = agg.cast.encode

        def spy(values: torch.Tensor, **kw: Any) -> Any:
            calls.append(kw)
            return encode(values, **kw)

        agg.cast.encode = spy  # type: ignore[method-assign]
        agg.aggregate(_ints(comm.rank, n), 0, _timer())
        return calls

    for rank, calls in enumerate(run_ranks(4, rank_main)):
        # phase 1: both parts; phase 3: the own part
        assert calls == [{"rank": rank, "offset": 11}] * 3


# -- the leader modes ---------------------------------------------------------------------------
@pytest.mark.parametrize(("inter", "kind"), [("reduce-broadcast", ReduceBroadcast),
                                             ("allgather", AllGather)])  # fmt: skip
def test_the_leader_owns_the_whole_vector(
    monkeypatch: pytest.MonkeyPatch, inter: str, kind: type
) -> None:
    """Local rank 0 owns [0, n), local rank 1 nothing: only leaders send between nodes, and
    the payload is G x the leader's encoded gradient on the leader, 0 on the other."""
    n = 1000

    def make(c: ThreadComm) -> Hierarchical:
        return Hierarchical(c, from_spec("none"), n, inter=inter)

    res = _on_ranks(monkeypatch, 4, 2, make)
    for rank, r in enumerate(res):
        agg = r["agg"]
        assert agg.parts == [(0, n), (n, n)]
        assert torch.equal(r["out"][0], _mean(4, n))
        # inside: the whole vector to the leader (4000 B) or back from it (4000 B)
        assert r["metrics"][0]["bytes_intra"] == 4000.0
        if rank % 2:
            assert agg.between is None
            assert r["metrics"][0]["bytes_inter"] == 0.0 and r["payload"][0] == 0
        else:
            assert type(agg.between) is kind
            # reduce-broadcast: half the vector out, the other half back (2000 + 2000 B);
            # allgather: the whole vector to the other leader (4000 B)
            assert r["metrics"][0]["bytes_inter"] == 4000.0
            # reduce-broadcast encodes every range (4000 B), allgather the vector (4000 B)
            assert r["payload"][0] == 2 * 4000


def test_a_rank_that_owns_nothing_sends_nothing_between_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A codec whose payload size depends on the data (adaptive) exchanges payload sizes
    first; the ranks that own no part must not run that exchange between nodes."""
    n = 256

    def make(c: ThreadComm) -> Hierarchical:
        return Hierarchical(c, from_spec("adaptive", seed=1), n, inter="reduce-broadcast")

    for rank, r in enumerate(_on_ranks(monkeypatch, 4, 2, make)):
        if rank % 2:
            assert r["agg"].between is None
            assert r["metrics"][0]["bytes_inter"] == 0.0 and r["payload"][0] == 0
        else:
            assert r["metrics"][0]["bytes_inter"] > 0


# -- levels of one member -----------------------------------------------------------------------
@pytest.mark.parametrize("g", [2, 4])
def test_one_node_compresses_nothing_between_nodes(monkeypatch: pytest.MonkeyPatch, g: int) -> None:
    """All ranks on one node: no inter-node phase, so a QSGD compressor never runs and the mean
    is exact. n = 1001 on QSGD's 128-value grid (8 buckets): G = 2 lanes of 512 and 489
    values; G = 4 lanes of 256, 256, 256 and 233. Inside: every other lane's values to their
    owner, then the own lane to each of the G - 1 peers, 4 B each; the payload is G x the
    own lane's fp32 bytes."""
    n = 1001
    lanes = {2: [(0, 512), (512, 1001)], 4: [(0, 256), (256, 512), (512, 768), (768, 1001)]}[g]

    def make(c: ThreadComm) -> Hierarchical:
        return Hierarchical(c, from_spec(QSGD, seed=2), n)

    res = _on_ranks(monkeypatch, g, g, make, steps=2)
    for rank, r in enumerate(res):
        a, b = lanes[rank]
        assert r["agg"].parts == lanes and r["agg"].between is None
        own = b - a
        for step in range(2):
            assert torch.equal(r["out"][step], _mean(g, n))
            assert r["metrics"][step] == {
                "bytes_intra": float(4 * (n - own) + 4 * own * (g - 1)),
                "bytes_inter": 0.0,
            }
            assert r["payload"][step] == g * 4 * own


def test_nodes_of_one_rank_cast_nothing_inside(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 nodes of 1 rank with a bf16 intra codec: no intra-node phase, so nothing is rounded to
    bf16: halves of odd integers times 2^-20 (beyond bf16's 8 bits) come back exact."""
    n = 300
    g0 = _ints(0, n) * 2.0**-20 + 1.0
    want = (g0 + (_ints(1, n) * 2.0**-20 + 1.0)) / 2

    def rank_main(comm: ThreadComm) -> tuple[torch.Tensor, dict[str, float]]:
        agg = Hierarchical(comm, from_spec("none"), n, intra="bf16")
        grad = _ints(comm.rank, n) * 2.0**-20 + 1.0
        return agg.aggregate(grad, 0, _timer()).clone(), agg.metrics()

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    for out, metrics in run_ranks(2, rank_main):
        assert torch.equal(out, want)
        assert metrics == {"bytes_intra": 0.0, "bytes_inter": 4.0 * n}  # 150 + 150 values


def test_one_rank_reports_its_whole_cast_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """K = 1: neither level runs; the payload is the gradient in the intra codec (bf16: 2 B a
    value) and the gradient comes back untouched."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    n = 301

    def rank_main(comm: ThreadComm) -> tuple[torch.Tensor, int, dict[str, float]]:
        agg = Hierarchical(comm, from_spec("none"), n, intra="bf16")
        out = agg.aggregate(_ints(0, n) + 0.125, 0, _timer())
        return out, agg.payload_bytes, agg.metrics()

    [(out, payload, metrics)] = run_ranks(1, rank_main)
    assert torch.equal(out, _ints(0, n) + 0.125)
    assert payload == 2 * n
    assert metrics == {"bytes_intra": 0.0, "bytes_inter": 0.0}


def test_the_node_mean_is_fp32_whatever_torchs_default_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner's accumulator is float32 by name: under a float64 default dtype the codecs
    (which take float32 only) still get float32 and the mean is exact."""
    n = 100
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        res = _on_ranks(monkeypatch, 2, 2, lambda c: Hierarchical(c, from_spec("none"), n))
    finally:
        torch.set_default_dtype(before)
    for r in res:
        assert r["out"][0].dtype == torch.float32
        assert torch.equal(r["out"][0], _mean(2, n))
