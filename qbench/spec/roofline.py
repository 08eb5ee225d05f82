"""The codec roofline of ``qbench bench kernels``: each rate, floor and break-even defined once.

* Throughput is in bytes of INPUT: the fp32 gradient, 4 bytes per value, per second
  (``input_gbps``), whatever the op writes or reads besides.
* The copy bandwidth is that of ``dst.copy_(src)`` on the same tensor, timed beside the op: a
  copy moves 8 bytes per value, reads 4 and writes 4 (``copy_gbps``).
* The memory floor of an op is the time the bytes it must move (``moved_bytes``) take at the
  copy bandwidth (``floor_seconds``); ``time / floor`` is 1.0 for an op at the floor, more for
  one bound by arithmetic or launches, and below 1 only for an op that moves less than the rule
  says (fp32's encode hands its input over without a copy).
* The break-even link rate B* (``breakeven_gbit``): below this link rate, compressing pays even
  when nothing hides the codec; with a fraction f of the codec time hidden, B* grows by
  1 / (1 - f).

Pure arithmetic (no torch): reports can read a kernels file and call these.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qbench.errors import UserError

FP32_BYTES = 4
"""Bytes per value of the gradient that goes in (and of the values a decode writes)."""
COPY_BYTES = 2 * FP32_BYTES
"""Bytes per value ``copy_`` moves: reads 4, writes 4."""
DEFAULT_OVERLAP = 0.5
"""Fraction of codec time hidden behind other work for the second break-even column."""


def input_gbps(numel: int, seconds: float) -> float:
    """Throughput in GB/s of input: 4 * numel fp32 bytes / seconds / 1e9."""
    return FP32_BYTES * numel / seconds / 1e9


def copy_gbps(numel: int, copy_seconds: float) -> float:
    """Measured copy bandwidth in GB/s: a copy moves 8 bytes per value (read 4, write 4)."""
    return COPY_BYTES * numel / copy_seconds / 1e9


def moved_bytes(
    wire_bytes: int, numel: int, op: str, *, error_feedback: bool, accumulate: bool = False
) -> int:
    """The bytes an encode or decode of ``numel`` fp32 values must move through memory at least.

    encode: reads the gradient (4 n) and writes the payload (``wire_bytes``); with error
        feedback it also reads and writes the fp32 residual (4 n + 4 n).
    decode: reads the payload (``wire_bytes``) and writes the values (4 n); decoding into a
        buffer that accumulates (``decode(payload, out)``) also reads that buffer (4 n).

    ``wire_bytes``: the catalog's wire bytes (``CompressorSpec.wire_bytes(n)``), or the measured
    payload where the payload size depends on the data. Nothing else counts: random draws are
    computed, not loaded, and per-bucket scales read twice are in cache.
    """
    n4 = FP32_BYTES * numel
    if op == "encode":
        return n4 + wire_bytes + (2 * n4 if error_feedback else 0)
    if op == "decode":
        return wire_bytes + n4 + (n4 if accumulate else 0)
    raise ValueError(f"op must be 'encode' or 'decode', got {op!r}")


def floor_seconds(moved: int, numel: int, copy_seconds: float) -> float:
    """Seconds ``moved`` bytes take at the copy bandwidth measured on ``numel`` values."""
    return moved * copy_seconds / (COPY_BYTES * numel)


def check_overlap(overlap: float) -> None:
    """The user's hidden fraction f: 0 <= f < 1 (f = 1 would say "any link", which needs no
    measuring); UserError otherwise."""
    if not 0 <= overlap < 1:
        raise UserError(
            f"overlap is the fraction of codec time hidden, 0 <= F < 1, got {overlap:g}; "
            "e.g. `--overlap 0.5`"
        )


def breakeven_gbit(c_enc: float, c_dec: float, ratio: float, overlap: float = 0.0) -> float | None:
    """B*, the break-even link rate in Gbit/s: below it, compressing pays even when nothing
    hides the codec (``overlap`` 0); with a fraction ``overlap`` of the codec time hidden.

    Sending n fp32 values raw over a link of B bytes/s takes 4n / B; compressed, 4n / (rB) plus
    the codec time 4n / C_enc + 4n / C_dec (unhidden part (1 - f) of it). Compression pays iff
    B < B* = (1 - 1/r) / ((1 - f) (1/C_enc + 1/C_dec)).

    c_enc, c_dec: encode and decode throughput in bytes of input per second.
    ratio: r = 4n / wire bytes.
    Returns None when r <= 1 (compressing never pays), inf when f = 1 and r > 1 (any link).
    """
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    if ratio <= 1:
        return None
    if overlap == 1:
        return math.inf
    per_byte = (1 - overlap) * (1 / c_enc + 1 / c_dec)
    return (1 - 1 / ratio) / per_byte * 8 / 1e9


def breakeven_of_times(
    numel: int, wire_bytes: int, encode_s: float, decode_s: float, overlap: float = 0.0
) -> float | None:
    """``breakeven_gbit`` from measured encode and decode seconds of ``numel`` values."""
    ratio = FP32_BYTES * numel / wire_bytes if wire_bytes > 0 else math.inf
    c_enc = FP32_BYTES * numel / encode_s
    c_dec = FP32_BYTES * numel / decode_s
    return breakeven_gbit(c_enc, c_dec, ratio, overlap)


@dataclass(frozen=True, kw_only=True)
class Placement:
    """One op of one compressor at one size on the roofline (a ``bench kernels`` row's
    ``roofline``)."""

    copy_gbps: float
    """The copy bandwidth measured beside the op, GB/s moved (``copy_gbps``)."""
    error_feedback: bool
    """The codec keeps a residual (``stateful``): its encode reads and writes it too."""
    moved_bytes: int
    """Bytes the op must move at least (``moved_bytes``)."""
    floor_seconds: float
    """``moved_bytes`` at the copy bandwidth: the memory floor."""
    floor_ratio: float
    """seconds / floor_seconds ("x floor"; 1.0 = at the floor)."""
    breakeven_gbit: float | None
    """B* in Gbit/s of the compressor at this size, from its encode and decode times (the same
    on both rows): below this link rate, compressing pays even when nothing hides the codec.
    None: the payload is not smaller than fp32, so compressing never pays."""
    breakeven_overlap_gbit: float | None
    """B* with a fraction ``overlap`` of the codec time hidden: breakeven_gbit / (1 - f)."""


def place(
    numel: int,
    seconds: Mapping[str, float],
    copy_seconds: float,
    *,
    wire_bytes: int | None,
    measured: int,
    error_feedback: bool,
    overlap: float,
    accumulate: bool = False,
) -> dict[str, Placement]:
    """Each op's placement from the median ``seconds`` of encode and decode and of the copy.

    wire_bytes: the catalog's payload bytes of ``numel`` values; None where they depend on the
        data, and then the ``measured`` payload counts, for the floor and the ratio r alike.
    """
    wire = measured if wire_bytes is None else wire_bytes
    breakeven = [
        breakeven_of_times(numel, wire, seconds["encode"], seconds["decode"], f)
        for f in (0.0, overlap)
    ]
    placed = {}
    for op, s in seconds.items():
        moved = moved_bytes(wire, numel, op, error_feedback=error_feedback, accumulate=accumulate)
        floor = floor_seconds(moved, numel, copy_seconds)
        placed[op] = Placement(
            copy_gbps=copy_gbps(numel, copy_seconds), error_feedback=error_feedback,
            moved_bytes=moved, floor_seconds=floor, floor_ratio=s / floor,
            breakeven_gbit=breakeven[0], breakeven_overlap_gbit=breakeven[1],
        )  # fmt: skip
    return placed


def summary(overlap: float, copies: Iterable[tuple[int, Sequence[float]]]) -> dict[str, Any]:
    """The ``roofline`` block of a kernels JSON document: the ``overlap`` of its second
    break-even rate, and per size the median of every copy sample timed there (``copies``:
    (numel, samples) of each compressor once) with the copy bandwidth it makes."""
    by_size: dict[int, list[float]] = {}
    for numel, samples in copies:
        by_size.setdefault(numel, []).extend(samples)
    rows = []
    for numel, samples in sorted(by_size.items()):
        median = statistics.median(samples)
        rows.append({
            "numel": numel, "copy_seconds": median, "copy_gbps": copy_gbps(numel, median),
            "samples": len(samples),
        })  # fmt: skip
    return {"overlap": overlap, "copy": rows}
