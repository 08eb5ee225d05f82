"""Allgather of encoded gradients (seed 002, Algorithm 1): encode, send to all, decode all.

Every rank encodes its whole gradient (stream 0), every rank receives all K payloads
(allgatherv) and decodes them into one buffer, then divides by K. Each rank puts (K-1) copies of
its payload on the wire, so traffic grows with K, unlike reduce-broadcast's two passes over one
vector; what it saves is the re-encode of the mean (no second quantization error). Payloads whose
size depends on the data (e.g. Huffman-coded) first exchange their sizes: 8 bytes per peer,
counted in ``bytes_sent`` like everything else.
"""

from __future__ import annotations

import torch

from qbench.aggregate.base import Aggregator
from qbench.timing import PhaseTimer


class AllGather(Aggregator):
    name = "allgather"

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        wire = self.encode_slice(grad, step, "allgather").to_wire()
        timer.mark("encode")
        sizes = self._gather_sizes(wire.numel(), grad.device)
        gathered = self.comm.allgatherv(wire, sizes)
        timer.mark("comm")
        # ``gathered`` is a fresh buffer, so grad's storage (which the payload may alias) is free.
        acc = self.mean_of(gathered, sizes, grad.zero_())
        timer.mark("decode")
        self.payload_bytes = wire.numel()
        return acc

    def _gather_sizes(self, own: int, device: torch.device) -> list[int]:
        k = self.comm.world_size
        if self.fixed:
            return [self.wire_size] * k
        return self.comm.allgather_sizes(own, device)
