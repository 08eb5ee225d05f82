"""Kernel benchmark results for people: one rich table per size, then the targets it touches."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from qbench.bench.kernels import KernelResult, KernelRow, TargetResult

# Wide when writing to a file or CI log, as in qbench.cli.console.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

_COLUMNS = ("compressor", "impl", "op", "time", "GB/s", "copy", "x copy", "wire", "bits/value")


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


def table(rows: list[KernelRow], title: str, repeats: int | None = None) -> Table:
    """repeats: the calls asked for; a row with fewer (cut by --max-time) says how many it has."""
    t = Table(title=title)
    for col in _COLUMNS:
        t.add_column(col, justify="left" if col in ("compressor", "impl", "op") else "right")
    for r in rows:
        time = seconds(r.seconds)
        if repeats is not None and len(r.samples) < repeats:
            n = len(r.samples)
            time += f" ({n} call{'' if n == 1 else 's'})"
        t.add_row(
            r.compressor, r.implementation, r.op, time, f"{r.gbps:.3g}",
            seconds(r.copy_seconds), f"{r.ratio:.3g}", nbytes(r.wire_bytes),
            f"{r.bits_per_value:.3g}",
        )  # fmt: skip
    return t


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
        out.print(table(rows, title, result.repeats))
        for t in targets:
            if t.target.log2_numel == e:
                out.print(target_line(t), markup=False, highlight=False)
