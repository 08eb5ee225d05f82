"""Allgather of encoded gradients (seed 002, Algorithm 1): encode, send to all, decode all.

Every rank encodes its whole gradient (stream 0), every rank receives all K payloads
(allgatherv) and decodes them into one buffer, then divides by K. Each rank puts (K-1) copies of
its payload on the wire, so traffic grows with K, unlike reduce-broadcast's two passes over one
vector; what it saves is the re-encode of the mean (no second quantization error). Payloads whose
size depends on the data (e.g. Huffman-coded) first exchange their sizes: 8 bytes per peer,
counted in ``bytes_sent`` like everything else.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from qbench.aggregate.base import Aggregator
from qbench.comm.base import Comm
from qbench.compress import Compressor
from qbench.timing import PhaseTimer


class AllGather(Aggregator):
    name = "allgather"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        tensors: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        self.fixed = compressor.fixed_size
        self.wire_size = compressor.wire_nbytes(numel, self.pieces()) if self.fixed else 0

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        c, rank = self.compressor, self.comm.rank
        wire = c.encode(
            grad, step=step, rank=rank, offset=self.offset, name="allgather", pieces=self.pieces()
        ).to_wire()
        timer.mark("encode")
        sizes = self._gather_sizes(wire.numel(), grad.device)
        gathered = self.comm.allgatherv(wire, sizes)
        timer.mark("comm")
        # ``gathered`` is a fresh buffer, so grad's storage (which the payload may alias) is free.
        acc = grad.zero_()
        pos = 0
        for size in sizes:
            c.decode(c.from_wire(gathered[pos : pos + size], self.numel, self.pieces()), out=acc)
            pos += size
        acc.div_(self.comm.world_size)
        timer.mark("decode")
        self.payload_bytes = wire.numel()
        return acc

    def _gather_sizes(self, own: int, device: torch.device) -> list[int]:
        k = self.comm.world_size
        if self.fixed:
            return [self.wire_size] * k
        return self.comm.allgather_sizes(own, device)
