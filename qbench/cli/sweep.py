"""``qbench sweep``: run a scenario's matrix (qbench.launch.sweep via the console)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import click


@click.command()
@click.argument("scenario", required=False)
@click.option("--out", type=click.Path(file_okay=False), help="Results directory [results/<name>].")
@click.option(
    "--dry-run", is_flag=True, help="Print the run matrix and excluded rows; run nothing."
)
@click.option(
    "--launcher", type=click.Choice(["local", "slurm"]), default=None,
    help="How runs start [the scenario's `launcher:`, else local].",
)  # fmt: skip
@click.option(
    "--isolation", default=None, metavar="auto|group|process",  # checked as `isolation:` is
    help="group: one launch per rank group runs its runs in turn; process: one launch per "
    "run; auto: group here, process under Slurm [the scenario's `isolation:`, else auto].",
)  # fmt: skip
@click.option(
    "--retry-failed", is_flag=True,
    help="Also redo runs that failed or timed out in an earlier sweep (by default they are "
    "kept; interrupted runs are always redone).",
)  # fmt: skip
@click.option(
    "--rerun-disturbed", "rerun_disturbed", type=click.IntRange(min=0), default=0, metavar="N",
    help="Run again, up to N times each, runs measured while other processes used the CPUs "
    "(the report's `disturbed`), until an attempt is clean; earlier attempts are kept in "
    "RUN/attempts/ [0: never].",
)  # fmt: skip
@click.option(
    "--skip-unavailable", is_flag=True,
    help="Skip runs whose prerequisites this machine lacks (recorded as skipped, with the "
    "reason) and run the others; by default the sweep stops before starting any.",
)  # fmt: skip
@click.option(
    "--check", is_flag=True,
    help="Check what the runs need on this machine: one line per missing prerequisite with "
    "its fix on stderr and exit 2, or exit 0; run nothing.",
)  # fmt: skip
@click.option(
    "--quick", is_flag=True,
    help="Every configuration at a tiny scale (first seed, one repeat, at most 4 samples a "
    "rank, one epoch of 2 steps or 1 + 2 iterations): proves the scenario runs end to end; "
    "keep its --out apart.",
)  # fmt: skip
@click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE",
    help="Replace a top-level scenario key (VALUE is YAML), e.g. --set seed=0 "
    "--set 'world_size=[1,2,4,8]' --set backend=nccl.",
)  # fmt: skip
@click.option(
    "--profile", is_flag=True,
    help="Write a profiler trace per rank (RUN/profile/); the same as --set profile=true.",
)  # fmt: skip
def sweep(
    scenario: str | None, out: str | None, dry_run: bool, launcher: str | None,
    isolation: str | None, retry_failed: bool, rerun_disturbed: int, skip_unavailable: bool,
    check: bool, quick: bool, sets: tuple[str, ...], profile: bool,
) -> None:  # fmt: skip
    """Run every combination of SCENARIO's axes (default: the embedded smoke scenario).

    Re-running skips runs already complete, so an interrupted sweep resumes where it stopped."""
    from qbench.cli import console
    from qbench.spec import scenario as scenario_mod

    text, source = _scenario_text(scenario)
    sets = (*sets, "profile=true") if profile else sets
    text = scenario_mod.with_overrides(text, source, sets)
    if quick:
        from qbench.spec.quick import quick as quick_text

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
    from qbench.spec import scenario as scenario_mod

    return scenario_mod.read_text(scenario), scenario
