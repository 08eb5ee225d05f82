"""Report of a results directory: summary tables (CSV, markdown), figures, terminal output.

Reads files only (through ``qbench.report.stats``); never imports torch, the worker or a launcher.
Everything it writes goes to ``DIR/report/``. Units shown to people: ms, MB (10^6 bytes), x.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from qbench.errors import UserError, choice_error
from qbench.records import memory
from qbench.records.store import (
    ACCURACY_CSV,
    SUMMARY_CSV,
    SUMMARY_MD,
    ResultStore,
    atomic_write_bytes,
)
from qbench.report import accuracy, disturbed, intervals, names, stats
from qbench.report import figures as report_figures
from qbench.report import page as report_page
from qbench.report.page import baselines as page_baselines
from qbench.report.page import breakeven
from qbench.report.page import cells as page_cells

FORMATS = ("table", "csv", "md", "json")
_LABEL_COLUMNS = ("model", "dataset", "backend", "scheme", "network")
NA = "-"
PIPE_WIDTH = 220
ON_FILE = list(stats.SUMMARY_COLUMNS)  # summary.csv's and printed CSV / JSON's: not the typed


@dataclass(frozen=True)
class ReportPaths:
    """What ``write_report`` wrote. notes: why something was skipped, for stderr."""

    summary_csv: Path
    summary_md: Path
    figures: tuple[Path, ...]
    notes: tuple[str, ...]
    summary: pd.DataFrame = field(repr=False, compare=False)
    page: Path | None = None  # report/index.html (index.md beside it): the study's questions


def write_report(
    root: Path | str, fmt: str | None = "table", out: TextIO | None = None,
    include_disturbed: bool = False, kernels: str | Path | None = None, figures: bool = True,
) -> ReportPaths:  # fmt: skip
    """Summarize ``root``, write ``root/report/{summary.csv,summary.md,*.png,*.pdf}``, then
    render the summary to ``out`` (stdout) in ``fmt`` (None: print nothing). Disturbed runs
    are shown but compared only with ``include_disturbed`` (``stats.summarize``); ``kernels``:
    a ``bench kernels --json`` file for the page's break-even link rates; ``figures``: draw them.

    Raises UserError when ``fmt`` is unknown, ``root`` holds no runs or ``kernels`` is bad.
    """
    if fmt is not None and fmt not in FORMATS:
        raise choice_error("report format", fmt, FORMATS)
    results = load_results(root)
    with names.using(results.names):
        return _write(root, fmt, out, results, include_disturbed, kernels, figures)


def _write(
    root: Path | str, fmt: str | None, out: TextIO | None, results: stats.Results,
    include_disturbed: bool, kernels: str | Path | None, figures: bool,
) -> ReportPaths:  # fmt: skip
    summary = stats.summarize(results, include_disturbed)
    codec = breakeven.load(Path(root), results.iterations, summary, kernels)  # before writing
    acc = accuracy.table(summary)
    report_dir = ResultStore(root).report_dir()
    csv_path, md_path = report_dir / SUMMARY_CSV, report_dir / SUMMARY_MD
    atomic_write_bytes(csv_path, summary[ON_FILE].to_csv(index=False).encode())
    atomic_write_bytes(md_path, markdown_report(summary, str(root), acc).encode())
    if not acc.empty:
        atomic_write_bytes(report_dir / ACCURACY_CSV, acc.to_csv(index=False).encode())
    through = stats.throughputs(results, summary)  # its lock-step rows feed a figure too
    paths, notes = list[Path](), list[str]()
    if figures:
        paths, notes = report_figures.write(summary, results, acc, through.rows, report_dir)
    page = report_page.write_page(report_dir, summary, acc, paths, through, codec)
    if fmt is not None:
        render(summary, fmt, out)
    return ReportPaths(csv_path, md_path, tuple(paths), tuple(notes), summary, page)


def load_results(root: Path | str) -> stats.Results:
    """``stats.load(root)``, or a one-line UserError when there is no directory or no run."""
    fix = f"run `qbench sweep SCENARIO.yaml --out {root}` first"
    if Path(root).exists() and not Path(root).is_dir():
        raise UserError(f"results directory {root} is a file, not a directory; give the --out "
                        "directory of a sweep")  # fmt: skip
    if not Path(root).is_dir():
        raise UserError(f"results directory {root} does not exist; {fix}")
    results = stats.load(root)
    if results.runs.empty:
        raise UserError(f"no runs found in {root} (no */run.json); {fix}")
    return results


def render(summary: pd.DataFrame, fmt: str = "table", out: TextIO | None = None) -> None:
    """Print the summary to ``out`` (default stdout) as a rich table, CSV, markdown or JSON."""
    renderers: dict[str, Callable[[pd.DataFrame, TextIO], object]] = {
        "table": _print_table,
        "csv": lambda s, o: o.write(s[ON_FILE].to_csv(index=False)),
        "md": lambda s, o: o.write(_markdown_table(s, _MD_COLUMNS) + "\n"),
        "json": lambda s, o: o.write(s[ON_FILE].to_json(orient="records", indent=2) + "\n"),
    }
    if fmt not in renderers:
        raise choice_error("report format", fmt, FORMATS)
    renderers[fmt](summary, out if out is not None else sys.stdout)


# -- formatting ------------------------------------------------------------------------------
def is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def text_cell(value: Any) -> str:
    return NA if is_missing(value) else str(value)


def number_cell(scale: float, digits: int, suffix: str = "") -> Callable[[Any], str]:
    def fmt(value: Any) -> str:
        return NA if is_missing(value) else f"{float(value) * scale:,.{digits}f}{suffix}"

    return fmt


ms_cell, _X = number_cell(1e3, 2), number_cell(1.0, 2, "x")


def ratio_text(row: Any, prefix: str) -> str:
    """A ratio with its 95 % interval and samples per side: ``1.21x (1.17-1.24; 5/5 it)``;
    ``~`` marks one whose interval includes 1 (within noise); ``-`` when there is none."""
    value = row.get(prefix)
    if is_missing(value):
        return NA
    found = intervals.of_row(row, prefix)
    return _X(value) if found is None else page_cells.interval_text(found)


def for_people(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary as tables show it: schemes and compressors by their display names
    (:mod:`qbench.report.names`), each ratio with its interval (``ratio_text``)."""
    shown = summary.copy()
    for column, name in (("scheme", names.scheme), ("baseline", names.scheme),
                         ("compressor", names.compressor)):  # fmt: skip
        shown[column] = [v if is_missing(v) else name(v) for v in summary[column]]
    records = summary.to_dict("records")
    shown["best_baseline"] = [page_cells.best_baseline(r) for r in records]
    for prefix in stats.RATIOS:
        shown[prefix] = [ratio_text(r, prefix) for r in records]
    shown["others"] = [others_text(r) for r in records]
    for column in memory.PEAKS:
        shown[column] = [page_cells.peak_cell(r, column) for r in records]
    return shown


def others_text(row: Any) -> str:
    """Other processes' CPU use while the run was measured: ``0.03``, ``1.31 disturbed``
    (``qbench.records.interference``'s rule), ``-`` when not recorded."""
    value = row.get("other_cores")
    if is_missing(value):
        return NA
    flag = row.get("disturbed")
    return f"{value:.2f}" + (" disturbed" if not is_missing(flag) and bool(flag) else "")


# column -> (header, formatter); the markdown table shows all, the terminal table a subset
_COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "run_id": ("run", text_cell),
    **{c: (c, text_cell) for c in _LABEL_COLUMNS[:4]},
    "compressor": ("compressor", text_cell),
    "world_size": ("ranks", text_cell),
    "network": ("network", text_cell),
    "precision": ("compute", text_cell),
    "status": ("status", text_cell),
    "others": ("other cores", text_cell),  # what else used the CPUs (docs/reports.md)
    "iterations": ("iters", text_cell),
    "skipped_steps": ("skipped", number_cell(1.0, 0)),  # nonfinite: skip; shown when a run skipped
    "samples_per_s": ("samples/s", number_cell(1.0, 1)),
    "t_iteration_median": ("iter ms", ms_cell),
    "t_iteration_p95": ("p95 ms", ms_cell),
    "t_compute": ("compute ms", ms_cell),
    "t_encode": ("encode ms", ms_cell),
    "t_comm": ("comm ms", ms_cell),
    "t_decode": ("decode ms", ms_cell),
    "t_step": ("step ms", ms_cell),
    "bytes_per_iteration": ("MB/iter", number_cell(1e-6, 3)),
    "compression_ratio": ("ratio", number_cell(1.0, 1, "x")),
    **{c: page_cells.DISPLAY[c] for c in memory.PEAKS},  # GPU: shown where measured
    "speedup_vs_best": ("vs best (95% CI; samples)", text_cell),  # terminal-narrow
    "best_baseline": ("best uncompressed baseline", text_cell),  # fp32 or a 16-bit cast
    "speedup_vs_fp32": ("vs fp32 (95% CI; samples)", text_cell),
    "baseline": ("fp32 baseline", text_cell),
    "speedup_vs_flat_fp32": ("vs flat fp32 (95% CI; samples)", text_cell),
    "scalability": ("scale (95% CI; samples)", text_cell),
    **{c: report_page.DISPLAY[c] for c in stats.MONEY_COLUMNS},  # shown when a price is set
}
_MD_COLUMNS = tuple(
    c for c in _COLUMNS if c not in (*stats.MONEY_COLUMNS, "skipped_steps", memory.GPU)
)
_TERMINAL_COLUMNS = (  # the breakdown's other parts: summary.md, summary.csv, breakdown.png
    *(*_LABEL_COLUMNS, "compressor", "world_size", "status", "samples_per_s"),
    *("t_iteration_median", "t_comm", "bytes_per_iteration", "compression_ratio"),
    *("speedup_vs_best", "best_baseline", "speedup_vs_fp32", "baseline", "scalability"),
)

_FINE = ("ok", stats.PROFILED)  # a profiled run finished: measured, only not compared
_TEXTUAL = (*_LABEL_COLUMNS, "compressor", "precision", "status", "baseline", "best_baseline")


def _cells(summary: pd.DataFrame, columns: tuple[str, ...]) -> list[list[str]]:
    summary = for_people(summary)
    formatters = [_COLUMNS[c][1] for c in columns]
    rows = summary[list(columns)].itertuples(index=False, name=None)
    return [[f(v) for f, v in zip(formatters, row, strict=True)] for row in rows]


def _markdown_table(frame: pd.DataFrame, columns: tuple[str, ...]) -> str:
    header = [_COLUMNS[c][0] for c in columns]
    return report_page.markdown_table(header, _cells(frame, columns))


def failed_rows(summary: pd.DataFrame) -> list[list[str]]:
    """run, status, exit code and first line of the error of every run that is not ok."""
    rows = []
    for row in summary[~summary["status"].isin(_FINE)].itertuples(index=False):
        error = text_cell(row.error).strip().splitlines() or [NA]
        rows.append([str(row.run_id), str(row.status), text_cell(row.exit_code), error[0]])
    return rows


def failed_runs(summary: pd.DataFrame) -> str:
    rows = failed_rows(summary)
    if not rows:
        return "None."
    return report_page.markdown_table(["run", "status", "exit code", "error"], rows)


def markdown_report(summary: pd.DataFrame, title: str, acc: pd.DataFrame | None = None) -> str:
    """The whole ``summary.md``: counts, the summary table and the failed-runs table."""
    counts = summary["status"].value_counts()
    status = ", ".join(f"{n} {s}" for s, n in counts.items())
    parts = [f"# qbench report: {title}", f"{len(summary)} runs: {status}."]
    parts.append("Times are medians over measured iterations (warm-up dropped); an iteration")
    parts[-1] += " lasts as long as its slowest rank. `(simulated)`: speed-only simulation."
    parts[-1] += f" {page_baselines.SUMMARY_NOTE}" + (
        " Runs with `+backward` or `ddp` communicate during backward: their `comm` is the"
        " exposed part only."
    )
    money = tuple(c for c in stats.MONEY_COLUMNS if c in summary and summary[c].notna().any())
    parts[-1] += (
        " `other cores`: what other processes used of the CPUs while the run was measured, on"
        " average (`disturbed` past the rule of docs/reports.md#disturbed-runs)."
    )
    parts[-1] += f" {page_cells.MEMORY_NOTE}"
    columns = _MD_COLUMNS + money
    for column in reversed(page_cells.shown_peaks(summary)[1:]):  # RSS, GPU, state
        columns = _after(columns, memory.RSS, column)
    if _skipped_any(summary):
        columns = _after(columns, "status", "skipped_steps")
        parts[-1] += f" {_SKIPPED_NOTE}"
    parts += [f"**Warning:** {w}" for w in disturbed.warnings(summary)]
    parts += ["## Summary", _markdown_table(summary, columns)]
    if acc is not None and not acc.empty:
        parts += ["## Accuracy", _ACC_NOTE, _plain_markdown(_acc_display(acc), _ACC_COLUMNS)]
    parts += ["## Failed runs", failed_runs(summary)]
    return "\n\n".join(parts) + "\n"


_SKIPPED_NOTE = (
    "`skipped`: steps a run skipped because a gradient held a NaN or inf (`nonfinite: skip`;"
    " warm-up included), docs/failures.md#non-finite-gradients."
)


def _skipped_any(summary: pd.DataFrame) -> bool:
    return bool((summary["skipped_steps"].fillna(0) > 0).any())


def codec_caption(summary: pd.DataFrame) -> str:
    """What a table's caption adds when its runs replayed another device's codec times
    (``codec_time:``): whose, and how often the real codec was slower than them."""
    devices = names.codec_devices(summary)
    if not devices:
        return ""
    text = " · codec time replayed from " + ", ".join(devices)
    worst = summary["codec_overrun_share"].max()
    if worst > 0:
        text += f" (real codec slower in up to {worst:.0%} of rank-iterations)"
    return text


def _after(columns: tuple[str, ...], anchor: str, column: str) -> tuple[str, ...]:
    at = columns.index(anchor) + 1
    return (*columns[:at], column, *columns[at:])


def _print_table(summary: pd.DataFrame, out: TextIO) -> None:
    constant = [c for c in _LABEL_COLUMNS if summary[c].nunique(dropna=False) == 1]
    said = page_baselines.one_each(summary)  # named once in the caption, not in every row
    columns = tuple(c for c in _TERMINAL_COLUMNS if c not in (*constant, *said))
    flagged = summary["disturbed"].fillna(False).astype(bool)
    if flagged.any():  # only then: a quiet sweep's table stays as narrow as it was
        columns = (*columns[: columns.index("status") + 1], "others",
                   *columns[columns.index("status") + 1 :])  # fmt: skip
    if _skipped_any(summary):  # likewise: only when a run skipped steps
        columns = _after(columns, "status", "skipped_steps")
    people = for_people(summary.iloc[:1])
    caption = " · ".join(f"{c}={text_cell(people[c].iloc[0])}" for c in constant)
    compute = summary["precision"].fillna("fp32").astype(str)
    if compute.nunique() > 1:  # e.g. real next to replayed compute: every row says which
        columns = _after(columns, "world_size", "precision")
    elif compute.iloc[0] != "fp32":
        caption += f" · compute={compute.iloc[0]}"
    dilations = sorted(set(summary["dilation"].fillna(1.0)) - {1.0})
    if dilations:  # the times shown are the measured ones / D: say so under every table
        caption += " · time-dilated x" + ", x".join(f"{d:g}" for d in dilations)
        caption += " (times shown divided by it)"
    caption += codec_caption(summary)
    if said:  # a line of its own: method names hold " · " themselves
        named = "; ".join(f"{_COLUMNS[c][0]}: {name}" for c, name in said.items())
        caption = f"{caption}\n{named}" if caption else named
    table = Table(title="qbench summary", caption=caption or None, header_style="bold")
    for column in columns:
        textual = column in _TEXTUAL  # text may fold; numbers never wrap
        table.add_column(_COLUMNS[column][0], justify="left" if textual else "right",
                         no_wrap=not textual, overflow="fold")  # fmt: skip
    rows = zip(_cells(summary, columns), summary["status"], flagged, strict=True)
    for cells, status, shaken in rows:
        table.add_row(*cells, style="red" if status not in _FINE else "yellow" if shaken else None)
    width = None if out.isatty() else PIPE_WIDTH  # a file or pipe has no reason to squeeze
    console = Console(file=out, width=width)
    console.print(table)
    for warning in disturbed.warnings(summary):
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    failed = failed_rows(summary)
    if failed:
        errors = Table("run", "status", "exit code", "error", title="Failed runs", style="red")
        for row in failed:
            errors.add_row(*row)
        console.print(errors)


_ACC_NOTE = (
    "Final test top-1 of the model averaged over ranks, mean +/- std over seeds and repeats; "
    "bits/value is what was actually sent (payload bytes x 8 / values); diff is to the fp32 "
    "run of the same model, dataset, skew and compute precision (gossip and push-sum against "
    "fp32 runs of themselves)."
)
_ACC_COLUMNS = (
    "model", "dataset", "precision", "scheme", "compressor", "skew", "runs", "bits/value",
    "top-1 %", "diff vs fp32 (pt)", "time to target (s)",
)  # fmt: skip


def _acc_display(acc: pd.DataFrame) -> pd.DataFrame:
    out = acc.copy()
    out["bits/value"] = out["bits_per_value"].map(lambda v: f"{v:.2f}")
    out["top-1 %"] = [f"{100 * m:.2f} +/- {100 * s:.2f}" for m, s in zip(
        out["top1_mean"], out["top1_std"], strict=True)]  # fmt: skip
    out["diff vs fp32 (pt)"] = out["diff_vs_fp32"].map(
        lambda v: NA if pd.isna(v) else f"{100 * v:+.2f}"
    )
    out["time to target (s)"] = out["time_to_target_s"].map(
        lambda v: NA if pd.isna(v) else f"{v:.2f}"
    )
    out["skew"] = out["skew"].map(lambda v: f"{v:g}")
    return out


def _plain_markdown(frame: pd.DataFrame, columns: tuple[str, ...]) -> str:
    """A markdown table of already formatted string columns."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in frame[list(columns)].values]
    return "\n".join(lines)
