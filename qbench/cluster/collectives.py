"""The time of one gradient exchange of ``nbytes`` (one rank's payload) among ``k`` devices on a
declared cluster. Each formula is the textbook one for its collective, on the declared values:

* **MPI reduce-and-broadcast through the host** (seed 002 §2.4.1 and §3.3: the model split in K
  ranges, each range sent to its owner, summed there and broadcast back; CNTK's MPI path stages
  every gradient in host memory):

      t = S / stage + 2 (K-1) S / bus + (K-1) latency + fixed      (K > 1)

  ``stage``: each device copies its payload to the host and the result back over its own PCIe
  path (independent of K); ``bus``: the K ranks' range exchange moves 2 (K-1) payloads in all
  through the host's shared memory, one bus for every rank; ``latency`` per peer step and a
  ``fixed`` cost per exchange.
* **NCCL ring allreduce** inside a node (Patarasuk and Yuan's bandwidth-optimal ring, as NCCL):
  ``t = 2 (K-1)/K * S / rate + 2 (K-1) latency``.
* **NCCL tree allreduce** (double binary tree: each half of the data down one tree and up the
  other): ``t = 2 S / rate + 2 log2(K) latency``.
* **Several nodes**: NCCL runs one ring (or tree) through every device of every node, its
  hops pipelined, so the slowest kind of hop sets the rate: the formula above over all K
  devices at ``min(intra.rate, inter.rate)``, every step charged ``inter.latency`` (an upper
  bound: the steps inside a node are faster). ``inter.rate`` is therefore what a multi-node
  nccl-tests allreduce reports as bus bandwidth for a node's links together (one NIC's worth
  per rail; nccl-tests issue 160: on 3 or more nodes a ring's busbw is the node's NIC total).

Rates are nccl-tests' bus bandwidth (its doc/PERFORMANCE.md: ``busbw = S / t * 2 (K-1)/K``
for an allreduce), so a published busbw is declared unchanged and the ring formula returns the
time nccl-tests measured. Compressed payloads, which no allreduce can sum, are exchanged with
the same volume (an all-to-all of ranges and an all-gather: ``qbench.catalog.schemes``).
"""

from __future__ import annotations

import math

from qbench.cluster.declared import Cluster, Host, Link


def host_reduce_broadcast(nbytes: float, k: int, host: Host) -> float:
    if k == 1:
        return 0.0
    return (nbytes / host.stage + 2 * (k - 1) * nbytes / host.bus + (k - 1) * host.latency
            + host.fixed)  # fmt: skip


def ring_allreduce(nbytes: float, k: int, link: Link) -> float:
    return 2 * (k - 1) / k * nbytes / link.rate + 2 * (k - 1) * link.latency  # 0 at k = 1


def tree_allreduce(nbytes: float, k: int, link: Link) -> float:
    if k == 1:
        return 0.0
    return 2 * nbytes / link.rate + 2 * math.log2(k) * link.latency


def exchange(cluster: Cluster, nbytes: float, k: int, host: Host | None = None) -> float:
    """One exchange among ``k`` devices (the first ``k`` of the cluster, filling nodes in
    order). ``host``: fitted values for a ``host: calibrated`` cluster."""
    if cluster.collective == "mpi-host":
        values = host or cluster.host
        assert values is not None, "mpi-host needs host values (declared or calibrated)"
        return host_reduce_broadcast(nbytes, k, values)
    if k == 1:
        return 0.0
    form = ring_allreduce if cluster.collective == "nccl-ring" else tree_allreduce
    return form(nbytes, k, path(cluster, k))


def path(cluster: Cluster, k: int) -> Link:
    """The link a collective among the first ``k`` devices runs at: ``intra`` inside one node;
    across nodes the slower of the two rates, at the latency between nodes."""
    if k <= cluster.devices_per_node:
        assert cluster.intra is not None, "a node of several devices declares intra"
        return cluster.intra
    assert cluster.inter is not None, "several nodes declare inter"
    if cluster.intra is None:
        return cluster.inter
    return Link(rate=min(cluster.intra.rate, cluster.inter.rate), latency=cluster.inter.latency)
