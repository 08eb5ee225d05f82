"""Every figure of a report (png and pdf), and a note for each one the runs cannot draw.

The summary's figures (``qbench.report.plots``), accuracy, the study's (seed 002's speedup and
scalability plots), and the two against link rate: speedup over DDP fp32 (``plots.utility``)
and compute utilization (``plots.utilization``), which reads the lock-step runs' iterations.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from qbench.report import plots, stats
from qbench.report.plots import accuracy as plots_accuracy
from qbench.report.plots import study as plots_study
from qbench.report.plots import utility as plots_utility
from qbench.report.plots import utilization as plots_utilization


def write(
    summary: pd.DataFrame, results: stats.Results, acc: pd.DataFrame, per_it: pd.DataFrame,
    out: Path,
) -> tuple[list[Path], list[str]]:  # fmt: skip
    """Every figure the summary has runs for, and a note per figure skipped; ``per_it``: the
    lock-step runs' ``stats.per_iteration`` rows (the report's throughputs hold them)."""
    figures, notes = plots.write_figures(summary, out)
    if not acc.empty and (fig := plots_accuracy.accuracy_figure(summary, results.epochs)):
        figures += plots.save_all(fig, out / "accuracy")
    study, skipped = plots_study.write_study_figures(summary, out)
    figures += study + plots_utility.write_utility_figure(summary, out)
    return figures + plots_utilization.write(summary, per_it, out), notes + skipped
