"""The ``qbench bench numerics`` figure: relative error of the averaged gradient against the
number of simulated ranks K, log-log, one panel per format, one line per reduction order (its
median over repeats, the band its 95 % interval). Saved as PNG or PDF by the path's suffix."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from qbench.errors import UserError
from qbench.records.store import atomic_write_bytes
from qbench.report import numerics, plots
from qbench.report.plots import styles

FORMATS = ("png", "pdf")
COLUMNS = 3


def check_path(path: Path) -> Path:
    """``path`` when its suffix names a format written here; UserError otherwise (before the
    simulation starts)."""
    if path.suffix.lower().lstrip(".") not in FORMATS:
        raise UserError(
            f"--figure {path}: the suffix says the format, .png or .pdf, got "
            f"{path.suffix or 'none'}; e.g. `--figure numerics.png`"
        )
    return path


def figure(doc: dict[str, Any]) -> Figure:
    summaries = numerics.summarize(numerics.rows(doc, "the document"))
    formats = list(dict.fromkeys(s.compressor for s in summaries))
    orders = list(dict.fromkeys(s.order for s in summaries))
    cols = min(COLUMNS, max(1, len(formats)))
    rows = math.ceil(len(formats) / cols) if formats else 1
    fig = Figure(figsize=(4.2 * cols, 3.3 * rows + 1.0), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, fmt in zip(axes, formats, strict=False):
        _panel(ax, [s for s in summaries if s.compressor == fmt], orders)
        ax.set_title(fmt)
    for ax in axes[len(formats) :]:
        ax.set_visible(False)
    found = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    if found:
        fig.legend(handles=list(found.values()), loc="outside lower center",
                   ncols=min(5, len(found)))  # fmt: skip
    repeats = doc.get("settings", {}).get("repeats", "?")
    fig.suptitle(
        "Relative error of the averaged gradient vs the float64 mean: simulated ranks, one "
        f"process\n{numerics.source_text(doc)}; median of {repeats} repeats, band: 95 % interval"
    )
    return fig


def _panel(ax: Axes, mine: Sequence[numerics.Summary], orders: Sequence[str]) -> None:
    for i, order in enumerate(orders):
        line = sorted(
            (s for s in mine if s.order == order and math.isfinite(s.median) and s.median > 0),
            key=lambda s: s.ranks,
        )
        if not line:
            continue
        color, marker = styles.PAIRS[i]
        ks = [s.ranks for s in line]
        ax.plot(ks, [s.median for s in line], color=color, marker=marker, label=order)
        low = [s.low if s.low > 0 else s.median for s in line]
        ax.fill_between(ks, low, [s.high for s in line], color=color, alpha=0.15, linewidth=0)
    ax.set_xscale("log", base=2)
    ks = sorted({s.ranks for s in mine})
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_yscale("log")
    ax.set_xlabel("simulated ranks K (one process)")
    ax.set_ylabel("relative error")
    ax.grid(True, which="major", linewidth=0.4, alpha=0.5)


def write(doc: dict[str, Any], path: Path) -> Path:
    """Draw ``doc`` and save it to ``path`` (PNG or PDF by suffix), atomically."""
    check_path(path)
    with matplotlib.rc_context(plots.STYLE):
        fig = figure(doc)
        buffer = io.BytesIO()
        fig.savefig(buffer, format=path.suffix.lower().lstrip("."), dpi=plots.DPI)
    atomic_write_bytes(path, buffer.getvalue())
    return path
