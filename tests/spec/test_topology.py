"""Clusters on one machine (issue 33): a network entry with ``nodes`` is a topology of nodes of
``world_size / nodes`` consecutive ranks, ``inter`` between nodes and ``intra`` inside one. The
spec, its labels and errors, how a run carries it and which launcher may run it; the namespaces
themselves are tests/launch/test_netns.py's."""

from __future__ import annotations

import pytest

from qbench.errors import UserError
from qbench.launch import decision
from qbench.spec import matrix, network, scenario
from qbench.spec.network import Link, Topology


@pytest.mark.parametrize(
    ("setting", "label", "topo"),
    [({}, "unshaped", Topology(1, 4)),
     ({"bandwidth": "1gbit"}, "1gbit", Topology(4, 1, Link(1e9, "1gbit"))),
     ({"nodes": 2}, "2nodes-unshaped", Topology(2, 2)),
     ({"nodes": 2, "inter": "1gbit"}, "2nodes-1gbit", Topology(2, 2, Link(1e9, "1gbit"))),
     ({"nodes": 4, "inter": "100mbit", "intra": "10 gbit"}, "4nodes-100mbit-intra10gbit",
      Topology(4, 1, Link(1e8, "100mbit"), Link(1e10, "10gbit"))),
     ({"nodes": 2, "inter": "unshaped", "intra": "unshaped"}, "2nodes-unshaped",
      Topology(2, 2))],
)  # fmt: skip
def test_settings_make_topologies_of_four_ranks(setting: dict, label: str, topo: Topology) -> None:
    assert network.topology(setting, 4) == topo
    assert network.link(setting).label == label  # a cluster is not the flat star at its rate
    assert network.link(setting).bits_per_s == topo.inter.bits_per_s  # the run's link: between
    assert [topo.node_of(r) for r in range(4)] == [r // topo.ranks_per_node for r in range(4)]


@pytest.mark.parametrize(
    ("setting", "message"),
    [({"inter": "1gbit"}, "network.inter needs network.nodes"),
     ({"intra": "1gbit"}, "network.intra needs network.nodes"),
     ({"bandwidth": "1gbit", "nodes": 2}, "network.bandwidth (a flat star"),
     ({"nodes": 0}, "network.nodes must be a whole number in [1, 64], got 0"),
     ({"nodes": "2"}, "network.nodes must be a whole number in [1, 64], got '2'"),
     ({"nodes": True}, "network.nodes must be a whole number"),
     ({"nodes": 2, "inter": "fast"}, "network.inter must be a positive rate in kbit/mbit/gbit"),
     ({"nodes": 2, "intra": "1 tbit"}, "network.intra must be a positive rate"),
     ({"nodes": 2, "racks": 2}, "unknown key network.racks; valid: bandwidth, nodes, inter")],
)  # fmt: skip
def test_bad_settings_are_one_line_naming_the_key(setting: dict, message: str) -> None:
    with pytest.raises(UserError) as err:
        network.link(setting)
    assert message in str(err.value) and "\n" not in str(err.value)


CLUSTER = """
name: c
model: mlp
world_size: 4
backend: [gloo, mpi]
network: [{nodes: 2, inter: 1gbit}, {nodes: 4, inter: 1gbit}, {bandwidth: 1gbit}, unshaped]
"""


def test_a_run_takes_its_nodes_from_the_network_entry() -> None:
    runs = [
        r for r in matrix.expand(scenario.loads(CLUSTER, "t")).runs if r.placement.backend == "gloo"
    ]
    got = [
        (
            r.placement.nodes,
            r.placement.topology.ranks_per_node,
            r.placement.network.emulates_hosts,
            r.run_id.split("-")[-2],
        )
        for r in runs
    ]
    assert got == [(2, 2, True, "w4n2"), (4, 1, True, "w4n4"), (1, 1, True, "w4"),
                   (1, 4, False, "w4")]  # fmt: skip
    assert len({r.run_id for r in runs}) == 4
    again = matrix.RunSpec.from_dict(runs[0].to_dict())  # as a worker reads its spec back
    assert again.placement.topology == Topology(2, 2, Link(1e9, "1gbit"))


def test_nodes_twice_is_one_line() -> None:
    with pytest.raises(UserError) as err:
        scenario.loads(CLUSTER + "nodes: [2]\n", "t")
    assert "say the same thing twice" in str(err.value) and "\n" not in str(err.value)


def _launch(text: str, launcher: str) -> str:
    sc = scenario.loads(text, "t")
    return decision.launch_for(sc, launcher, matrix.expand(sc)).kind


def test_emulated_nodes_run_locally_and_real_nodes_under_slurm() -> None:
    assert _launch(CLUSTER, "local") == "local"
    real = "name: c\nmodel: mlp\nworld_size: 4\nnetwork: {nodes: 2}\n"
    assert _launch(real, "slurm") == "slurm"  # the allocation's hosts, recorded, not shaped
    with pytest.raises(UserError, match=r"nodes: 2 needs a multi-node launcher.*`network: "):
        _launch("name: c\nmodel: mlp\nworld_size: 4\nnodes: 2\n", "local")
    with pytest.raises(UserError, match="under Slurm the links are the cluster's own"):
        _launch(CLUSTER, "slurm")
