"""The collectives' byte counts and bus factors (qbench.catalog.schemes.collectives) against
numbers written by hand from nccl-tests' doc/PERFORMANCE.md and qbench's own counting."""

from __future__ import annotations

import pytest

from qbench.catalog.schemes.collectives import (
    all_gather_bytes,
    allreduce_bus_bytes,
    busbw_factor,
    collective_msgs,
    collective_wire,
    reduce_scatter_bytes,
    ring_allreduce_bytes,
)


def test_ring_allreduce_bytes_are_2_k_minus_1_over_k_rounded_down_to_whole_bytes() -> None:
    assert allreduce_bus_bytes(1000, 4) == 1500  # 2 * 3 / 4 * 1000
    assert allreduce_bus_bytes(1001, 3) == 1334  # 2 * 2 * 1001 / 3 = 1334.67, floored
    assert allreduce_bus_bytes(1000, 1) == 0
    assert ring_allreduce_bytes(1001, 3) == pytest.approx(4004 / 3, rel=1e-15)  # not floored


def test_reduce_scatter_and_all_gather_bytes_per_rank() -> None:
    assert reduce_scatter_bytes(1000, 4) == 750  # the 3 shards owed to peers
    assert reduce_scatter_bytes(1001, 3) == 667  # 2 * 1001 / 3 = 667.33, floored
    assert all_gather_bytes(250, 4) == 750  # the own shard once per peer
    assert all_gather_bytes(250, 1) == 0


@pytest.mark.parametrize(
    ("collective", "k", "factor"),
    [("allreduce", 4, 1.5), ("allgather", 4, 0.75), ("reducescatter", 8, 0.875),
     ("alltoall", 2, 0.5), ("broadcast", 8, 1.0)],
)  # fmt: skip
def test_bus_factors_are_nccl_tests(collective: str, k: int, factor: float) -> None:
    assert busbw_factor(collective, k) == factor


def test_message_steps_and_wire_of_the_cost_models_collectives() -> None:
    assert [collective_msgs(c, 5) for c in ("allreduce", "alltoallv", "allgatherv", "exchange")] \
        == [8, 4, 4, 8]  # fmt: skip
    assert collective_wire("allreduce", 4, 1000) == 1500
    assert collective_wire("alltoallv", 4, 1000) == 750
    assert collective_wire("exchange", 4, 1000) == 1500  # alltoallv + allgatherv, 3/4 each
    assert collective_wire("allgatherv", 4, 1000) == 3000  # own buffer to each of 3 peers
