"""Reduce-and-broadcast (CNTK's MPI scheme, seed 002 section 2.4.1) with any compressor.

Rank i owns range i of K. Each rank encodes every range and sends it to its owner (alltoallv);
the owner decodes the K payloads, averages them, re-encodes the mean (stream 1, its own
error-feedback slot) and every rank gathers all owners' encoded ranges (allgatherv) and decodes.
Payloads whose size depends on the data (e.g. Huffman-coded) first exchange their sizes: 8 bytes
per peer, counted in ``bytes_sent`` like everything else.

Per-tensor compressors (catalog granularity ``tensor``) encode each owner range cut at the
slice's tensor boundaries: the tail of one tensor and the head of the next are separate pieces
of one payload, so a range never mixes two layers' scales, widths or budgets (with QSGD
``align: tensor`` the ranges also start on a tensor's bucket grid).

``overlap: C`` (C > 1) splits the slice into C chunks and double-buffers them (seed 002 section
3.2.1): chunk c+1 is encoded while chunk c's alltoallv is in flight. Phases then interleave, so
only the iteration time is meaningful (the worker records the run as mode ``overlap``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from qbench.aggregate.base import Aggregator
from qbench.comm.base import Comm, Pending
from qbench.compress import Compressor
from qbench.timing import PhaseTimer


@dataclass(frozen=True)
class _Chunk:
    start: int
    ranges: list[tuple[int, int]]  # owner ranges, relative to start
    wire_sizes: list[int]  # per owner range, when the compressor is fixed-size
    pieces: list[list[int]]  # per owner range: its cut at the tensor boundaries


class ReduceBroadcast(Aggregator):
    name = "reduce-broadcast"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, overlap: int = 1,
        *, tensors: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        chunks = [self._chunk(a, b - a) for a, b in self.split(numel, overlap) if b > a]
        self.chunks = chunks or [self._chunk(0, 0)]
        self.overlapped = len(self.chunks) > 1
        self._acc: dict[int, torch.Tensor] = {}

    def _chunk(self, start: int, n: int) -> _Chunk:
        ranges = self.split(n, self.comm.world_size, start)
        pieces = [self.pieces(start + a, start + b) for a, b in ranges]
        c = self.compressor
        sizes = (
            [c.wire_nbytes(b - a, p) for (a, b), p in zip(ranges, pieces, strict=True)]
            if self.fixed else []
        )  # fmt: skip
        return _Chunk(start, ranges, sizes, pieces)

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        if len(self.chunks) == 1:
            self.payload_bytes = self._synchronised(grad, self.chunks[0], step, timer)
            return grad
        self.payload_bytes = self._pipelined(grad, step)
        timer.mark("comm")  # interleaved phases: the worker keeps only the iteration time
        return grad

    def _synchronised(self, grad: torch.Tensor, ch: _Chunk, step: int, timer: PhaseTimer) -> int:
        wire, send_sizes = self._encode_sends(grad, ch, step)
        timer.mark("encode")
        recv_sizes = self._recv_sizes(ch, send_sizes)
        received = self.comm.alltoallv(wire, send_sizes, recv_sizes)
        timer.mark("comm")
        self._finish(grad, ch, received, recv_sizes, step, timer)
        return wire.numel()

    def _pipelined(self, grad: torch.Tensor, step: int) -> int:
        """Three stages in flight: chunk c is encoded and sent to its owners while chunk c-1's
        owners average and re-encode and chunk c-2's gathered ranges are decoded."""
        sent = 0
        to_owners: list[tuple[_Chunk, Pending, list[int]]] = []
        to_all: list[tuple[_Chunk, Pending, list[int]]] = []
        for ch in [*self.chunks, None, None]:
            if ch is not None:
                wire, send_sizes = self._encode_sends(grad, ch, step)
                recv_sizes = self._recv_sizes(ch, send_sizes)
                to_owners.append(
                    (ch, self.comm.ialltoallv(wire, send_sizes, recv_sizes), recv_sizes)
                )
                sent += wire.numel()
            if len(to_owners) > 1 or (ch is None and to_owners):
                prev, pending, sizes = to_owners.pop(0)
                to_all.append(self._owner_step(prev, pending.wait(), sizes, step))
            if len(to_all) > 1 or (ch is None and to_all):
                done, pending, sizes = to_all.pop(0)
                self._unpack_all(pending.wait(), done, sizes, grad)
        return sent

    def _owner_step(
        self, ch: _Chunk, received: torch.Tensor, recv_sizes: list[int], step: int
    ) -> tuple[_Chunk, Pending, list[int]]:
        own = self._owner_encode(ch, self._owner_mean(ch, received, recv_sizes), step)
        sizes = self._gather_sizes(ch, own.numel())
        return ch, self.comm.iallgatherv(own, sizes), sizes

    def _owner_mean(
        self, ch: _Chunk, received: torch.Tensor, recv_sizes: list[int]
    ) -> torch.Tensor:
        a, b = ch.ranges[self.comm.rank]
        return self._mean_of(received, recv_sizes, b - a, ch.pieces[self.comm.rank])

    def _owner_encode(self, ch: _Chunk, mean: torch.Tensor, step: int) -> torch.Tensor:
        """The owner's second quantization: stream 1 and its own error-feedback slot."""
        a = ch.ranges[self.comm.rank][0]
        return self.compressor.encode(
            mean, step=step, rank=self.comm.rank, stream=1, offset=self.offset + ch.start + a,
            name=f"owner{ch.start}", pieces=ch.pieces[self.comm.rank],
        ).to_wire()  # fmt: skip

    def _encode_sends(
        self, grad: torch.Tensor, ch: _Chunk, step: int
    ) -> tuple[torch.Tensor, list[int]]:
        c, rank, base = self.compressor, self.comm.rank, self.offset + ch.start
        sends = [
            c.encode(
                grad[ch.start + s : ch.start + e], step=step, rank=rank, offset=base + s,
                name=f"send{ch.start}.{j}", pieces=ch.pieces[j],
            ).to_wire()
            for j, (s, e) in enumerate(ch.ranges)
        ]  # fmt: skip
        return torch.cat(sends), [w.numel() for w in sends]

    def _finish(
        self, grad: torch.Tensor, ch: _Chunk, received: torch.Tensor, recv_sizes: list[int],
        step: int, timer: PhaseTimer,
    ) -> None:  # fmt: skip
        """Owner side: average the received payloads, re-encode, gather every owner's range."""
        mean = self._owner_mean(ch, received, recv_sizes)
        timer.mark("decode")
        own = self._owner_encode(ch, mean, step)
        timer.mark("encode")
        sizes = self._gather_sizes(ch, own.numel())
        gathered = self.comm.allgatherv(own, sizes)
        timer.mark("comm")
        self._unpack_all(gathered, ch, sizes, grad)
        timer.mark("decode")

    def _recv_sizes(self, ch: _Chunk, send_sizes: list[int]) -> list[int]:
        if self.fixed:
            return [ch.wire_sizes[self.comm.rank]] * self.comm.world_size
        return self.comm.alltoall_sizes(send_sizes)

    def _gather_sizes(self, ch: _Chunk, own: int) -> list[int]:
        if self.fixed:
            return ch.wire_sizes
        return self.comm.allgather_sizes(own)

    def _mean_of(
        self, received: torch.Tensor, sizes: list[int], n: int, pieces: list[int]
    ) -> torch.Tensor:
        # One accumulator per size, reused: a fresh large buffer costs page faults every step.
        acc = self._acc.get(n)
        if acc is None or acc.device != received.device:
            acc = self._acc[n] = torch.empty(n, dtype=torch.float32, device=received.device)
        return self.mean_of(received, sizes, acc.zero_(), pieces)

    def _unpack_all(
        self, gathered: torch.Tensor, ch: _Chunk, sizes: list[int], out: torch.Tensor
    ) -> None:
        pos = 0
        for (s, e), size, pieces in zip(ch.ranges, sizes, ch.pieces, strict=True):
            payload = self.compressor.from_wire(gathered[pos : pos + size], e - s, pieces)
            # Decode straight into the gradient (zero, then the kernels' decode-accumulate):
            # no temporary the size of the range.
            self.compressor.decode(payload, out=out[ch.start + s : ch.start + e].zero_())
            pos += size
