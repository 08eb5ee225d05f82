"""qbench's FSDP collectives in one process (qbench.fsdp.collectives), without FSDP or a process
group: the account (CommLog), torch's collectives timed (their calls recorded by stand-ins for
torch.distributed's functions and works), and the compressed reduce-scatter and all-gather on
K = 3 ranks as threads (tests/threadcomm.py) with a stand-in codec that sends fp32 values as
they are, records every encode and takes 1 ms per encode and decode (codec time to account).
Shards hold small integers, so every sum and mean is exact and compared bit for bit."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, cast

import pytest
import torch
import torch.distributed as dist

from qbench.compress.base import Payload
from qbench.fsdp import collectives as c
from tests.threadcomm import ThreadComm, run_ranks

K, N = 3, 4  # ranks, values per shard
TICK = 0.001  # the stand-in codec's time per encode and per decode
EARLIER = 5.0  # seconds an account already holds when a collective adds to it


class _Group:
    """FSDP's process group as the collectives read it: its size."""

    def __init__(self, k: int) -> None:
        self.k = k

    def size(self) -> int:
        return self.k


def _group(k: int) -> Any:
    return cast(Any, _Group(k))


def _log() -> c.CommLog:
    """An account begun (every iteration begins one)."""
    log = c.CommLog()
    log.begin(0)
    return log


class Codec:
    """fp32 values on the wire; with ``fixed`` False each payload also carries rank + 1 pad
    bytes, so that payload sizes differ between ranks and must be exchanged."""

    def __init__(self, fixed: bool = True) -> None:
        self.fixed_size = fixed
        self.calls: list[dict[str, Any]] = []

    def encode(self, x: torch.Tensor, **kw: Any) -> Payload:
        self.calls.append(kw)
        time.sleep(TICK)
        buffers = {"values": x.clone()}
        if not self.fixed_size:
            buffers["pad"] = torch.zeros(kw["rank"] + 1, dtype=torch.uint8)
        return Payload(numel=x.numel(), buffers=buffers)

    def from_wire(self, wire: torch.Tensor, n: int) -> Payload:
        return Payload(numel=n, buffers={"values": wire[: 4 * n].clone().view(torch.float32)})

    def decode(self, payload: Payload, out: torch.Tensor | None = None) -> torch.Tensor:
        time.sleep(TICK)
        values = payload.buffers["values"]
        return values.clone() if out is None else out.add_(values)


# -- CommLog ------------------------------------------------------------------------------------
def test_begin_resets_the_account() -> None:
    log = c.CommLog()
    log.held, log.codec, log.payload_bytes, log.found = 2.0, 3.0, 4, ("b", "NaN")
    log.spans, log.sent = {"all_gather": [(0.0, 1.0)]}, {"all_gather": 5}
    log.begin(7)
    assert (log.step, log.held, log.payload_bytes, log.codec, log.found) == (7, 0.0, 0, 0.0, None)
    assert log.spans == {"all_gather": [], "reduce_scatter": []}
    assert log.sent == {"all_gather": 0, "reduce_scatter": 0}


def test_spans_union_per_kind_and_overall() -> None:
    log = c.CommLog()  # no begin: a kind's list is made on its first span
    log.span("all_gather", 0.0, 2.0)
    log.span("all_gather", 1.0, 3.0)
    log.span("reduce_scatter", 2.5, 4.0)
    assert log.spans == {"all_gather": [(0.0, 2.0), (1.0, 3.0)], "reduce_scatter": [(2.5, 4.0)]}
    assert log.total("all_gather") == 3.0  # [0, 3]
    assert log.total("reduce_scatter") == 1.5
    assert log.total() == 4.0  # [0, 4], the overlaps once
    assert log.total("other") == 0.0


def test_bytes_sent_per_kind_and_overall() -> None:
    log = c.CommLog()
    log.sent = {"all_gather": 100, "reduce_scatter": 20}
    assert log.bytes_sent() == 120
    assert log.bytes_sent("all_gather") == 100
    assert log.bytes_sent("reduce_scatter") == 20


def test_check_zeroes_a_nonfinite_block_and_keeps_the_first() -> None:
    log = c.CommLog()
    log.begin(0)
    fine = torch.ones(3)
    log.check(fine, "b0")
    assert log.found is None and torch.equal(fine, torch.ones(3))
    nan = torch.tensor([1.0, float("nan"), 2.0])
    log.check(nan, "b1")
    assert log.found == ("b1", "NaN") and torch.equal(nan, torch.zeros(3))
    inf = torch.tensor([float("inf"), 1.0])
    log.check(inf, "b2")
    assert log.found == ("b1", "NaN") and torch.equal(inf, torch.zeros(2))


def test_buffers_are_allocated_as_fsdp_asks() -> None:
    cpu = torch.device("cpu")
    t = c.TimedAllGather(c.CommLog()).allocate((2, 3), dtype=torch.float16, device=cpu)
    assert t.shape == (2, 3) and t.dtype == torch.float16


# -- torch's collectives, timed -----------------------------------------------------------------
class _NoFuture:
    """gloo's reduce-scatter work: no future; the end of its wait is the end of the span. Its
    wait takes a tick and is recorded with its arguments."""

    def __init__(self) -> None:
        self.waits: list[tuple[Any, ...]] = []

    def get_future(self) -> Any:
        raise RuntimeError("no future")

    def wait(self, *args: Any) -> bool:
        self.waits.append(args)
        time.sleep(TICK)
        return True

    def is_completed(self) -> bool:
        return bool(self.waits)


class _WithFuture(_NoFuture):
    """A work whose future completes when it is waited on (as a finished collective's)."""

    def __init__(self) -> None:
        super().__init__()
        self.future: torch.futures.Future[Any] = torch.futures.Future()

    def get_future(self) -> torch.futures.Future[Any]:
        return self.future

    def wait(self, *args: Any) -> bool:
        super().wait(*args)
        if not self.future.done():
            self.future.set_result(None)
        return True


class _Record:
    """Stands in for torch.distributed's collective: records its arguments, returns ``work``."""

    def __init__(self, work: Any) -> None:
        self.work = work
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kw: Any) -> Any:
        self.calls.append((args, kw))
        return self.work


@pytest.mark.parametrize("work", [_NoFuture, _WithFuture])
def test_timed_all_gather_passes_fsdps_tensors_and_times_one_span(
    monkeypatch: pytest.MonkeyPatch, work: type
) -> None:
    """Synchronous by default: torch's all-gather is issued asynchronously and waited on here;
    one span whether the end comes from the future or from the wait."""
    gather = _Record(work())
    monkeypatch.setattr(c, "_GATHER", gather)
    log, group = c.CommLog(), _group(4)
    log.begin(0)
    log.held = EARLIER
    out, inp = torch.empty(40), torch.ones(10)
    before = time.perf_counter()
    assert c.TimedAllGather(log)(out, inp, group) is None
    after = time.perf_counter()
    [(args, kw)] = gather.calls
    assert args[0] is out and args[1] is inp and len(args) == 2
    assert kw == {"group": group, "async_op": True} and kw["async_op"] is True
    [(start, end)] = log.spans["all_gather"]
    assert before <= start <= end <= after
    # held from the call to the wait's return; the span ends there or at the future's callback
    assert end - start - 1e-9 <= log.held - EARLIER <= after - before + 1e-9
    # 10 fp32 values to each of 3 peers; a second call adds as much
    assert log.sent["all_gather"] == 120
    c.TimedAllGather(log)(out, inp, group)
    assert log.sent["all_gather"] == 240 and len(log.spans["all_gather"]) == 2


@pytest.mark.parametrize("work", [_NoFuture, _WithFuture])
def test_an_async_collective_is_charged_its_wait_and_spans_to_its_completion(
    monkeypatch: pytest.MonkeyPatch, work: type
) -> None:
    """FSDP asks for async: the call holds the thread for its own time only and returns a work
    whose waits (with or without a timeout, passed on) are charged too. The span ends when the
    future completes, or, without a future, when FSDP's wait returns; once."""
    inner = work()
    monkeypatch.setattr(c, "_GATHER", _Record(inner))
    log = c.CommLog()
    log.begin(0)
    log.held = EARLIER
    before = time.perf_counter()
    held = c.TimedAllGather(log)(torch.empty(8), torch.ones(4), _group(2), async_op=True)
    after = time.perf_counter()
    assert isinstance(held, c._HeldWork) and held.inner is inner
    assert EARLIER <= log.held <= EARLIER + (after - before) + 1e-9
    assert held.is_completed() is False
    if work is _WithFuture:
        assert held.get_future() is inner.future
        inner.future.set_result(None)  # it completes before FSDP waits: its span ends now
        assert len(log.spans["all_gather"]) == 1
    else:
        assert log.spans["all_gather"] == []
    charged = log.held
    start = time.perf_counter()
    assert held.wait() is True
    end = time.perf_counter()
    assert inner.waits == [()]
    assert TICK <= log.held - charged <= end - start + 1e-9
    [(first, last)] = log.spans["all_gather"]
    assert before <= first <= last <= end
    assert held.is_completed() is True
    assert held.wait(timedelta(seconds=5)) is True
    assert inner.waits == [(), (timedelta(seconds=5),)]
    assert len(log.spans["all_gather"]) == 1  # a second wait adds no span


@pytest.mark.parametrize("work", [_NoFuture, _WithFuture])
def test_timed_reduce_scatter_passes_fsdps_tensors_and_op(
    monkeypatch: pytest.MonkeyPatch, work: type
) -> None:
    scatter = _Record(work())
    monkeypatch.setattr(c, "_SCATTER", scatter)
    log, group, op = c.CommLog(), _group(4), dist.ReduceOp.AVG
    log.begin(0)
    log.held = EARLIER
    out, inp = torch.empty(10), torch.ones(40)
    before = time.perf_counter()
    assert c.TimedReduceScatter(log, "b0")(out, inp, group, op) is None
    after = time.perf_counter()
    [(args, kw)] = scatter.calls
    assert args[0] is out and args[1] is inp and len(args) == 2
    assert kw == {"op": op, "group": group, "async_op": True} and kw["async_op"] is True
    [(start, end)] = log.spans["reduce_scatter"]
    assert before <= start <= end <= after
    assert end - start - 1e-9 <= log.held - EARLIER <= after - before + 1e-9
    # the block gradient (160 B) is this rank's payload; it sends the 3 peers' shards (120 B)
    assert (log.payload_bytes, log.sent["reduce_scatter"]) == (160, 120)
    nan = torch.ones(40)
    nan[3] = float("nan")
    c.TimedReduceScatter(log, "b1")(out, nan, group, op)
    assert (log.payload_bytes, log.sent["reduce_scatter"]) == (320, 240)
    assert log.found == ("b1", "NaN") and torch.equal(nan, torch.zeros(40))


# -- the compressed collectives on 3 ranks ------------------------------------------------------
def _block(rank: int) -> torch.Tensor:
    """Rank r's block gradient: 100 r + i, i = 0 .. K N - 1 (shard j: i in [N j, N j + N))."""
    return torch.arange(K * N, dtype=torch.float32) + 100 * rank


def _rs_want(rank: int, op: Any) -> torch.Tensor:
    """Shard r summed over the senders s: sum_s (100 s + N r + t) = 300 + 3 (N r + t)."""
    t = torch.arange(N, dtype=torch.float32)
    total = 300 + 3 * (N * rank + t)
    return total / 3 if op == dist.ReduceOp.AVG else total


@pytest.mark.parametrize("fixed", [True, False])
def test_compressed_reduce_scatter_sums_averages_and_accounts(fixed: bool) -> None:
    """Two calls (AVG, then SUM) on one block's collective, at step 6, block 4. Per call each
    rank encodes its K shards (shard j at offset N j, stream 2 + 4, slot rs4.j) and sends the
    2 peers theirs: 16 B of values each, plus rank + 1 pad bytes and, first, 8 B of size to
    each peer where the codec's size depends on the data."""

    def rank_main(comm: ThreadComm) -> dict[str, Any]:
        codec = Codec(fixed)
        log = c.CommLog()
        log.begin(6)
        log.held = log.codec = EARLIER  # what the iteration held and coded before
        rs = c.CompressedReduceScatter(log, comm, cast(Any, codec), 4)
        outs, times = [], []
        for op in (dist.ReduceOp.AVG, dist.ReduceOp.SUM):
            out = torch.empty(N)
            before = time.perf_counter()
            assert rs(out, _block(comm.rank), _group(K), op) is None
            times.append((before, time.perf_counter()))
            outs.append(out)
        return {"outs": outs, "times": times, "log": log, "calls": codec.calls,
                "comm_bytes": comm.bytes_sent}  # fmt: skip

    for rank, r in enumerate(run_ranks(K, rank_main)):
        assert torch.equal(r["outs"][0], _rs_want(rank, dist.ReduceOp.AVG))
        assert torch.equal(r["outs"][1], _rs_want(rank, dist.ReduceOp.SUM))
        one = {"step": 6, "rank": rank, "stream": 6}
        calls = [{**one, "offset": N * j, "name": f"rs4.{j}"} for j in range(K)]
        assert r["calls"] == calls * 2
        log, pad = r["log"], 0 if fixed else rank + 1
        assert log.payload_bytes == 2 * K * (4 * N + pad)  # every shard, its own too
        assert log.sent == {"all_gather": 0, "reduce_scatter": 2 * 2 * (4 * N + pad)}
        sizes = 0 if fixed else 2 * 2 * 8
        assert r["comm_bytes"] == 2 * 2 * (4 * N + pad) + sizes
        held, codec = _two_spans_within_their_calls(log, "reduce_scatter", r["times"])
        # K encodes and K decodes of a tick each per call, within the calls
        assert 2 * 2 * K * TICK <= codec <= held


def test_compressed_reduce_scatter_on_one_rank_exchanges_sizes_with_itself() -> None:
    def rank_main(comm: ThreadComm) -> torch.Tensor:
        rs = c.CompressedReduceScatter(_log(), comm, cast(Any, Codec(False)), 0)
        out = torch.empty(N)
        rs(out, torch.arange(N, dtype=torch.float32), _group(1), dist.ReduceOp.SUM)
        return out

    assert torch.equal(run_ranks(1, rank_main)[0], torch.arange(N, dtype=torch.float32))


def test_compressed_reduce_scatter_reuses_its_accumulator_per_shard_size() -> None:
    """The accumulator is kept while the shard size stays, and remade when it changes."""

    def rank_main(comm: ThreadComm) -> tuple[list[torch.Tensor], list[int]]:
        rs = c.CompressedReduceScatter(_log(), comm, cast(Any, Codec()), 0)
        outs, ptrs = [], []
        for n in (N, 2, 2):
            out = torch.empty(n)
            rs(out, _block(comm.rank)[: K * n], _group(K), dist.ReduceOp.SUM)
            outs.append(out)
            assert rs._acc is not None
            ptrs.append(rs._acc.data_ptr())
        return outs, ptrs

    for rank, (outs, ptrs) in enumerate(run_ranks(K, rank_main)):
        assert torch.equal(outs[0], _rs_want(rank, dist.ReduceOp.SUM))
        # shards of 2: rank r's is [2 r, 2 r + 2) of every block: 300 + 3 (2 r + t)
        want = 300 + 3 * (2 * rank + torch.arange(2, dtype=torch.float32))
        assert torch.equal(outs[1], want) and torch.equal(outs[2], want)
        assert ptrs[1] == ptrs[2]


def test_compressed_reduce_scatter_sums_in_fp32_whatever_torchs_default_dtype() -> None:
    """1 + 2^-24 + 2^-24 summed in fp32, in rank order: each addition is a tie that rounds to
    even, 1.0; a float64 sum would give 1 + 2^-23."""
    values = [1.0, 2.0**-24, 2.0**-24]

    def rank_main(comm: ThreadComm) -> torch.Tensor:
        rs = c.CompressedReduceScatter(_log(), comm, cast(Any, Codec()), 0)
        out = torch.empty(N, dtype=torch.float32)
        grad = torch.full((K * N,), values[comm.rank], dtype=torch.float32)
        rs(out, grad, _group(K), dist.ReduceOp.SUM)
        return out

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        outs = run_ranks(K, rank_main)
    finally:
        torch.set_default_dtype(before)
    for out in outs:
        assert torch.equal(out, torch.ones(N))


def test_compressed_reduce_scatter_zeroes_a_nonfinite_block_naming_it() -> None:
    def rank_main(comm: ThreadComm) -> tuple[Any, torch.Tensor]:
        log = c.CommLog()
        log.begin(0)
        rs = c.CompressedReduceScatter(log, comm, cast(Any, Codec()), 4)
        grad = _block(comm.rank)
        if comm.rank == 1:
            grad[0] = float("inf")
        out = torch.empty(N)
        rs(out, grad, _group(K), dist.ReduceOp.SUM)
        return log.found, out

    for rank, (found, out) in enumerate(run_ranks(K, rank_main)):
        assert found == (("block 4", "inf") if rank == 1 else None)
        # rank 1's block went out as zeros: the sum over ranks 0 and 2 only
        assert torch.equal(out, 200 + 2 * (N * rank + torch.arange(N, dtype=torch.float32)))


def test_compressed_reduce_scatter_refuses_other_ops() -> None:
    def rank_main(comm: ThreadComm) -> None:
        rs = c.CompressedReduceScatter(_log(), comm, cast(Any, Codec()), 0)
        rs(torch.empty(N), torch.ones(N), _group(1), dist.ReduceOp.MAX)

    with pytest.raises(ValueError) as e:
        run_ranks(1, rank_main)
    want = "compressed reduce-scatter sums or averages; FSDP asked for RedOpType.MAX"
    assert str(e.value) == want


@pytest.mark.parametrize("fixed", [True, False])
def test_compressed_all_gather_decodes_every_shard_and_accounts(fixed: bool) -> None:
    """Two calls at step 6, block 4: each rank encodes its shard once (offset N r, stream 6,
    slot ag4) and sends it to the 2 peers (16 B of values, rank + 1 pad bytes and first 8 B
    of size each where the size depends on the data); every rank decodes all K shards."""

    def rank_main(comm: ThreadComm) -> dict[str, Any]:
        codec = Codec(fixed)
        log = c.CommLog()
        log.begin(6)
        log.held = log.codec = EARLIER  # what the iteration held and coded before
        ag = c.CompressedAllGather(log, comm, cast(Any, codec), 4)
        outs, times = [], []
        for _ in range(2):
            out = torch.empty(K * N)
            shard = torch.arange(N, dtype=torch.float32) + 10 * comm.rank
            before = time.perf_counter()
            assert ag(out, shard, _group(K)) is None
            times.append((before, time.perf_counter()))
            outs.append(out)
        return {"outs": outs, "times": times, "log": log, "calls": codec.calls,
                "comm_bytes": comm.bytes_sent}  # fmt: skip

    want = torch.tensor([0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23], dtype=torch.float32)
    for rank, r in enumerate(run_ranks(K, rank_main)):
        assert torch.equal(r["outs"][0], want) and torch.equal(r["outs"][1], want)
        call = {"step": 6, "rank": rank, "stream": 6, "offset": N * rank, "name": "ag4"}
        assert r["calls"] == [call, call]
        log, pad = r["log"], 0 if fixed else rank + 1
        assert log.sent == {"all_gather": 2 * 2 * (4 * N + pad), "reduce_scatter": 0}
        sizes = 0 if fixed else 2 * 2 * 8
        assert r["comm_bytes"] == 2 * 2 * (4 * N + pad) + sizes
        held, codec = _two_spans_within_their_calls(log, "all_gather", r["times"])
        # one encode and K decodes of a tick each per call, within the calls
        assert 2 * (1 + K) * TICK <= codec <= held


def test_compressed_all_gather_wants_one_floating_dtype() -> None:
    def rank_main(comm: ThreadComm) -> None:
        ag = c.CompressedAllGather(_log(), comm, cast(Any, Codec()), 3)
        ag(torch.empty(N), torch.arange(N), _group(1))

    with pytest.raises(ValueError) as e:
        run_ranks(1, rank_main)
    assert str(e.value) == (
        "all_gather codec: block 3 gathers torch.int64 (parameters of several dtypes in one "
        "block); give the block one floating dtype"
    )


class _World:
    def __init__(self, k: int) -> None:
        self.world_size = k


@pytest.mark.parametrize(
    ("k", "world", "whole", "message"),
    [(2, 3, 8, "FSDP collective over 2 ranks (8 values, shard 4); qbench's communicator has 3: "
               "shard over the default group"),
     (3, 3, 13, "FSDP collective over 3 ranks (13 values, shard 4); qbench's communicator has "
                "3: shard over the default group")],
)  # fmt: skip
def test_fsdps_group_must_be_the_communicators_ranks(
    k: int, world: int, whole: int, message: str
) -> None:
    comm = cast(Any, _World(world))
    ag = c.CompressedAllGather(_log(), comm, cast(Any, Codec()), 0)
    with pytest.raises(ValueError) as e:
        ag(torch.empty(whole), torch.ones(N), _group(k))
    assert str(e.value) == message
    rs = c.CompressedReduceScatter(_log(), comm, cast(Any, Codec()), 0)
    with pytest.raises(ValueError) as e:
        rs(torch.empty(N), torch.ones(whole), _group(k), dist.ReduceOp.SUM)
    assert str(e.value) == message


def _two_spans_within_their_calls(log, kind: str, times) -> tuple[float, float]:
    """The two calls' spans of ``kind`` lie within the calls and add up to the held time;
    returns (held, codec) seconds beyond EARLIER."""
    spans = log.spans[kind]
    assert len(spans) == 2
    for (start, end), (before, after) in zip(spans, times, strict=True):
        assert before <= start < end <= after
    held, codec = log.held - EARLIER, log.codec - EARLIER
    assert held == pytest.approx(sum(e - s for s, e in spans), abs=1e-6)
    return held, codec
