"""The Python API for notebooks and scripts: sweep, load, report.

::

    import qbench

    out = qbench.sweep({"name": "nb", "model": "mlp", "world_size": 2,
                        "compressor": ["none", {"name": "qsgd", "bits": 4}]}, out="results/nb")
    data = qbench.load(out)          # data.summary, data.iterations: pandas DataFrames
    qbench.report(out)               # out/report/: summary.md, summary.csv, figures

The same validation and errors as the command line (``qbench sweep`` / ``qbench report``): a
mistake raises ``qbench.errors.UserError`` (a ValueError) with the CLI's one-line message, and
model, dataset and loss factories are imported and checked before the first run.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from qbench.cli import console
from qbench.errors import UserError
from qbench.launch import decision
from qbench.launch import sweep as sweep_mod
from qbench.records.store import ResultStore
from qbench.report import stats
from qbench.spec import matrix as matrix_mod
from qbench.spec import scenario as scenario_mod

if TYPE_CHECKING:
    import pandas as pd

    from qbench.report.tables import ReportPaths

__all__ = ["Results", "load", "report", "sweep"]

ScenarioLike = Mapping[str, Any] | str | os.PathLike[str]


def sweep(
    scenario: ScenarioLike,
    out: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    retry_failed: bool = False,
    launcher: str | None = None,
    isolation: str | None = None,
    progress: bool = True,
    rerun_disturbed: int = 0,
) -> Path:
    """Run every combination of ``scenario`` (a mapping as the YAML would be, or a path to a
    scenario file) and return the results directory (``out``, default ``results/<name>``).

    ``overrides`` replace top-level keys like ``qbench sweep --set`` (``{"seed": 0}``). Runs
    already complete in ``out`` are skipped, so calling it again resumes. A run that fails does
    not raise: its row in :func:`load`'s summary says so (status, error). ``isolation``
    (``auto``, ``group``, ``process``) overrides the scenario's, as ``--isolation`` does.
    ``progress`` prints one line per run to stderr. ``rerun_disturbed`` runs again, up to
    that many times, runs measured while other processes used the CPUs
    (``qbench sweep --rerun-disturbed``).
    """
    text, source = _scenario_text(scenario)
    # JSON is YAML: each override as `--set KEY=VALUE` would give it
    sets = [f"{k}={json.dumps(_plain(v), default=str)}" for k, v in (overrides or {}).items()]
    text = scenario_mod.with_overrides(text, source, sets)
    sc = scenario_mod.loads(text, source)
    m = matrix_mod.expand(sc)
    target = Path(out) if out is not None else Path("results") / sc.name
    launch = decision.launch_for(sc, launcher, m, isolation)
    if console.factories(m):
        from qbench.run import workload  # torch: only for a scenario that names factories

        workload.preflight(m.runs)
    decision.check_available(launch, sc, m)
    if rerun_disturbed < 0:
        raise UserError(f"rerun_disturbed must be 0 or more, got {rerun_disturbed}; e.g. 2")
    todo = len(sweep_mod.plan(m, ResultStore(target), retry_failed).todo)
    with console.progress(todo) if progress else contextlib.nullcontext() as tick:
        sweep_mod.run_sweep(
            m, target, text, on_progress=tick, launch=launch, retry_failed=retry_failed,
            resolved=decision.resolved(sc, launch), rerun_disturbed=rerun_disturbed,
            on_rerun=tick.rerun if tick is not None else None,
        )  # fmt: skip
    return target


@dataclass(frozen=True)
class Results:
    """A results directory as pandas DataFrames."""

    summary: pd.DataFrame
    """One row per run: what ``qbench report`` prints (docs/reports.md lists the columns)."""
    iterations: pd.DataFrame
    """Every rank's row per iteration, warm-up included (docs/results-layout.md)."""
    runs: pd.DataFrame
    """One row per run: status, error and the labels from run.json."""
    epochs: pd.DataFrame
    """Accuracy mode: one row per run and epoch (empty otherwise)."""


def load(directory: str | os.PathLike[str]) -> Results:
    """Read a results directory (``qbench.sweep``'s return value): the summary and the raw
    iterations as DataFrames. UserError when it holds no runs."""
    root = Path(directory)
    fix = f"run qbench.sweep(...) or `qbench sweep SCENARIO.yaml --out {root}` first"
    if not root.is_dir():
        raise UserError(f"results directory {root} does not exist; {fix}")
    results = stats.load(root)
    if results.runs.empty:
        raise UserError(f"no runs found in {root} (no */run.json); {fix}")
    return Results(stats.summarize(results), results.iterations, results.runs, results.epochs)


def report(
    directory: str | os.PathLike[str], fmt: str | None = None, include_disturbed: bool = False,
    kernels: str | os.PathLike[str] | None = None, figures: bool = True,
) -> ReportPaths:  # fmt: skip
    """Write ``directory/report/`` as ``qbench report`` does (summary.md and .csv, figures,
    index.html) and return their paths with the summary (``.summary``). ``fmt`` (table, csv,
    md, json) also prints the summary to stdout; None prints nothing. ``include_disturbed``,
    ``kernels``, ``figures``: as ``qbench report --include-disturbed``, ``--kernels FILE``,
    ``--no-figures``."""
    from qbench.report import tables  # matplotlib (~250 ms): not for qbench.load or qbench.sweep

    return tables.write_report(
        Path(directory), fmt, include_disturbed=include_disturbed,
        kernels=None if kernels is None else Path(kernels), figures=figures,
    )  # fmt: skip


def _scenario_text(scenario: ScenarioLike) -> tuple[str, str]:
    if isinstance(scenario, Mapping):
        return yaml.safe_dump(_plain(dict(scenario)), sort_keys=False), "<dict>"
    if isinstance(scenario, str | os.PathLike):
        path = Path(scenario)
        if not path.is_file():
            raise UserError(
                f"scenario file {str(path)!r} not found; check the path (see scenarios/)"
            )
        return path.read_text(), str(path)
    raise UserError(
        f"scenario must be a mapping or a path to a YAML file, got {type(scenario).__name__}"
    )


def _plain(value: Any) -> Any:
    """Tuples as lists (YAML's safe dumper writes lists only), recursively."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(v) for v in value]
    return value
