"""Hand-written expectations for the cost model, independent of ``qbench.costmodel``.

Message steps, wire bytes and codec work of each aggregation scheme, written from the schemes'
definitions: README "Aggregation schemes and byte accounting", the docstrings of
``qbench/aggregate/*.py`` and the byte counts of ``qbench.comm.base`` (an allreduce of S bytes
puts 2 (K-1)/K S on the wire, nccl-tests' bus bytes; an allgatherv K-1 copies of the own buffer;
an alltoallv the sends to the K-1 peers). Nothing here imports qbench: the tests compare the
model with these, and these with literal tables (tests/costmodel/test_costmodel_reference.py).

Notation: K ranks, n gradient values, ``bits`` wire bits per value of the compressor,
P = n bits / 8 payload bytes per rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RATE_BPS = {"unshaped": 1e9, "500mbit": 500e6, "1gbit": 1e9, "10gbit": 10e9}
"""Link rates of the network labels the tests use (unshaped: beta is quoted as at 1 gbit)."""


def qsgd(label: str) -> tuple[int, int]:
    """(bits, bucket size) of a qsgd label: ``qsgd-4b-b512`` -> (4, 512)."""
    bits, bucket = label.split("-")[1:3]
    return int(bits.rstrip("b")), int(bucket.lstrip("b"))


def bits_per_value(compressor: str) -> float:
    """Wire bits per value: fp32 32, fp16/bf16 16, fixed-Nb N, qsgd its levels plus one fp32
    scale per bucket (bits + 32 / bucket)."""
    if compressor == "fp32":
        return 32.0
    if compressor in ("fp16", "bf16"):
        return 16.0
    if compressor.startswith("fixed-"):
        return float(compressor.split("-")[1].rstrip("b"))
    bits, bucket = qsgd(compressor)
    return bits + 32 / bucket


def ring_steps(k: int) -> int:
    """Ring allreduce: K-1 reduce-scatter steps, then K-1 allgather steps."""
    return 2 * (k - 1)


def ring_bytes(nbytes: float, k: int) -> float:
    """Each of the 2 (K-1) ring steps sends one K-th of the buffer."""
    return 2 * (k - 1) * nbytes / k


INT_WIDTHS = {"gloo": (1, 4), "nccl": (1, 4), "mpi": (1, 2, 4)}
"""Integer widths in bytes each backend sums (gloo rejects int16, NCCL has none)."""


def int_width(backend: str, k: int, bits: int) -> int:
    """integer-allreduce's integers: the narrowest summable width holding K levels of
    2^(bits-1) - 1 without overflow."""
    bound = k * (2 ** (bits - 1) - 1)
    return next(w for w in INT_WIDTHS[backend] if bound <= 2 ** (8 * w - 1) - 1)


def payload_bits(scheme: str, compressor: str, backend: str, k: int) -> float:
    """Bits per value of the rank's own payload: integer-allreduce sends its integers and the
    fp32 bucket scales, every other scheme the compressor's payload."""
    if scheme == "integer-allreduce" and compressor != "fp32":
        bits, bucket = qsgd(compressor)
        return 8 * int_width(backend, k, bits) + 32 / bucket
    return bits_per_value(compressor)


@dataclass(frozen=True)
class Comm:
    key: str
    """The collective whose fitted alpha and beta price this phase."""
    msgs: float
    """Message steps per rank (each pays alpha)."""
    calls: tuple[float, ...]
    """Wire bytes per rank of each collective call."""

    @property
    def wire(self) -> float:
        return sum(self.calls)


def comm(scheme: str, compressor: str, k: int, n: float, backend: str = "gloo",
         overlap: int = 1, bits: float | None = None) -> Comm:  # fmt: skip
    """The comm phase of one aggregation of n values."""
    bits = bits_per_value(compressor) if bits is None else bits
    payload = n * bits / 8
    if scheme == "allreduce":  # one sum allreduce of the (fp32 or cast 16-bit) buffer
        key = "allreduce" if compressor == "fp32" else f"allreduce-{compressor}"
        return Comm(key, ring_steps(k), (ring_bytes(payload, k),))
    if scheme == "lowprec-allreduce":  # projected: an allreduce of the payload itself
        return Comm("allreduce", ring_steps(k), (ring_bytes(payload, k),))
    if scheme == "simulated-lowprec":  # an fp32 buffer of ceil(P / 4) elements
        padded = 4 * math.ceil(payload / 4)
        return Comm("allreduce", ring_steps(k), (ring_bytes(padded, k),))
    if scheme == "reduce-broadcast":
        to_owners = (k - 1) * payload / k  # alltoallv: the K-1 ranges other ranks own
        to_all = (k - 1) * (payload / k)  # allgatherv: the own range's mean to K-1 peers
        if overlap > 1:  # C chunks, each an alltoallv and an allgatherv, one stream
            return Comm("exchange+overlap", overlap * 2 * (k - 1), (to_owners + to_all,))
        return Comm("exchange", (k - 1) + (k - 1), (to_owners, to_all))
    if scheme == "allgather":  # the whole payload to each of the K-1 peers
        return Comm("allgather", k - 1, ((k - 1) * payload,))
    if scheme == "integer-allreduce":
        if compressor == "fp32":  # full-precision groups: a plain fp32 allreduce
            return Comm("allreduce", ring_steps(k), (ring_bytes(4 * n, k),))
        qbits, bucket = qsgd(compressor)
        scales = ring_bytes(4 * math.ceil(n / bucket), k)  # the MAX allreduce of the scales
        ints = ring_bytes(n * int_width(backend, k, qbits), k)  # the sum of the integers
        if overlap > 1:  # the scales once, then C chunk allreduces in flight
            return Comm("allreduce-int+overlap", (1 + overlap) * ring_steps(k), (scales, ints))
        return Comm("allreduce-int", 2 * ring_steps(k), (scales, ints))
    raise ValueError(f"no reference for scheme {scheme!r}")


def codec_units(scheme: str, k: int, n: float, op: str) -> float:
    """Values one rank encodes or decodes in one aggregation of n values."""
    if scheme == "reduce-broadcast":
        if op == "encode":  # every range (n in all), then the owner's mean of n / K again
            return n + n / k
        return n + n  # the owner's K received payloads of n / K, then all K gathered ranges
    if scheme == "allgather":
        return n if op == "encode" else k * n  # decodes every rank's payload of n
    return n  # allreduce, simulated-lowprec, integer-allreduce, lowprec-allreduce: once each


def comm_seconds(alpha: float, beta: float, c: Comm, credit: float = 0.0) -> float:
    """alpha per message step, beta per wire byte; on an emulated link each call gets up to
    ``credit`` seconds of transfer free from the token bucket."""
    return c.msgs * alpha + sum(max(0.0, w * beta - credit) for w in c.calls)


def ddp_iteration(
    forward: float, backward: float, step: float, handed: list[float], seconds: list[float],
    imbalance: float = 1.0,
) -> tuple[float, float]:  # fmt: skip
    """(iteration, exposed comm) of DDP with one communication stream (Agarwal et al., MLSys
    2022): buckets go out in hand-over order, each when it is handed over and the stream is
    free; after backward's last hand-over the loop waits for what is still in flight."""
    free = 0.0
    for h, d in zip(handed, seconds, strict=True):
        free = max(free, h) + d  # starts when both the bucket and the stream are ready
    waited = max(0.0, free - max(handed))
    return (forward + backward + waited + step) * imbalance, waited
