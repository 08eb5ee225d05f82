"""The reduction orders of ``qbench bench numerics``, simulated in one process: each turns K
ranks' float32 gradients (the rows of ``x``) into the averaged gradient every rank ends with,
rounding through a codec wherever a real collective would send values.

* ``ring``: reduce-scatter then allgather. The vector is cut into K chunks (on the codec's
  bucket grid, as ``qbench.aggregate`` splits ranges); chunk c starts at rank c+1 and travels
  K-1 hops, each receiver decoding the incoming partial sum, adding its own float32 chunk and
  re-encoding it; the owner (rank c) divides the full sum by K and encodes it once more for the
  allgather, which every rank decodes. Hop h encodes with draw stream h, the allgather with
  stream K.
* ``tree``: a binary reduction tree whose inner nodes receive from two children: both
  children's partial sums are encoded (stream = level), decoded and added in float32, log2 K
  levels; an unpaired last node moves up a level as it is. The root divides by K and encodes the
  mean once for the broadcast (stream = levels + 1).
* ``allgather``: every rank's gradient encoded once (stream 0), all decoded and summed in
  float32 in rank order, divided by K: no partial sum is rounded.
* ``alltoall``: each rank owns a 1/K shard, receives every rank's encoded shard (stream 0),
  sums the decoded shards in float32 in rank order, divides by K and encodes its shard's mean
  once for the allgather (stream 1).
* ``integer``: ranks agree on per-block scales (elementwise MAX of each rank's statistic),
  encode to integers on them, the integers add up exactly (as int32: a real allreduce may use a
  narrower dtype that cannot overflow, the same integers), decoded once
  (``qbench.compress.integer_sum``).

Draws: every encode here is keyed (seed = the repeat, step 0, rank 0, the order's stream) and
row r's values have element offsets r n .. r n + n - 1 (a chunk of a row: its start), so no
two encodes share a draw and each is reproducible. The encodes that ranks make of one stream
(a ring hop's K chunks, a tree level's nodes, every rank's shards) are merged into one call
here where that gives the same bits (:class:`Rounder`): a codec that rounds each value on its
own, or one with buckets, over ranges that start on its bucket grid. A codec that scales per
call or per tensor is called once per message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from qbench.aggregate.base import split_ranges
from qbench.compress import Compressor, Key
from qbench.compress.integer_sum import IntegerSum

Range = tuple[int, int]


def grid(comp: Compressor) -> int | None:
    """The alignment under which encoding consecutive ranges in one call gives the same bits as
    one call per range: 1 for a codec that rounds every value on its own, its bucket (block)
    length for one that scales per bucket; None when a scale covers a whole call or tensor
    (then every range is its own call)."""
    if comp.granularity == "value":
        return 1
    if comp.granularity != "bucket":
        return None
    block = comp.spec.entry.integer_grid(comp.spec.params)[1]  # values per scale, where known
    size = block or getattr(comp, "bucket_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


BATCH = 1 << 22
"""Most values one batched encode call takes here (several ranges merged), bounding memory."""


class Rounder:
    """``decode(encode(.))`` of one codec as the simulated ranks call it; counts encode calls
    (one per non-empty range a rank sends, however they are merged here)."""

    def __init__(self, comp: Compressor, *, batch: bool = True) -> None:
        """batch: merge messages into calls where that changes no bit (False: one call per
        message, the reference the tests compare with)."""
        self.comp = comp
        self.grid = grid(comp)
        self.batch = batch
        self.calls = 0

    @property
    def align(self) -> int:
        """Where chunks are cut: the codec's bucket grid, else anywhere."""
        return self.grid or 1

    def round(self, x: torch.Tensor, ranges: Sequence[Range], *, stream: int) -> torch.Tensor:
        """``x`` (flat float32) as consecutive ranges covering it, each encoded by its own call
        (draws keyed by ``stream`` and the range's start as the element offset), decoded."""
        live = [(a, b) for a, b in ranges if b > a]
        self.calls += len(live)
        merged = self._merged(live)
        if merged == [(0, x.numel())]:
            return self._roundtrip(x, stream, 0)
        out = torch.empty_like(x)
        for a, b in merged:
            out[a:b] = self._roundtrip(x[a:b], stream, a)
        return out

    def rows(self, x: torch.Tensor, cuts: Sequence[Range], *, stream: int) -> torch.Tensor:
        """Every row of ``x`` [m, n] sent as the messages ``cuts`` (ranges of a row): row j's
        draws start at element offset j n."""
        m, n = x.shape
        ranges = [(j * n + a, j * n + b) for j in range(m) for a, b in cuts]
        return self.round(x.reshape(-1), ranges, stream=stream).view(m, n)

    def _merged(self, live: list[Range]) -> list[Range]:
        """The calls made: consecutive ranges merged where one call gives the same bits (every
        range after the first starts on the codec's bucket grid of the call)."""
        if self.grid is None or not self.batch:
            return live
        merged: list[Range] = []
        for a, b in live:
            if merged and merged[-1][1] == a and (a - merged[-1][0]) % self.grid == 0 and (
                b - merged[-1][0] <= BATCH
            ):  # fmt: skip
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        return merged

    def _roundtrip(self, x: torch.Tensor, stream: int, offset: int) -> torch.Tensor:
        self.comp.reset()  # one step: no error-feedback residual from an earlier encode
        return self.comp.decode(self.comp.encode(x.contiguous(), stream=stream, offset=offset))


# -- the orders ----------------------------------------------------------------------------------
def ring(rt: Rounder, x: torch.Tensor) -> torch.Tensor:
    k, n = x.shape
    chunks = split_ranges(n, k, rt.align)
    sizes = torch.tensor([b - a for a, b in chunks])
    chunk_of = torch.repeat_interleave(torch.arange(k), sizes)
    cols = torch.arange(n)
    acc = x[(chunk_of + 1) % k, cols]  # chunk c starts at rank c + 1
    for hop in range(1, k):
        acc = rt.round(acc, chunks, stream=hop) + x[(chunk_of + 1 + hop) % k, cols]
    return rt.round(acc / k, chunks, stream=k)  # the owner's mean, allgathered


def tree(rt: Rounder, x: torch.Tensor) -> torch.Tensor:
    k, n = x.shape
    nodes, level = x, 0
    while nodes.shape[0] > 1:
        level += 1
        paired = nodes.shape[0] // 2 * 2
        sent = rt.rows(nodes[:paired], [(0, n)], stream=level)
        # an unpaired last node moves up a level as it is
        nodes = torch.cat([sent[0::2] + sent[1::2], nodes[paired:]])
    return rt.round(nodes[0] / k, [(0, n)], stream=level + 1)


def allgather(rt: Rounder, x: torch.Tensor) -> torch.Tensor:
    k, n = x.shape
    sent = rt.rows(x, [(0, n)], stream=0)
    acc = torch.zeros(n, dtype=torch.float32)
    for r in range(k):  # float32, in rank order
        acc.add_(sent[r])
    return acc / k


def alltoall(rt: Rounder, x: torch.Tensor) -> torch.Tensor:
    k, n = x.shape
    shards = split_ranges(n, k, rt.align)
    sent = rt.rows(x, shards, stream=0)  # rank r's shard s goes to its owner s
    acc = torch.zeros(n, dtype=torch.float32)
    for r in range(k):  # each owner adds its shard's contributions in rank order
        acc.add_(sent[r])
    return rt.round(acc / k, shards, stream=1)


def integer(isum: IntegerSum, x: torch.Tensor, seed: int) -> torch.Tensor:
    k, n = x.shape
    stats = isum.local_scales(x[0])
    for r in range(1, k):  # the MAX allreduce of the ranks' per-block statistics
        stats = torch.maximum(stats, isum.local_scales(x[r]))
    scales = isum.share(stats)
    # int32 holds K x top for every codec and K <= 1024 here; the sum is exact either way
    dtype = torch.int32 if k * isum.top < 2**31 else torch.int64
    sums = torch.zeros(n, dtype=dtype)
    for r in range(k):  # rank r's draws start at element offset r n, as in the other orders
        sums.add_(isum.encode(x[r], scales, Key(seed=seed), r * n, dtype))
    return isum.decode(sums, scales, k, torch.empty(n, dtype=torch.float32))


ORDERS: dict[str, Callable[[Rounder, torch.Tensor], torch.Tensor] | None] = {
    "ring": ring, "tree": tree, "allgather": allgather, "alltoall": alltoall, "integer": None,
}  # fmt: skip
"""Every order by name; ``integer`` rounds through an IntegerSum, not a Rounder."""
DESCRIPTIONS = {
    "ring": "low-precision ring: partial sums re-encoded at each of K-1 hops, then the mean "
    "encoded once for the allgather",
    "tree": "binary tree: both children's partial sums encoded at each of log2 K levels, then "
    "the mean encoded once for the broadcast",
    "allgather": "each rank's gradient encoded once, summed in float32: no partial sum rounded",
    "alltoall": "reduce-scatter by all-to-all: contributions encoded once, each shard's mean "
    "once more",
    "integer": "shared-scale integers summed exactly, decoded once",
}


def calls(order: str, k: int, per_call: bool) -> int:
    """Encode calls one sample of ``order`` makes here at K ranks: a codec that scales per call
    is called once per chunk in ring and alltoall (about K^2 calls); the others batch a hop's
    (or a rank's) chunks into one call."""
    if order == "ring":
        return k * k if per_call else k
    if order == "alltoall":
        return k * k + k if per_call else k + 1
    return {"tree": 2 * k - 1, "allgather": k, "integer": k}[order]
