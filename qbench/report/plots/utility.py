"""``utility``: speedup over PyTorch DDP fp32 against link bandwidth, one line per method.

After Agarwal et al., "On the Utility of Gradient Compression in Distributed Training Systems"
(MLSys 2022): against the baseline users run (DDP, whose bucketed fp32 allreduce overlaps
backward), compression pays only where communication is exposed, i.e. on slow links and for
models whose gradient is large next to their compute. One panel per model (and ranks); the x
axis is the emulated link rate (log), with unshaped links (loopback) at the right edge; where a
method's line crosses 1x the crossover bandwidth is marked (interpolated in log bandwidth).
Rates, the baseline and the line styles come from the specs the runs recorded
(``qbench.report.names``: links, schemes, compressors by label), never from the labels.

``matplotlib.figure.Figure`` only, style from ``qbench.report.plots``, each method's colour and
marker from ``qbench.report.plots.styles`` (dashed: sent after backward, not per DDP bucket).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from qbench.catalog.schemes import spelling
from qbench.report import names, plots
from qbench.report.plots import styles, wrap_label

PANEL_KEYS = ["model", "backend", "world_size", "precision"]
METHOD = ["scheme", "compressor"]
MAX_PANELS = 8


def utility_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """Ok runs with a DDP fp32 run of the same model, ranks and link: their speedup over it
    (``vs_ddp``, median over repeats) and the link rate in bit/s (``bps``; NaN unshaped)."""
    ok = summary[(summary["status"] == "ok") & summary["samples_per_s"].notna()].copy()
    if "left_out" in ok:  # disturbed runs (stats.summarize): neither a point nor a baseline
        ok = ok[~ok["left_out"].astype(bool)]
    if ok.empty or "network" not in ok:
        return ok.iloc[0:0]
    keys = [*PANEL_KEYS, "network", "dataset"]
    base = ok[[_is_ddp_fp32(s, c) for s, c in zip(ok["scheme"], ok["compressor"], strict=True)]]
    ref = base.groupby(keys, dropna=False)["samples_per_s"].median().rename("_ddp")
    ok = ok.merge(ref, how="inner", left_on=keys, right_index=True)
    ok["vs_ddp"] = ok["samples_per_s"] / ok["_ddp"]
    ok["bps"] = ok["link_bits_per_s"]  # NaN: unshaped (loopback) or not recorded
    grouped = ok.groupby([*keys, *METHOD, "backward", "bps"], dropna=False)["vs_ddp"].median()
    return grouped.reset_index()


def _is_ddp_fp32(scheme: object, compressor: object) -> bool:
    """The baseline: PyTorch DDP with its default buckets, sending fp32 (compressor ``none``)."""
    spec, comp = names.scheme_spec(scheme), names.compressor_spec(compressor)
    if spec is None or comp is None:
        return False
    return spec.name == spelling.DDP and spec.is_default and comp.name == "none"


def crossover(points: pd.DataFrame) -> float | None:
    """The link rate (bit/s) where the speedup crosses 1x going from slow to fast links,
    interpolated in log bandwidth between the two measured rates around it; None when the line
    stays on one side."""
    shaped = points.dropna(subset=["bps"]).sort_values("bps")
    xs = [math.log10(b) for b in shaped["bps"]]
    ys = list(shaped["vs_ddp"])
    for (x0, y0), (x1, y1) in zip(
        zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False
    ):
        if (y0 - 1) * (y1 - 1) < 0:
            return float(10 ** (x0 + (1 - y0) * (x1 - x0) / (y1 - y0)))
    return None


def utility_figure(summary: pd.DataFrame) -> Figure | None:
    """The figure, or None without at least two link rates and a DDP fp32 run per panel."""
    rows = utility_rows(summary)
    if rows.empty or rows["bps"].dropna().nunique() < 2:
        return None
    fig = panel_figure(rows, summary, _panel)
    fig.suptitle(
        "Speedup over PyTorch DDP fp32\n(bucketed allreduce overlapped with backward = 1x)"
        + names.compute_note(rows)
    )
    return fig


Panel = Callable[[Axes, pd.DataFrame, tuple[object, ...], dict[str, styles.Style]], None]
"""Draws one panel: (axes, its rows, its PANEL_KEYS values, each method's look)."""


def panel_figure(rows: pd.DataFrame, summary: pd.DataFrame, draw: Panel) -> Figure:
    """One panel per PANEL_KEYS group of ``rows`` (at most MAX_PANELS, two a row), each drawn by
    ``draw`` with the methods' looks, and one legend below them (a column when names are long)."""
    panels = list(rows.groupby(PANEL_KEYS, dropna=False, sort=True))[:MAX_PANELS]
    cols = min(2, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(6.4 * cols, 4.2 * nrows + 0.8), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    methods = summary[[*METHOD, "precision"]].drop_duplicates().sort_values([*METHOD, "precision"])
    looks = styles.assign(((names.method(s, c), styles.key(s, c, p))
                           for s, c, p in methods.itertuples(index=False)), summary)  # fmt: skip
    for ax, (key, panel) in zip(axes, panels, strict=False):
        draw(ax, panel, key, looks)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    found = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    wide = max((len(label) for label in found), default=0) > 40  # DiLoCo's names are long
    ncols = 1 if wide else min(3, len(found))
    # a name longer than the figure is wide is cut at both edges: wrapped to fit instead
    fit = int(13 * fig.get_figwidth())
    labels = [wrap_label(label, fit) for label in found]
    fig.legend(list(found.values()), labels, loc="outside lower center", ncols=ncols)
    return fig


def _panel(
    ax: Axes, panel: pd.DataFrame, key: tuple[object, ...], looks: dict[str, styles.Style]
) -> None:
    shaped = panel["bps"].dropna()
    right = shaped.max() * 4  # unshaped links (loopback) drawn at the right edge
    for (scheme, comp), line in panel.groupby(METHOD, sort=True):
        if _is_ddp_fp32(scheme, comp):
            continue  # the baseline itself: the dashed 1x line
        x = line["bps"].fillna(right)
        order = x.argsort()
        label = names.method(scheme, comp)
        color, marker = looks[label]
        ax.plot(x.iloc[order], line["vs_ddp"].iloc[order], marker=marker, color=color,
                linestyle="-" if line["backward"].all() else "--",  # per bucket: solid
                label=label)  # fmt: skip
        cross = crossover(line)
        if cross is not None:
            ax.axvline(cross, color=color, linewidth=0.8, alpha=0.5)
            ax.annotate(f"{cross / 1e9:.2g} Gbit/s", (cross, 1), textcoords="offset points",
                        xytext=(3, 6), fontsize=7, color=color)  # fmt: skip
    ax.axhline(1.0, color="0.3", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ticks = [*sorted(set(shaped)), right]
    ax.set_xticks(ticks, [rate_label(t) for t in ticks[:-1]] + ["loopback"])
    ax.minorticks_off()
    ax.set_xlabel("link bandwidth (emulated, tc tbf)")
    ax.set_ylabel("speedup over DDP fp32")
    model, backend, ranks, precision = key
    ax.set_title(f"{model}, {ranks} ranks, {backend}, {precision}")


def rate_label(bps: float) -> str:
    return f"{bps / 1e9:g} Gbit/s" if bps >= 1e9 else f"{bps / 1e6:g} Mbit/s"


def write_utility_figure(summary: pd.DataFrame, out_dir: Path) -> list[Path]:
    with matplotlib.rc_context(plots.STYLE):
        fig = utility_figure(summary)
        return [] if fig is None else plots.save_all(fig, out_dir / "utility")
