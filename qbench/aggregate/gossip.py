"""Decentralized gossip (seed 001; seed 000 section 5.3): every rank steps its own model with its
own gradient, then mixes models with its graph neighbours only, with any compressor.

``aggregate`` returns the local gradient unchanged; the mixing happens in ``after_step`` on this
scheme's slice of the flat parameters x_i, with W the Metropolis mixing matrix of the topology
(``qbench.aggregate.topology``: symmetric, doubly stochastic) and C the compressor:

- ``dpsgd`` (Lian et al. 2017): x_i <- W_ii x_i + sum_{j~i} W_ij C(x_j). Own model exact; with
  compressor ``none`` this is exact D-PSGD, x <- W x.
- ``choco`` (Choco-SGD, Koloskova et al. 2019/2020): public copies x_hat, q_i = C(x_i - x_hat_i)
  sent to the neighbours, x_hat_j += q_j for self and neighbours, then
  x_i += gamma sum_j W_ij (x_hat_j - x_hat_i). Kept in the memory-efficient form of Koloskova
  et al. 2020 (Algorithm 1): s_i = sum_j W_ij x_hat_j (self included) instead of one x_hat per
  neighbour, so s_i += sum_j W_ij q_j and x_i += gamma (s_i - x_hat_i). x_hat = s = 0 at start.
- ``deepsqueeze`` (Tang et al. 2019): error-compensated v_i = x_i + delta_i, c_i = C(v_i),
  delta_i <- v_i - c_i, x_i += gamma sum_j (W_ij - I_ij) c_j.

gamma (seed 001, Algorithm 1 line 7: x_i = x~_i + gamma sum_j W_ij h(C[v_j])) is the consensus
step size, default 1.0 as in the seed's published code (``--eta`` "averaging rate", default 1.0;
its run.sh uses 1 without compression and 0.01 with 99% top-k sparsification). With compressor
``none`` and gamma = 1 all three algorithms are D-PSGD; aggressive compressors need a smaller
gamma. Both algorithms conserve the average of the models over ranks for any C and gamma.

The compressor is used as a memoryless operator C: Choco's x_hat and DeepSqueeze's delta are
already the error feedback, so a compressor with ``error_feedback: true`` is refused.

Traffic: one encoded payload to each neighbour per step (``alltoallv`` with zero counts to the
other ranks), so ``bytes_sent`` = deg * payload bytes; data-dependent payload sizes (e.g.
``adaptive``) first send 8 bytes to each neighbour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from qbench.aggregate import topology as graphs
from qbench.aggregate.decentralized import Decentralized, allreduce_uncounted
from qbench.comm.base import Comm
from qbench.compress import Compressor
from qbench.timing import PhaseTimer

STREAM = 2  # rounding draws apart from the other schemes' encodes (0: gradients, 1: owners)


class Gossip(Decentralized):
    name = "gossip"
    stream = STREAM

    def __init__(
        self,
        comm: Comm,
        compressor: Compressor,
        numel: int,
        offset: int = 0,
        *,
        topology: str,
        algorithm: str,
        gamma: float,
        tensors: Sequence[int] | None = None,
    ) -> None:
        """Parameters validated by the catalog (qbench.catalog.schemes.GOSSIP), which also keeps
        compressors with their own error feedback out (qbench.spec.rules)."""
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        self.graph = graphs.build(topology, comm.world_size)
        self.algorithm, self.gamma = algorithm, gamma
        self.self_weight, self.weights = self.graph.weights(comm.rank)
        self.peers = list(self.weights)  # ascending ranks
        self._mix = {"dpsgd": self._dpsgd, "choco": self._choco, "deepsqueeze": self._deepsqueeze}[
            algorithm
        ]

    def after_step(self, params: torch.Tensor, step: int, timer: PhaseTimer) -> None:
        self._params = params
        if not self.peers:
            return  # one rank: W = [1], every algorithm leaves x as it is
        self._mix(params, step, timer)

    # -- algorithms ---------------------------------------------------------------------------
    def _dpsgd(self, x: torch.Tensor, step: int, timer: PhaseTimer) -> None:
        wire = self._encode(x, step).to_wire()
        timer.mark("encode")
        received = self._exchange(wire)
        timer.mark("comm")
        mixed = x * self.self_weight
        self._add_neighbours(mixed, received)
        x.copy_(mixed)
        timer.mark("decode")

    def _choco(self, x: torch.Tensor, step: int, timer: PhaseTimer) -> None:
        x_hat, s = self._buffer("x_hat", x), self._buffer("s", x)
        q = self._encode(x - x_hat, step)
        wire = q.to_wire()
        timer.mark("encode")
        received = self._exchange(wire)
        timer.mark("comm")
        own = self.compressor.decode(q)
        x_hat.add_(own)
        s.add_(own, alpha=self.self_weight)
        self._add_neighbours(s, received)
        x.add_(s - x_hat, alpha=self.gamma)
        timer.mark("decode")

    def _deepsqueeze(self, x: torch.Tensor, step: int, timer: PhaseTimer) -> None:
        delta = self._buffer("delta", x)
        v = x + delta
        c = self._encode(v, step)
        wire = c.to_wire()
        timer.mark("encode")
        received = self._exchange(wire)
        timer.mark("comm")
        own = self.compressor.decode(c)
        torch.sub(v, own, out=delta)  # the compression error, added back next step
        update = own * (self.self_weight - 1.0)
        self._add_neighbours(update, received)
        x.add_(update, alpha=self.gamma)
        timer.mark("decode")

    # -- helpers ------------------------------------------------------------------------------
    def _exchange(self, wire: torch.Tensor) -> dict[int, torch.Tensor]:
        """Send ``wire`` to every neighbour; what each neighbour sent, by rank."""
        return self.exchange(
            dict.fromkeys(self.peers, wire), self.weights, self.wire_size, wire.device
        )

    def _add_neighbours(self, acc: torch.Tensor, received: dict[int, torch.Tensor]) -> None:
        """acc += sum over neighbours j of W_ij C(.)_j, decoded from their wire buffers."""
        c = self.compressor
        for j, buf in received.items():
            acc.add_(c.decode(c.from_wire(buf, self.numel, self.pieces())), alpha=self.weights[j])


def consensus_distance(comm: Comm, squares: Sequence[float], device: torch.device) -> float:
    """Mean over ranks of ||x_i - x_bar|| over the whole model, from this rank's ``consensus_sq``
    of every slice: sqrt of their sum, averaged with one scalar allreduce (not counted in
    ``bytes_sent``). Every rank must call it, with its slices' values."""
    t = torch.tensor([math.sqrt(sum(squares))], dtype=torch.float64, device=device)
    allreduce_uncounted(comm, t)
    return float(t) / comm.world_size
