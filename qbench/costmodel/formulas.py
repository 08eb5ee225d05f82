"""Alpha-beta times of the collectives, and each scheme's declared traffic as the model reads it.

What a scheme sends and codes is declared once, in ``qbench.catalog.schemes.traffic`` (the schemes'
``traffic``; the model's own projected allreduce here, ``OWN``): this module only reads it
(:func:`traffic`, :func:`comm_plan`, :func:`coding`), with no branch on a scheme's name.

**Collectives** (per rank, K ranks, a buffer of S bytes, alpha = seconds per message step,
beta = seconds per byte on one rank's link; byte counts as in ``qbench.comm.formulas``):

* ring allreduce:            t = 2 (K-1) alpha + 2 (K-1) / K * S * beta
* alltoallv (direct):        t =   (K-1) alpha +   (K-1) / K * S * beta
* allgatherv of S per rank:  t =   (K-1) alpha +   (K-1)     * S * beta
* ``exchange`` = alltoallv + allgatherv of 1/K each (reduce-broadcast's comm phase):
                             t = 2 (K-1) alpha + 2 (K-1) / K * P * beta   (P: full payload)

**Emulated links** (``network: {bandwidth: ...}``, tc tbf): the token bucket holds 2 ms of
traffic (``qbench.spec.network.tbf_burst_bytes``), so a call that starts on a full bucket gets up to
that much transfer time free. On shaped links each collective call is therefore charged
``max(0, wire_call * beta - credit)``, the credit (0 <= credit <= the burst time) being fitted
with alpha and beta (``qbench.costmodel.fit.lsq``); unshaped links have none. Predictions for real
links drop it (``Config.tbf_burst = False``).

**Collective keys** (``comm_plan``): ``allreduce`` (fp32 allreduce, simulated-lowprec),
``allreduce-fp16`` / ``allreduce-bf16``, ``allreduce-int`` (integer-allreduce's comm phase: the
MAX allreduce of the bucket scales plus the integer allreduce, 2 x 2 (K-1) messages, two
calls), ``exchange`` (reduce-broadcast: two calls), ``allgather``; pipelined schemes
(``overlap: C``) have ``exchange+overlap`` / ``allreduce-int+overlap`` with C times the
messages, as one continuous call. A key without a fit falls back to a related one
(``FALLBACK``), with a note in the prediction.

**Other links:** beta scales with the inverse of the link rate, ``beta' = beta * bw_fit /
bw_new``, alpha is kept; the fit on the nearest rate (in log scale) is used. Unshaped (loopback)
fits have no rate and predict unshaped links only.

**Codec units** (``codec_units``, the traffic's ``Coding.units``): the elements one rank
encodes / decodes in one aggregation of n values, so that codec fits scale with K:
reduce-broadcast encodes n (1 + 1/K) values (K ranges and the owner's re-encode) and decodes
2 n (owner mean and gather); allgather decodes K n; the others n each.
"""

from __future__ import annotations

from collections.abc import Sequence

from qbench.catalog import CompressorSpec
from qbench.catalog.schemes.collectives import (
    collective_msgs,
    collective_wire,
    ring_allreduce_bytes,
)
from qbench.catalog.schemes.traffic import ANY, Coding, Exchange, Phase, Traffic
from qbench.costmodel.schemes import NONE, SCHEMES, Scheme, declared
from qbench.errors import UserError
from qbench.spec import network as network_mod
from qbench.spec.network import Link

__all__ = [
    "FALLBACK", "CommItem", "allreduce_wire", "burst_s", "codec_units", "coding",
    "collective_msgs", "collective_time", "collective_wire", "comm_plan", "comm_time",
    "payload_bits", "scale_beta", "traffic",
]  # fmt: skip

FALLBACK = {
    "allreduce-fp16": "allreduce",
    "allreduce-bf16": "allreduce",
    "allreduce-int": "allreduce",
    "allgather": "exchange",
    "exchange+overlap": "exchange",
    "allreduce-int+overlap": "allreduce-int",
}
"""Collective key -> the key whose parameters stand in when it has no fit."""

CommItem = Phase
"""One comm phase: the collective key, message steps per rank, and the wire bytes per rank of
each collective call in it (``qbench.catalog.schemes.traffic.Phase``)."""


def allreduce_wire(nbytes: float, k: int) -> float:
    """Per-rank bytes of a ring allreduce of ``nbytes`` (``Comm.bytes_sent``'s count, unrounded)."""
    return ring_allreduce_bytes(nbytes, k)


def collective_time(alpha: float, beta: float, kind: str, k: int, nbytes: float) -> float:
    """alpha-beta time of one collective (formulas in the module docstring)."""
    return collective_msgs(kind, k) * alpha + collective_wire(kind, k, nbytes) * beta


def scale_beta(beta: float, bw_fit_bps: float, bw_new_bps: float) -> float:
    """beta on a link of another rate: seconds per byte scale with 1 / bandwidth."""
    return beta * bw_fit_bps / bw_new_bps


def burst_s(link: Link) -> float:
    """Seconds of traffic in the tbf bucket of an emulated link (2 ms from 65.5 Mbit/s up);
    0 unshaped."""
    bps = link.bits_per_s
    return 0.0 if bps is None else network_mod.tbf_burst_s(bps)


def comm_time(
    alpha: float, beta: float, credit: float, msgs: float, calls: Sequence[float]
) -> float:
    """msgs * alpha + sum over calls of max(0, wire * beta - credit)."""
    return msgs * alpha + sum(max(0.0, w * beta - credit) for w in calls)


def traffic(
    scheme: Scheme, compressor: CompressorSpec, k: int, n: float, bits_per_value: float,
    backend: str, nodes: int = 0,
) -> Traffic:  # fmt: skip
    """What the scheme sends and codes aggregating n values over K ranks (``nodes``: N nodes of
    K / N ranks; 0: one rank per node), as the catalog declares it."""
    of = declared(scheme.name)
    if of is None:
        raise UserError(
            f"the cost model has no scheme {scheme.name!r}; valid: {', '.join(SCHEMES)}"
        )
    return of(Exchange(
        ranks=k, values=n, compressor=compressor, bits_per_value=bits_per_value,
        backend=backend, overlap=scheme.overlap, nodes=nodes, params=scheme.params,
    ))  # fmt: skip


def comm_plan(
    scheme: Scheme,
    compressor: CompressorSpec,
    k: int,
    n: float,
    bits_per_value: float,
    backend: str,
) -> CommItem:
    """The comm phase of a flat scheme aggregating n values (payload = n * bits_per_value / 8
    bytes). Pipelined schemes keep C chunks in flight, one continuous stream: one call for the
    credit."""
    phases = traffic(scheme, compressor, k, n, bits_per_value, backend).phases
    if len(phases) != 1 or phases[0].level != ANY:
        raise UserError(f"scheme {scheme.name} runs in levels; time it on a topology")
    return phases[0]


def coding(scheme: Scheme, k: int, n: float, op: str, nodes: int = 0) -> Coding:
    """One rank's encode or decode of n values over K ranks; a scheme without declared traffic
    (DDP's loop) codes each value once."""
    if declared(scheme.name) is None:
        return Coding(scheme.name, k, n, n)
    return traffic(scheme, NONE, k, n, 32.0, "gloo", nodes).coding(op)


def codec_units(scheme: str, k: int, n: float, op: str) -> float:
    """Elements one rank encodes / decodes in one aggregation of n values (the x of the codec
    fits, so that they scale with K)."""
    return coding(Scheme(scheme), k, n, op).units


def payload_bits(
    scheme: Scheme, compressor: CompressorSpec, bits_per_value: float, backend: str, k: int
) -> float:
    """Bits per value of a rank's own payload (``payload_bytes`` in records)."""
    if declared(scheme.name) is None:
        return bits_per_value
    return traffic(scheme, compressor, k, 1.0, bits_per_value, backend).payload_bits
