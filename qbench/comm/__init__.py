"""Collectives behind one small interface (gloo, nccl, mpi4py), bytes counted.

Importing the package imports no torch: the byte counts
(``qbench.catalog.schemes.collectives``) are read by torch-free code such as the cost model;
``Comm`` is ``qbench.comm.base``'s, imported from there by the code that holds one (torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qbench.catalog.schemes.collectives import allreduce_bus_bytes, busbw_factor
from qbench.comm.env import INIT_METHOD_ENV, MPI_RANK_VARS

if TYPE_CHECKING:
    from qbench.comm.base import Comm

__all__ = ["INIT_METHOD_ENV", "MPI_RANK_VARS", "allreduce_bus_bytes", "busbw_factor", "connect"]


def connect(backend: str, timeout_s: float = 600.0) -> Comm:
    """Join the communicator the launcher set up for this process."""
    # torch (and mpi4py): loaded when a rank joins; importing the package loads none (the cost
    # model reads its byte counts)
    from qbench.comm import mpi, torchdist

    if backend == "mpi":
        return mpi.MPIComm()
    return torchdist.TorchDistComm(backend, timeout_s)
