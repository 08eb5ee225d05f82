"""An in-process communicator: K ranks as K threads exchanging tensors through shared slots.

Enough of :class:`qbench.comm.Comm` for the synchronous schemes (allreduce, alltoallv and what
is built on it, ``split`` for the hierarchical scheme's levels), with the base class's byte
counting, so a scheme's exchange runs on K ranks in one process in a fraction of a second.
``run_ranks(k, fn)`` calls ``fn(comm)`` on every rank and returns the results in rank order; an
exception on one rank breaks the barrier of the others and is re-raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from qbench.comm.base import Comm

T = TypeVar("T")


class _Shared:
    def __init__(self, k: int) -> None:
        self.barrier = threading.Barrier(k, timeout=60)
        self.slots: list[Any] = [None] * k


class ThreadComm(Comm):
    backend = "gloo"  # what integer-allreduce and the rules read: the widths gloo sums

    def __init__(self, shared: _Shared, rank: int, world_size: int) -> None:
        super().__init__()
        self.shared, self.rank, self.world_size = shared, rank, world_size

    def _exchange(self, mine: Any) -> list[Any]:
        """Every rank's ``mine``, in rank order."""
        self.shared.slots[self.rank] = mine
        self.shared.barrier.wait()
        got = list(self.shared.slots)
        self.shared.barrier.wait()  # nobody overwrites a slot before all have read it
        return got

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        parts = self._exchange(tensor.clone())
        out = parts[0].clone()
        for p in parts[1:]:
            out = out + p if op == "sum" else torch.maximum(out, p)
        tensor.copy_(out)

    def _alltoallv(
        self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> torch.Tensor:
        everyone = self._exchange((send.clone(), list(send_counts)))
        chunks = []
        for j, (buf, counts) in enumerate(everyone):
            start = sum(counts[: self.rank])
            chunk = buf[start : start + counts[self.rank]]
            assert chunk.numel() == recv_counts[j], (self.rank, j, chunk.numel(), recv_counts[j])
            chunks.append(chunk)
        return torch.cat(chunks) if chunks else send[:0].clone()

    def barrier(self) -> None:
        self.shared.barrier.wait()

    def split(self, color: int) -> ThreadComm:
        """The ranks of the same ``color``, in this communicator's order (``Comm.split``): the
        first of them makes their shared slots, which every member then takes."""
        colors = self._exchange(color)
        members = [r for r, c in enumerate(colors) if c == color]
        made = self._exchange(_Shared(len(members)) if members[0] == self.rank else None)
        sub = type(self)(made[members[0]], members.index(self.rank), len(members))
        sub.parent = self  # its bytes count into this communicator's too
        return sub

    def close(self) -> None:
        return None


def run_ranks(
    k: int, fn: Callable[[ThreadComm], T], comm_type: type[ThreadComm] | None = None
) -> list[T]:
    shared, make = _Shared(k), comm_type or ThreadComm
    results: list[Any] = [None] * k
    errors: list[BaseException] = []

    def rank_main(r: int) -> None:
        try:
            results[r] = fn(make(shared, r, k))
        except BaseException as e:  # re-raised below; the others must not wait for this rank
            errors.append(e)
            shared.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return results
