"""``utilization``: compute utilization against link rate, one line per method, with the rates
each needs for 50, 90 and 99 % (``qbench.report.utilization``).

The curve DiLoCo and its family are judged by (issue 47): the share of wall time spent computing
as the emulated link slows, beside DDP fp32 and bf16 when the sweep has them. One panel per model
(and ranks, backend, precision); unshaped links (loopback) at the right edge; each point's 95 %
interval as an error bar; the targets as dotted lines. ``utilization.csv`` beside the figure
holds every run's value and interval and every method's needed rates.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from qbench.records.store import atomic_write_bytes
from qbench.report import names, plots, utilization
from qbench.report.plots import styles
from qbench.report.plots.utility import METHOD, PANEL_KEYS, panel_figure, rate_label

CSV = "utilization.csv"


def points(summary: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per panel, method and link rate (``bps``; NaN unshaped): the median over repeats of the
    runs' utilization and interval ends (ok runs, disturbed ones left out)."""
    ok = summary[(summary["status"] == "ok")]
    if "left_out" in ok:
        ok = ok[~ok["left_out"].astype(bool)]
    rows = ok.merge(runs, on="run_id")
    if rows.empty:
        return rows
    rows = rows.assign(bps=rows["link_bits_per_s"])
    keys = [*PANEL_KEYS, *METHOD, "bps"]
    cols = ["utilization", "low", "high", "bytes_mean", "bytes_peak"]
    return rows.groupby(keys, dropna=False)[cols].median().reset_index()


def needed_table(pts: pd.DataFrame) -> pd.DataFrame:
    """Per panel and method, the rate (bit/s) and interval ends reaching each target."""
    out = []
    for key, line in pts.groupby([*PANEL_KEYS, *METHOD], dropna=False, sort=True):
        row = dict(zip([*PANEL_KEYS, *METHOD], key, strict=True))
        for target in utilization.TARGETS:
            got = utilization.needed(line, target)
            pct = f"{target * 100:g}"
            row.update({f"bps_{pct}": got.rate, f"bps_{pct}_low": got.low,
                        f"bps_{pct}_high": got.high, f"needed_{pct}": got.text()})  # fmt: skip
        out.append(row)
    return pd.DataFrame(out)


def figure(pts: pd.DataFrame, summary: pd.DataFrame) -> Figure | None:
    """None without two shaped link rates in some panel."""
    if pts.empty or pts["bps"].dropna().nunique() < 2:
        return None
    fig = panel_figure(pts, summary, _panel)
    fig.suptitle("Compute utilization (compute time / wall time) against link rate")
    return fig


def _panel(
    ax: Axes, panel: pd.DataFrame, key: tuple[object, ...], looks: dict[str, styles.Style]
) -> None:
    shaped = panel["bps"].dropna()
    right = shaped.max() * 4 if len(shaped) else 1e12
    for (scheme, comp), line in panel.groupby(METHOD, sort=True):
        x = line["bps"].fillna(right)
        order = x.argsort()
        label = names.method(scheme, comp)
        color, marker = looks.get(label, ("0.3", "o"))
        y = line["utilization"].iloc[order]
        err = [y - line["low"].iloc[order], line["high"].iloc[order] - y]
        ax.errorbar(x.iloc[order], y, yerr=err, marker=marker, color=color, label=label,
                    capsize=2)  # fmt: skip
    for target in utilization.TARGETS:
        ax.axhline(target, color="0.5", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ticks = [*sorted(set(shaped)), right]
    ax.set_xticks(ticks, [rate_label(t) for t in ticks[:-1]] + ["loopback"])
    ax.minorticks_off()
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("link bandwidth (emulated, tc tbf)")
    ax.set_ylabel("compute utilization")
    model, backend, ranks, precision = key
    ax.set_title(f"{model}, {ranks} ranks, {backend}, {precision}")


def write(summary: pd.DataFrame, per_it: pd.DataFrame, out_dir: Path) -> list[Path]:
    """The figure (png, pdf) and ``utilization.csv`` when two or more link rates were swept."""
    pts = points(summary, utilization.per_run(per_it))
    with matplotlib.rc_context(plots.STYLE):
        fig = figure(pts, summary)
        if fig is None:
            return []
        paths = plots.save_all(fig, out_dir / "utilization")
    table = pts.merge(needed_table(pts), on=[*PANEL_KEYS, *METHOD], how="left")
    atomic_write_bytes(out_dir / CSV, table.to_csv(index=False).encode())
    return paths
