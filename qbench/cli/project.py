"""``qbench project CLUSTER STUDY``: each method's iteration on a declared cluster
(``qbench.cluster``), with the error band its validation measured; ``--against CELLS.csv``
compares the same predictions with a real machine's published numbers instead."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import click
import pandas as pd
from rich.table import Table

from qbench.cli import options
from qbench.cli.cost.render import FORMATS, err_console, out_console, print_frame
from qbench.cluster import calibrate, declared, study, table, validate


@click.command()
@click.argument("cluster_file", metavar="CLUSTER", type=click.Path(dir_okay=False))
@click.argument("study_file", metavar="STUDY", type=click.Path(dir_okay=False))
@click.option("--against", type=click.Path(dir_okay=False), metavar="CELLS.csv",
              help="Compare with measured cells (network, gpus, method, samples_per_s) instead "
                   "of projecting: each cell predicted, its error, the summary.")  # fmt: skip
@click.option("--band-out", type=click.Path(dir_okay=False), metavar="FILE",
              help="With --against: write the error band of the predicted cells (a cluster's "
                   "`band:` reads it).")  # fmt: skip
@options.setting(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="table",
    help="table for people; csv or json (every column) for programs.",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Also write every column to FILE (CSV).",
)
def project(cluster_file: str, study_file: str, against: str | None, band_out: str | None,
            fmt: str, csv_path: str | None) -> None:  # fmt: skip
    """Project a study's methods onto a declared cluster, with the error band its validation
    measured.

    For STUDY's workloads and methods on CLUSTER: samples/s, the iteration's compute / codec /
    exchange, speedup over the best uncompressed method (16-bit included) and scalability
    (docs/projection.md)."""
    cluster = declared.load(cluster_file)
    plan = study.load(study_file)
    if band_out and not against:
        raise click.UsageError("--band-out needs --against CELLS.csv (the band is measured there)")
    host, fitted = calibrate.host_of(cluster, plan)
    if against:
        rows = validate.table(cluster, plan, against, host)
        _write(rows, fmt, csv_path, _show_validation)
        for s in validate.summaries(rows):
            err_console().print(s.line(), highlight=False, markup=False)
        if band_out:
            validate.write_band(validate.band(rows, f"{Path(against).name} via {cluster.name}"),
                                band_out)  # fmt: skip
            err_console().print(f"band written to {band_out}", highlight=False, markup=False)
        return
    result = table.projection(cluster, plan, host, fitted)
    _write(result.frame, fmt, csv_path, _show_projection)
    for line in result.rests_on:
        err_console().print(f"rests on: {line}", highlight=False, markup=False)
    band = result.band
    err_console().print(
        "modelled: every number above is computed from the declared cluster, none measured"
        + (f"; band: 8 in 10 of {band.cells} validated cells ({band.source}) erred between "
           f"{band.low:+.0%} and {band.high:+.0%}" if band else
           "; no band: this cluster names no validation (`band:`)"),
        highlight=False, markup=False)  # fmt: skip


def _write(
    frame: pd.DataFrame, fmt: str, csv_path: str | None, show: Callable[[pd.DataFrame], None]
) -> None:
    if csv_path:
        frame.to_csv(csv_path, index=False)
    print_frame(frame, fmt, show)


def _show_projection(frame: pd.DataFrame) -> None:
    t = Table(title="projected (modelled) iteration, ms; samples/s with its measured band")
    for col in ("workload", "GPUs", "method"):
        t.add_column(col)
    for col in ("compute", "codec", "comm", "iteration", "samples/s", "band", "speedup",
                "vs", "scalab."):  # fmt: skip
        t.add_column(col, justify="right")
    for r in frame.itertuples(index=False):
        band = "-" if math.isnan(r.band_low) else f"{r.band_low:.4g}-{r.band_high:.4g}"
        t.add_row(r.workload, str(r.gpus), r.method, f"{r.compute_ms:.4g}", f"{r.codec_ms:.3g}",
                  f"{r.comm_ms:.4g}", f"{r.iteration_ms:.4g}", f"{r.samples_per_s:.4g}", band,
                  f"{r.speedup:.2f}x", r.baseline, f"{r.scalability:.2f}")  # fmt: skip
    out_console().print(t)


def _show_validation(frame: pd.DataFrame) -> None:
    t = Table(title="predicted vs measured samples/s; error = predicted / measured - 1")
    for col in ("workload", "GPUs", "method", "role"):
        t.add_column(col)
    for col in ("measured", "predicted", "error"):
        t.add_column(col, justify="right")
    for r in frame.itertuples(index=False):
        t.add_row(r.workload, str(r.gpus), r.method, r.role, f"{r.measured:.4g}",
                  f"{r.predicted:.4g}", f"{r.error:+.1%}")  # fmt: skip
    out_console().print(t)
