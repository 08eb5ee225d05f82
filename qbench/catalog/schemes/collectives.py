"""Byte counts, message steps and bus-bandwidth factors of the collectives, without torch.

The communicators (``qbench.comm.base``), the schemes' declared traffic
(``qbench.catalog.schemes.traffic``), the collective bench and the cost model all count with
these, so they cannot drift apart; importing this module imports nothing heavy.

Per rank, K ranks, S bytes (nccl-tests ``doc/PERFORMANCE.md``):

* allreduce: 2 (K-1) / K * S, the traffic of a ring allreduce (busbw = algbw * 2 (K-1) / K);
* alltoall(v): the sends to the K-1 peers, (K-1) / K * S of an evenly split buffer;
* allgather(v) of S per rank: the own buffer once per peer, (K-1) * S (nccl-tests quotes the
  gathered K S, hence its factor (K-1) / K);
* reduce-scatter of S per rank (the whole input): the K-1 shards owed to peers, (K-1) / K * S.
"""

from __future__ import annotations


def allreduce_bus_bytes(nbytes: int, world_size: int) -> int:
    """Per-rank bytes of a ring allreduce of ``nbytes``, rounded down to whole bytes (what
    ``Comm.bytes_sent`` counts)."""
    return (2 * (world_size - 1) * nbytes) // world_size


def ring_allreduce_bytes(nbytes: float, world_size: int) -> float:
    """:func:`allreduce_bus_bytes` unrounded, for payloads of fractional bytes (the cost model)."""
    return 2 * (world_size - 1) * nbytes / world_size


def reduce_scatter_bytes(nbytes: int, world_size: int) -> int:
    """Per-rank bytes of a reduce-scatter of ``nbytes`` (this rank's whole input): the K-1
    shards it owes its peers, (K-1) / K * S."""
    return ((world_size - 1) * nbytes) // world_size


def all_gather_bytes(shard_bytes: int, world_size: int) -> int:
    """Per-rank bytes of an all-gather of a ``shard_bytes`` shard: once per peer."""
    return (world_size - 1) * shard_bytes


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


def collective_msgs(kind: str, k: int) -> int:
    """Message steps per rank (each pays alpha) of one collective over K ranks: ``allreduce``
    (a ring), ``alltoallv`` and ``allgatherv`` (direct), ``exchange`` (both of the latter)."""
    steps = {"allreduce": 2 * (k - 1), "alltoallv": k - 1, "allgatherv": k - 1}
    steps["exchange"] = steps["alltoallv"] + steps["allgatherv"]
    return steps[kind]


def collective_wire(kind: str, k: int, nbytes: float) -> float:
    """Per-rank wire bytes: ``nbytes`` is the allreduced buffer, the alltoallv send buffer or
    exchange payload (all ranges), or the allgatherv contribution of one rank."""
    factor = {
        "allreduce": busbw_factor("allreduce", k),
        "alltoallv": busbw_factor("alltoall", k),
        "exchange": busbw_factor("alltoall", k) + busbw_factor("allgather", k),
        "allgatherv": float(k - 1),  # the own buffer once per peer
    }
    return factor[kind] * nbytes
