"""Directed, possibly time-varying graphs for push-sum (seed 001 section 3); pure, no communication.

Push-sum only needs a column-stochastic mixing matrix P(t): P_ki is the share of its mass that
rank i pushes to rank k at step t, and every column sums to 1 (``P_ii`` is what i keeps). Both
graphs here give each rank one out-peer per step, keep 1/2 and push 1/2 (SGP, Assran et al. 2019):

- ``directed-ring``: i -> i + 1 (mod K) at every step;
- ``exponential``: i -> i + 2^(t mod m) (mod K) at step t, with m = ceil(log2 K) hop sizes
  1, 2, 4, ... < K (SGP's time-varying exponential graph, one peer per step; m = log2 K for a
  power of two). For K = 2^m the product of the m matrices of one period is exactly the average
  J / K, since every offset 0..K-1 is one sum of distinct hops, each with weight 1/2^m.

Every rank also receives from exactly one in-peer, so these matrices happen to be doubly
stochastic as well and the push-sum weights stay 1; the scheme still tracks them, so it stays
correct for any column-stochastic schedule (tests use rank-dependent weights).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qbench.errors import UserError, choice_error

TOPOLOGIES = ("directed-ring", "exponential")


@dataclass(frozen=True)
class Mixing:
    """What rank i needs of P(t): its own column, and the entries of its row it receives."""

    keep: float
    """P_ii, the share of x_i and w_i that stays on rank i."""
    out: dict[int, float]
    """P_ki for each out-peer k: the share pushed to k (keep + sum(out) = 1)."""
    inn: dict[int, float]
    """P_ij for each in-peer j: the share of j's mass that arrives here."""


def hops(topology: str, world_size: int) -> tuple[int, ...]:
    """The hop sizes a rank cycles through, one per step; () for a single rank."""
    _check(topology, world_size)
    if world_size == 1:
        return ()
    if topology == "directed-ring":
        return (1,)
    # ceil(log2 K) hops 1, 2, 4, ..., all < K, so a rank never sends to itself.
    return tuple(1 << e for e in range((world_size - 1).bit_length()))


def period(topology: str, world_size: int) -> int:
    """Steps after which the graph repeats (1 for static graphs and a single rank)."""
    return max(1, len(hops(topology, world_size)))


def out_peers(topology: str, rank: int, world_size: int, step: int) -> tuple[int, ...]:
    """The ranks ``rank`` pushes to at ``step``."""
    h = hops(topology, world_size)
    return ((rank + h[step % len(h)]) % world_size,) if h else ()


def weights(topology: str, rank: int, world_size: int, step: int) -> tuple[float, dict[int, float]]:
    """(P_ii, {k: P_ki}) of column ``rank`` at ``step``: an equal share for self and each
    out-peer (1/2 and 1/2 here), so the column sums to 1."""
    peers = out_peers(topology, rank, world_size, step)
    share = 1.0 / (len(peers) + 1)  # 1/2 or 1: exact in binary, so columns sum to exactly 1
    return share, dict.fromkeys(peers, share)


def in_weights(topology: str, rank: int, world_size: int, step: int) -> dict[int, float]:
    """{j: P_ij} for each rank j that pushes to ``rank`` at ``step``, ascending."""
    got = {}
    for j in range(world_size):
        share = weights(topology, j, world_size, step)[1].get(rank)
        if share is not None:
            got[j] = share
    return got


def mixing(topology: str, rank: int, world_size: int, step: int) -> Mixing:
    keep, out = weights(topology, rank, world_size, step)
    return Mixing(keep, out, in_weights(topology, rank, world_size, step))


def schedule(topology: str, rank: int, world_size: int) -> tuple[Mixing, ...]:
    """``rank``'s Mixing for each step of one period; step t uses entry t mod period."""
    n = period(topology, world_size)
    return tuple(mixing(topology, rank, world_size, t) for t in range(n))


def matrix(topology: str, world_size: int, step: int) -> torch.Tensor:
    """The K x K column-stochastic P(step) (float64): x <- P x is one exact push-sum step."""
    p = torch.zeros(world_size, world_size, dtype=torch.float64)
    for i in range(world_size):
        p[i, i], out = weights(topology, i, world_size, step)
        for k, share in out.items():
            p[k, i] = share
    return p


def _check(topology: str, world_size: int) -> None:
    if topology not in TOPOLOGIES:
        raise choice_error("push-sum topology", topology, TOPOLOGIES)
    if world_size < 1:
        raise UserError(f"push-sum: world_size must be >= 1, got {world_size}")
