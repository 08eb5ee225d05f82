"""Hierarchical aggregation: sum inside each node, exchange between nodes, share inside the node.

Nodes are G consecutive ranks (``qbench.comm.env.ranks_per_node``: torchrun's
LOCAL_WORLD_SIZE), N = K / G of them; ``Comm.node_comms`` splits off an intra-node and an
inter-node communicator (CGX's two communicators; NCCL's rings and trees per level). Three
phases:

1. inside the node: every rank casts each part with the ``intra`` codec (none = fp32, or a
   16-bit cast) and sends it to the part's owner, which decodes the G casts, adds them in fp32
   and divides by G (the node's mean of its part);
2. between nodes, with the run's compressor: each owner runs a flat scheme on its part over the
   inter-node communicator (qbench's own ReduceBroadcast or AllGather, error feedback and all),
   which leaves the mean over all K ranks. ``inter: reduce-scatter``: the parts are the G
   ranges of the vector and local rank i exchanges range i with rank i of every other node
   (reduce-broadcast among them), so every rank carries 1/G of the inter-node traffic, as NCCL
   and CGX do; ``reduce-broadcast`` / ``allgather``: local rank 0 (the node leader) owns the
   whole vector and runs that scheme among the leaders;
3. inside the node: the owners cast their part with the intra codec again and send it to every
   local rank; every rank (owners too) decodes every part, so all end with the same vector.

A level with one member is skipped: one rank per node sends nothing inside it (no cast), one
node sends nothing between nodes (no compression). ``metrics`` gives the bytes this rank sent
on each level in the last call (``bytes_intra``, ``bytes_inter``); the run's ``bytes_sent``
counts both (sub-communicators count into their parent).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from qbench.aggregate.allgather import AllGather
from qbench.aggregate.base import Aggregator
from qbench.aggregate.reduce_broadcast import ReduceBroadcast
from qbench.comm.base import Comm
from qbench.comm.env import ranks_per_node
from qbench.compress import Compressor, from_spec
from qbench.timing import PhaseTimer

LEVEL_BYTES = ("bytes_intra", "bytes_inter")
"""The iteration columns of ``metrics``: bytes sent inside the node and between nodes."""

_INTER = {"reduce-scatter": ReduceBroadcast, "reduce-broadcast": ReduceBroadcast,
          "allgather": AllGather}  # fmt: skip


class Hierarchical(Aggregator):
    name = "hierarchical"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        intra: str = "none", inter: str = "reduce-scatter", tensors: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        per_node = ranks_per_node(comm.world_size)
        self.intra, self.inter = comm.node_comms(per_node)
        self.cast = from_spec(intra, seed=compressor.seed)
        local = self.intra.rank
        if inter == "reduce-scatter":
            self.parts = self.split(numel, per_node)
        else:  # the leader owns everything
            self.parts = [(0, numel)] + [(numel, numel)] * (per_node - 1)
        a, b = self.parts[local]
        self.between = None
        if self.inter.world_size > 1 and b > a:
            self.between = _INTER[inter](
                self.inter, compressor, b - a, offset + a, tensors=self.pieces(a, b)
            )
        self.sent = dict.fromkeys(LEVEL_BYTES, 0)

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        intra0, inter0 = self.intra.bytes_sent, self.inter.bytes_sent
        a, b = self.parts[self.intra.rank]
        part = self._node_mean(grad, timer) if self.intra.world_size > 1 else grad[a:b]
        if self.between is not None:
            part = self.between.aggregate(part, step, timer)
        if self.intra.world_size > 1:
            self._share(part, grad, timer)
        elif part.data_ptr() != grad.data_ptr():
            grad.copy_(part)
        self.payload_bytes = self._payload()
        self.sent = {
            "bytes_intra": self.intra.bytes_sent - intra0,
            "bytes_inter": self.inter.bytes_sent - inter0,
        }
        return grad

    def _node_mean(self, grad: torch.Tensor, timer: PhaseTimer) -> torch.Tensor:
        """Phase 1: each part, cast, to its owner; the owner's part summed in fp32, / G."""
        sends = [self._encode(grad[a:b]) for a, b in self.parts]
        timer.mark("encode")
        a, b = self.parts[self.intra.rank]
        size = self.cast.wire_nbytes(b - a)
        g = self.intra.world_size
        received = self.intra.alltoallv(torch.cat(sends), [w.numel() for w in sends], [size] * g)
        timer.mark("comm")
        acc = torch.zeros(b - a, dtype=torch.float32, device=grad.device)
        for j in range(g if b > a else 0):
            self.cast.decode(self.cast.from_wire(received[j * size : (j + 1) * size], b - a), acc)
        timer.mark("decode")
        return acc.div_(g)

    def _share(self, part: torch.Tensor, grad: torch.Tensor, timer: PhaseTimer) -> None:
        """Phase 3: every owner's part, cast, to every local rank; all decode all parts."""
        own = self._encode(part)
        timer.mark("encode")
        sizes = [self.cast.wire_nbytes(b - a) for a, b in self.parts]
        gathered = self.intra.allgatherv(own, sizes)
        timer.mark("comm")
        pos = 0
        for (a, b), size in zip(self.parts, sizes, strict=True):
            if b > a:
                payload = self.cast.from_wire(gathered[pos : pos + size], b - a)
                self.cast.decode(payload, out=grad[a:b].zero_())
            pos += size
        timer.mark("decode")

    def _encode(self, values: torch.Tensor) -> torch.Tensor:
        if not values.numel():
            return torch.empty(0, dtype=torch.uint8, device=values.device)
        return self.cast.encode(values, rank=self.comm.rank, offset=self.offset).to_wire()

    def _payload(self) -> int:
        """G times the bytes of this rank's share of the gradient on the inter-node wire (the
        run's compressor), or of its intra-node cast where no inter-node phase runs. A rank
        encodes 1/G of its node's gradient (a lane) or all or none of it (leader modes), so
        the mean over ranks, which reports divide the gradient's bytes by, is the node's whole
        encoded gradient, as a flat scheme's payload is."""
        if self.between is not None:
            return self.intra.world_size * self.between.payload_bytes
        a, b = self.parts[self.intra.rank]
        return (
            self.intra.world_size * self.cast.wire_nbytes(b - a)
            if self.intra.world_size > 1
            else self.cast.wire_nbytes(self.numel)
        )

    def metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.sent.items()}
