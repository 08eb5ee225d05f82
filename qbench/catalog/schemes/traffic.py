"""What each scheme sends and codes in one aggregation: every scheme's traffic, declared once.

A scheme's ``SchemeEntry.traffic`` maps an :class:`Exchange` (K ranks as N nodes of G, n
values, the compressor and its payload's bits per value, the pipeline depth C, the backend) to
its :class:`Traffic`: the comm phases with their message steps and each call's wire bytes per
rank, on which level they run, and one rank's encode and decode work. The cost model times
exactly this (``qbench.costmodel``) and branches on no scheme's name; a scheme that declares
no traffic is one the cost model cannot time. Per rank, K ranks, payload P = n x bits / 8:

* allreduce: one ring allreduce of P (fp32, or a summable cast), decode divides by K;
* simulated-lowprec: a ring allreduce of P rounded up to whole floats (speed only);
* reduce-broadcast: an ``exchange`` (alltoallv of the K ranges + allgatherv of the owners'
  re-encoded means, seed 002 section 2.4.1); encodes n (1 + 1/K) values in K + 1 calls and
  decodes 2n in 2K (owner mean and gather); with ``overlap: C``, C chunks as one stream;
* allgather: an allgatherv of P, (K-1) P; decodes all K payloads;
* integer-allreduce: a MAX allreduce of the bucket scales and a ring allreduce of integers the
  backend sums without overflow (two calls);
* hierarchical: inside a node (G > 1) an ``exchange`` of the fp32 or 16-bit gradient among G
  ranks; between nodes (N > 1) reduce-broadcast lanes of 1/G each (``reduce-scatter``) or one
  among node leaders, or an allgather among leaders; its codec is that exchange's among N.

Byte counts and message steps are :mod:`qbench.catalog.schemes.collectives`'.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from qbench.catalog.compressors import CompressorEntry
from qbench.catalog.schemes.collectives import (
    collective_msgs,
    collective_wire,
    ring_allreduce_bytes,
)
from qbench.errors import UserError

RING, DIRECT = "ring", "direct"
"""How a phase's bytes cross two levels (``qbench.costmodel.levels``): a ring puts one edge
per node on the link between nodes; direct sends go from every rank to every peer."""
ANY, INTRA, INTER = "any", "intra", "inter"
"""Where a phase runs: on the run's links (both levels when it spans nodes), or on one level."""
INTEGER_SUM_BYTES = {"mpi": (1, 2, 4), "gloo": (1, 4), "nccl": (1, 4)}
"""Integer widths (bytes) each backend's allreduce sums: gloo has no int16 sum, MPI has."""


class CompressorSpec(Protocol):
    """What traffic reads of a compressor (``qbench.catalog.CompressorSpec`` is one)."""

    @property
    def entry(self) -> CompressorEntry: ...
    @property
    def params(self) -> dict[str, Any]: ...
    @property
    def name(self) -> str: ...
    @property
    def label(self) -> str: ...


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """One aggregation as a scheme's traffic sees it."""

    ranks: int
    values: float
    """n: the values one rank aggregates."""
    compressor: CompressorSpec
    bits_per_value: float
    """The compressor's wire bits per value (its payload, metadata included)."""
    backend: str = "gloo"
    overlap: int = 1
    """C: chunks in flight (``overlap: C``), one continuous stream."""
    nodes: int = 0
    """N nodes of ``ranks / nodes`` ranks each; 0: one rank per node (a flat star)."""
    params: dict[str, Any] = field(default_factory=dict)
    """The scheme's validated parameters (hierarchical's ``intra`` and ``inter``)."""

    @property
    def per_node(self) -> int:
        return self.ranks // self.nodes if self.nodes else 1

    @property
    def payload(self) -> float:
        return self.values * self.bits_per_value / 8

    @property
    def fp32(self) -> bool:
        """The compressor sends fp32 values as they are (``none``)."""
        return self.compressor.name == "none"


@dataclass(frozen=True)
class Phase:
    """One comm phase: its collective (the key the cost model fits), message steps per rank
    and each call's wire bytes per rank (each call may start on a full token bucket)."""

    collective: str
    msgs: float
    calls: tuple[float, ...]
    pattern: str = RING
    level: str = ANY
    lanes: int = 1
    """Ranks of a node that carry this phase's bytes together (one rank's share is 1/lanes)."""

    @property
    def wire(self) -> float:
        return float(sum(self.calls))


@dataclass(frozen=True)
class Coding:
    """One rank's encode or decode in one aggregation."""

    scheme: str
    """Whose codec phases time it (a measured fit of that scheme at ``ranks``)."""
    ranks: int
    values: float
    """The aggregation's n (an elementwise pass touches n values)."""
    units: float
    """Elements coded: the x of the codec fits, so that they scale with K."""
    calls: int = 1
    passes: int = 0
    """Elementwise passes besides the codec (divide by K, zeroing)."""
    per_element: bool = False
    """One plain pass per value, so another scheme's per-element cost may stand in."""


@dataclass(frozen=True)
class Traffic:
    phases: tuple[Phase, ...]
    encode: Coding
    decode: Coding
    payload_bits: float
    """Bits per value of a rank's own payload (``payload_bytes`` in records)."""

    @property
    def wire(self) -> float:
        """Bytes one rank sends (a lane's share of what its node's lanes carry together)."""
        return sum(p.wire / p.lanes for p in self.phases)

    @property
    def levelled(self) -> bool:
        """Its phases name their level (inside a node, between nodes)."""
        return any(p.level != ANY for p in self.phases)

    def coding(self, op: str) -> Coding:
        return self.encode if op == "encode" else self.decode


Declared = Callable[[Exchange], Traffic]


def names_levels(of: Declared, fp32: CompressorSpec) -> bool:
    """Whether a scheme's traffic runs on named levels (asked of two nodes of two ranks;
    ``fp32``: the ``none`` compressor)."""
    probe = Exchange(ranks=4, values=1.0, compressor=fp32, bits_per_value=32.0, nodes=2)
    return of(probe).levelled


def integer_sum_bytes(backend: str, world_size: int, top: int) -> int | None:
    """The narrowest width the backend sums in which K values in [-top, top] cannot overflow
    (integer-allreduce's integers); None when even 4 bytes overflow."""
    bound = world_size * top
    for width in INTEGER_SUM_BYTES.get(backend, INTEGER_SUM_BYTES["gloo"]):
        if bound <= 2 ** (8 * width - 1) - 1:
            return width
    return None


def int_sum_bytes(backend: str, k: int, top: int) -> int:
    """:func:`integer_sum_bytes`, or UserError when K integers up to ``top`` overflow int32."""
    width = integer_sum_bytes(backend, k, top)
    if width is None:
        raise UserError(f"integer-allreduce: {k} ranks x integers up to {top} overflow int32")
    return width


def _once(name: str, x: Exchange, decode_passes: int = 0, plain: bool = False) -> Traffic:
    """Traffic whose encode and decode touch each value once (phases filled in by the caller)."""
    k, n = x.ranks, x.values
    return Traffic(
        (),
        Coding(name, k, n, n, per_element=plain),
        Coding(name, k, n, n, passes=decode_passes, per_element=plain),
        x.bits_per_value,
    )


def _ring(key: str, x: Exchange, nbytes: float) -> Phase:
    return Phase(
        key, collective_msgs("allreduce", x.ranks), (ring_allreduce_bytes(nbytes, x.ranks),)
    )


def allreduce(x: Exchange) -> Traffic:
    key = "allreduce" if x.fp32 else f"allreduce-{x.compressor.label}"
    return replace(_once("allreduce", x, decode_passes=1), phases=(_ring(key, x, x.payload),))


def simulated_lowprec(x: Exchange, padded: bool = True) -> Traffic:
    """An fp32-typed allreduce as large as the payload, rounded up to whole floats (the cost
    model's projected native low-precision allreduce: the same, unpadded)."""
    nbytes = 4 * math.ceil(x.payload / 4) if padded else x.payload
    once = _once("simulated-lowprec", x, plain=True)
    return replace(once, phases=(_ring("allreduce", x, nbytes),))


def reduce_broadcast(x: Exchange) -> Traffic:
    k, n, c = x.ranks, x.values, x.overlap
    half = collective_wire("alltoallv", k, x.payload)  # = the allgatherv's (K-1) P / K
    if c > 1:
        phase = Phase("exchange+overlap", c * collective_msgs("exchange", k), (2 * half,), DIRECT)
    else:
        phase = Phase("exchange", collective_msgs("exchange", k), (half, half), DIRECT)
    scheme = "reduce-broadcast"
    return Traffic(
        (phase,),
        Coding(scheme, k, n, n * (1 + 1 / k), calls=k + 1),  # K ranges + the owner's re-encode
        Coding(scheme, k, n, 2 * n, calls=2 * k, passes=1),  # owner mean + gather
        x.bits_per_value,
    )


def allgather(x: Exchange) -> Traffic:
    k, n = x.ranks, x.values
    phase = Phase("allgather", collective_msgs("allgatherv", k),
                  (collective_wire("allgatherv", k, x.payload),), DIRECT)  # fmt: skip
    return Traffic(
        (phase,),
        Coding("allgather", k, n, n, per_element=True),
        Coding("allgather", k, n, k * n, calls=k, passes=1, per_element=True),
        x.bits_per_value,
    )


def integer_allreduce(x: Exchange) -> Traffic:
    k, n, c, comp = x.ranks, x.values, x.overlap, x.compressor
    once = _once("integer-allreduce", x)
    if x.fp32:  # full-precision groups take a plain allreduce
        return replace(once, phases=(_ring("allreduce", x, 4 * n),))
    why = comp.entry.integer_levels(comp.params)
    if why is not None:
        raise UserError(f"integer-allreduce cannot sum {comp.label}: {why}")
    top, bucket = comp.entry.integer_grid(comp.params)
    width = int_sum_bytes(x.backend, k, top)
    ints = ring_allreduce_bytes(n * width, k)
    scales = ring_allreduce_bytes(4 * math.ceil(n / bucket), k)
    ring = collective_msgs("allreduce", k)
    if c > 1:
        phase = Phase("allreduce-int+overlap", (1 + c) * ring, (scales, ints))
    else:
        phase = Phase("allreduce-int", 2 * ring, (scales, ints))
    return replace(once, phases=(phase,), payload_bits=8 * width + 32 / bucket)


def hierarchical(x: Exchange) -> Traffic:
    g, nodes, n = x.per_node, x.nodes or x.ranks, x.values
    inter = str(x.params.get("inter", "reduce-scatter"))
    phases: list[Phase] = []
    if g > 1:  # parts to their owners and the sums back, fp32 or a 16-bit cast
        s = n * (4 if x.params.get("intra", "none") == "none" else 2)
        half = collective_wire("alltoallv", g, s)
        phases.append(Phase("exchange", collective_msgs("exchange", g), (half, half), DIRECT,
                            INTRA))  # fmt: skip
    lanes = g if inter == "reduce-scatter" else 1
    flat = allgather if inter == "allgather" else reduce_broadcast
    among = replace(x, ranks=nodes, nodes=0, overlap=1)
    between = flat(replace(among, values=n / lanes if nodes > 1 else 0.0))
    if nodes > 1:  # the lanes together carry the whole payload among N ranks on the node's link
        whole = flat(among).phases[0]
        phases.append(replace(whole, level=INTER, lanes=lanes))
    return Traffic(tuple(phases), between.encode, between.decode, x.bits_per_value)
