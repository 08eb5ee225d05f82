"""What the decentralized schemes (gossip, push-sum) share: every rank steps its own model with
its own gradient (``aggregate`` passes it through) and mixes models with its graph neighbours in
``after_step``.

The mixing encodes on the scheme's own rounding stream; its messages travel in one
``alltoallv`` with zero counts to the ranks that are not neighbours, after 8 bytes of size to
each neighbour where the payload's size depends on the data. The consensus metric is a
measurement, left out of ``bytes_sent``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import ClassVar

import torch

from qbench.aggregate.base import Aggregator
from qbench.comm.base import Comm
from qbench.compress import Compressor, Payload
from qbench.timing import PhaseTimer


class Decentralized(Aggregator):
    """Base of gossip and push-sum: ``after_step`` mixes, with ``exchange`` for the messages."""

    stream: ClassVar[int]
    """The encodes' rounding stream, apart from every other scheme's."""

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        tensors: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        self._buffers: dict[str, torch.Tensor] = {}
        self._params: torch.Tensor | None = None
        """This slice of the model as the last ``after_step`` left it (push-sum: the de-biased
        z_i), which ``metrics`` measures."""

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        return grad  # each rank steps its own model; the mixing is in after_step

    def metrics(self) -> dict[str, float]:
        """This rank's squared distance to the mean model over this slice, ``consensus_sq``;
        the worker sums it over slices and calls gossip's ``consensus_distance``."""
        x = self._params
        if x is None:
            return {}
        mean = self._buffer("mean", x).copy_(x)
        allreduce_uncounted(self.comm, mean)
        diff = mean.div_(-self.comm.world_size).add_(x)
        return {"consensus_sq": float(torch.dot(diff, diff))}

    def _encode(self, t: torch.Tensor, step: int) -> Payload:
        payload = self.encode_slice(t, step, self.name, self.stream)
        self.payload_bytes = payload.nbytes
        return payload

    def _buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        if name not in self._buffers:
            self._buffers[name] = torch.zeros_like(like)
        return self._buffers[name]

    def exchange(
        self, messages: dict[int, torch.Tensor], sources: Collection[int], size: int,
        device: torch.device,
    ) -> dict[int, torch.Tensor]:  # fmt: skip
        """Send ``messages[k]`` to each rank k; the bytes each rank of ``sources`` sent here,
        by ascending rank. ``size``: every message's bytes when the compressor is ``fixed``."""
        k = self.comm.world_size
        if self.fixed:
            sizes = dict.fromkeys(sources, size)
        else:
            sizes = self._sizes(messages, sources, device)
        send_counts = [messages[j].numel() if j in messages else 0 for j in range(k)]
        recv_counts = [sizes.get(j, 0) for j in range(k)]
        parts = [messages[j] for j in sorted(messages)]  # alltoallv wants destination order
        send = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
        got = self.comm.alltoallv(send, send_counts, recv_counts)
        peers = sorted(sources)  # alltoallv delivers in source rank order
        return dict(zip(peers, got.split([sizes[j] for j in peers]), strict=True))

    def _sizes(
        self, messages: dict[int, torch.Tensor], sources: Collection[int], device: torch.device
    ) -> dict[int, int]:
        """Each source's message bytes: one int64 from every sender to each destination."""
        k = self.comm.world_size
        mine = [messages[j].numel() for j in sorted(messages)]
        sizes = torch.tensor(mine, dtype=torch.int64, device=device).view(torch.uint8)
        send_counts = [8 if j in messages else 0 for j in range(k)]
        got = self.comm.alltoallv(sizes, send_counts, [8 if j in sources else 0 for j in range(k)])
        return dict(zip(sorted(sources), got.view(torch.int64).tolist(), strict=True))


def allreduce_uncounted(comm: Comm, t: torch.Tensor) -> None:
    """Sum ``t`` over the ranks in place, left out of ``bytes_sent``: a measurement, not
    training traffic."""
    sent = comm.bytes_sent
    comm.allreduce_(t)
    comm.bytes_sent = sent
