"""Kernel benchmark results for people: one rich table per size, then the targets it touches
and a caption saying what the roofline columns mean; and the consoles (``out``, ``err``) and
number formats (``seconds``, ``nbytes``) that ``comm.render`` and ``qbench bench numerics``
print with."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from qbench.bench import kernels
from qbench.bench.kernels import KernelResult, KernelRow, TargetResult
from qbench.records.store import atomic_write_json
from qbench.spec import roofline

# Wide when writing to a file or CI log, as in qbench.cli.console.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

_COLUMNS = (
    "compressor", "impl", "op", "time", "GB/s", "copy", "x copy", "x floor",
    *(f"x {peer}" for peer in kernels.PEERS), "wire", "bits/value",
)  # fmt: skip
_LEFT = ("compressor", "impl", "op")

CAPTION = (
    "GB/s        fp32 input (4 bytes a value) per second",
    "x copy      time / time of copy_ of the same tensor, timed beside it",
    "x floor     time / (bytes the op must move, at that copy's bandwidth); 1.0 = at the floor",
    "x fp8 cast  time / torch's fp32 -> float8_e4m3fn cast (decode: back to fp32), timed beside",
    "            it into a preallocated tensor; x bf16 cast: the same with bfloat16",
    "            encode: 4 B/value in, payload out, + 8 B/value of residual with error feedback",
    "            decode: payload in, 4 B/value out",
    "break-even  link rate (Gbit/s) below which compressing pays even when nothing hides the",
    "            codec (f=0), or with a fraction f of codec time hidden (--overlap); one per",
    "            compressor, on its encode row; never: the payload is not smaller than fp32",
)
"""What the columns mean, printed once below the tables."""


def seconds(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def nbytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def link_rate(gbit: float | None) -> str:
    """A break-even link rate in Gbit/s: ``never`` (None), ``any`` (infinite), else 3 digits."""
    if gbit is None:
        return "never"
    if math.isinf(gbit):
        return "any"
    return f"{gbit:,.0f}" if gbit >= 1000 else f"{gbit:.3g}"


def table(
    rows: list[KernelRow],
    title: str,
    repeats: int | None = None,
    overlap: float = roofline.DEFAULT_OVERLAP,
) -> Table:
    """repeats: the calls asked for; a row with fewer (cut by --max-time) says how many it has.
    overlap: the f of the second break-even column."""
    t = Table(title=title)
    for col in _COLUMNS:
        t.add_column(col, justify="left" if col in _LEFT else "right")
    t.add_column("break-even\nGbit/s f=0", justify="right")
    t.add_column(f"break-even\nGbit/s f={overlap:g}", justify="right")
    for r in rows:
        time = seconds(r.seconds)
        if repeats is not None and len(r.samples) < repeats:
            n = len(r.samples)
            time += f" ({n} call{'' if n == 1 else 's'})"
        p = r.roofline
        # B* is the compressor's (encode and decode together): once, on its encode row.
        rates = (p.breakeven_gbit, p.breakeven_overlap_gbit) if r.op == "encode" else None
        t.add_row(
            r.compressor, r.implementation, r.op, time, f"{r.gbps:.3g}",
            seconds(r.copy_seconds), f"{r.ratio:.3g}", f"{p.floor_ratio:.3g}",
            *(_ratio(r.peer_ratio(peer)) for peer in kernels.PEERS), nbytes(r.wire_bytes),
            f"{r.bits_per_value:.3g}",
            *((link_rate(b) for b in rates) if rates else ("", "")),
        )  # fmt: skip
    return t


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def target_line(t: TargetResult) -> str:
    measured = ", ".join(
        f"{op} {ratio:.2f}x {'PASS' if t.passed(op) else 'MISS'}" for op, ratio in t.ratios.items()
    )
    return f"target: {t.target.describe()}: measured {measured}"


def show_kernels(result: KernelResult) -> None:
    """Print one table per size with the targets at that size below it; notes on stderr."""
    for note in result.notes:
        err.print(note, markup=False, highlight=False)
    targets = result.targets()
    for e in result.sizes:
        rows = [r for r in result.rows if r.numel == 2**e]
        title = (
            f"kernels: 2^{e} = {2**e:,} float32 on {result.device}, {result.threads} thread(s), "
            f"median of {result.repeats} calls or of those made in {result.max_time:g} s"
        )
        out.print(table(rows, title, result.repeats, result.overlap))
        for t in targets:
            if t.target.log2_numel == e:
                out.print(target_line(t), markup=False, highlight=False)
    if result.rows:
        out.print("\n".join(CAPTION), markup=False, highlight=False)


def command(
    specs: Sequence[str], *, sizes: Sequence[int], repeats: int, max_time: float, device: str,
    threads: int, backend: str, overlap: float, json_path: Path | None,
) -> None:  # fmt: skip
    """``qbench bench kernels``: measure, print the tables, optionally write the JSON."""
    result = kernels.measure(
        specs or None, sizes=sizes, repeats=repeats, max_time=max_time, device=device,
        threads=threads, backend=backend, overlap=overlap,
        on_progress=lambda what: err.print(f"timing {what}", highlight=False),
    )  # fmt: skip
    show_kernels(result)
    if json_path is not None:
        atomic_write_json(json_path, kernels.to_document(result))
        err.print(f"wrote {json_path}", highlight=False)
