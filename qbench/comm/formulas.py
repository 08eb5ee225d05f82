"""Byte counts and bus-bandwidth factors of the collectives, without torch.

The communicators (``qbench.comm.base``), the collective bench and the cost model all count
with these, so they cannot drift apart; importing this module imports nothing heavy.

Per rank, K ranks, S bytes (nccl-tests ``doc/PERFORMANCE.md``):

* allreduce: 2 (K-1) / K * S, the traffic of a ring allreduce (busbw = algbw * 2 (K-1) / K);
* alltoall(v): the sends to the K-1 peers, (K-1) / K * S of an evenly split buffer;
* allgather(v) of S per rank: the own buffer once per peer, (K-1) * S (nccl-tests quotes the
  gathered K S, hence its factor (K-1) / K).
"""

from __future__ import annotations


def allreduce_bus_bytes(nbytes: int, world_size: int) -> int:
    """Per-rank bytes of a ring allreduce of ``nbytes``, rounded down to whole bytes (what
    ``Comm.bytes_sent`` counts)."""
    return (2 * (world_size - 1) * nbytes) // world_size


def ring_allreduce_bytes(nbytes: float, world_size: int) -> float:
    """:func:`allreduce_bus_bytes` unrounded, for payloads of fractional bytes (the cost model)."""
    return 2 * (world_size - 1) * nbytes / world_size


def busbw_factor(collective: str, world_size: int) -> float:
    """nccl-tests factor from algorithm bandwidth (S/t) to bus bandwidth."""
    k = world_size
    factors = {
        "allreduce": 2 * (k - 1) / k,
        "allgather": (k - 1) / k,
        "reducescatter": (k - 1) / k,
        "alltoall": (k - 1) / k,
        "broadcast": 1.0,
    }
    return factors[collective]
