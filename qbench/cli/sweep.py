"""``qbench sweep``: run a scenario's matrix (qbench.launch.sweep via the console)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import click

from qbench.cli import console, options
from qbench.spec import scenario as scenario_mod
from qbench.spec.quick import quick as quick_text


@click.command()
@click.argument("scenario", required=False)
@click.option("--out", type=click.Path(file_okay=False), help="Results directory [results/<name>].")
@options.flag("--dry-run", help="Print the run matrix and excluded rows; run nothing.")
@click.option(
    "--launcher", type=click.Choice(["local", "slurm"]), default=None,
    help="How runs start [the scenario's `launcher:`, else local].",
)  # fmt: skip
@click.option(
    "--isolation", default=None, metavar="auto|group|process",  # checked as `isolation:` is
    help="group: one launch per rank group runs its runs in turn; process: one launch per "
    "run; auto: group here, process under Slurm [the scenario's `isolation:`, else auto].",
)  # fmt: skip
@options.flag("--retry-failed", help="Also redo runs that failed or timed out in an earlier "
              "sweep (by default they are kept; interrupted runs are always redone).")  # fmt: skip
@click.option(
    "--rerun-disturbed", "rerun_disturbed", type=click.IntRange(min=0), default=0, metavar="N",
    help="Run again, up to N times each, runs measured while other processes used the CPUs "
    "(the report's `disturbed`), until an attempt is clean; earlier attempts are kept in "
    "RUN/attempts/ [0: never].",
)  # fmt: skip
@options.flag("--skip-unavailable", help="Skip runs whose prerequisites this machine lacks "
              "(recorded as skipped, with the reason) and run the others; by default the sweep "
              "stops before starting any.")  # fmt: skip
@options.flag("--check", help="Check what the runs need on this machine: one line per missing "
              "prerequisite with its fix on stderr and exit 2, or exit 0; run "
              "nothing.")  # fmt: skip
@options.flag(
    "--quick",
    help="Every configuration at a tiny scale (first seed, one repeat, at most 4 samples a "
    "rank, one epoch of 2 steps or 1 + 2 iterations): proves the scenario runs end to end; "
    "keep its --out apart.",
)  # fmt: skip
@options.listed("--set", "sets", metavar="KEY=VALUE", help="Replace a top-level scenario key "
                "(VALUE is YAML), e.g. --set seed=0 --set 'world_size=[1,2,4,8]' --set "
                "backend=nccl.")  # fmt: skip
@options.flag("--profile", help="Write a profiler trace per rank (RUN/profile/); the same as "
              "--set profile=true.")  # fmt: skip
def sweep(
    scenario: str | None, out: str | None, dry_run: bool, launcher: str | None,
    isolation: str | None, retry_failed: bool, rerun_disturbed: int, skip_unavailable: bool,
    check: bool, quick: bool, sets: tuple[str, ...], profile: bool,
) -> None:  # fmt: skip
    """Run every combination of SCENARIO's axes (default: the embedded smoke scenario).

    Re-running skips runs already complete, so an interrupted sweep resumes where it stopped."""
    text, source = _scenario_text(scenario)
    sets = (*sets, "profile=true") if profile else sets
    text = scenario_mod.with_overrides(text, source, sets)
    if quick:
        text = quick_text(text, source)
    console.sweep(
        text, source, Path(out) if out else None, dry_run, launcher=launcher,
        retry_failed=retry_failed, skip_unavailable=skip_unavailable, check=check,
        isolation=isolation, rerun_disturbed=rerun_disturbed,
    )  # fmt: skip


def _scenario_text(scenario: str | None) -> tuple[str, str]:
    if scenario is None:
        return resources.files("qbench.spec").joinpath(
            "default.yaml"
        ).read_text(), "<embedded default>"
    return scenario_mod.read_text(scenario), scenario
