"""Message steps, wire bytes and alpha-beta times of the collectives, per scheme.

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
with alpha and beta (``qbench.costmodel.lsq``); unshaped links have none. Predictions for real
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

**Codec units** (``codec_units``): the elements one rank encodes / decodes in one aggregation of
n values, so that codec fits scale with K: reduce-broadcast encodes n (1 + 1/K) values (K ranges
and the owner's re-encode) and decodes 2 n (owner mean and gather); allgather decodes K n; the
others n each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from qbench.catalog import CompressorSpec
from qbench.comm.formulas import busbw_factor, ring_allreduce_bytes
from qbench.costmodel.schemes import PROJECTED, SCHEMES, Scheme, full_precision, int_sum_bytes
from qbench.errors import UserError
from qbench.spec import network as network_mod
from qbench.spec.network import Link

FALLBACK = {
    "allreduce-fp16": "allreduce",
    "allreduce-bf16": "allreduce",
    "allreduce-int": "allreduce",
    "allgather": "exchange",
    "exchange+overlap": "exchange",
    "allreduce-int+overlap": "allreduce-int",
}
"""Collective key -> the key whose parameters stand in when it has no fit."""


def allreduce_wire(nbytes: float, k: int) -> float:
    """Per-rank bytes of a ring allreduce of ``nbytes`` (``Comm.bytes_sent``'s count, unrounded)."""
    return ring_allreduce_bytes(nbytes, k)


def collective_msgs(kind: str, k: int) -> int:
    """Message steps per rank (each pays alpha) of one collective over K ranks."""
    steps = {"allreduce": 2 * (k - 1), "alltoallv": k - 1, "allgatherv": k - 1}
    steps["exchange"] = steps["alltoallv"] + steps["allgatherv"]
    return steps[kind]


def collective_wire(kind: str, k: int, nbytes: float) -> float:
    """Per-rank wire bytes: ``nbytes`` is the allreduced buffer, the alltoallv send buffer or
    exchange payload (all ranges), or the allgatherv contribution of one rank."""
    factor = {
        "allreduce": busbw_factor("allreduce", k),
        "alltoallv": busbw_factor("alltoall", k),
        "exchange": busbw_factor("alltoall", k) + busbw_factor("allgather", k),
        "allgatherv": float(k - 1),  # the own buffer once per peer (qbench.comm.formulas)
    }
    return factor[kind] * nbytes


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


def codec_units(scheme: str, k: int, n: float, op: str) -> float:
    """Elements one rank encodes / decodes in one aggregation of n values (the x of the codec
    fits, so that they scale with K)."""
    if scheme == "reduce-broadcast":  # K ranges + the owner's re-encode; owner mean + gather
        return n * (1 + 1 / k) if op == "encode" else 2 * n
    if scheme == "allgather":
        return n if op == "encode" else k * n
    return n


@dataclass(frozen=True)
class CommItem:
    """One comm phase: the collective key, message steps per rank, and the wire bytes per rank of
    each collective call in it (each call may start on a full tbf bucket)."""

    collective: str
    msgs: float
    calls: tuple[float, ...]

    @property
    def wire(self) -> float:
        return float(sum(self.calls))


def comm_plan(
    scheme: Scheme,
    compressor: CompressorSpec,
    k: int,
    n: float,
    bits_per_value: float,
    backend: str,
) -> CommItem:
    """The comm phase of aggregating n values (payload = n * bits_per_value / 8 bytes).

    Pipelined schemes keep C chunks in flight, one continuous stream: one call for the credit.
    """
    payload = n * bits_per_value / 8
    c = scheme.overlap
    ring = collective_msgs("allreduce", k)
    if scheme.name == "allreduce":
        key = "allreduce" if full_precision(compressor) else f"allreduce-{compressor.label}"
        return CommItem(key, ring, (allreduce_wire(payload, k),))
    if scheme.name in ("simulated-lowprec", PROJECTED):
        nbytes = 4 * math.ceil(payload / 4) if scheme.name == "simulated-lowprec" else payload
        return CommItem("allreduce", ring, (allreduce_wire(nbytes, k),))
    if scheme.name == "reduce-broadcast":
        half = collective_wire("alltoallv", k, payload)  # = the allgatherv's (K-1) P / K
        if c > 1:
            return CommItem("exchange+overlap", c * collective_msgs("exchange", k), (2 * half,))
        return CommItem("exchange", collective_msgs("exchange", k), (half, half))
    if scheme.name == "allgather":
        wire = collective_wire("allgatherv", k, payload)
        return CommItem("allgather", collective_msgs("allgatherv", k), (wire,))
    if scheme.name == "integer-allreduce":
        if full_precision(compressor):  # full-precision groups take a plain allreduce
            return CommItem("allreduce", ring, (allreduce_wire(4 * n, k),))
        why = compressor.entry.integer_levels(compressor.params)
        if why is not None:
            raise UserError(f"integer-allreduce cannot sum {compressor.label}: {why}")
        top, bucket = compressor.entry.integer_grid(compressor.params)
        ints = allreduce_wire(n * int_sum_bytes(backend, k, top), k)
        scales = allreduce_wire(4 * math.ceil(n / bucket), k)
        if c > 1:
            return CommItem("allreduce-int+overlap", (1 + c) * ring, (scales, ints))
        return CommItem("allreduce-int", 2 * ring, (scales, ints))
    raise UserError(f"the cost model has no scheme {scheme.name!r}; valid: {', '.join(SCHEMES)}")


def payload_bits(
    scheme: Scheme, compressor: CompressorSpec, bits_per_value: float, backend: str, k: int
) -> float:
    """Bits per value of a rank's own payload (``payload_bytes`` in records)."""
    if scheme.name == "integer-allreduce" and not full_precision(compressor):
        top, block = compressor.entry.integer_grid(compressor.params)
        return 8 * int_sum_bytes(backend, k, top) + 32 / block
    return bits_per_value
