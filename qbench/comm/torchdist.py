"""torch.distributed backends: gloo (CPU) and nccl (CUDA). Started by torchrun (env://) or by
qbench's own launch of a local rank group (a file rendezvous)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from qbench.comm.base import Comm, Pending, allreduce_bus_bytes
from qbench.comm.env import INIT_METHOD_ENV
from qbench.errors import UserError

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def _init_process_group(backend: str, timeout: timedelta) -> None:
    """env:// as torchrun sets it up, or the launcher's file rendezvous (``INIT_METHOD_ENV``):
    ranks on one host then meet in a file and need no TCP port chosen ahead of them, which
    another process may take first (EADDRINUSE)."""
    method = os.environ.get(INIT_METHOD_ENV)
    if not method:
        dist.init_process_group(backend, timeout=timeout)
        return
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        backend, init_method=method, rank=rank, world_size=size, timeout=timeout
    )


class TorchDistComm(Comm):
    def __init__(
        self, backend: str, timeout_s: float = 600.0, *, init: bool = True, group: Any = None
    ) -> None:
        """Join the process group the launcher set up; ``init=False`` uses the default
        group someone else already initialised (see :meth:`attach`); ``group``: a subgroup
        of it (:meth:`split`)."""
        super().__init__()
        self.backend = backend
        if init and group is None:
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            _init_process_group(backend, timedelta(seconds=timeout_s))
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._owner = init and group is None

    def split(self, color: int) -> TorchDistComm:
        """torch.distributed makes a subgroup collectively: every rank creates every group, in
        the same order, and keeps its own; the colors are exchanged first (not counted: set-up,
        not gradient traffic)."""
        colors: list[Any] = [None] * self.world_size
        dist.all_gather_object(colors, color, group=self.group)
        mine = None
        for c in sorted(set(colors)):
            members = [self._global(r) for r, rc in enumerate(colors) if rc == c]
            group = dist.new_group(members)
            mine = group if c == color else mine
        sub = TorchDistComm(self.backend, group=mine)
        sub.parent = self
        return sub

    def _global(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    @classmethod
    def attach(cls) -> TorchDistComm:
        """A communicator over the default process group of a script that initialised it
        (qbench.ddp hooks in a user's own training loop); closing it leaves the group alone."""
        if not dist.is_initialized():
            raise UserError(
                "qbench.ddp needs torch.distributed initialised first; call "
                "torch.distributed.init_process_group(...) before building the hook"
            )
        return cls(str(dist.get_backend()), init=False)

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        self.bytes_sent += allreduce_bus_bytes(
            tensor.numel() * tensor.element_size(), self.world_size
        )
        dist.all_reduce(tensor, op=_OPS[op], group=self.group)

    def iallreduce_(self, tensor: torch.Tensor, op: str = "sum") -> Pending:
        self.bytes_sent += allreduce_bus_bytes(
            tensor.numel() * tensor.element_size(), self.world_size
        )
        work = dist.all_reduce(tensor, op=_OPS[op], group=self.group, async_op=True)
        assert work is not None

        def wait() -> torch.Tensor:
            work.wait()
            return tensor

        return Pending(wait)

    def _alltoallv(
        self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> torch.Tensor:
        out = torch.empty(sum(recv_counts), dtype=send.dtype, device=send.device)
        dist.all_to_all_single(out, send, list(recv_counts), list(send_counts), group=self.group)
        return out

    def _ialltoallv(
        self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> Pending:
        out = torch.empty(sum(recv_counts), dtype=send.dtype, device=send.device)
        work = dist.all_to_all_single(
            out, send, list(recv_counts), list(send_counts), group=self.group, async_op=True
        )
        assert work is not None

        def wait() -> torch.Tensor:
            work.wait()
            return out

        return Pending(wait)

    def _send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        dist.send(tensor, self._global(dst), group=self.group, tag=tag)

    def _recv(self, tensor: torch.Tensor, src: int | None, tag: int) -> int:
        # src None: gloo's recv-from-any-source (nccl has none: async-ps excludes nccl).
        src = None if src is None else self._global(src)
        got = dist.recv(tensor, src, group=self.group, tag=tag)
        return got if self.group is None else dist.get_group_rank(self.group, got)

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def close(self) -> None:
        if self._owner and dist.is_initialized():
            dist.destroy_process_group()
