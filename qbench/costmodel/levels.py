"""Two levels of alpha-beta: a run on N nodes of G ranks (``qbench.spec.network.Topology``),
``intra`` links inside a node and ``inter`` links between nodes, each timed by the collective
fits on its own link (``phases.collective_fit``: the intra level is what 1-node runs measured,
the inter level what runs of one rank per node measured).

**Flat schemes across nodes** (K = N G ranks, consecutive ranks on a node), where each rank's
wire per call is W (``formulas.comm_plan`` at K). Every message step is synchronous, so the
slower level bounds the collective: ``t = max(t_inter, t_intra)``, each level's time being its
fit's alpha-beta time (message steps x alpha + bytes on its link x beta):

* ring (allreduce, integer-allreduce): one ring edge per node crosses to the next node, so each
  node's inter link carries W, and each rank's intra edge W;
* direct (exchange = alltoallv + allgatherv, allgather): each rank sends W / (K-1) to every
  peer, G (N-1) of them on other nodes; the node's inter link carries its G ranks' share,
  ``W G^2 (N-1) / (K-1)``; inside, a rank sends ``W (G-1) / (K-1)`` (a shaped intra link is
  one bus per node: G times that).

**hierarchical** (``qbench.aggregate.hierarchical``), the phases one after the other:

* inside (G > 1): parts to their owners and the sums back, an ``exchange`` of the fp32 (or
  16-bit) gradient among G ranks on the intra link;
* between (N > 1): ``reduce-scatter``: G lanes, each a reduce-broadcast among N ranks of 1/G of
  the payload P, sharing the node's link: ``exchange`` with calls of (N-1)/N P each on the
  inter link; ``reduce-broadcast`` among node leaders: the same bytes; ``allgather`` among node
  leaders: ``allgatherv`` of P, (N-1) P;
* codec: reduce-broadcast's (or allgather's) codec fits among N ranks on the n / G values of a
  lane (the whole n on leaders); none with one node (the scheme skips that level).
"""

from __future__ import annotations

from dataclasses import dataclass

from qbench.catalog import CompressorSpec
from qbench.costmodel.config import Config
from qbench.costmodel.formulas import collective_msgs, collective_wire, comm_plan
from qbench.costmodel.model import CostModel
from qbench.costmodel.phases import codec_time, collective_fit
from qbench.costmodel.schemes import Scheme
from qbench.spec.network import Link, Topology


@dataclass(frozen=True)
class LevelTime:
    seconds: float
    wire: float
    """Bytes one rank sends (both levels)."""
    notes: tuple[str, ...] = ()


def _timed(
    model: CostModel, cfg: Config, key: str, link: Link, msgs: float, calls: tuple[float, ...]
) -> tuple[float, list[str]]:
    fit, notes = collective_fit(model, cfg.backend, link, key)
    return fit.time(msgs, calls, link, cfg.tbf_burst), notes


def flat_comm(
    model: CostModel, cfg: Config, scheme: Scheme, comp: CompressorSpec, n: float, bits: float
) -> LevelTime:
    """A flat scheme's comm phase on the configuration's topology (module docstring)."""
    topo = _topology(cfg)
    nodes, g, k = topo.nodes, topo.ranks_per_node, topo.world_size
    item = comm_plan(scheme, comp, k, n, bits, cfg.backend)
    if nodes == 1 or g == 1:  # one level: today's flat formulas on that level's link
        link = topo.intra if nodes == 1 else topo.inter
        t, notes = _timed(model, cfg, item.collective, link, item.msgs, item.calls)
        return LevelTime(t, item.wire, tuple(notes))
    if item.collective.startswith("allreduce"):  # rings: allreduce-fp16, -int, ...
        inter_share = intra_share = 1.0
    else:
        inter_share = g * g * (nodes - 1) / (k - 1)
        intra_share = (g - 1) / (k - 1) * (g if topo.intra.shaped else 1)
    t_inter, n1 = _timed(
        model, cfg, item.collective, topo.inter, item.msgs,
        tuple(c * inter_share for c in item.calls),
    )  # fmt: skip
    t_intra, n2 = _timed(
        model, cfg, item.collective, topo.intra, item.msgs,
        tuple(c * intra_share for c in item.calls),
    )  # fmt: skip
    return LevelTime(max(t_inter, t_intra), item.wire, tuple(n1 + n2))


def hierarchical_comm(
    model: CostModel, cfg: Config, scheme: Scheme, n: float, bits: float
) -> LevelTime:
    """hierarchical's comm phase: inside, then between nodes (module docstring)."""
    topo = _topology(cfg)
    nodes, g = topo.nodes, topo.ranks_per_node
    seconds, wire, notes = 0.0, 0.0, list[str]()
    if g > 1:
        s = n * (4 if scheme.intra == "none" else 2)
        half = collective_wire("alltoallv", g, s)
        t, why = _timed(model, cfg, "exchange", topo.intra, collective_msgs("exchange", g),
                        (half, half))  # fmt: skip
        seconds, wire, notes = seconds + t, wire + 2 * half, notes + why
    if nodes > 1:
        p = n * bits / 8
        if scheme.inter == "allgather":
            key, msgs = "allgather", collective_msgs("allgatherv", nodes)
            calls: tuple[float, ...] = (collective_wire("allgatherv", nodes, p),)
        else:
            key, msgs = "exchange", collective_msgs("exchange", nodes)
            half = collective_wire("alltoallv", nodes, p)
            calls = (half, half)
        t, why = _timed(model, cfg, key, topo.inter, msgs, calls)
        lanes = g if scheme.inter == "reduce-scatter" else 1
        seconds, wire, notes = seconds + t, wire + sum(calls) / lanes, notes + why
    return LevelTime(seconds, wire, tuple(notes))


def hierarchical_codec(
    model: CostModel, cfg: Config, scheme: Scheme, comp: str, n: float, op: str
) -> tuple[float, list[str]]:
    """Encode or decode seconds of hierarchical's exchange between nodes (none on one node)."""
    topo = _topology(cfg)
    if topo.nodes == 1:
        return 0.0, []
    flat = Scheme("allgather" if scheme.inter == "allgather" else "reduce-broadcast")
    share = topo.ranks_per_node if scheme.inter == "reduce-scatter" else 1
    return codec_time(model, cfg.backend, flat, comp, topo.nodes, n / share, op, cfg.device)


def _topology(cfg: Config) -> Topology:
    """The configuration's topology; without one, a flat star (one rank per node)."""
    if cfg.topology is not None:
        return cfg.topology
    return Topology(cfg.world_size, 1, cfg.network)
