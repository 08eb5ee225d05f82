"""Figures of a summary table (``qbench.report.stats.summarize``), saved as PNG and PDF.

Uses ``matplotlib.figure.Figure`` directly, never pyplot: no global figure registry, no
backend switch, nothing left open. Only ok runs with measured iterations are drawn; repeats
of one configuration are shown as their median.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import NullLocator

from qbench.records.store import atomic_write_bytes
from qbench.report import names
from qbench.report.plots import styles

DPI = 150
# stacking order bottom-up: communication first, as in the seed paper's breakdown figures
PARTS = {
    "t_comm": ("communication", "#4C72B0"),
    "t_encode": ("encode", "#DD8452"),
    "t_decode": ("decode", "#C44E52"),
    "t_compute": ("compute (fwd+bwd)", "#55A868"),
    "t_step": ("optimizer step", "#A0A0A0"),
}
STYLE: dict[Any, Any] = {  # keys typed Any: matplotlib's stubs want Literal keys
    **{"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9},
    **{"xtick.labelsize": 9, "ytick.labelsize": 9, "figure.titlesize": 12},
    "pdf.fonttype": 42,  # embed TrueType so the PDF text stays editable and sharp in print
}
_ORDER = ["world_size", "bits", "compressor", "scheme"]


def spread_note(runs: pd.DataFrame, keys: list[str], per: str, shown: str) -> str:
    """What a figure's band or error bars are, for its title: "mean over 3 seeds, bars: +/- 1
    std", or "one seed per point, so no bars" when no configuration (``keys``) of ``runs`` (a
    row per run: ``run_id``, ``repeat`` if any) had two runs. Runs of one configuration differ
    by seed, or by repeat where there are repeats (then they are called runs)."""
    counts = sorted(set(runs.groupby(keys, dropna=False)["run_id"].nunique()))
    repeats = pd.to_numeric(runs["repeat"], errors="coerce") if "repeat" in runs else pd.Series()
    unit = "runs" if (repeats > 0).any() else "seeds"
    if counts == [1]:
        return f"one {unit[:-1]} per {per}, so no {shown}"
    over = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    where = " where 2 or more" if counts[0] == 1 else ""
    return f"mean over {over} {unit}, {shown}: +/- 1 std{where}"


def write_figures(summary: pd.DataFrame, out_dir: Path) -> tuple[list[Path], list[str]]:
    """Save breakdown.{png,pdf} and scalability.{png,pdf}; returns (paths, notes on skips)."""
    paths: list[Path] = []
    notes: list[str] = []
    with matplotlib.rc_context(STYLE):  # restores every setting on exit
        for name, build in (("breakdown", breakdown_figure), ("scalability", scalability_figure)):
            fig = build(summary)
            if fig is None:
                notes.append(f"{name} figure skipped: no ok run with measured iterations")
                continue
            paths += [_save(fig, out_dir / f"{name}.{ext}", ext) for ext in ("png", "pdf")]
    return paths, notes


def save_all(fig: Figure, stem: Path) -> list[Path]:
    """``stem``.png and ``stem``.pdf, written atomically, with the shared style."""
    with matplotlib.rc_context(STYLE):
        return [_save(fig, stem.with_suffix(f".{ext}"), ext) for ext in ("png", "pdf")]


def _save(fig: Figure, path: Path, ext: str) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format=ext, dpi=DPI)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def _measured(summary: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Ok rows with a median iteration time, repeats merged (median), ordered for drawing."""
    rows = summary[(summary["status"] == "ok") & summary["t_iteration_median"].notna()]
    if rows.empty:
        return rows
    named = {c: rows[c].astype(object).fillna("?") for c in ("model", "dataset", "backend")}
    rows = rows.assign(series=_series_labels(rows), network=rows["network"].fillna("?"), **named)
    values = ["samples_per_s", "t_iteration_median", *PARTS]
    # simulated: constant per series (names keep "(simulated)"); the lines' dashes read it
    by = [*keys, "series", "compressor_name", "precision", "simulated", *_ORDER]
    merged = rows.groupby(by, as_index=False, dropna=False)[values]
    order = [True, False, True, True]  # fp32 (32 bits) before fewer bits
    return merged.median().sort_values(_ORDER, ascending=order, na_position="last")


def wrap_label(label: str, width: int = 28) -> str:
    """A long name over several lines, broken after ``·`` and ``,`` (and before ``+`` of a
    label no name was found for), so no tick label or title squeezes its axes to nothing."""
    if len(label) <= width:
        return label
    lines: list[str] = []
    for part in label.split("\n"):
        line = ""
        for piece in (
            # the space after a break point starts the next piece: dropped at a line's start
            part.replace(" · ", " ·\0 ").replace(", ", ",\0 ").replace("+", "\0+").split("\0")
        ):
            if line and len(line) + len(piece) > width:
                lines.append(line.rstrip())
                line = ""
            line += piece if line else piece.lstrip()
        lines.append(line.rstrip())
    return "\n".join(lines)


def _series_labels(rows: pd.DataFrame) -> pd.Series:
    """The compressor's name (:mod:`qbench.report.names`), as scheme and compressor when the
    rows have several schemes, plus the compute precision when they have several (runs of
    different precisions are separate bars and lines, never one median)."""
    compressors = rows["compressor"].fillna("?").astype(str)
    if rows["scheme"].nunique() > 1:
        schemes = rows["scheme"].fillna("?").astype(str)
        label = pd.Series([names.method(s, c) for s, c in zip(schemes, compressors, strict=True)],
                          index=rows.index)  # fmt: skip
    else:
        label = compressors.map(names.compressor)
    if "precision" in rows and rows["precision"].nunique() > 1:
        label = label + " · " + rows["precision"].fillna("fp32").astype(str)
    return label


# -- (a) stacked time breakdown ------------------------------------------------------------
def breakdown_figure(summary: pd.DataFrame) -> Figure | None:
    """Stacked median parts per run (ms): one panel per model, bars grouped by backend and
    world size, one bar per compressor; a black tick marks the median iteration time."""
    data = _measured(summary, ["model", "dataset", "backend", "network"])
    if data.empty:
        return None
    panels = list(data.groupby(["model", "dataset"], sort=True))
    widest = max(len(rows) for _, rows in panels)
    width = min(18.0, max(6.0, 2.0 + 0.55 * widest))
    longest = max(len(line) for s in data["series"] for line in wrap_label(s, 20).split("\n"))
    fig = Figure(figsize=(width, 0.8 + (3.6 + 0.075 * longest) * len(panels)),
                 layout="constrained")  # fmt: skip
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    show_net = data["network"].nunique() > 1
    for ax, ((model, dataset), rows) in zip(axes, panels, strict=True):
        _breakdown_panel(ax, rows, show_net)
        ax.set_title(f"{model} ({dataset})")
    fig.suptitle("Time per iteration by part (medians)" + names.compute_note(data))
    ncols = 6 if width >= 10.5 else 3  # the legend must fit inside the figure's width
    fig.legend(handles=_part_handles(), loc="outside lower center", ncols=ncols, frameon=False)
    return fig


def _breakdown_panel(ax: Axes, rows: pd.DataFrame, show_net: bool) -> None:
    x, ticks, top = 0.0, [], 0.0
    for (backend, network, world_size), group in rows.groupby(
        ["backend", "network", "world_size"], sort=True, dropna=False
    ):
        positions = [x + i for i in range(len(group))]
        top = max(top, _stack(ax, positions, group))
        where = f"{backend} · {network}" if show_net else f"{backend}"
        _group_label(ax, positions, f"{where}\n{_gpus(world_size)}")
        ticks += list(zip(positions, group["series"], strict=True))
        x = positions[-1] + 1.8
    # upright: rotated labels of neighbouring bars overlap (and their boxes, which tests check)
    ax.set_xticks([p for p, _ in ticks], [wrap_label(s, 20) for _, s in ticks], rotation=90)
    ax.tick_params(axis="x", length=0)
    low, high = -0.7, x - 1.1
    pad = max(0.0, (3.0 - (high - low)) / 2)  # a lone bar should not fill the panel
    ax.set_xlim(low - pad, high + pad)
    ax.set_ylim(0, top * 1.3 if top > 0 else 1.0)
    ax.set_ylabel("time per iteration (ms)")
    ax.grid(axis="y", alpha=0.3)


def _stack(ax: Axes, positions: list[float], group: pd.DataFrame) -> float:
    bottom = pd.Series(0.0, index=group.index)
    for part, (_, color) in PARTS.items():
        height = group[part].fillna(0.0) * 1e3
        ax.bar(positions, height, 0.75, bottom=bottom, color=color, edgecolor="white", lw=0.4)
        bottom += height
    iteration_ms = group["t_iteration_median"] * 1e3
    ax.scatter(positions, iteration_ms, marker="_", s=220, color="black", lw=1.6, zorder=3)
    return float(max(bottom.max(), iteration_ms.max()))


def _gpus(world_size: object) -> str:
    if pd.isna(world_size):
        return "? ranks"
    return "1 rank" if world_size == 1 else f"{world_size} ranks"


def _group_label(ax: Axes, positions: list[float], text: str) -> None:
    center = (positions[0] + positions[-1]) / 2
    ax.text(center, 0.97, text, transform=ax.get_xaxis_transform(), ha="center", va="top")
    if positions[0] > 0:  # separator from the previous group
        ax.axvline(positions[0] - 0.9, color="#CCCCCC", lw=0.8)


def _part_handles() -> list[Patch | Line2D]:
    handles: list[Patch | Line2D] = [Patch(color=c, label=n) for n, c in PARTS.values()]
    iteration = Line2D([], [], color="black", marker="_", ms=14, ls="none", mew=1.6)
    iteration.set_label("iteration (slowest rank)")
    return [*handles, iteration]


# -- (b) throughput vs world size ----------------------------------------------------------
def scalability_figure(summary: pd.DataFrame) -> Figure | None:
    """Samples/s vs ranks (log2 x): one panel per (model, backend), one line per compressor
    (and scheme when several), each with its own colour and marker (``styles``); dotted grey:
    linear scaling of the 1-GPU fp32 run."""
    data = _measured(summary, ["model", "dataset", "backend", "network"])
    if not data.empty:  # without a batch size or a world size there is no point to draw
        data = data[data["samples_per_s"].notna() & data["world_size"].notna()]
    if data.empty:
        return None
    panels = list(data.groupby(["model", "dataset", "backend", "network"], sort=True))
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    width = max(5.5, 4.4 * ncols)
    fig = Figure(figsize=(width, 0.9 + 3.3 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    entries = data[["series", "scheme", "compressor", "precision"]].drop_duplicates()
    looks = styles.assign(
        ((r.series, styles.key(r.scheme, r.compressor, r.precision))
         for r in entries.itertuples()), summary)  # fmt: skip
    for ax, ((model, dataset, backend, network), rows) in zip(axes, panels, strict=False):
        _scalability_panel(ax, rows, looks)
        ax.set_title(f"{model} ({dataset}) · {backend} · {network}")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    fig.suptitle("Throughput vs number of ranks (GPUs or CPU processes)"
                 + names.compute_note(data))  # fmt: skip
    fits = max(1, int(width // 3.4))  # about 3.4 in per entry for the longest labels
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncols=fits)
    return fig


def _scalability_panel(ax: Axes, rows: pd.DataFrame, looks: dict[str, styles.Style]) -> None:
    for series, line in rows.groupby("series", sort=False):
        line = line.sort_values("world_size")
        simulated = bool(line["simulated"].iloc[0])  # dashed, hollow
        color, marker = looks[str(series)]
        ax.plot(line["world_size"], line["samples_per_s"], "--" if simulated else "-",
                color=color, lw=1.6, marker=marker, ms=6, label=series,
                mfc="white" if simulated else color)  # fmt: skip
    _ideal_line(ax, rows)
    _log2_axis(ax, sorted(int(w) for w in rows["world_size"].dropna().unique()))
    ax.set_xlabel("ranks (world size)")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def _ideal_line(ax: Axes, rows: pd.DataFrame) -> None:
    single = rows[(rows["world_size"] == 1) & (rows["compressor_name"] == "none")]
    if single.empty or rows["world_size"].max() <= 1:
        return
    sizes = sorted(rows["world_size"].unique())
    base = float(single["samples_per_s"].max())
    ax.plot(sizes, [base * w for w in sizes], ":", color="#888888", label="linear scaling (fp32)")


def _log2_axis(ax: Axes, sizes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(sizes) / 1.4, max(sizes) * 1.4)
