"""The decoded-mean scheme (torch): decode locally, then one fp32 allreduce (a toy: what it
sends is the decoded gradient, so it measures the codec's error, not its bytes)."""

from __future__ import annotations

import torch

from qbench.aggregate import Aggregator
from qbench.timing import PhaseTimer


class DecodedMean(Aggregator):
    name = "decoded-mean"

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        c = self.compressor
        payload = c.encode(grad, step=step, rank=self.comm.rank, offset=self.offset)
        self.payload_bytes = payload.nbytes
        timer.mark("encode")
        out = c.decode(payload)
        timer.mark("decode")
        self.comm.allreduce_(out)
        timer.mark("comm")
        return out.div_(self.comm.world_size)
