"""Accuracy figure (seed 002 Figure 5): test top-1 of the averaged model against the epoch, one
panel per (model, dataset, scheme family, skew), one line per configuration with its mean over
seeds and a band of +/- one standard deviation (the title says when there was one seed, so no
band). Each line has its own colour and marker (``styles``), dashed for decentralized schemes.
Reads summary and epoch frames only.
"""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from qbench.report import names
from qbench.report.accuracy import family
from qbench.report.plots import spread_note, styles, wrap_label

PANEL_KEYS = ["model", "dataset", "family", "skew"]
MAX_PANELS = 12


def accuracy_figure(summary: pd.DataFrame, epochs: pd.DataFrame) -> Figure | None:
    """None when no ok run has epoch rows."""
    rows = _rows(summary, epochs)
    if rows.empty:
        return None
    panels = list(rows.groupby(PANEL_KEYS, sort=True, dropna=False))[:MAX_PANELS]
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    lines = rows["line"].nunique()
    width = max(5.0, 4.2 * cols)
    ncols = max(1, min(3, int(width * 72 // (4.6 * rows["line"].str.len().max() + 40))))
    fig = Figure(figsize=(width, 0.9 + 3.2 * nrows + 0.2 * math.ceil(lines / ncols)),
                 layout="constrained")  # fmt: skip
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    entries = rows[["line", "scheme", "compressor", "precision"]].drop_duplicates()
    looks = styles.assign(
        sorted((r.line, styles.key(r.scheme, r.compressor, r.precision))
               for r in entries.itertuples()), summary)  # fmt: skip
    for ax, (key, group) in zip(axes, panels, strict=False):
        _panel(ax, group, key, looks)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    # one legend for all panels, below them: lines end where the data is, never under it
    found = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    fig.legend(handles=list(found.values()), loc="outside lower center", ncols=ncols,
               fontsize=8, frameon=False)  # fmt: skip
    spread = spread_note(rows.drop_duplicates("run_id"), [*PANEL_KEYS, "line"], "line", "band")
    fig.suptitle(f"Test accuracy of the averaged model\n({spread})")
    return fig


def _rows(summary: pd.DataFrame, epochs: pd.DataFrame) -> pd.DataFrame:
    columns = ["run_id", "model", "dataset", "scheme", "compressor", "skew", "precision"]
    ok = summary[summary["status"] == "ok"][columns + (["repeat"] if "repeat" in summary else [])]
    rows = epochs.merge(ok, on="run_id", how="inner")
    rows["family"] = rows["scheme"].map(family)
    rows["line"] = [names.method(s, c) for s, c in zip(rows["scheme"], rows["compressor"],
                                                        strict=True)]  # fmt: skip
    if rows["precision"].nunique() > 1:  # seeds of one configuration only: never mix precisions
        rows["line"] += " · " + rows["precision"].astype(str)
    return rows


def _panel(
    ax: Axes, group: pd.DataFrame, key: tuple[object, ...], looks: dict[str, styles.Style]
) -> None:
    model, dataset, kind, skew = key
    for line, g in group.groupby("line", sort=True):
        stats = g.groupby("epoch")["top1"].agg(["mean", "std"]).fillna(0.0)
        color, marker = looks[str(line)]
        style = "--" if family(str(g["scheme"].iloc[0])) != "centralized" else "-"
        x = stats.index.to_numpy()
        mean, std = stats["mean"].to_numpy() * 100, stats["std"].to_numpy() * 100
        ax.plot(x, mean, style, color=color, label=str(line), marker=marker, markersize=3.5)
        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)
    kind = str(kind) if kind == "centralized" else names.scheme(kind)
    title = f"{model} on {dataset}, {kind}"
    title += f", skew {float(str(skew)):g}" if float(str(skew)) else ""
    ax.set_title(wrap_label(title, 40))
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("test top-1 (%)")
    ax.grid(alpha=0.3)
