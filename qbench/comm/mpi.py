"""MPI through mpi4py (started by mpirun). Host buffers: CUDA tensors are staged through host.

Non-blocking allreduce: Open MPI progresses an ``MPI_Iallreduce`` only inside MPI calls, so a
rank busy quantizing the next chunk would leave it idle (measured: no overlap at all). When the
library provides MPI_THREAD_MULTIPLE, ``iallreduce_`` instead runs a blocking ``Allreduce`` on a
duplicated communicator in one helper thread (mpi4py and the C kernels release the GIL), which
keeps the wire busy while the caller computes; collectives stay in issue order on every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from qbench.comm.base import Comm, Pending, allreduce_bus_bytes


class MPIComm(Comm):
    backend = "mpi"

    def __init__(self, comm: Any = None) -> None:
        """COMM_WORLD, or ``comm`` (a communicator :meth:`split` made)."""
        super().__init__()
        from mpi4py import MPI  # importing it calls MPI_Init: only when a communicator is made

        self._mpi = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.world_size = self.comm.Get_size()
        self._threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self.threads = self._threaded  # a helper thread's collectives need THREAD_MULTIPLE
        self._bg_comm: Any = None
        self._bg: ThreadPoolExecutor | None = None

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        self.bytes_sent += allreduce_bus_bytes(
            tensor.numel() * tensor.element_size(), self.world_size
        )
        host = _host(tensor)
        mpi_op = {"sum": self._mpi.SUM, "max": self._mpi.MAX}[op]
        self.comm.Allreduce(self._mpi.IN_PLACE, host.numpy(), op=mpi_op)
        if host is not tensor:
            tensor.copy_(host)

    def iallreduce_(self, tensor: torch.Tensor, op: str = "sum") -> Pending:
        self.bytes_sent += allreduce_bus_bytes(
            tensor.numel() * tensor.element_size(), self.world_size
        )
        host = _host(tensor)
        mpi_op = {"sum": self._mpi.SUM, "max": self._mpi.MAX}[op]
        if self._threaded:
            if self._bg is None:
                self._bg_comm = self.comm.Dup()
                self._bg = ThreadPoolExecutor(1, thread_name_prefix="qbench-mpi")
            bg_comm, buf = self._bg_comm, host.numpy()
            future = self._bg.submit(lambda: bg_comm.Allreduce(self._mpi.IN_PLACE, buf, op=mpi_op))
            done: Callable[[], Any] = future.result
        else:
            done = self.comm.Iallreduce(self._mpi.IN_PLACE, host.numpy(), op=mpi_op).Wait

        def wait() -> torch.Tensor:
            done()
            if host is not tensor:
                tensor.copy_(host)
            return tensor

        return Pending(wait)

    def _alltoallv(
        self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> torch.Tensor:
        src = _host(send).numpy()
        out = np.empty(sum(recv_counts), dtype=src.dtype)
        self.comm.Alltoallv([src, (list(send_counts), None)], [out, (list(recv_counts), None)])
        return torch.from_numpy(out).to(send.device)

    def _ialltoallv(
        self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> Pending:
        src = _host(send).numpy()
        out = np.empty(sum(recv_counts), dtype=src.dtype)
        req = self.comm.Ialltoallv(
            [src, (list(send_counts), None)], [out, (list(recv_counts), None)]
        )

        def wait(src: np.ndarray = src) -> torch.Tensor:  # keeps src alive until completion
            req.Wait()
            return torch.from_numpy(out).to(send.device)

        return Pending(wait)

    def allgatherv(self, send: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
        self.bytes_sent += send.numel() * send.element_size() * (self.world_size - 1)
        src = _host(send).numpy()
        out = np.empty(sum(counts), dtype=src.dtype)
        self.comm.Allgatherv(src, [out, (list(counts), None)])
        return torch.from_numpy(out).to(send.device)

    def _send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        self.comm.Send(_host(tensor).numpy(), dest=dst, tag=tag)

    def _recv(self, tensor: torch.Tensor, src: int | None, tag: int) -> int:
        host = _host(tensor)
        status = self._mpi.Status()
        source = self._mpi.ANY_SOURCE if src is None else src
        self.comm.Recv(host.numpy(), source=source, tag=tag, status=status)
        if host is not tensor:
            tensor.copy_(host)
        return int(status.Get_source())

    def split(self, color: int) -> MPIComm:
        sub = MPIComm(self.comm.Split(color, self.rank))
        sub.parent = self
        return sub

    def abort(self, code: int) -> None:
        self.comm.Abort(code)

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        if self._bg is not None:
            self._bg.shutdown(wait=True)
            self._bg = None
        if self._bg_comm is not None:
            self._bg_comm.Free()
            self._bg_comm = None


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous() if t.device.type == "cpu" else t.cpu()
