"""``qbench report DIR [OTHER]``: summaries, figures and comparisons (qbench.report)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.markup import escape

from qbench.cli import options
from qbench.cli.console import err
from qbench.report import disturbed
from qbench.report import tables as report_mod
from qbench.report.ab import report as ab_report
from qbench.report.ab import stats as ab_stats


@click.command()
@click.argument("directory")
@click.argument("other", required=False)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "md", "json"]), default="table",
    help="How to print the summary (files are always written to DIR/report/).",
)  # fmt: skip
@click.option(
    "--fail-if-slower", "fail_pct", type=click.FloatRange(min=0), default=None, metavar="PCT",
    help="With A B: exit 1 when any configuration of B is slower than A by more than PCT % "
    "beyond the noise (the 95 % interval's lower end above 1 + PCT/100), for CI.",
)  # fmt: skip
@options.flag(
    "--include-disturbed",
    help="Compare runs measured while other processes used the CPUs too (flagged `disturbed`; "
    "by default they are shown but left out of every speedup, baseline and verdict).",
)  # fmt: skip
@click.option(
    "--kernels", metavar="FILE", default=None,
    help="A `qbench bench kernels --json` file: the page shows each compressor's break-even link "
    "rate from its codec times (default: the sweep's own `codec_time:` file, if any).",
)  # fmt: skip
@options.setting(
    "--figures/--no-figures", default=True,
    help="Draw the figures (png and pdf). --no-figures writes the tables and the page only, "
    "in a fraction of the time (drawing is most of it): for CI jobs that read the CSV.",
)  # fmt: skip
def report(
    directory: str, other: str | None, fmt: str, fail_pct: float | None, include_disturbed: bool,
    kernels: str | None, figures: bool,
) -> None:  # fmt: skip
    """Summarise DIRECTORY's runs: tables and figures in DIRECTORY/report/.

    With OTHER: compare OTHER (B) against DIRECTORY (A, the baseline) per matching
    configuration, with the ratio of iteration times and whether it is beyond the noise
    (written to OTHER/report/compare.{csv,md})."""
    if other is not None:
        if kernels is not None:  # A B writes no page, so codec times would go unread
            raise click.UsageError("--kernels adds to one directory's page: qbench report DIR")
        compare(Path(directory), Path(other), fmt, fail_pct, include_disturbed)
        return
    if fail_pct is not None:
        raise click.UsageError("--fail-if-slower compares two directories: qbench report A B")
    summarise(Path(directory), fmt, include_disturbed, kernels, figures)


def summarise(
    directory: Path, fmt: str, include_disturbed: bool = False, kernels: str | None = None,
    figures: bool = True,
) -> None:  # fmt: skip
    """``report DIR``: the tables, page and figures, and a line saying where they are."""
    paths = report_mod.write_report(directory, fmt, include_disturbed=include_disturbed,
                                    kernels=kernels, figures=figures)  # fmt: skip
    for note in paths.notes:
        err.print(note)
    if fmt != "table":  # the table prints them under itself
        for warning in disturbed.warnings(paths.summary):
            err.print(f"warning: {escape(warning)}")
    drawn = ", ".join(p.name for p in paths.figures) or "none"
    drawn += "" if figures else " (--no-figures)"
    err.print(f"report: {paths.summary_md} and {paths.summary_csv.name}; figures: {drawn} "
              f"(in {paths.summary_md.parent})")  # fmt: skip


def compare(
    a: Path, b: Path, fmt: str, fail_pct: float | None = None, include_disturbed: bool = False
) -> None:
    """``report A B``; with ``fail_pct`` exit 1 when a configuration regressed beyond noise."""
    csv_path, md_path, frame = ab_report.write_comparison(
        a, b, fmt, include_disturbed=include_disturbed
    )
    counts = ", ".join(f"{n} {v}" for v, n in frame["verdict"].value_counts().items())
    err.print(f"comparison: {counts}; written to {md_path} and {csv_path.name}")
    few = ab_report.compare_few_runs(frame)
    if few:
        err.print(f"warning: {escape(few)}")
    left = frame[["a_disturbed", "b_disturbed"]].fillna(0).sum()
    if left.any():
        err.print(f"warning: disturbed runs left out ({int(left['a_disturbed'])} of A, "
                  f"{int(left['b_disturbed'])} of B; listed in {md_path.name}); "
                  "--include-disturbed compares them")  # fmt: skip
    if fail_pct is None:
        return
    slow = ab_stats.regressions(frame, fail_pct)
    for r in slow.to_dict("records"):
        err.print(f"slower: {r['model']} {r['backend']} {r['scheme']} {r['compressor']} "
                  f"{r['world_size']} ranks {r['network']}: B/A {r['ratio']:.3f} "
                  f"(95 % interval {r['ci_low']:.3f}-{r['ci_high']:.3f})")  # fmt: skip
    if len(slow):
        err.print(f"fail: {len(slow)} configurations slower by more than {fail_pct:g} % "
                  "beyond the noise (--fail-if-slower)")  # fmt: skip
        sys.exit(1)
    err.print(f"pass: no configuration slower by more than {fail_pct:g} % beyond the noise")
