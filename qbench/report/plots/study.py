"""Figures that answer seed 002's study questions from a summary table (``stats.summarize``).

* ``speedup_ratio``: seed 002 Figure 16 right. Whether low precision pays depends on how much
  gradient a rank sends per unit of computation (MB / GFLOP); the speedup over fp32 rises with
  that ratio and is bounded by the compression (32 / bits).
* ``pareto``: what a configuration buys in accuracy and time for the bits it sends; the
  configurations no other one beats on both axes form the Pareto front.

``matplotlib.figure.Figure`` only (never pyplot), shared style from ``qbench.report.plots``, each
series' colour and marker from ``qbench.report.plots.styles``.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

from qbench.report import names, plots
from qbench.report.accuracy import CONFIG_KEYS
from qbench.report.plots import styles

MAX_PANELS = 6
# Forward + backward of a dense network costs about 3 forward passes (backward computes the
# gradients of both activations and weights): the convention behind "GFLOP per iteration".
FWD_BWD_FACTOR = 3.0
RATIO_LABEL = (
    "communication / computation: fp32 gradient MB per GFLOP (log)\n"
    "MB = 4 x parameters / 1e6;  GFLOP = 3 x forward GFLOPs/sample x batch per rank"
)


def write_study_figures(summary: pd.DataFrame, out_dir: Path) -> tuple[list[Path], list[str]]:
    """Save speedup_ratio.{png,pdf} and pareto.{png,pdf}; returns (paths, notes on skips).

    A note explains only a surprising skip (compressed runs of known size, but all at one ratio):
    results without accuracy runs or without the ``gflops_per_sample`` label (written before it
    existed) simply have nothing to draw, like the accuracy figure."""
    paths: list[Path] = []
    notes: list[str] = []
    with matplotlib.rc_context(plots.STYLE):  # text sizes are fixed when artists are created
        for name, build in (("speedup_ratio", speedup_ratio_figure), ("pareto", pareto_figure)):
            fig = build(summary)
            if fig is not None:
                paths += plots.save_all(fig, out_dir / name)
            elif name == "speedup_ratio" and not _ratio_rows(summary).empty:
                notes.append(
                    "speedup_ratio figure skipped: every compressed run has the same MB/GFLOP "
                    "ratio; sweep models of different sizes or batch sizes to vary it"
                )
    return paths, notes


def legend_label(parts: list[str], simulated: bool) -> str:
    """Joined label parts, ending in "(simulated)" for speed-only simulations (seed 002
    section 4.4): a simulated speedup must never pass for a real one."""
    text = " · ".join(p.removesuffix(names.SIMULATED) for p in parts)
    return text + names.SIMULATED if simulated else text


def _is_simulated(rows: pd.DataFrame) -> bool:
    return bool(rows["simulated"].astype(bool).any())


# -- speedup vs communication / computation ratio ------------------------------------------
def comm_comp_ratio(summary: pd.DataFrame) -> pd.Series:
    """MB of fp32 gradient per GFLOP of one rank's iteration (NaN where a label is missing)."""
    megabytes = 4 * summary["numel"].astype(float) / 1e6
    gflop = FWD_BWD_FACTOR * summary["gflops_per_sample"].astype(float)
    gflop = gflop * summary["batch_size"].astype(float)
    return megabytes / gflop.where(gflop > 0)


def _ratio_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """Ok runs of 2+ ranks other than fp32 (16-bit casts included: the uncompressed baselines
    compression must beat) with a speedup over fp32 and a known ratio (one rank communicates
    nothing, so its "speedup" would only show noise)."""
    needed = ("speedup_vs_fp32", "numel", "gflops_per_sample", "batch_size")
    if any(c not in summary.columns for c in needed):
        return summary.iloc[0:0].assign(ratio=pd.Series(dtype=float))
    multi = pd.to_numeric(summary["world_size"], errors="coerce") > 1
    rows = summary[(summary["status"] == "ok") & (summary["compressor_name"] != "none") & multi]
    casts = rows["uncompressed"].astype(bool) if "uncompressed" in rows else False  # older CSVs
    rows = rows.assign(ratio=comm_comp_ratio(rows), uncompressed=casts)
    return rows[rows["ratio"].notna() & rows["speedup_vs_fp32"].notna()]


def speedup_ratio_figure(summary: pd.DataFrame) -> Figure | None:
    """Speedup over fp32 of each compressed configuration against the communication /
    computation ratio (log x): one line per (compressor, backend, world size), and per scheme,
    network and compute precision when those vary, each with its own colour and marker; 16-bit
    casts are drawn too and marked "uncompressed". Dashed grey: no speedup (1x, the legend
    names the fastest fp32 configurations' schemes); dotted: the bound 32 / bits.

    The ratio is fp32 gradient MB (4 x numel / 1e6) over the GFLOPs one rank computes per
    iteration, taken as 3 x forward GFLOPs per sample x per-rank batch (forward + backward about
    3 forward passes), like seed 002's MB/GFLOPS. None when fewer than 2 distinct ratios."""
    rows = _ratio_rows(summary)
    if rows["ratio"].round(12).nunique() < 2:
        return None
    keys = ["compressor", "backend", "world_size"]
    keys += [c for c in ("scheme", "network", "precision") if rows[c].nunique() > 1]
    fig = Figure(figsize=(8.0, 5.2), layout="constrained")
    ax = fig.subplots()
    lines = [(_speedup_label(line, dict(zip(keys, map(str, key), strict=True))), line)
             for key, line in rows.groupby(keys, sort=True, dropna=False)]  # fmt: skip
    looks = styles.assign(((label, _config(line)) for label, line in lines), summary)
    for label, line in lines:
        _speedup_line(ax, line, label, looks[label])
    top = _speedup_top(rows["speedup_vs_fp32"], _bounds(rows))
    _draw_bounds(ax, _bounds(rows), top)
    ax.axhline(1.0, color="#444444", ls="--", lw=1.0, label=_fp32_label(rows))
    _log_ratio_axis(ax, rows["ratio"])
    ax.set_ylim(0, top)
    ax.set(xlabel=RATIO_LABEL, ylabel="speedup over the fastest fp32 (samples/s ratio)")
    ax.grid(alpha=0.3, which="both")
    casts = "\n(16-bit lines: uncompressed baselines, which compression must beat too)"
    ax.set_title("Speedup over fp32 vs communication / computation ratio"
                 + (casts if rows["uncompressed"].astype(bool).any() else "")
                 + names.compute_note(rows))  # fmt: skip
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=2)
    return fig


def _fp32_label(rows: pd.DataFrame) -> str:
    """The 1x line names the baseline: ``1x: fastest fp32 (DDP)``; schemes where they differ."""
    schemes = sorted({names.scheme(b) for b in rows["baseline"].dropna()})
    return f"1x: fastest fp32 ({', '.join(schemes)})"


def _log_ratio_axis(ax: Axes, ratios: pd.Series) -> None:
    """Log x with plain numbers; a few measured ratios are the ticks themselves (a sweep has
    a handful of models, and "4x10^0" helps no one)."""
    ax.set_xscale("log")
    distinct = sorted(ratios.round(12).unique())
    if len(distinct) <= 8:
        ax.set_xticks(distinct, [f"{r:.3g}" for r in distinct])
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    low, high = distinct[0], distinct[-1]
    ax.set_xlim(low / (high / low) ** 0.08, high * (high / low) ** 0.08)


def _config(rows: pd.DataFrame) -> styles.Key:
    first = rows.iloc[0]
    return styles.key(first["scheme"], first["compressor"], first.get("precision"))


def _speedup_label(line: pd.DataFrame, key: dict[str, str]) -> str:
    """The method (scheme too when schemes vary), backend, ranks and whatever else varies."""
    name = (names.method(key["scheme"], key["compressor"]) if "scheme" in key
            else names.compressor(key["compressor"]))  # fmt: skip
    label = [name, key["backend"], f"{key['world_size']} ranks"]
    label += [key[c] for c in ("network", "precision") if c in key]
    if line["uncompressed"].astype(bool).any():  # a 16-bit cast: what compression must beat
        label.append("uncompressed")
    return legend_label(label, _is_simulated(line))


def _speedup_line(ax: Axes, line: pd.DataFrame, label: str, look: styles.Style) -> None:
    points = line.groupby("ratio", sort=True)["speedup_vs_fp32"].median()  # repeats, seeds
    simulated = _is_simulated(line)
    ax.plot(points.index, points.to_numpy(), "--" if simulated else "-", color=look.color,
            marker=look.marker, ms=6, lw=1.6, mfc="white" if simulated else look.color,
            label=label)  # fmt: skip


def _bounds(rows: pd.DataFrame) -> dict[str, float]:
    """Per compressor the bits per value actually sent (measured, so bucket scales count),
    else the nominal bits; compressors with neither get no bound."""
    labels = rows["compressor"].astype(str).str.removesuffix(names.SIMULATED)  # one per codec
    bits = rows["bits_per_value"].fillna(rows["bits"]).astype(float)
    per = bits.groupby(labels).median()
    return {str(name): float(b) for name, b in per.items() if b > 0 and math.isfinite(b)}


def _speedup_top(speedups: pd.Series, bounds: dict[str, float]) -> float:
    """Room for the data; a bound close above them is shown, far ones are listed instead
    (a 32x line would squash speedups of 1.2x to the floor)."""
    top = max(1.3, 1.25 * float(speedups.max()))
    near = [32 / b for b in bounds.values() if 32 / b <= 2.5 * top]
    return max([top, *(1.08 * n for n in near)])


def _draw_bounds(ax: Axes, bounds: dict[str, float], top: float) -> None:
    far = []
    for name, bits in sorted(bounds.items(), key=lambda kv: kv[1]):
        bound = 32 / bits
        text = f"{names.compressor(name)}: 32/{bits:.3g} bits = {bound:.3g}x"
        if bound > top:
            far.append(text)
            continue
        ax.axhline(bound, color="#444444", ls=":", lw=1.3)  # the text beside it names it
        ax.text(0.99, bound, f"upper bound {text}", transform=ax.get_yaxis_transform(),
                ha="right", va="bottom", fontsize=8)  # fmt: skip
    if far:
        ax.text(0.01, 0.98, "upper bounds (off scale):\n" + "\n".join(far), fontsize=8,
                transform=ax.transAxes, ha="left", va="top", color="#444444",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})  # fmt: skip


# -- time-to-accuracy vs bits: Pareto front ------------------------------------------------
def pareto_front(points: pd.DataFrame, y: str, lower_is_better: bool) -> pd.DataFrame:
    """The points no other point beats with fewer (or equal) bits and a better ``y``, ordered
    by bits: sending more bits is only worth it when it buys time or accuracy."""
    ordered = points.sort_values(["bits", y], ascending=[True, lower_is_better])
    best, keep = (math.inf if lower_is_better else -math.inf), []
    for index, value in ordered[y].items():
        if (value < best) if lower_is_better else (value > best):
            keep.append(index)
            best = value
    return ordered.loc[keep]


def _runs(summary: pd.DataFrame) -> pd.DataFrame:
    """Ok runs with a final top-1 and the bits they sent: what the Pareto figure draws."""
    if "final_top1" not in summary.columns:
        return summary.iloc[0:0]
    rows = summary[(summary["status"] == "ok") & summary["final_top1"].notna()]
    return rows[rows["bits_per_value"].notna()].assign(top1=lambda r: 100 * r["final_top1"])


def _configs(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration of ``_runs`` (seeds and repeats merged): mean and std of time
    to target and of final top-1 (%), median bits per value actually sent."""
    if rows.empty:
        return rows
    grouped = rows.groupby(CONFIG_KEYS, sort=True, dropna=False)
    out = grouped.agg(
        bits=("bits_per_value", "median"), time=("time_to_target_s", "mean"),
        time_std=("time_to_target_s", "std"), top1=("top1", "mean"), top1_std=("top1", "std"),
        simulated=("simulated", "any"),
    ).reset_index()  # fmt: skip
    return out.fillna({"time_std": 0.0, "top1_std": 0.0})


def _y_axis(summary: pd.DataFrame, configs: pd.DataFrame) -> tuple[str, str]:
    """(column, label): time to target when any configuration reached it, else final top-1
    with the reason in the label, so the figure never hides that no target was met."""
    column = summary["target_accuracy"] if "target_accuracy" in summary else pd.Series([])
    targets = pd.to_numeric(column, errors="coerce").dropna().unique()
    if configs["time"].notna().any():
        goal = f"{100 * targets[0]:g} % top-1" if len(targets) == 1 else "target top-1"
        return "time", f"training time to {goal} (s)"
    why = "no run reached its target" if len(targets) else "no target_accuracy set"
    return "top1", f"final test top-1 (%), {why}"


def pareto_figure(summary: pd.DataFrame) -> Figure | None:
    """Time to target accuracy (or final top-1) against bits per value (log2 x): one point per
    configuration with +/- 1 std over seeds (the title says when there was one seed, so no
    bars), the Pareto front as a step line; one panel per (model, dataset, skew). Each
    configuration has its own colour and marker (``styles``); the legend below the panels names
    every one (scheme and compressor, and backend, ranks and compute precision where they vary),
    those that never reached the target included (hollow, not drawn), so no label sits on the
    data. None without accuracy runs."""
    runs = _runs(summary)
    configs = _configs(runs)
    if configs.empty:
        return None
    y, ylabel = _y_axis(summary, configs)
    varying = [c for c in ("backend", "world_size", "precision") if configs[c].nunique() > 1]
    configs["label"] = [_pareto_label(row, varying) for row in configs.to_dict("records")]
    panels = list(configs.groupby(["model", "dataset", "skew"], sort=True))[:MAX_PANELS]
    shown = pd.concat([group for _, group in panels])
    looks = styles.assign(((r["label"], _config(pd.DataFrame([r])))
                           for r in shown.to_dict("records")), summary)  # fmt: skip
    handles = _pareto_handles(shown, y, looks)
    cols = min(2, len(panels))
    nrows = math.ceil(len(panels) / cols)
    width = 6.4 * cols
    fig = Figure(figsize=(width, 0.9 + 4.4 * nrows + 0.2 * len(handles) / _ncols(
        handles, width)), layout="constrained")  # fmt: skip
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    for ax, ((model, dataset, skew), group) in zip(axes, panels, strict=False):
        _pareto_panel(ax, group, y, ylabel, looks)
        ax.set_title(f"{model} on {dataset}" + (f", skew {float(skew):g}" if skew else ""))
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    front = Line2D([], [], color="#444444", ls="--", marker="o", ms=13, mfc="none")
    front.set_label("Pareto front (fewer bits, less time)" if y == "time" else
                    "Pareto front (fewer bits, higher top-1)")  # fmt: skip
    entries = [*handles.values(), front]
    fig.legend(handles=entries, loc="outside lower center", ncols=_ncols(handles, width),
               fontsize=8, frameon=False)  # fmt: skip
    what = "Time to accuracy" if y == "time" else "Final accuracy"
    spread = plots.spread_note(runs, CONFIG_KEYS, "point", "bars")
    fig.suptitle(f"{what} vs bits sent per value\n({spread})")
    return fig


def _ncols(handles: dict[str, Line2D], width_in: float) -> int:
    """Legend columns that fit the figure's width (about 4.6 pt per character at 8 pt)."""
    longest = max((len(label) for label in handles), default=10)
    return max(1, min(3, int(width_in * 72 // (4.6 * longest + 40))))


def _pareto_label(row: dict[str, object], varying: list[str]) -> str:
    parts = [names.method(row["scheme"], row["compressor"])]
    parts += [f"{row[c]} ranks" if c == "world_size" else str(row[c]) for c in varying]
    return legend_label(parts, bool(row["simulated"]))


def _pareto_handles(
    shown: pd.DataFrame, y: str, looks: dict[str, styles.Style]
) -> dict[str, Line2D]:
    """One legend entry per configuration label, in its look (label -> handle). One that
    never reached the target is not drawn: its entry is hollow and says so, also where it
    reached it in another panel only."""
    out = {}
    for label, rows in shown.groupby("label", sort=False):
        color, marker = looks[str(label)]
        reached = rows[y].notna()
        hollow = bool(rows["simulated"].any()) or not reached.all()
        text = str(label) + (
            ""
            if reached.all()
            else " (never reached the target)"
            if not reached.any()
            else " (absent where it never reached the target)"
        )
        handle = Line2D([], [], color=color, marker=marker, ls="none", ms=7,
                        mfc="white" if hollow else color)  # fmt: skip
        handle.set_label(text)
        out[text] = handle
    return out


def _pareto_panel(
    ax: Axes, group: pd.DataFrame, y: str, ylabel: str, looks: dict[str, styles.Style]
) -> None:
    points = group[group[y].notna()]
    for row in points.to_dict("records"):
        color, marker = looks[str(row["label"])]
        ax.errorbar(row["bits"], row[y], yerr=row[f"{y}_std"], fmt=marker, color=color, ms=7,
                    capsize=3, mfc="white" if row["simulated"] else color)  # fmt: skip
    front = pareto_front(points, y, lower_is_better=y == "time")
    ax.step(front["bits"], front[y], where="post", color="#444444", lw=1.2, ls="--")
    ax.scatter(front["bits"], front[y], s=260, facecolors="none", edgecolors="#444444", lw=1.2)
    _log2_bits_axis(ax, group["bits"])
    ax.set(xlabel="bits sent per value (log2; fp32 = 32)", ylabel=ylabel)
    ax.margins(y=0.15)
    ax.grid(alpha=0.3)


def _log2_bits_axis(ax: Axes, bits: pd.Series) -> None:
    low = math.floor(math.log2(float(bits.min())))
    high = math.ceil(math.log2(float(bits.max())))
    ticks = [2.0**k for k in range(low, high + 1)]
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
