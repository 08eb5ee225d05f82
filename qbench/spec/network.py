"""Network settings of a run: unshaped (the default), a flat star of emulated links
(``bandwidth``: every rank its own host), or a cluster of nodes (``nodes``, ``inter``, ``intra``:
``world_size / nodes`` consecutive ranks per node, sharing its loopback; nodes joined by links of
rate ``inter``; ``intra`` shapes each node's loopback, all of the node's internal traffic at once).

Pure validation and labelling, and the emulated link's token bucket size (which the cost model
reads too); the namespaces and ``tc`` shaping live in ``qbench.launch``. A rate is parsed here
only: :func:`link` turns a checked setting (a scenario entry, a recorded ``network`` mapping, an
option) into a :class:`Link`, whose ``bits_per_s`` everything downstream reads; its ``label``
is for people and run ids and is never parsed back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from qbench.errors import UserError

KEYS = ("bandwidth", "nodes", "inter", "intra")
TOPOLOGY_KEYS = ("nodes", "inter", "intra")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*(kbit|mbit|gbit)$")
_UNIT = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
TBF_MIN_BURST_BYTES = 16 * 1024
"""The smallest tbf bucket (> 10 full frames), so that low rates do not stall on single frames."""
MAX_NODES = 64
"""Emulated hosts of one run (each a network namespace; the subnet has 253 addresses)."""
UNSHAPED = "unshaped"
"""The label of a link that is not emulated (loopback between processes of one host)."""


@dataclass(frozen=True)
class Link:
    """A checked link: ``bits_per_s`` of the emulated rate, None when unshaped; ``label`` for
    people and run ids (``1gbit``, ``unshaped``), made from the setting as written."""

    bits_per_s: float | None = None
    label: str = UNSHAPED

    @property
    def shaped(self) -> bool:
        return self.bits_per_s is not None


@dataclass(frozen=True)
class Topology:
    """Where a run's ranks are and what joins them: ``nodes`` hosts of ``ranks_per_node``
    consecutive ranks each, ``inter`` between hosts and ``intra`` inside one."""

    nodes: int
    ranks_per_node: int
    inter: Link = Link()
    intra: Link = Link()

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def shape(self) -> str:
        """``NxG``: N nodes of G ranks (``2x2``), how tables and ``--hold-out`` name it."""
        return f"{self.nodes}x{self.ranks_per_node}"


@dataclass(frozen=True, kw_only=True)
class Network:
    """A checked network setting, kept as written (run ids and run.json hold :meth:`written`):
    none of its keys for unshaped, ``bandwidth`` for a flat star, ``nodes`` with ``inter`` and
    ``intra`` for a cluster."""

    bandwidth: str | None = None
    nodes: int | None = None
    inter: str | None = None
    intra: str | None = None

    @classmethod
    def of(cls, setting: Mapping[str, Any]) -> Network:
        """The setting (``{}``, ``{bandwidth: 1gbit}``, ...) checked; UserError if bad."""
        check(setting)
        return cls(**{str(k): v for k, v in setting.items()})

    def written(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in KEYS if getattr(self, k) is not None}

    @property
    def link(self) -> Link:
        return link(self.written())

    @property
    def label(self) -> str:
        return label(self.written())

    @property
    def emulates_hosts(self) -> bool:
        return emulates_hosts(self.written())

    def topology(self, world_size: int, nodes: int = 1) -> Topology:
        return topology(self.written(), world_size, nodes)


def link(net: Mapping[str, Any]) -> Link:
    """The link between hosts of a network setting (``{}``, ``{bandwidth: 1gbit}`` or
    ``{nodes: 2, inter: 1gbit}``; UserError if bad). Its label names the whole setting in run
    ids and tables (:func:`label`)."""
    _check_keys(net)
    if "bandwidth" in net:
        return Link(bits_per_s(net["bandwidth"]), label(net))
    intra_link(net)  # checked here too: a setting link() accepts is whole
    return Link(inter_link(net).bits_per_s, label(net))


def inter_link(net: Mapping[str, Any]) -> Link:
    """The link between nodes of a cluster setting (unshaped without ``inter``)."""
    return _cluster_link(net, "inter")


def intra_link(net: Mapping[str, Any]) -> Link:
    """The link inside a node, its shaped loopback (unshaped without ``intra``)."""
    return _cluster_link(net, "intra")


def _cluster_link(net: Mapping[str, Any], key: str) -> Link:
    raw = net.get(key, UNSHAPED)
    if str(raw).strip().lower() == UNSHAPED:
        return Link()
    return Link(bits_per_s(raw, f"network.{key}"), _rate_label(raw))


def topology(net: Mapping[str, Any], world_size: int, nodes: int = 1) -> Topology:
    """The topology of a run of ``world_size`` ranks: ``bandwidth`` makes every rank its own
    host; ``nodes`` in the setting wins over the run's ``nodes`` (a Slurm allocation's hosts)."""
    if "bandwidth" in net:
        return Topology(world_size, 1, link(net))
    n = int(net.get("nodes", nodes))
    return Topology(n, world_size // n, inter_link(net), intra_link(net))


def dilated(topo: Topology, factor: float) -> Topology:
    """The links that stand for ``topo`` under time dilation: each shaped rate divided by
    ``factor`` (labels unchanged: they name the rate stood for)."""
    if factor == 1:
        return topo

    def slow(link: Link) -> Link:
        return link if link.bits_per_s is None else Link(link.bits_per_s / factor, link.label)

    return replace(topo, inter=slow(topo.inter), intra=slow(topo.intra))


def emulates_hosts(net: Mapping[str, Any]) -> bool:
    """Whether the setting asks for emulated hosts (network namespaces), shaped or not."""
    return "bandwidth" in net or "nodes" in net


def option(text: str | None) -> Link:
    """The link of a rate option (``1gbit``; None or ``unshaped``: none)."""
    if text is None or str(text).strip().lower() == UNSHAPED:
        return Link()
    return link({"bandwidth": text})


def declared(rate: Any, key: str) -> Link:
    """A rate declared outside a scenario (a projection's cluster file: ``intra.rate``), parsed
    here like every other, its errors naming ``key``; always shaped (no ``unshaped``)."""
    return Link(bits_per_s(rate, key), _rate_label(rate))


def at_rate(bps: float) -> Link:
    """A link at a computed rate (the cost model's probes), labelled ``12.5gbit``, ``300mbit``."""
    unit, div = ("gbit", 1e9) if bps >= 1e9 else ("mbit", 1e6) if bps >= 1e6 else ("kbit", 1e3)
    return Link(bps, f"{bps / div:.9f}".rstrip("0").rstrip(".") + unit)


def parse(raw: Any) -> dict[str, Any]:
    """``unshaped`` / ``{}`` -> {}; ``{bandwidth: 1gbit}`` -> {"bandwidth": "1gbit"}."""
    if raw in (UNSHAPED, None, {}):
        return {}
    if not isinstance(raw, dict):
        raise UserError(
            f"network entry {raw!r} must be `unshaped` or a mapping like {{bandwidth: 1gbit}}"
        )
    out = {str(k): v for k, v in raw.items()}
    check(out)
    return out


def check(net: Mapping[str, Any]) -> None:
    link(net)


def _check_keys(net: Mapping[str, Any]) -> None:
    for k in net:
        if k not in KEYS:
            shown = k if isinstance(k, str) and k.isprintable() else repr(k)  # one line
            raise UserError(f"unknown key network.{shown}; valid: {', '.join(KEYS)}")
    cluster = [k for k in TOPOLOGY_KEYS if k in net]
    if "bandwidth" in net and cluster:
        raise UserError(
            f"network.bandwidth (a flat star: every rank its own host) does not go with "
            f"network.{cluster[0]}; e.g. `{{nodes: 2, inter: 1gbit}}` for nodes of several ranks"
        )
    if cluster and "nodes" not in net:
        raise UserError(
            f"network.{cluster[0]} needs network.nodes (how many hosts); e.g. "
            "`{nodes: 2, inter: 1gbit, intra: unshaped}`"
        )
    if "nodes" in net:
        n = net["nodes"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NODES:
            raise UserError(
                f"network.nodes must be a whole number in [1, {MAX_NODES}], got {n!r}; "
                "e.g. `{nodes: 2, inter: 1gbit}`"
            )


def bits_per_s(rate: Any, key: str = "network.bandwidth") -> float:
    """The rate parser (``1gbit`` -> 1e9). Call :func:`link` / :func:`option` instead: a test
    (tests/spec/test_network_link.py) lists the modules that still parse a rate themselves."""
    m = _RATE.match(str(rate).strip().lower())
    bits = float(m.group(1)) * _UNIT[m.group(2)] if m else math.nan
    if not 1 <= bits < math.inf:  # nan: no match; inf: hundreds of digits; tc needs >= 1 bit/s
        raise UserError(
            f"{key} must be a positive rate in kbit/mbit/gbit, got {rate!r}; "
            f"e.g. `{key.rsplit('.', 1)[-1]}: 1gbit`"
        )
    return bits


def label(net: Mapping[str, Any]) -> str:
    """``unshaped``, ``1gbit`` (a flat star), and for a cluster its nodes and links:
    ``2nodes-1gbit``, ``2nodes-unshaped``, ``2nodes-100mbit-intra10gbit``, so that tables and
    run ids tell a cluster from the flat star at the same rate."""
    if net.get("bandwidth"):
        return _rate_label(net["bandwidth"])
    if "nodes" not in net:
        return UNSHAPED
    inter, intra = inter_link(net).label, intra_link(net)
    links = f"{inter}-intra{intra.label}" if intra.shaped else inter
    return f"{net['nodes']}nodes-{links}"


def _rate_label(rate: Any) -> str:
    return str(rate).replace(" ", "")


def tbf_burst_bytes(rate_bits_per_s: float) -> int:
    """Bytes of the tbf bucket of an emulated link: 2 ms of traffic at the rate, at least
    ``TBF_MIN_BURST_BYTES`` (why: ``qbench.launch.netns.tbf_for``). A call that starts on a full
    bucket gets that much transfer free, so the cost model credits it."""
    rate = int(rate_bits_per_s)
    return max(rate // 8 // 500, TBF_MIN_BURST_BYTES)


def tbf_burst_s(rate_bits_per_s: float) -> float:
    """Seconds of traffic the tbf bucket holds at that rate (2 ms from 65.5 Mbit/s up)."""
    return tbf_burst_bytes(rate_bits_per_s) * 8 / rate_bits_per_s
