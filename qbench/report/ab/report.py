"""``qbench report A B``: the A/B comparison (:mod:`qbench.report.ab.stats`) as people read it:
``B/report/compare.{csv,md}``, a terminal table, failed runs of both sides, the warning when
configurations rest on fewer than 3 runs per side.

Reads files only (through ``qbench.report``); never imports torch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from qbench.errors import choice_error
from qbench.records.store import COMPARE_CSV, COMPARE_MD, ResultStore, atomic_write_bytes
from qbench.report import disturbed, names, stats
from qbench.report.ab import stats as ab_stats
from qbench.report.tables import (
    FORMATS,
    NA,
    PIPE_WIDTH,
    failed_rows,
    failed_runs,
    is_missing,
    load_results,
    ms_cell,
    number_cell,
    text_cell,
)

_COMPARE_SHOW = (
    *("model", "backend", "scheme", "compressor", "world_size", "network", "a_runs", "b_runs"),
    *("a_median_s", "b_median_s", "ratio", "ci", "n", "verdict"),
)
_COMPARE_HEAD = {
    "world_size": "ranks", "a_median_s": "A ms", "b_median_s": "B ms", "ratio": "B/A",
    "ci": "95% interval", "a_runs": "A runs", "b_runs": "B runs", "n": "samples (A vs B)",
}  # fmt: skip


def write_comparison(
    a: Path | str, b: Path | str, fmt: str | None = "table", out: TextIO | None = None,
    include_disturbed: bool = False,
) -> tuple[Path, Path, pd.DataFrame]:  # fmt: skip
    """Compare ``b`` against baseline ``a`` (:mod:`qbench.report.ab.stats`); write
    ``b/report/compare.{csv,md}`` and print the table in ``fmt``; failed runs of both listed,
    and the disturbed runs left out (compared with ``include_disturbed``)."""
    if fmt is not None and fmt not in FORMATS:
        raise choice_error("report format", fmt, FORMATS)
    # one-line errors for missing / empty dirs
    ra, rb = load_results(a), load_results(b)
    with names.using(ra.names.merged(rb.names)):
        return _write_comparison(a, b, fmt, out, include_disturbed, ra, rb)


def _write_comparison(
    a: Path | str, b: Path | str, fmt: str | None, out: TextIO | None, include_disturbed: bool,
    ra: stats.Results, rb: stats.Results,
) -> tuple[Path, Path, pd.DataFrame]:  # fmt: skip
    sa, sb = stats.summarize(ra, include_disturbed), stats.summarize(rb, include_disturbed)
    frame = ab_stats.compare(a, b, include_disturbed)
    report_dir = ResultStore(b).report_dir()
    csv_path, md_path = report_dir / COMPARE_CSV, report_dir / COMPARE_MD
    atomic_write_bytes(csv_path, frame.to_csv(index=False).encode())
    failed = pd.concat([sa.assign(side="A"), sb.assign(side="B")], ignore_index=True)
    text = _compare_markdown(frame, failed, str(a), str(b))
    atomic_write_bytes(md_path, text.encode())
    if fmt is not None:
        stream = out if out is not None else sys.stdout
        if fmt == "csv":
            stream.write(frame.to_csv(index=False))
        elif fmt == "json":
            stream.write(frame.to_json(orient="records", indent=2) + "\n")
        elif fmt == "md":
            stream.write(text)
        else:
            _print_comparison(frame, failed, stream, str(a), str(b))
    return csv_path, md_path, frame


def _compare_cells(frame: pd.DataFrame) -> list[list[str]]:
    rows = []
    for r in frame.to_dict("records"):
        ci = NA if is_missing(r["ci_low"]) else f"{r['ci_low']:.3f}-{r['ci_high']:.3f}"
        unit = "runs" if r["noise"] == "runs" else "iterations"
        n = NA if is_missing(r["a_n"]) else f"{int(r['a_n'])} vs {int(r['b_n'])} {unit}"
        cells = {**r, "ci": ci, "n": n, "scheme": names.scheme(r["scheme"]),
                 "compressor": names.compressor(r["compressor"])}  # fmt: skip
        rows.append([
            ms_cell(cells[c]) if c in ("a_median_s", "b_median_s")
            else number_cell(1.0, 3)(cells[c]) if c == "ratio" else text_cell(cells[c])
            for c in _COMPARE_SHOW
        ])  # fmt: skip
    return rows


def _compare_markdown(frame: pd.DataFrame, failed: pd.DataFrame, a: str, b: str) -> str:
    head = [_COMPARE_HEAD.get(c, c) for c in _COMPARE_SHOW]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [
        "| " + " | ".join(_compare_cells(frame.iloc[[i]])[0]) + " |" for i in range(len(frame))
    ]
    counts = frame["verdict"].value_counts()
    verdicts = ", ".join(f"{n} {v}" for v, n in counts.items())
    parts = [
        f"# qbench comparison: B = {b} against A = {a}",
        f"{len(frame)} configurations: {verdicts}.",
    ]
    parts.append(
        "B/A is the ratio of median iteration times (below 1: B is faster). The 95 % interval "
        "bootstraps whole runs when both sides have two or more, otherwise iterations (noise "
        "within one run only). A change is beyond the noise when the interval excludes 1."
    )
    few = compare_few_runs(frame)
    if few:
        parts.append(f"**Warning:** {few}")
    parts += [f"**Warning:** {w}" for w in disturbed_warnings(failed)]
    parts += ["## Configurations", "\n".join(lines)]
    bad = failed[~failed["status"].isin(["ok", "profiled"])]
    parts += ["## Failed runs", failed_runs(bad.assign(run_id=bad["side"] + ": " + bad["run_id"]))]
    return "\n\n".join(parts) + "\n"


def disturbed_warnings(both: pd.DataFrame) -> list[str]:
    """Each side's disturbed runs, left out of the comparison or compared all the same
    (``both``: the two summaries with a ``side`` column)."""
    return [
        f"{side}: {w}" for side in ("A", "B")
        for w in disturbed.warnings(both[both["side"] == side])
    ]  # fmt: skip


def compare_few_runs(frame: pd.DataFrame) -> str:
    """The warning when compared configurations rest on fewer than 3 runs per side ("" if
    none do)."""
    few = ab_stats.few_runs(frame)
    if not few:
        return ""
    matched = int(frame["ratio"].notna().sum())
    return f"{few} of {matched} compared configurations {ab_stats.FEW_RUNS_NOTE}."


def _print_comparison(
    frame: pd.DataFrame, failed: pd.DataFrame, out: TextIO, a: str, b: str
) -> None:
    table = Table(title=f"B = {b} vs A = {a}", header_style="bold",
                  caption="B/A < 1: B faster; verdict from a 95 % bootstrap interval")  # fmt: skip
    for c in _COMPARE_SHOW:
        textual = c in ("model", "backend", "scheme", "compressor", "network", "verdict")
        table.add_column(_COMPARE_HEAD.get(c, c), justify="left" if textual else "right")
    for cells, verdict in zip(_compare_cells(frame), frame["verdict"], strict=True):
        style = {"slower": "red", "faster": "green"}.get(str(verdict))
        table.add_row(*cells, style=style)
    console = Console(file=out, width=None if out.isatty() else PIPE_WIDTH)
    console.print(table)
    few = compare_few_runs(frame)
    if few:
        console.print(f"[yellow]warning:[/] {escape(few)}")
    for warning in disturbed_warnings(failed):
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    bad = failed[~failed["status"].isin(["ok", "profiled"])]
    if not bad.empty:
        errors = Table("run", "status", "exit code", "error", title="Failed runs", style="red")
        for row in failed_rows(bad.assign(run_id=bad["side"] + ": " + bad["run_id"])):
            errors.add_row(*row)
        console.print(errors)
