"""Push-sum over directed graphs (seed 001 section 2): stochastic gradient push (SGP, Assran et al.
2019) and its Choco-compressed form (Quant-SGP, Taheri et al. 2020), with any compressor.

Each rank keeps a numerator x_i and a push-sum weight w_i (1 at start) in this scheme's state;
the worker's slice of the flat parameters holds the de-biased model z_i = x_i / w_i, which the
forward pass and the gradient use. ``aggregate`` returns the local gradient unchanged, so the
optimizer leaves z_i - lr g_i in the slice; ``after_step`` adds that displacement to x_i (SGP
applies the gradient taken at z_i to the numerator), mixes (x, w) over the graph and writes
z_i = x_i / w_i back into the slice. With P(t) the column-stochastic matrix of
``qbench.aggregate.directed`` (P_ki: the share rank i pushes to k) and C the compressor:

- ``sgp``: x_i <- P_ii x_i + sum_j P_ij C(x_j), w_i <- P_ii w_i + sum_j P_ij w_j. With
  compressor ``none`` this is exact SGP; a lossy C does not conserve sum_i x_i (like gossip's
  D-PSGD with a compressor).
- ``choco`` (Quant-SGP): Choco-SGD's consensus step on public copies,
  x_i += gamma (sum_j P_ij x_hat_ji - sum_k P_ki x_hat_ik), and the same for w_i (sent exactly).
  An edge of a time-varying graph is active only every few steps, so one public copy per rank
  would go stale at its occasional receivers: x_hat is kept per directed edge, by both its
  sender and its receiver, and moved by q = C(x_i - x_hat_ik) only when the edge is active
  (zero at start). Both ends add the same q, so sum_i x_i and sum_i w_i = K are conserved for
  any C and gamma. Memory: one copy per out-edge and per in-edge of a period, 2 on the
  directed ring, 2 ceil(log2 K) on the exponential graph. C = none, gamma = 1: exact SGP.

``auto`` (the default) runs sgp with compressor ``none`` and gamma 1, choco otherwise. As in
gossip, the compressor is memoryless: choco's x_hat is its error feedback, so a compressor with
``error_feedback: true`` is refused.

Quasi-global momentum (``qgm``; Lin et al. 2021, QG-DSGDm; seed 001 Table 4) builds the momentum
from the model's change over a whole step, mixing included, rather than from local gradients.
The optimizer lives in the worker, so the scheme applies it as a correction, in units of
displacement u = lr m: x_i -= beta u_i before mixing, then u_i <- beta u_i + (1 - beta)
(z_i(t) - z_i(t+1)). For a constant lr this is QG-DSGDm with mu = beta; when lr changes, u keeps
displacements taken at the old rate. The first step's displacement is not seen (the slice was
already stepped), so u starts at the second step. The scenario must use ``momentum: 0``.

Traffic: per step one encoded payload plus the 4-byte fp32 weight to each out-peer (alltoallv
with zero counts to the other ranks), so ``bytes_sent`` = payload bytes + 4 per out-peer;
data-dependent payload sizes (e.g. ``adaptive``) first send 8 bytes of size to each out-peer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from qbench.aggregate import directed
from qbench.aggregate.decentralized import Decentralized
from qbench.catalog.schemes import qgm_beta
from qbench.comm.base import Comm
from qbench.compress import Compressor, Payload
from qbench.timing import PhaseTimer

STREAM = 3  # rounding draws apart from other encodes (0: gradients, 1: owners, 2: gossip)
WEIGHT = 4  # bytes of the fp32 push-sum weight appended to every message


class PushSum(Decentralized):
    name = "push-sum"
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
        qgm: bool | float,
        tensors: Sequence[int] | None = None,
    ) -> None:
        """Parameters validated by the catalog (qbench.catalog.schemes.PUSH_SUM), which also
        keeps compressors with their own error feedback out (qbench.spec.rules)."""
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        self.algorithm = _resolve(algorithm, compressor.name, gamma)
        self.gamma, self.beta = gamma, qgm_beta(qgm)  # beta 0: no quasi-global momentum
        self.schedule = directed.schedule(topology, comm.rank, comm.world_size)
        """This rank's mixing at each step of the period; tests swap in other column-stochastic
        schedules (the real graphs are also row-stochastic, so w would stay 1)."""
        self.weight = 1.0
        self._copies: dict[tuple[str, int], torch.Tensor] = {}  # choco's x_hat per edge

    def after_step(self, params: torch.Tensor, step: int, timer: PhaseTimer) -> None:
        self._params = params
        x, before = self._numerator(params)
        if self.beta:
            x.sub_(self._buffer("u", x), alpha=self.beta)
        mix = self.schedule[step % len(self.schedule)]
        if mix.out or mix.inn:  # one rank: nothing to mix
            self.weight = _fp32(self.weight)  # sent as fp32: both ends must use the same value
            (self._choco if self.algorithm == "choco" else self._sgp)(x, mix, step, timer)
        torch.div(x, self.weight, out=params)  # the de-biased model for the next forward pass
        if self.beta and before is not None:
            u = self._buffer("u", x)
            u.mul_(self.beta).add_(before.sub_(params), alpha=1.0 - self.beta)

    # -- algorithms ---------------------------------------------------------------------------
    def _numerator(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x_i += the optimizer's displacement, params - z_i (z_i = x_i / w_i is what the slice
        held before the step); returns x_i and, for qgm, that previous z_i."""
        if "x" not in self._buffers:  # first step: x_0 = z_0 (w = 1), plus the displacement
            self._buffers["x"] = params.clone()
            return self._buffers["x"], None
        x = self._buffers["x"]
        if self.beta:
            before = x / self.weight
            x.add_(params).sub_(before)
            return x, before
        x.mul_(1.0 - 1.0 / self.weight).add_(params)  # x - x / w + params, without a temporary
        return x, None

    def _sgp(self, x: torch.Tensor, mix: directed.Mixing, step: int, timer: PhaseTimer) -> None:
        message = self._message(self._encode(x, step).to_wire())
        timer.mark("encode")
        received = self._exchange(dict.fromkeys(mix.out, message), mix.inn, x.device)
        timer.mark("comm")
        x.mul_(mix.keep)
        weight = mix.keep * self.weight
        for j, (payload, w_j) in received.items():
            x.add_(self.compressor.decode(payload), alpha=mix.inn[j])
            weight += mix.inn[j] * w_j
        self.weight = weight
        timer.mark("decode")

    def _choco(self, x: torch.Tensor, mix: directed.Mixing, step: int, timer: PhaseTimer) -> None:
        own = {k: self._encode(x - self._copy("out", k, x), step) for k in mix.out}
        messages = {k: self._message(q.to_wire()) for k, q in own.items()}
        timer.mark("encode")
        received = self._exchange(messages, mix.inn, x.device)
        timer.mark("comm")
        g, w = self.gamma, self.weight
        for k, q in own.items():  # what this rank pushes out leaves it ...
            x.sub_(self.compressor.decode(q, out=self._copy("out", k, x)), alpha=g * mix.out[k])
        for j, (q, _) in received.items():  # ... and arrives at its out-peers, bit for bit
            x.add_(self.compressor.decode(q, out=self._copy("in", j, x)), alpha=g * mix.inn[j])
        pushed = sum(mix.out.values()) * w
        self.weight = w + g * (sum(mix.inn[j] * w_j for j, (_, w_j) in received.items()) - pushed)
        timer.mark("decode")

    # -- helpers ------------------------------------------------------------------------------
    def _message(self, wire: torch.Tensor) -> torch.Tensor:
        """The payload's wire bytes followed by the fp32 push-sum weight."""
        w = torch.tensor([self.weight], dtype=torch.float32, device=wire.device)
        return torch.cat([wire, w.view(torch.uint8)])

    def _exchange(
        self, messages: dict[int, torch.Tensor], inn: dict[int, float], device: torch.device
    ) -> dict[int, tuple[Payload, float]]:
        """Send ``messages[k]`` to each out-peer k; (payload, weight) from each in-peer."""
        got = self.exchange(messages, inn, self.wire_size + WEIGHT, device)
        return {j: self._unpack(b) for j, b in got.items()}

    def _unpack(self, buf: torch.Tensor) -> tuple[Payload, float]:
        weight = float(buf[-WEIGHT:].clone().view(torch.float32))
        return self.compressor.from_wire(buf[:-WEIGHT], self.numel, self.pieces()), weight

    def _copy(self, end: str, peer: int, like: torch.Tensor) -> torch.Tensor:
        """Choco's public copy x_hat of edge (self -> peer) for end "out", (peer -> self) "in"."""
        if (end, peer) not in self._copies:
            self._copies[end, peer] = torch.zeros_like(like)
        return self._copies[end, peer]


def _resolve(algorithm: str, compressor: str, gamma: float) -> str:
    """``auto``: exact sgp when nothing is compressed and gamma is 1 (choco would compute the
    same with two more copies of the model), else choco, the one that compresses or damps."""
    if algorithm != "auto":
        return algorithm
    return "sgp" if compressor == "none" and gamma == 1.0 else "choco"


def _fp32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))
