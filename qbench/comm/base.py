"""Communication backends behind one small interface, with honest byte accounting.

``bytes_sent`` accumulates the bytes of data this rank puts on the wire for its peers:

* alltoallv: the send counts to other ranks (the part for itself never leaves the rank);
* allgatherv: this rank's buffer once per peer, (K-1) * own;
* allreduce of S bytes: 2 (K-1) / K * S, the per-rank traffic of a ring allreduce, which is the
  nccl-tests "bus bandwidth" convention (busbw = algbw * 2 (K-1) / K, see nccl-tests
  doc/PERFORMANCE.md). The library may pick another algorithm; this is the comparable count
  (``qbench.catalog.schemes.collectives``, torch-free, holds these counts and factors);
* send (point to point): the tensor's bytes; recv counts nothing (the sender did).

A sub-communicator (:meth:`Comm.split`, :meth:`Comm.node_comms`) counts its own bytes, and each
byte it counts is its parent's too: the run's ``bytes_sent`` stays the total over all levels.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch

from qbench.catalog.schemes.collectives import allreduce_bus_bytes, busbw_factor

__all__ = ["Comm", "Pending", "allreduce_bus_bytes", "busbw_factor"]


class Pending:
    """A collective in flight; ``wait()`` returns its result."""

    def __init__(self, wait: Callable[[], torch.Tensor]) -> None:
        self._wait = wait

    def wait(self) -> torch.Tensor:
        return self._wait()


class Comm(ABC):
    """One process's view of a communicator of ``world_size`` ranks."""

    backend: str
    rank: int
    world_size: int
    threads = True
    """Whether a communicator split from this one may run collectives on a second thread
    (``qbench.comm.background``)."""

    def __init__(self) -> None:
        self._sent = 0
        self.parent: Comm | None = None
        """The communicator this one was split from, which counts its bytes too."""
        self._nodes: dict[int, tuple[Comm, Comm]] = {}

    @property
    def bytes_sent(self) -> int:
        return self._sent

    @bytes_sent.setter
    def bytes_sent(self, value: int) -> None:
        # Only what is added reaches the parent: a loop resetting a sub-communicator's
        # counter to 0 must not take bytes off the run's total.
        if self.parent is not None and value > self._sent:
            self.parent.bytes_sent += value - self._sent
        self._sent = value

    def split(self, color: int) -> Comm:
        """The sub-communicator of the ranks that pass the same ``color``, ranked in this
        communicator's order. Collective: every rank calls it, in the same order."""
        raise NotImplementedError(f"{type(self).__name__} cannot split")

    def node_comms(self, per_node: int) -> tuple[Comm, Comm]:
        """(intra, inter) for nodes of ``per_node`` consecutive ranks: intra holds this rank's
        node, inter the ranks with this rank's local index on every node (local rank 0's is
        the node leaders'). Made once per ``per_node`` (every rank asks in the same order)."""
        if per_node not in self._nodes:
            intra = self.split(self.rank // per_node)
            inter = self.split(self.rank % per_node)
            self._nodes[per_node] = (intra, inter)
        return self._nodes[per_node]

    @abstractmethod
    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """In-place allreduce; op is ``sum`` or ``max``."""
        raise NotImplementedError

    def iallreduce_(self, tensor: torch.Tensor, op: str = "sum") -> Pending:
        """Non-blocking in-place allreduce; ``wait()`` returns ``tensor`` once it holds the
        result. Backends without one complete it here."""
        self.allreduce_(tensor, op)
        return Pending(lambda: tensor)

    @abstractmethod
    def _alltoallv(
        self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> torch.Tensor:
        raise NotImplementedError

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        """Blocking point-to-point send of a contiguous tensor to rank ``dst``. Messages between
        two ranks with the same tag arrive in the order they were sent."""
        self.bytes_sent += tensor.numel() * tensor.element_size()
        self._send(tensor, dst, tag)

    def recv(self, tensor: torch.Tensor, src: int | None = None, tag: int = 0) -> int:
        """Blocking receive into ``tensor`` (its size must match the message) from ``src``, or
        from whichever rank sends first when ``src`` is None; returns the sender's rank."""
        return self._recv(tensor, src, tag)

    def _send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        # Not abstract: in-process test communicators need not offer point-to-point messages.
        raise NotImplementedError(f"{type(self).__name__} has no point-to-point send")

    def _recv(self, tensor: torch.Tensor, src: int | None, tag: int) -> int:
        raise NotImplementedError(f"{type(self).__name__} has no point-to-point recv")

    def abort(self, code: int) -> None:
        """End every rank after a local failure. torchrun already does when a rank exits
        non-zero; MPI does not, and peers would wait in their collective until the timeout."""
        return None

    @abstractmethod
    def barrier(self) -> None:
        raise NotImplementedError

    @abstractmethod
    def close(self) -> None:
        raise NotImplementedError

    def alltoallv(
        self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> torch.Tensor:
        """Rank r sends ``send_counts[j]`` consecutive bytes of ``send`` to rank j; returns the
        concatenation of what every rank sent to r (``recv_counts[j]`` bytes from rank j)."""
        self.bytes_sent += sum(send_counts) - send_counts[self.rank]
        return self._alltoallv(send, send_counts, recv_counts)

    def ialltoallv(
        self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> Pending:
        """Non-blocking alltoallv, so the caller can encode the next bucket meanwhile
        (double buffering). Backends without one complete it here."""
        self.bytes_sent += sum(send_counts) - send_counts[self.rank]
        return self._ialltoallv(send, send_counts, recv_counts)

    def _ialltoallv(
        self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> Pending:
        done = self._alltoallv(send, send_counts, recv_counts)
        return Pending(lambda: done)

    def iallgatherv(self, send: torch.Tensor, counts: Sequence[int]) -> Pending:
        """Non-blocking allgatherv (same direct exchange and byte count as ``allgatherv``)."""
        k = self.world_size
        return self.ialltoallv(send.repeat(k), [send.numel()] * k, list(counts))

    def allgatherv(self, send: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
        """Every rank contributes ``counts[rank]`` bytes; all receive the concatenation."""
        k = self.world_size
        # Direct exchange through alltoallv: own buffer once per peer, exactly (K-1) * own bytes.
        return self.alltoallv(send.repeat(k), [send.numel()] * k, list(counts))

    def alltoall_sizes(self, counts: Sequence[int], device: Any = None) -> list[int]:
        """What each rank will send this one, given what this one sends each (payload sizes
        that depend on the data): one int64 per peer through ``alltoallv``, counted."""
        k = self.world_size
        sizes = torch.tensor(list(counts), dtype=torch.int64, device=device)
        got = self.alltoallv(sizes.view(torch.uint8), [8] * k, [8] * k)
        return [int(v) for v in got.view(torch.int64).tolist()]

    def allgather_sizes(self, own: int, device: Any = None) -> list[int]:
        """Every rank's ``own`` size (one int64 each through ``allgatherv``, counted)."""
        size = torch.tensor([own], dtype=torch.int64, device=device)
        got = self.allgatherv(size.view(torch.uint8), [8] * self.world_size)
        return [int(v) for v in got.view(torch.int64).tolist()]
