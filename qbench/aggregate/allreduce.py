"""Allreduce (the NCCL path of seed 002): one collective on a dtype the backend sums, then / K.

* fp32 (compressor none): the gradient is summed in place.
* fp16 / bf16: cast to the 16-bit dtype (encode), allreduce in that dtype (comm: half the bytes
  of fp32; every partial sum is rounded to 16 bits, so the error grows with K, and fp16 sums
  overflow to inf above 65504), cast back to float32 and divide by K (decode).

Packed payloads (qsgd, onebit, ...) cannot be summed as raw buffers, and MPI cannot sum bf16
(numpy, hence mpi4py, has no bfloat16 datatype): ``qbench.spec.rules`` excludes those
combinations before any rank starts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from qbench.aggregate.base import Aggregator
from qbench.comm.base import Comm
from qbench.compress import Compressor
from qbench.compress.fp16 import BFloat16, Half
from qbench.compress.none import NoCompression
from qbench.timing import PhaseTimer

SUMMABLE = (NoCompression, Half, BFloat16)


class AllReduce(Aggregator):
    name = "allreduce"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        tensors: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        if not isinstance(compressor, SUMMABLE):
            raise ValueError(
                f"allreduce sums raw buffers: compressor must be none, fp16 or bf16, "
                f"got {compressor.name}"
            )
        self.cast = not isinstance(compressor, NoCompression)
        self.payload_bytes = compressor.wire_nbytes(numel)

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        if not self.cast:
            return fp32_mean(self.comm, grad, timer)
        payload = self.compressor.encode(grad, step=step, rank=self.comm.rank, offset=self.offset)
        values = payload.buffers["values"]
        timer.mark("encode")
        self.comm.allreduce_(values)
        timer.mark("comm")
        # The cast back of Half/BFloat16.decode, written into grad's storage, then the mean.
        grad.copy_(values).div_(self.comm.world_size)
        timer.mark("decode")
        return grad


def fp32_mean(comm: Comm, grad: torch.Tensor, timer: PhaseTimer) -> torch.Tensor:
    """The uncompressed path: ``grad`` summed in place over the ranks (comm), then / K
    (decode)."""
    comm.allreduce_(grad)
    timer.mark("comm")
    grad.div_(comm.world_size)
    timer.mark("decode")
    return grad
