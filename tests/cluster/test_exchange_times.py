"""The projection's arithmetic held by hand-computed cases (issue 46): a ring allreduce on a
declared link, reduce-and-broadcast through the host, a tree, two levels of nodes, and a codec
at a stated rate. Each case is worked out in its comment; ``PLAUSIBLE_BUGS`` shows that the
numbers used tell the formula from the mistakes one would make writing it."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from qbench import catalog
from qbench.cluster import collectives, project
from qbench.cluster.declared import Cluster, Codec, Compute, Device, Host, Link, parse
from qbench.cluster.study import Workload

LINK = Link(rate=10e9, latency=10e-6)  # 80 Gbit/s, 10 us
HOST = Host(stage=1e9, bus=4e9, latency=1e-3, fixed=2e-3)


def test_ring_allreduce_on_a_declared_link() -> None:
    # 1 GB among 4: each rank sends and receives 2 (K-1)/K = 1.5 of it at 10 GB/s = 0.15 s,
    # in 2 (K-1) = 6 steps of 10 us
    assert collectives.ring_allreduce(1e9, 4, LINK) == pytest.approx(0.15 + 6e-5, rel=1e-12)


def test_reduce_and_broadcast_through_the_host() -> None:
    # 100 MB among 4: staged at 1 GB/s (0.1 s); 2 (K-1) = 6 payloads through a 4 GB/s bus
    # (0.15 s); 3 peer steps of 1 ms; 2 ms fixed
    assert collectives.host_reduce_broadcast(1e8, 4, HOST) == pytest.approx(0.255, rel=1e-12)


def test_tree_allreduce() -> None:
    # 1 GB among 8: 2 S / rate = 0.2 s; 2 log2(8) = 6 latencies
    assert collectives.tree_allreduce(1e9, 8, LINK) == pytest.approx(0.2 + 6e-5, rel=1e-12)


def test_one_device_exchanges_nothing() -> None:
    for collective in ("nccl-ring", "nccl-tree"):
        cluster = dataclasses.replace(_cluster(4, 8), collective=collective)
        assert collectives.exchange(cluster, 1e9, 1) == 0.0
    # nodes of one device declare no link inside a node
    single = dataclasses.replace(_cluster(4, 8), devices_per_node=1, intra=None)
    assert collectives.exchange(single, 1e9, 1) == 0.0
    assert collectives.exchange(single, 1e9, 2) == pytest.approx(1.0 + 2e-3)
    for f, values in ((collectives.ring_allreduce, LINK), (collectives.tree_allreduce, LINK),
                      (collectives.host_reduce_broadcast, HOST)):  # fmt: skip
        assert f(1e9, 1, values) == 0.0  # type: ignore[operator]


def _cluster(nodes: int, per_node: int) -> Cluster:
    doc = {"nodes": nodes, "devices_per_node": per_node, "collective": "nccl-ring",
           "device": {"name": "d"}, "intra": {"rate": "80gbit", "latency": "10us"},
           "inter": {"rate": "8gbit", "latency": "1ms"}}  # fmt: skip
    return parse(doc, base=Path("."))


def test_several_nodes_run_one_ring_at_the_slower_hop() -> None:
    # 4 nodes x 8, 1 GB: one ring through all 32 devices at min(10, 1) GB/s: 2 * 31/32 * 1 s
    # = 1.9375 s, and 62 steps at the 1 ms between nodes
    cluster = _cluster(4, 8)
    want = 1.9375 + 62e-3
    assert collectives.exchange(cluster, 1e9, 32) == pytest.approx(want, rel=1e-12)
    # within one node only the intra ring counts: 2 * 7/8 * 0.1 s and 14 steps of 10 us
    assert collectives.exchange(cluster, 1e9, 8) == pytest.approx(0.175 + 14e-5, rel=1e-12)
    # a faster link between nodes than inside: the NVLink-like intra rate bounds the ring
    fast = dataclasses.replace(cluster, inter=Link(rate=50e9, latency=1e-3))
    assert collectives.exchange(fast, 1e9, 32) == pytest.approx(0.19375 + 62e-3, rel=1e-12)
    # a tree across the nodes: 2 S / 1 GB/s and 2 log2(32) = 10 steps of 1 ms
    tree = dataclasses.replace(cluster, collective="nccl-tree")
    assert collectives.exchange(tree, 1e9, 32) == pytest.approx(2.0 + 10e-3, rel=1e-12)


WORKLOAD = Workload(name="w", params=1_000_000, tensors=10, batch={4: 64})


def test_a_codec_at_a_stated_rate() -> None:
    # QSGD through reduce-and-broadcast among 4, 1M values in 10 tensors: encode n (1 + 1/K) =
    # 1.25M values at 1e9/s = 1.25 ms; decode 2n = 2M at 2e9/s = 1 ms; kernels: per tensor 2
    # encodes and 2 (K-1) = 6 decodes, 80 at 5 us = 0.4 ms
    cluster = _with_codec(Codec(encode=1e9, decode=2e9, launch=5e-6))
    qsgd = catalog.compressor({"name": "qsgd", "bits": 4, "bucket_size": 512})
    got = project.codec_s(cluster, WORKLOAD, qsgd, 4, None)
    assert got == pytest.approx(1.25e-3 + 1e-3 + 0.4e-3, rel=1e-12)
    # a cast is allreduced: n each way, 2 kernels per tensor: 1 ms + 0.5 ms + 0.1 ms
    bf16 = catalog.compressor("bf16")
    assert project.codec_s(cluster, WORKLOAD, bf16, 4, None) == pytest.approx(1.6e-3, rel=1e-12)
    # fp32 codes nothing
    assert project.codec_s(cluster, WORKLOAD, catalog.FP32, 4, None) == 0.0


def _with_codec(codec: Codec) -> Cluster:
    """8 devices in a node, on LINK; compute of the workload: 0.1 s for 16 samples."""
    dev = Device(name="d", compute={"w": Compute(seconds=0.1, batch=16, source="stated")},
                 codec=codec)  # fmt: skip
    return dataclasses.replace(_cluster(1, 8), device=dev)


def test_an_iteration_adds_compute_codec_and_exchange() -> None:
    # batch 64 over 4 GPUs: 16 each, 0.1 s; QSGD 4-bit payload of 1M values in buckets of 512:
    # 500,000 code bytes + 1954 scales * 4 = 507,816 bytes, ring of 4 at 10 GB/s:
    # 1.5 * 507816 / 1e10 + 6 * 10 us; codec as above
    cluster = _with_codec(Codec(encode=1e9, decode=2e9, launch=5e-6))
    qsgd = catalog.compressor({"name": "qsgd", "bits": 4, "bucket_size": 512})
    b = project.predict(cluster, WORKLOAD, qsgd, 4)
    assert b.payload_bytes == 507_816
    comm = 1.5 * 507_816 / 1e10 + 6e-5
    assert b.compute_s == pytest.approx(0.1) and b.comm_s == pytest.approx(comm, rel=1e-12)
    assert b.samples_per_s == pytest.approx(64 / (0.1 + 2.65e-3 + comm), rel=1e-12)


def test_double_buffering_takes_the_longer_of_codec_and_exchange() -> None:
    b = project.Breakdown("w", 4, "m", 64, compute_s=1.0, codec_s=0.3, comm_s=0.5,
                          payload_bytes=1, overlap=True)  # fmt: skip
    assert b.iteration_s == 1.5
    assert project.Breakdown("w", 4, "m", 64, 1.0, 0.3, 0.5, 1).iteration_s == pytest.approx(1.8)


# A wrong formula one could write for each case, and the same inputs: every one must differ from
# the hand-computed value by more than the tests' tolerance, or the case would not catch it.
PLAUSIBLE_BUGS = {
    "ring: (K-1) instead of (K-1)/K": (lambda: 2 * 3 * 1e9 / 10e9 + 6e-5, 0.15 + 6e-5),
    "ring: one pass instead of two": (lambda: 0.75 * 1e9 / 10e9 + 3e-5, 0.15 + 6e-5),
    "ring: K steps of latency": (lambda: 0.15 + 4e-5, 0.15 + 6e-5),
    "host: bus per rank, not shared": (lambda: 0.1 + 2 * 3 / 4 * 1e8 / 4e9 + 3e-3 + 2e-3, 0.255),
    "host: K latencies": (lambda: 0.1 + 0.15 + 4e-3 + 2e-3, 0.255),
    "host: staging forgotten": (lambda: 0.15 + 3e-3 + 2e-3, 0.255),
    "nodes: intra and inter rings in turn": (lambda: 0.175 + 14e-5 + 1.5 + 6e-3, 1.9375 + 62e-3),
    "codec: decode n, not 2n": (lambda: 1.25e-3 + 0.5e-3 + 0.4e-3, 2.65e-3),
    "codec: one kernel per tensor": (lambda: 1.25e-3 + 1e-3 + 0.05e-3, 2.65e-3),
    "codec: encode n only": (lambda: 1e-3 + 1e-3 + 0.4e-3, 2.65e-3),
}


@pytest.mark.parametrize("bug", sorted(PLAUSIBLE_BUGS))
def test_the_hand_computed_cases_tell_a_plausible_bug_apart(bug: str) -> None:
    wrong, right = PLAUSIBLE_BUGS[bug]
    assert not math.isclose(wrong(), right, rel_tol=1e-6)
