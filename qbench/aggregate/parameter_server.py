"""Parameter server on rank 0, optionally with double quantization (seed 003).

Rank 0 is the server and also computes a gradient, like every rank. Per step:

1. up: every rank encodes its gradient (stream 0) and sends it to rank 0 (alltoallv in which
   only the count to rank 0 is non-zero); rank 0 decodes the K payloads and averages them;
2. down: rank 0 encodes the mean with the ``down`` compressor (stream 1; default None sends the
   fp32 mean) and sends the same payload to each of the K-1 other ranks (alltoallv from rank 0);
   every rank, rank 0 included, decodes it, so all ranks apply the same vector.

Seed 003's double quantization is ``down: {name: qsgd, bits: 8}``: gradients quantized up, the
update quantized down. Bytes are those put on the wire: each worker sends its payload once,
rank 0 sends K-1 copies of the mean (its own copy never leaves it), so rank 0's link carries
K-1 payloads each way: the bottleneck this scheme is known for. Payloads whose size depends on
the data first send their sizes the same way (8 bytes per message, counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from qbench.aggregate.base import Aggregator
from qbench.comm.base import Comm
from qbench.compress import Compressor, from_spec
from qbench.timing import PhaseTimer

SERVER = 0


class ParameterServer(Aggregator):
    name = "parameter-server"

    def __init__(
        self,
        comm: Comm,
        compressor: Compressor,
        numel: int,
        offset: int = 0,
        down: dict[str, Any] | None = None,
        *,
        tensors: Sequence[int] | None = None,
    ) -> None:
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        # The run's seed keys the down-encode too (the catalog refuses a seed of its own).
        self.down = from_spec(down or "none", seed=compressor.seed)

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        wire = self.encode_slice(grad, step, "up").to_wire()
        timer.mark("encode")
        self.payload_bytes = wire.numel()
        received, sizes = self._gather(wire)
        timer.mark("comm")
        down = torch.empty(0, dtype=torch.uint8, device=grad.device)
        if self.comm.rank == SERVER:
            # Nothing is read from ``wire`` any more, so grad's storage (it may alias) is free.
            mean = self.mean_of(received, sizes, grad.zero_())
            timer.mark("decode")
            down = self.down.encode(
                mean, step=step, rank=SERVER, stream=1, offset=self.offset, name="down",
                pieces=self.pieces(),
            ).to_wire()  # fmt: skip
            timer.mark("encode")
        down = self._broadcast(down)
        timer.mark("comm")
        out = self.down.decode(self.down.from_wire(down, self.numel, self.pieces()))
        timer.mark("decode")
        return out

    def _gather(self, wire: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """Every rank's ``wire`` to the server; returns what it received and the sizes."""
        k = self.comm.world_size
        if self.fixed:
            sizes = [self.wire_size] * k
        else:
            size = torch.tensor([wire.numel()], dtype=torch.int64, device=wire.device)
            got = self._to_server(size.view(torch.uint8), [8] * k)
            # Only the server receives sizes (elsewhere ``got`` is empty, not viewable as int64).
            sizes = got.view(torch.int64).tolist() if self.comm.rank == SERVER else [0] * k
        return self._to_server(wire, sizes), sizes

    def _to_server(self, send: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        k, rank = self.comm.world_size, self.comm.rank
        send_counts = [send.numel() if j == SERVER else 0 for j in range(k)]
        recv_counts = sizes if rank == SERVER else [0] * k
        return self.comm.alltoallv(send, send_counts, recv_counts)

    def _broadcast(self, down: torch.Tensor) -> torch.Tensor:
        """The server's ``down`` bytes on every rank (the server sends K-1 copies)."""
        if self.down.fixed_size:
            nbytes = self.down.wire_nbytes(self.numel, self.pieces())
        else:
            size = torch.tensor([down.numel()], dtype=torch.int64, device=down.device)
            nbytes = int(self._from_server(size.view(torch.uint8), 8).view(torch.int64)[0])
        return self._from_server(down, nbytes)

    def _from_server(self, send: torch.Tensor, nbytes: int) -> torch.Tensor:
        k, rank = self.comm.world_size, self.comm.rank
        if rank == SERVER:
            # The server keeps its own copy: it sends K-1 copies and receives nothing.
            peers = [0 if j == SERVER else nbytes for j in range(k)]
            self.comm.alltoallv(send.repeat(k - 1), peers, [0] * k)
            return send
        recv_counts = [nbytes if j == SERVER else 0 for j in range(k)]
        return self.comm.alltoallv(send[:0], [0] * k, recv_counts)
