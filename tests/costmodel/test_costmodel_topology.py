"""The two-level cost model (issue 33): a flat ring and a direct exchange across nodes, the
hierarchical scheme, fitting each level from one-level runs, and the CLI's cluster options.
Expected values are written from the formulas' definitions (docs/costmodel.md), not computed
by qbench."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from qbench import catalog
from qbench.cli.cost import cost as cost_cli
from qbench.costmodel import Config, CostModel
from qbench.costmodel.config import Prediction
from qbench.costmodel.fit import fit_collectives
from qbench.costmodel.fit.points import CommPoint, level_link
from qbench.costmodel.formulas import comm_plan
from qbench.costmodel.model import CodecFit, CollectiveFit
from qbench.costmodel.predict import predict
from qbench.costmodel.schemes import NONE, Scheme
from qbench.errors import UserError
from qbench.spec.network import Link, Topology

GBIT = Link(1e9, "1gbit")
A_IN, B_IN = 1e-5, 1e-10  # intra: 10 us per message step, 80 Gbit/s
A_OUT, B_OUT = 1e-4, 8e-9  # inter: 100 us per message step, 1 Gbit/s


def _fit(network: str, collective: str, alpha: float, beta: float) -> CollectiveFit:
    return CollectiveFit(
        backend="gloo", network=network, collective=collective, alpha_s=alpha,
        beta_s_per_byte=beta, r2=1.0, points=2, rel_err_median=0.0, rel_err_max=0.0,
    )  # fmt: skip


def _model() -> CostModel:
    return CostModel(collectives=[
        _fit(net, key, a, b)
        for net, a, b in (("unshaped", A_IN, B_IN), ("1gbit", A_OUT, B_OUT))
        for key in ("allreduce", "exchange")
    ])  # fmt: skip


def _comm(scheme: Scheme, nodes: int, per_node: int, n: int = 1000) -> float:
    cfg = Config(
        scheme=scheme, topology=Topology(nodes, per_node, GBIT), numel=n, compute_s=0.0,
        step_s=0.0, tbf_burst=False,
    )  # fmt: skip
    return predict(_model(), cfg).comm_s


def test_a_ring_across_nodes_is_bounded_by_the_link_between_them() -> None:
    # 2 nodes x 2 ranks, 4000 bytes: 2 (K-1) = 6 steps, each rank sends 2 (K-1)/K S = 6000 B;
    # every step waits for the ring edge that crosses nodes.
    assert _comm(Scheme("allreduce"), 2, 2) == pytest.approx(6 * A_OUT + 6000 * B_OUT)
    # one node: all edges inside it
    assert _comm(Scheme("allreduce"), 1, 4) == pytest.approx(6 * A_IN + 6000 * B_IN)


def test_a_direct_exchange_across_nodes_shares_the_node_link() -> None:
    # reduce-broadcast 2 x 2: two calls of 1000 B to each of 3 peers; the node link carries its
    # 2 ranks' sends to the other node's 2 ranks: 2 x 2 x 1000 = 4000 B per call.
    assert _comm(Scheme("reduce-broadcast"), 2, 2) == pytest.approx(6 * A_OUT + 8000 * B_OUT)


def test_hierarchical_sums_inside_then_exchanges_between_nodes() -> None:
    # inside (G = 2, 4000 B fp32): half to the other rank, half back: 2 steps, 2 x 2000 B;
    # between (N = 2): 2 lanes of 2000 B, each sending half of it twice, on one link: 2 x 2000 B
    inside, between = 2 * A_IN + 4000 * B_IN, 2 * A_OUT + 4000 * B_OUT
    assert _comm(Scheme("hierarchical"), 2, 2) == pytest.approx(inside + between)
    assert _comm(Scheme("hierarchical"), 1, 2) == pytest.approx(inside)  # no inter level
    assert _comm(Scheme("hierarchical"), 2, 1) == pytest.approx(between)  # no intra level


def test_each_level_is_fitted_from_its_own_one_level_runs() -> None:
    truth = {"unshaped": (A_IN, B_IN), "1gbit": (A_OUT, B_OUT)}
    points = []
    for nodes, per_node in ((1, 2), (1, 4), (2, 1), (4, 1)):
        for n in (10_000, 100_000):
            cfg = Config(topology=Topology(nodes, per_node, GBIT), world_size=nodes * per_node)
            link = level_link(cfg)
            assert link is not None
            item = comm_plan(Scheme("allreduce"), NONE, cfg.world_size, n, 32.0, "gloo")
            alpha, beta = truth[link.label]
            points.append(CommPoint(
                backend="gloo", network=link.label, collective="allreduce",
                world_size=cfg.world_size, msgs=item.msgs, calls=item.calls,
                seconds=item.msgs * alpha + item.wire * beta, source="synthetic",
                scheme="allreduce", compressor="fp32", bytes=4 * n,
            ))  # fmt: skip
    both = Config(topology=Topology(2, 2, GBIT), world_size=4)
    assert level_link(both) is None  # crosses both levels: predicted, never fitted
    fits = {f.network: f for f in fit_collectives(points)}
    assert set(fits) == set(truth)
    for net, (alpha, beta) in truth.items():
        assert fits[net].alpha_s == pytest.approx(alpha, rel=1e-6)
        assert fits[net].beta_s_per_byte == pytest.approx(beta, rel=1e-6)


def test_a_topology_not_fitted_is_noted_as_extrapolated() -> None:
    m = _model()
    m.topologies = ["1x2", "2x1"]
    cfg = Config(topology=Topology(16, 8, GBIT), numel=1000, compute_s=0.0, step_s=0.0)
    assert any("16 nodes x 8 ranks: extrapolated" in n for n in predict(m, cfg).notes)
    fitted = Config(topology=Topology(2, 1, GBIT), numel=1000, compute_s=0.0, step_s=0.0)
    assert not any("extrapolated" in n for n in predict(m, fitted).notes)


def test_hierarchical_levels_are_read_from_the_catalog_spec() -> None:
    s = Scheme.of(catalog.scheme({"name": "hierarchical", "inter": "allgather", "intra": "bf16"}))
    assert (s.intra, s.inter) == ("bf16", "allgather")


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--nodes", "2"], "give --nodes and --ranks-per-node together"),
     (["--nodes", "0", "--ranks-per-node", "8"], "--nodes must be >= 1, got 0"),
     (["--intra-bandwidth", "1gbit"], "--intra-bandwidth needs --nodes and --ranks-per-node"),
     (["--nodes", "2", "--ranks-per-node", "2", "--world-size", "4"], "--world-size is --nodes"),
     (["--nodes", "2", "--ranks-per-node", "2", "--intra-bandwidth", "fast"],
      "--intra-bandwidth must be a rate in kbit/mbit/gbit or `unshaped`, got 'fast'")],
)  # fmt: skip
def test_cluster_options_refuse_bad_values_in_one_line(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    path = tmp_path / "model.json"
    _model().save(path)
    res = CliRunner().invoke(cost_cli, ["predict", str(path), "--model-numel", "1M", *argv])
    # qbench's entry point prints a UserError as one line on stderr and exits 2
    assert isinstance(res.exception, UserError), res.output
    assert message in str(res.exception) and "\n" not in str(res.exception)


def test_predict_asks_about_a_large_cluster(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    _model().save(path)
    res = CliRunner().invoke(cost_cli, [
        "predict", str(path), "--model-numel", "1000", "--compute-s", "0", "--step-s", "0",
        "--nodes", "16", "--ranks-per-node", "8", "--bandwidth", "1gbit", "--no-tbf-burst",
        "--scheme", "allreduce", "--compressor", "none", "--format", "csv",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    row = res.stdout.strip().splitlines()[1].split(",")
    # K = 128 ranks, ring of 4000 B: 254 steps, 2 x 127/128 x 4000 B, bounded by the 1gbit level
    assert row[2] == "128"
    assert float(row[10]) == pytest.approx(254 * A_OUT + 2 * 127 / 128 * 4000 * B_OUT)


def test_hold_out_names_a_topology_by_its_shape() -> None:
    """`--hold-out shape=2x2` leaves out the 2-node runs of 2 ranks each, not the 2-node runs
    of one rank (same network label) nor the one-node runs of 4 (same world size)."""
    import pandas as pd

    from qbench.costmodel.inputs import held_out

    shapes = [Topology(2, 2, GBIT), Topology(2, 1, GBIT), Topology(1, 4), None]
    table = pd.DataFrame({"world_size": [4, 2, 4, 2], "network": ["2nodes-1gbit"] * 2 + ["x"] * 2,
                          "shape": [t.shape if t else "" for t in shapes]})  # fmt: skip
    assert list(table["shape"]) == ["2x2", "2x1", "1x4", ""]
    assert list(held_out(table, [("shape", "2x2")])["shape"]) == ["2x1", "1x4", ""]
    with pytest.raises(UserError, match="shape"):
        held_out(table.drop(columns="shape"), [("shape", "2x2")])


# Issue 44 item 9: each test below fails on one planted bug in qbench/costmodel/levels.py that
# every other test let through. Expected values are α-β arithmetic done by hand from what each
# rank sends, never by the module's formulas.
BUS = Link(1e7, "10mbit")  # a shaped (tc) loopback: one bus per node
A_BUS, B_BUS = 1e-5, 8e-7  # 10 us per message step, 10 Mbit/s
Q4 = "qsgd-4b-b512"


def _predict(scheme: Scheme, nodes: int, per_node: int, n: int, **kw: object) -> Prediction:
    m = _model()
    m.collectives.append(_fit(BUS.label, "exchange", A_BUS, B_BUS))
    m.phases = [  # hierarchical's codec between nodes is reduce-broadcast's among N ranks
        CodecFit(backend="gloo", scheme="reduce-broadcast", compressor=Q4, op=op, device="cpu",
                 c0_s=0.0, c1_s=c1, r2=1.0, points=2, rel_err_median=0.0, rel_err_max=0.0)
        for op, c1 in (("encode", 1e-9), ("decode", 2e-9))
    ]  # fmt: skip
    intra = kw.pop("intra", Link())
    assert isinstance(intra, Link)
    cfg = Config(
        scheme=scheme, topology=Topology(nodes, per_node, GBIT, intra), numel=n, compute_s=0.0,
        step_s=0.0, tbf_burst=False, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return predict(m, cfg)


def test_a_shaped_intra_link_carries_all_of_its_nodes_ranks() -> None:
    # reduce-broadcast 2 x 2 of 1000 fp32 values: each of 2 calls sends 1000 B to each of the
    # 3 peers, in 6 message steps. The shaped loopback carries both ranks' 1000 B to their one
    # peer on the node (2000 B a call); the node link both ranks' 2 x 1000 B (4000 B a call).
    bus = 6 * A_BUS + 2 * 2000 * B_BUS
    link = 6 * A_OUT + 2 * 4000 * B_OUT
    assert bus > link  # the bus bounds the collective here
    got = _predict(Scheme("reduce-broadcast"), 2, 2, 1000, intra=BUS)
    assert got.comm_s == pytest.approx(bus)


@pytest.mark.parametrize("intra", ["fp16", "bf16"])
def test_a_16_bit_sum_inside_a_node_sends_2_bytes_a_value(intra: str) -> None:
    # 1 node x 4 ranks, 1000 values of 2 bytes: each rank sends 3 of its 4 quarters (1500 B) to
    # their owners, then its summed quarter to 3 peers (1500 B): 3 + 3 message steps
    got = _predict(Scheme("hierarchical", intra=intra), 1, 4, 1000)
    assert got.wire_bytes == pytest.approx(3000)
    assert got.comm_s == pytest.approx(6 * A_IN + 3000 * B_IN)


def test_hierarchical_wire_counts_one_lane_per_rank() -> None:
    # 2 nodes x 4 ranks, 8000 fp32 values (32000 B). Inside: 3/4 of 32000 B out, then 3/4 back
    # (48000 B, 6 steps). Between: rank r's lane is 1/4 of the payload (8000 B); it sends the
    # other node's half (4000 B) and its summed half back (4000 B), 2 steps; the node link
    # carries 4 lanes of that, 16000 B a call.
    got = _predict(Scheme("hierarchical"), 2, 4, 8000)
    assert got.wire_bytes == pytest.approx(48000 + 8000)
    inside, between = 6 * A_IN + 48000 * B_IN, 2 * A_OUT + 2 * 16000 * B_OUT
    assert got.comm_s == pytest.approx(inside + between)


def test_hierarchical_codec_encodes_one_lane_of_n_over_g_values() -> None:
    # 2 nodes x 4 ranks, 8000 values: each lane is a reduce-broadcast of 2000 values among the
    # 2 nodes. Encode: the lane's 2 ranges (2000 values) and the owner's summed range (1000);
    # decode: the 2 ranges of its own 1000 values, then the gathered lane (2000).
    got = _predict(Scheme("hierarchical"), 2, 4, 8000, compressor=catalog.from_label(Q4))
    assert got.encode_s == pytest.approx((2000 + 1000) * 1e-9)
    assert got.decode_s == pytest.approx((2 * 1000 + 2000) * 2e-9)


# -- gaps the mutation run of costmodel/levels found (docs/results/mutation.md) ---------------
A_AG, B_AG = 3e-4, 2e-8  # an allgather fit on the node link, unlike the exchange fit there


def _hier(inter: str, nodes: int, per_node: int, n: int, **kw: object) -> Prediction:
    m = _model()
    m.collectives.append(_fit(GBIT.label, "allgather", A_AG, B_AG))
    m.phases = [  # c1 per element: the scheme's own fit for each flat level scheme
        CodecFit(backend="gloo", scheme=scheme, compressor=Q4, op=op, device="cpu", c0_s=0.0,
                 c1_s=c1, r2=1.0, points=2, rel_err_median=0.0, rel_err_max=0.0)
        for scheme, op, c1 in (("reduce-broadcast", "encode", 1e-9),
                               ("reduce-broadcast", "decode", 2e-9),
                               ("allgather", "encode", 5e-9), ("allgather", "decode", 7e-9))
    ]  # fmt: skip
    cfg = Config(
        scheme=Scheme("hierarchical", inter=inter), topology=Topology(nodes, per_node, GBIT),
        numel=n, compute_s=0.0, step_s=0.0, tbf_burst=False, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return predict(m, cfg)


def test_hierarchical_with_allgather_between_nodes_gathers_every_leaders_payload() -> None:
    # 2 nodes x 2 ranks, 1000 fp32 values (4000 B). Inside: as reduce-scatter's, 2 steps of
    # 2000 B. Between: the leaders' allgatherv among N = 2, (N-1) x 4000 B in N-1 = 1 step,
    # on the allgather fit; one lane, so the wire counts it once.
    got = _hier("allgather", 2, 2, 1000)
    assert got.wire_bytes == pytest.approx(4000 + 4000)
    assert got.comm_s == pytest.approx(2 * A_IN + 4000 * B_IN + 1 * A_AG + 4000 * B_AG)


def test_hierarchical_with_reduce_broadcast_between_nodes_is_one_lane() -> None:
    # as reduce-scatter's exchange among 2 nodes of the whole 4000 B, but one lane (the
    # leaders'), not G = 2 lanes of half of it: the leader sends 2 x 2000 B
    got = _hier("reduce-broadcast", 2, 2, 1000)
    assert got.wire_bytes == pytest.approx(4000 + 4000)
    assert got.comm_s == pytest.approx(2 * A_IN + 4000 * B_IN + 2 * A_OUT + 4000 * B_OUT)
    assert _hier("reduce-scatter", 2, 2, 1000).wire_bytes == pytest.approx(4000 + 2000)


def test_hierarchical_codec_is_its_level_schemes_on_the_values_a_leader_holds() -> None:
    # 2 nodes x 4 ranks, 8000 values. allgather between nodes: the leader encodes its 8000
    # values once and decodes N = 2 payloads of 8000; reduce-broadcast: its 8000 values as
    # N = 2 ranges plus the owner's 4000, and decodes 2 x 8000; on one node, no codec at all
    q4 = catalog.from_label(Q4)
    gather = _hier("allgather", 2, 4, 8000, compressor=q4)
    assert gather.encode_s == pytest.approx(8000 * 5e-9)
    assert gather.decode_s == pytest.approx(2 * 8000 * 7e-9)
    leaders = _hier("reduce-broadcast", 2, 4, 8000, compressor=q4)
    assert leaders.encode_s == pytest.approx((8000 + 4000) * 1e-9)
    assert leaders.decode_s == pytest.approx(2 * 8000 * 2e-9)
    one_node = _hier("reduce-scatter", 1, 4, 8000, compressor=q4)
    assert one_node.encode_s == 0.0 and one_node.decode_s == 0.0


def test_without_a_topology_every_rank_is_a_node_on_the_network_link() -> None:
    # world_size 4 on 1 Gbit/s links, no topology: a flat star, the ring's 6 steps of 6000 B
    # (1000 fp32 values) on the node link's fit, not the intra one
    cfg = Config(scheme=Scheme("allreduce"), world_size=4, network=GBIT, numel=1000,
                 compute_s=0.0, step_s=0.0, tbf_burst=False)  # fmt: skip
    assert predict(_model(), cfg).comm_s == pytest.approx(6 * A_OUT + 6000 * B_OUT)
    # hierarchical there: no level inside a node; between the 4 "nodes" an exchange of the
    # whole 4000 B, 3 + 3 steps of 3000 B each way, on the node link
    got = predict(_model(), replace(cfg, scheme=Scheme("hierarchical")))
    assert got.comm_s == pytest.approx(6 * A_OUT + 6000 * B_OUT)
    assert got.wire_bytes == pytest.approx(6000)


def test_a_direct_exchange_across_three_nodes_shares_the_node_link() -> None:
    # reduce-broadcast 3 x 2 (K = 6) of 4000 B: each rank sends 4000 / 6 B to each of its 5
    # peers in each of 2 calls, 10 message steps; the node link carries its 2 ranks' sends to
    # the 4 ranks on other nodes: 2 x 4 x 4000 / 6 B per call
    per_call = 2 * 4 * 4000 / 6
    assert _comm(Scheme("reduce-broadcast"), 3, 2) == pytest.approx(
        10 * A_OUT + 2 * per_call * B_OUT
    )


@pytest.mark.parametrize(("scheme", "nodes", "per_node"), [
    (Scheme("allreduce"), 2, 1), (Scheme("allreduce"), 2, 2), (Scheme("hierarchical"), 2, 2),
])  # fmt: skip
def test_a_level_on_a_link_not_fitted_says_it_was_scaled(
    scheme: Scheme, nodes: int, per_node: int
) -> None:
    two = Link(2e9, "2gbit")
    cfg = Config(scheme=scheme, topology=Topology(nodes, per_node, two), numel=1000,
                 compute_s=0.0, step_s=0.0, tbf_burst=False)  # fmt: skip
    notes = predict(_model(), cfg).notes
    assert any("scaled from 1gbit to 2gbit" in n for n in notes), notes
