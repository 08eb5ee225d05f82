"""SIMULATED low-precision allreduce (seed 002 section 4.4, "NCCL Simulation"): speed only.

NCCL sums only full-precision types, so the paper times low precision on NCCL by sending "the
same number of bits using NCCL as we would if NCCL would have had support for low-precision".
This scheme does the same on any backend:

1. encode the gradient for real (timed as encode);
2. allreduce a float32 buffer of ceil(payload_bytes / 4) elements (timed as comm): the bytes a
   low-precision allreduce would move, typed fp32 as NCCL requires;
3. decode this rank's OWN payload (timed as decode) and return it.

The gradients are NOT reduced: each rank applies its own (compressed) gradient, so the models
drift apart and accuracy and loss are meaningless; only the timings are (the matrix labels these
runs ``simulated: True``). The buffer holds zeros: summing the payload's bit patterns as floats
would hit NaN and denormal slow paths that a real low-precision reduction never takes.

Payloads whose size depends on the data (not ``fixed_size``) first agree on the largest size
with one int64 MAX allreduce (counted in ``bytes_sent``), since allreduce needs equal sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from qbench.aggregate.base import Aggregator
from qbench.comm.base import Comm
from qbench.compress import Compressor
from qbench.timing import PhaseTimer


class SimulatedLowPrec(Aggregator):
    name = "simulated-lowprec"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        tensors: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        self._buffer = torch.zeros(0, dtype=torch.float32)

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        payload = self.encode_slice(grad, step, "own")
        timer.mark("encode")
        nbytes = payload.nbytes if self.fixed else self._max_over_ranks(payload.nbytes, grad)
        self.comm.allreduce_(self._zeros(-(-nbytes // 4), grad.device))
        timer.mark("comm")
        own = self.compressor.decode(payload)
        timer.mark("decode")
        self.payload_bytes = payload.nbytes
        return own

    def _max_over_ranks(self, nbytes: int, grad: torch.Tensor) -> int:
        size = torch.tensor([nbytes], dtype=torch.int64, device=grad.device)
        self.comm.allreduce_(size, op="max")
        return int(size.item())

    def _zeros(self, numel: int, device: torch.device) -> torch.Tensor:
        # Reused between steps (a sum of zeros stays zero); grown when a payload is larger.
        if self._buffer.numel() < numel or self._buffer.device != device:
            self._buffer = torch.zeros(numel, dtype=torch.float32, device=device)
        return self._buffer[:numel]
