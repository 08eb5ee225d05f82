"""Gossip graphs (ring, 2-D torus) and their mixing matrices; pure, no communication.

The decentralized algorithms of seed 001 (D-PSGD, Choco-SGD, DeepSqueeze) assume a symmetric,
doubly stochastic mixing matrix W ("every row and column sum to 1"). We use Metropolis-Hastings
weights, W_ij = 1 / (1 + max(deg_i, deg_j)) for each neighbour j and W_ii = 1 - sum of the
others: symmetric and doubly stochastic for any undirected graph. Rings and tori are regular,
so this is the uniform 1 / (deg + 1) over self and neighbours. Weights are computed as exact
fractions, so a row sums to 1 up to one rounding per entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import torch

from qbench.catalog.schemes import torus_rows
from qbench.errors import UserError, choice_error

TOPOLOGIES = ("ring", "torus")


@dataclass(frozen=True)
class Graph:
    """An undirected graph on ranks 0..size-1 without self-loops."""

    name: str
    size: int
    neighbours: tuple[tuple[int, ...], ...]
    """Distinct neighbours of each rank, ascending (a K=2 ring has one, a K=1 ring none)."""

    def degree(self, rank: int) -> int:
        return len(self.neighbours[rank])

    def weights(self, rank: int) -> tuple[float, dict[int, float]]:
        """(W_ii, {j: W_ij for each neighbour j}) of row ``rank``."""
        exact = {
            j: Fraction(1, 1 + max(self.degree(rank), self.degree(j)))
            for j in self.neighbours[rank]
        }
        return float(1 - sum(exact.values(), Fraction(0))), {j: float(w) for j, w in exact.items()}

    def matrix(self) -> torch.Tensor:
        """The K x K mixing matrix W (float64)."""
        w = torch.zeros(self.size, self.size, dtype=torch.float64)
        for i in range(self.size):
            w[i, i], row = self.weights(i)
            for j, v in row.items():
                w[i, j] = v
        return w


def ring(size: int) -> Graph:
    """Each rank talks to rank +-1 (mod K); K=2 gives one neighbour, K=1 none."""
    return Graph(
        "ring", size, tuple(_distinct(i, ((i - 1) % size, (i + 1) % size)) for i in range(size))
    )


def torus_shape(size: int) -> tuple[int, int]:
    """(rows, cols) with rows * cols = size, 2 <= rows <= cols, as close to square as possible."""
    rows = torus_rows(size)
    if rows < 2:
        raise UserError(
            f"gossip: topology torus needs world_size = r x c with r, c >= 2, got {size}; "
            "use a world_size such as 4, 6, 8 or 9, or `topology: ring`"
        )
    return rows, size // rows


def torus(size: int) -> Graph:
    """Rank i = a * cols + b talks to its up/down/left/right neighbours, wrapping around."""
    rows, cols = torus_shape(size)

    def around(i: int) -> list[int]:
        a, b = divmod(i, cols)
        return [((a - 1) % rows) * cols + b, ((a + 1) % rows) * cols + b,
                a * cols + (b - 1) % cols, a * cols + (b + 1) % cols]  # fmt: skip

    return Graph("torus", size, tuple(_distinct(i, around(i)) for i in range(size)))


_BUILDERS = {"ring": ring, "torus": torus}


def build(name: str, size: int) -> Graph:
    """The graph ``name`` on ``size`` ranks; UserError for an unknown name or impossible size."""
    if name not in _BUILDERS:
        raise choice_error("gossip topology", name, list(TOPOLOGIES))
    if size < 1:
        raise UserError(f"gossip: world_size must be >= 1, got {size}")
    return _BUILDERS[name](size)


def _distinct(rank: int, candidates: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(set(candidates) - {rank}))
