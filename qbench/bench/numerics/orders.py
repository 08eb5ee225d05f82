"""The reduction orders of ``qbench bench numerics``, simulated in one process: each turns K
ranks' float32 gradients (the rows of ``x``) into the averaged gradient every rank ends with,
doing what a real low-precision implementation of that collective does: a rank encodes what it
sends, the receiver decodes it and adds it to its own float32 values, and only what travels is
rounded (IST-DASLab/torch_cgx's scatter-reduce-allgather keeps its own chunk uncompressed the
same way). The one exception is the final copy that every rank must hold alike: its owner encodes
it for the others and uses the decoded copy itself, so that no rank holds a different vector.

* ``ring``: reduce-scatter then allgather. The vector is cut into K chunks (on the codec's
  bucket grid, as ``qbench.aggregate`` splits ranges); chunk c starts at rank c+1, which encodes
  its own float32 chunk; each of the next K-1 ranks decodes the incoming partial sum, adds its
  own float32 chunk (never rounded before it is added) and encodes the sum for the next hop:
  K-1 roundings of partial sums per chunk. The owner (rank c) adds its own chunk to the last
  one it receives, divides the float32 sum by K and encodes the mean once for the allgather;
  every rank, the owner too, decodes that one payload (forwarded, never re-encoded). Hop h
  encodes with draw stream h, the allgather with stream K.
* ``tree``: a binary reduction tree over ranks 0 .. K-1. At level l the nodes are the ranks
  j 2^(l-1); in each pair the right node encodes its float32 partial sum and sends it, the left
  node decodes it and adds it to its own float32 partial sum (not rounded): one rounding per
  edge, K-1 in all, log2 K on any leaf's path. An unpaired last node moves up a level unsent.
  The root (rank 0) divides by K and encodes the mean once for the broadcast; every rank, the
  root too, decodes it. Level l encodes with stream l, the broadcast with stream levels + 1.
* ``allgather``: every rank encodes its gradient once (stream 0) and every rank decodes all K
  payloads, its own too (as torch_cgx's all-to-all allreduce does, so that all ranks sum the
  same values), and sums them in float32 in rank order, divided by K: no partial sum is rounded.
* ``alltoall``: reduce-scatter by all-to-all: rank r encodes shard s of its gradient for each
  owner s != r (stream 0) and keeps its own shard in float32; owner s adds the K-1 decoded
  shards to its own float32 shard in rank order, divides by K and encodes its shard's mean once
  for the allgather (stream 1), which every rank, the owner too, decodes.
* ``integer``: ranks agree on per-block scales (elementwise MAX of each rank's float32
  statistic: exact), every rank rounds its own gradient once to integers on them (its own too:
  the integers are what is summed), the integers add up exactly (as int32: a real allreduce may
  use a narrower dtype that cannot overflow, the same integers), and every rank decodes the same
  sum once (``qbench.compress.integer_sum``).

Draws: every encode here is keyed (seed = the repeat, step 0, rank 0, the order's stream), each
phase of an order has a stream of its own, and within a stream the messages have disjoint
element offsets: rank r's values r n .. r n + n - 1 (a chunk of a row: its start; in the tree,
the j-th sender of a level: j n), so no two encodes share a draw and each is reproducible. The
encodes that ranks make of one stream (a ring hop's K chunks, a tree level's senders, every
rank's shards) are merged into one call here where that gives the same bits (:class:`Rounder`):
a codec that rounds each value on its own, or one with buckets, over ranges that start on its
bucket grid. A codec that scales per call or per tensor is called once per message.
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
        """``x`` (flat float32) with each of the ascending, disjoint ``ranges`` encoded by its
        own call (draws keyed by ``stream`` and the range's start as the element offset) and
        decoded; values outside every range (what stays home) are returned as they are."""
        live = [(a, b) for a, b in ranges if b > a]
        self.calls += len(live)
        merged = self._merged(live)
        if merged == [(0, x.numel())]:
            return self._roundtrip(x, stream, 0)
        out = x.clone()
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
    """Reduce-scatter ring then allgather; only the partial sums sent on are rounded."""
    k, n = x.shape
    chunks = split_ranges(n, k, rt.align)
    sizes = torch.tensor([b - a for a, b in chunks])
    chunk_of = torch.repeat_interleave(torch.arange(k), sizes)
    cols = torch.arange(n)
    acc = x[(chunk_of + 1) % k, cols]  # chunk c starts at rank c + 1
    for hop in range(1, k):
        # the receiver adds its own float32 chunk to the decoded partial sum
        acc = rt.round(acc, chunks, stream=hop) + x[(chunk_of + 1 + hop) % k, cols]
    return rt.round(acc / k, chunks, stream=k)  # the owner's mean, allgathered


def tree(rt: Rounder, x: torch.Tensor) -> torch.Tensor:
    """Binary reduction tree then broadcast; only the partial sum a node sends up is rounded."""
    k, n = x.shape
    nodes, level = x, 0  # nodes[j]: the float32 partial sum of rank j 2^level
    while nodes.shape[0] > 1:
        level += 1
        paired = nodes.shape[0] // 2 * 2
        sent = rt.rows(nodes[1:paired:2], [(0, n)], stream=level)  # the right nodes send
        # each left node adds the decoded sum to its own float32 one; an unpaired last node
        # moves up a level unsent
        nodes = torch.cat([nodes[0:paired:2] + sent, nodes[paired:]])
    return rt.round(nodes[0] / k, [(0, n)], stream=level + 1)  # the root's mean, broadcast


def allgather(rt: Rounder, x: torch.Tensor) -> torch.Tensor:
    """Every gradient encoded once; every rank decodes all K (its own too) and sums in fp32."""
    k, n = x.shape
    sent = rt.rows(x, [(0, n)], stream=0)
    acc = torch.zeros(n, dtype=torch.float32)
    for r in range(k):  # float32, in rank order
        acc.add_(sent[r])
    return acc / k


def alltoall(rt: Rounder, x: torch.Tensor) -> torch.Tensor:
    """All-to-all reduce-scatter (own shard kept in fp32), then each shard's mean allgathered."""
    k, n = x.shape
    shards = split_ranges(n, k, rt.align)
    # rank r sends shard s to its owner s != r; its own shard stays home, unrounded
    away = [(r * n + a, r * n + b) for r in range(k) for s, (a, b) in enumerate(shards) if s != r]
    sent = rt.round(x.reshape(-1), away, stream=0).view(k, n)
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
    "ring": "low-precision ring: each partial sum encoded when it is sent on, K-1 hops (the "
    "receiver's own chunk stays float32 until added), then the mean encoded once for the "
    "allgather",
    "tree": "binary tree: each node's float32 partial sum encoded once when it is sent up (the "
    "receiver's own sum stays float32), then the mean encoded once for the broadcast",
    "allgather": "each rank's gradient encoded once, all K decoded and summed in float32: no "
    "partial sum rounded",
    "alltoall": "reduce-scatter by all-to-all: each contribution sent to a shard's owner encoded "
    "once (the owner's own shard stays float32), then each shard's mean encoded once",
    "integer": "each gradient rounded once to integers on shared scales, summed exactly, decoded "
    "once",
}


def calls(order: str, k: int, per_call: bool) -> int:
    """Encode calls one sample of ``order`` makes here at K ranks (at most): a codec that scales
    per call is called once per message, K^2 in ring and alltoall; the others batch a hop's (or
    a rank's) messages into one call (alltoall: two, around the shard that stays home)."""
    if order == "ring":
        return k * k if per_call else k
    if order == "alltoall":
        return k * k if per_call else 2 * k + 1
    return {"tree": k, "allgather": k, "integer": k}[order]
