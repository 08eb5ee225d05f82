"""``qbench report DIR [OTHER]``: summaries, figures and comparisons (qbench.report)."""

from __future__ import annotations

from pathlib import Path

import click


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
@click.option(
    "--include-disturbed", is_flag=True,
    help="Compare runs measured while other processes used the CPUs too (flagged `disturbed`; "
    "by default they are shown but left out of every speedup, baseline and verdict).",
)  # fmt: skip
@click.option(
    "--kernels", metavar="FILE", default=None,
    help="A `qbench bench kernels --json` file: the page shows each compressor's break-even link "
    "rate from its codec times (default: the sweep's own `codec_time:` file, if any).",
)  # fmt: skip
@click.option(
    "--figures/--no-figures", default=True, show_default=True,
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
    from qbench.cli import console

    if other is not None:
        if kernels is not None:  # A B writes no page, so codec times would go unread
            raise click.UsageError("--kernels adds to one directory's page: qbench report DIR")
        console.compare(Path(directory), Path(other), fmt, fail_pct, include_disturbed)
        return
    if fail_pct is not None:
        raise click.UsageError("--fail-if-slower compares two directories: qbench report A B")
    console.report(Path(directory), fmt, include_disturbed, kernels, figures)
