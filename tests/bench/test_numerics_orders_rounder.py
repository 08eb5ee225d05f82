"""qbench.bench.numerics.orders beyond each order's hand-computed sequence
(tests/bench/test_bench_numerics_orders.py): the ring's hop order at three ranks, the Rounder's
ranges (what stays home, rows cut inside, empty messages), which messages it merges into one
call and how large a call may grow, the bucket grid of codecs whose bucket length is odd or
unreadable, and the integer order's int64 sum where K x top passes int32."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from qbench import compress
from qbench.aggregate.base import split_ranges
from qbench.bench.numerics import orders
from qbench.compress import integer_sum
from tests.bench.test_bench_numerics_orders import STOCHASTIC, _roundtrip, _x


def _spy_calls(comp: compress.Compressor, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the encode calls comp makes from now on."""
    sizes: list[int] = []
    encode = comp.encode

    def spy(x: torch.Tensor, **kw: Any) -> Any:
        sizes.append(x.numel())
        return encode(x, **kw)

    monkeypatch.setattr(comp, "encode", spy)
    return sizes


# -- the ring's hops ------------------------------------------------------------------------------
def test_ring_at_three_ranks_adds_the_ranks_in_ring_order() -> None:
    """Chunk c starts at rank c+1; hop h's receiver, rank c+1+h, adds its own float32 chunk to
    the decoded partial sum, so the last hop ends at the owner c (two ranks cannot tell the
    direction apart: three can)."""
    comp = compress.from_spec(STOCHASTIC, seed=3)
    rt, k, x = _roundtrip(comp), 3, _x(3, 12)
    chunks = split_ranges(12, k, 4)
    assert chunks == [(0, 4), (4, 8), (8, 12)]
    want = []
    for c, (a, b) in enumerate(chunks):
        acc = x[(c + 1) % k, a:b]
        for hop in (1, 2):
            acc = rt(acc, hop, a) + x[(c + 1 + hop) % k, a:b]
        want.append(rt(acc / k, k, a))  # the owner's mean, allgathered on stream K
    got = orders.ring(orders.Rounder(comp), x)
    assert torch.equal(got, torch.cat(want))
    assert torch.equal(orders.ring(orders.Rounder(comp, batch=False), x), got)


# -- the Rounder's ranges -------------------------------------------------------------------------
def test_values_outside_the_ranges_stay_as_they_are() -> None:
    """A range that leaves the first value home: that value is returned unrounded and the rest
    is encoded at its own start offset (not as the whole tensor from 0)."""
    comp = compress.from_spec(STOCHASTIC, seed=5)
    rt, x = _roundtrip(comp), _x(1, 13)[0]
    got = orders.Rounder(comp).round(x, [(1, 13)], stream=2)
    assert got[0] == x[0]
    assert torch.equal(got[1:], rt(x[1:], 2, 1))
    assert not torch.equal(got, rt(x, 2, 0))


def test_rows_encode_each_rows_cut_at_that_rows_offset() -> None:
    """``rows`` with a cut inside the row: row j sends values a..b at element offset j n + a,
    and keeps the rest of the row."""
    comp = compress.from_spec(STOCHASTIC, seed=5)
    rt, x = _roundtrip(comp), _x(3, 9)
    got = orders.Rounder(comp, batch=False).rows(x, [(2, 6)], stream=1)
    for j in range(3):
        assert torch.equal(got[j, 2:6], rt(x[j, 2:6], 1, j * 9 + 2)), j
        assert torch.equal(got[j, :2], x[j, :2]) and torch.equal(got[j, 6:], x[j, 6:]), j


def test_an_empty_range_is_no_message() -> None:
    comp = compress.from_spec(STOCHASTIC, seed=5)
    x = _x(1, 8)[0]
    rt = orders.Rounder(comp)
    got = rt.round(x, [(0, 4), (4, 4), (4, 8)], stream=0)
    assert rt.calls == 2
    assert torch.equal(got, orders.Rounder(comp).round(x, [(0, 4), (4, 8)], stream=0))


# -- merged calls ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ranges", "calls"),
    [
        ([(0, 8), (8, 16)], [16]),  # consecutive, the second on the bucket grid: one call
        ([(2, 10), (10, 18)], [16]),  # on the grid of the call's start, not of 0
        ([(2, 6), (6, 14)], [4, 8]),  # 6 is off the grid of a call starting at 2
        ([(0, 1), (1, 9)], [1, 8]),
        ([(0, 8), (9, 17)], [8, 8]),  # a gap between them
    ],
)
def test_messages_merge_into_one_call_only_on_the_calls_bucket_grid(
    ranges: list[tuple[int, int]], calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """QSGD with buckets of 8 and stochastic draws: a message after the first joins the call only
    where it starts a bucket of that call, so the merged call gives the bits of one call per
    message; the calls made are the ones listed."""
    comp = compress.from_spec("qsgd:bits=4,bucket_size=8", seed=7)
    x = _x(1, 20)[0] * torch.linspace(0.1, 3.0, 20)  # buckets of different scales
    single = orders.Rounder(comp, batch=False).round(x, ranges, stream=3)
    sizes = _spy_calls(comp, monkeypatch)
    rt = orders.Rounder(comp)
    assert torch.equal(rt.round(x, ranges, stream=3), single)
    assert sizes == calls
    assert rt.calls == len(ranges)


def test_a_call_takes_at_most_batch_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Merging stops where a call would pass BATCH values (counted from the call's start):
    exactly BATCH still merges."""
    comp = compress.from_spec("bf16")  # every value on its own: any ranges merge
    batch = orders.BATCH
    x = torch.linspace(-1, 1, batch + 16)
    sizes = _spy_calls(comp, monkeypatch)
    rt = orders.Rounder(comp)
    for ranges, calls in (
        ([(0, 8), (8, batch)], [batch]),
        ([(8, 16), (16, batch + 8)], [batch]),
        ([(0, 16), (16, batch + 8)], [16, batch - 8]),
    ):
        sizes.clear()
        got = rt.round(x, ranges, stream=0)
        assert sizes == calls, ranges
        a, b = ranges[0][0], ranges[-1][1]
        assert torch.equal(got[a:b], x[a:b].bfloat16().float())
    assert max(sizes) <= batch


def test_a_rounder_merges_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ring at 4 ranks on a bucketed codec: 16 messages (rt.calls), but each hop's 4 chunks
    and the allgather's go out in one call each, as ``calls`` counts."""
    comp = compress.from_spec("qsgd:bits=4,bucket_size=8", seed=1)
    sizes = _spy_calls(comp, monkeypatch)
    rt = orders.Rounder(comp)
    orders.ring(rt, _x(4, 64))
    assert rt.calls == 16
    assert sizes == [64] * 4 and len(sizes) == orders.calls("ring", 4, per_call=False)


# -- the bucket grid ------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["qsgd:bits=4,bucket_size=1", "onebit:bucket_size=1",
                                  "fp8:block_size=1"])  # fmt: skip
def test_buckets_of_one_value_merge_anywhere(spec: str) -> None:
    assert orders.grid(compress.from_spec(spec)) == 1


def _bucketed(**attrs: Any) -> Any:
    """A stand-in plug-in codec that scales per bucket, without an integer grid in its
    catalog entry (like onebit), and the given attributes."""
    entry = SimpleNamespace(integer_grid=lambda params: (0, 0))
    return SimpleNamespace(granularity="bucket", spec=SimpleNamespace(entry=entry, params={}),
                           **attrs)  # fmt: skip


@pytest.mark.parametrize(
    "attrs", [{}, {"bucket_size": None}, {"bucket_size": 0}, {"bucket_size": -8},
              {"bucket_size": True}, {"bucket_size": "64"}],
)  # fmt: skip
def test_a_bucket_length_that_cannot_be_read_means_one_call_per_message(attrs: dict) -> None:
    """A codec scaling per bucket whose bucket length is missing or not a positive integer: no
    grid to merge on, so every message is its own call (as a per-tensor scale is)."""
    assert orders.grid(_bucketed(**attrs)) is None
    assert orders.grid(_bucketed(bucket_size=48)) == 48


# -- the integer order ----------------------------------------------------------------------------
def test_the_integer_order_sums_in_int64_where_k_times_top_passes_int32() -> None:
    """FP8 E4M3's largest value is 229376 units: 9363 ranks that all send it sum to 9363 x
    229376 > 2^31 - 1, which int32 would wrap; the mean is that largest value, 448."""
    comp = compress.from_spec("fp8:block_size=1")
    view = integer_sum.for_compressor(comp)
    assert view is not None and view.top == 229376
    k = 9363
    assert k * view.top >= 2**31 > (k - 1) * view.top
    x = torch.full((k, 2), 448.0)
    x[:, 1] = -448.0
    assert torch.equal(orders.integer(view, x, 0), torch.tensor([448.0, -448.0]))
