"""Two levels of alpha-beta: a run on N nodes of G ranks (``qbench.spec.network.Topology``),
``intra`` links inside a node and ``inter`` links between nodes, each timed by the collective
fits on its own link (``phases.collective_fit``: the intra level is what 1-node runs measured,
the inter level what runs of one rank per node measured).

Each scheme's phases are its declared traffic (``qbench.catalog.schemes.traffic``); a phase either
names its level or runs on the run's links.

**Phases on the run's links across nodes** (K = N G ranks, consecutive ranks on a node), where
each rank's wire per call is W. Every message step is synchronous, so the
slower level bounds the collective: ``t = max(t_inter, t_intra)``, each level's time being its
fit's alpha-beta time (message steps x alpha + bytes on its link x beta):

* ``ring`` (allreduce, integer-allreduce): one ring edge per node crosses to the next node, so
  each node's inter link carries W, and each rank's intra edge W;
* ``direct`` (exchange = alltoallv + allgatherv, allgather): each rank sends W / (K-1) to every
  peer, G (N-1) of them on other nodes; the node's inter link carries its G ranks' share,
  ``W G^2 (N-1) / (K-1)``; inside, a rank sends ``W (G-1) / (K-1)`` (a shaped intra link is
  one bus per node: G times that).

**Phases on one level** (hierarchical, ``qbench.aggregate.hierarchical``), one after the other,
each on its level's link, with a rank's wire its lanes' share:

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

from qbench.catalog.schemes.traffic import DIRECT, INTER, INTRA, Phase, Traffic
from qbench.costmodel.config import Config
from qbench.costmodel.model import CostModel
from qbench.costmodel.phases import collective_fit
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


def comm(model: CostModel, cfg: Config, traffic: Traffic) -> LevelTime:
    """The comm phase of ``traffic`` on the configuration's topology: its phases one after the
    other (module docstring)."""
    topo = topology(cfg)
    seconds, notes = 0.0, list[str]()
    for phase in traffic.phases:
        t, why = _phase(model, cfg, topo, phase)
        seconds, notes = seconds + t, notes + why
    return LevelTime(seconds, traffic.wire, tuple(notes))


def _phase(model: CostModel, cfg: Config, topo: Topology, p: Phase) -> tuple[float, list[str]]:
    if p.level in (INTRA, INTER):
        link = topo.intra if p.level == INTRA else topo.inter
        return _timed(model, cfg, p.collective, link, p.msgs, p.calls)
    nodes, g, k = topo.nodes, topo.ranks_per_node, topo.world_size
    if nodes == 1 or g == 1:  # one level: the flat formulas on that level's link
        link = topo.intra if nodes == 1 else topo.inter
        return _timed(model, cfg, p.collective, link, p.msgs, p.calls)
    if p.pattern == DIRECT:
        inter_share = g * g * (nodes - 1) / (k - 1)
        intra_share = (g - 1) / (k - 1) * (g if topo.intra.shaped else 1)
    else:
        inter_share = intra_share = 1.0
    t_inter, n1 = _timed(model, cfg, p.collective, topo.inter, p.msgs,
                         tuple(c * inter_share for c in p.calls))  # fmt: skip
    t_intra, n2 = _timed(model, cfg, p.collective, topo.intra, p.msgs,
                         tuple(c * intra_share for c in p.calls))  # fmt: skip
    return max(t_inter, t_intra), n1 + n2


def topology(cfg: Config) -> Topology:
    """The configuration's topology; without one, a flat star (one rank per node)."""
    if cfg.topology is not None:
        return cfg.topology
    return Topology(cfg.world_size, 1, cfg.network)
