"""Which training samples each rank owns, with a tunable label skew (non-IID data).

Skew follows seed paper 001, after Hsieh et al. 2020 ("The Non-IID Data Quagmire of
Decentralized Machine Learning", SkewScout): a fraction ``skew`` of the samples, chosen at
random, is sorted by label and dealt out in contiguous equal chunks, so each rank holds mostly a
few classes; the other ``1 - skew`` are shuffled and dealt equally (IID). ``skew=0`` is IID,
``skew=1`` fully label-sorted.

Every rank computes the same assignment from ``(labels, world_size, skew, seed)`` alone, so no
communication is needed and partitions are disjoint by construction. All ranks get exactly the
same number of samples, because synchronous data-parallel steps need equal batch counts: the
skewed part is rounded to a multiple of ``world_size`` and fewer than ``world_size`` samples in
all are left out.
"""

from __future__ import annotations

import torch


def partition(
    labels: torch.Tensor, world_size: int, rank: int, *, skew: float = 0.0, seed: int = 0
) -> torch.Tensor:
    """int64 indices of the training samples ``rank`` owns, in a seeded random order.

    The order is shuffled (seed and rank) so that a trainer that walks the indices in order
    does not see label-sorted batches; its own per-epoch shuffle is still welcome.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    mine = _assignment(labels, world_size, skew, seed)[rank]
    gen = torch.Generator().manual_seed(seed * 1000003 + rank + 1)
    return mine[torch.randperm(len(mine), generator=gen)]


def _assignment(
    labels: torch.Tensor, world_size: int, skew: float, seed: int
) -> list[torch.Tensor]:
    """Every rank's samples (unshuffled): the skewed chunk, then the IID chunk."""
    if labels.dim() != 1:
        raise ValueError(f"labels must be 1-D, got shape {tuple(labels.shape)}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0.0 <= skew <= 1.0:
        raise ValueError(f"skew must be in [0, 1], got {skew}")
    n = len(labels)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    # a multiple of world_size, so the skewed part splits exactly and only the IID part drops
    n_skewed = min(round(skew * n / world_size), n // world_size) * world_size
    skewed, iid = perm[:n_skewed], perm[n_skewed:]
    skewed = skewed[torch.sort(labels[skewed], stable=True).indices]  # random within a label
    per_skewed, per_iid = n_skewed // world_size, len(iid) // world_size
    return [
        torch.cat([
            skewed[r * per_skewed : (r + 1) * per_skewed],
            iid[r * per_iid : (r + 1) * per_iid],
        ]).long()
        for r in range(world_size)
    ]  # fmt: skip


def label_histogram(
    labels: torch.Tensor, world_size: int, skew: float = 0.0, seed: int = 0
) -> torch.Tensor:
    """``(world_size, classes)`` label counts of the partition ``partition`` makes."""
    classes = int(labels.max().item()) + 1 if len(labels) else 0
    parts = _assignment(labels, world_size, skew, seed)
    return torch.stack([torch.bincount(labels[p].long(), minlength=classes) for p in parts])


def skew_measure(hist: torch.Tensor) -> float:
    """How non-IID a partition is, in [0, 1]: 0 when every rank sees the global label mix.

    The measure is the sample-weighted mean over ranks of the total-variation distance between
    a rank's label distribution and the global one (that of all partitioned samples), divided
    by the same quantity for the fully label-sorted partition with the same class counts and
    rank sizes, which is the most skewed one can make (so skew=1 gives exactly 1). Since a rank
    with skew ``s`` holds a mix of ``s`` sorted and ``1 - s`` IID samples, the measure is close
    to ``s`` itself, up to sampling noise at small ``s``.
    """
    hist = hist.double()
    sorted_tv = _mean_tv(_sorted_histogram(hist.sum(dim=0), hist.sum(dim=1)))
    if sorted_tv <= 0.0:  # one class or one rank: no partition can be skewed
        return 0.0
    return min(1.0, max(0.0, _mean_tv(hist) / sorted_tv))


def _mean_tv(hist: torch.Tensor) -> float:
    """Sample-weighted mean total-variation distance of each row's distribution to the total."""
    sizes = hist.sum(dim=1, keepdim=True)
    total = hist.sum()
    if total <= 0:
        return 0.0
    rows = hist / sizes.clamp_min(1e-12)
    tv = 0.5 * (rows - hist.sum(dim=0) / total).abs().sum(dim=1)
    return float((tv * sizes.squeeze(1)).sum() / total)


def _sorted_histogram(class_counts: torch.Tensor, rank_sizes: torch.Tensor) -> torch.Tensor:
    """Label counts when samples sorted by label fill the ranks in turn: interval overlaps."""
    zero = class_counts.new_zeros(1)
    c_edges = torch.cat([zero, class_counts.cumsum(0)])
    r_edges = torch.cat([zero, rank_sizes.cumsum(0)])
    lo = torch.maximum(r_edges[:-1, None], c_edges[None, :-1])
    hi = torch.minimum(r_edges[1:, None], c_edges[None, 1:])
    return (hi - lo).clamp_min(0)
