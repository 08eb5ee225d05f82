"""``qbench timeline``: a replay timeline derived from FLOPs and a stated device speed, for
``timeline:`` in a scenario with ``compute: replay`` (qbench.run.replay)."""

from __future__ import annotations

from pathlib import Path

import click

from qbench.cli import options
from qbench.errors import UserError
from qbench.records.store import atomic_write_json
from qbench.spec import matrix, scenario


@click.command()
@click.argument("scenario_path", metavar="SCENARIO", type=click.Path(dir_okay=False))
@click.option("--tflops", type=click.FloatRange(min=0, min_open=True), required=True,
              help="The device's sustained float32 compute in TFLOP/s, e.g. 60.")  # fmt: skip
@click.option(
    "--memory-tbps", type=click.FloatRange(min=0, min_open=True), required=True,
    help="The device's memory bandwidth in TB/s (the optimizer step), e.g. 3.35.",
)  # fmt: skip
@click.option("--device", "device", required=True, metavar="NAME", help="What the speeds are "
              "of, recorded in the timeline, e.g. 'H100 (stated)'.")  # fmt: skip
@options.out_file("The timeline JSON to write, for `timeline:` in the scenario.")
def timeline(
    scenario_path: str, tflops: float, memory_tbps: float, device: str, out: str
) -> None:  # fmt: skip
    """Derive a replay timeline for the one workload of SCENARIO from its FLOPs."""
    from qbench.run import (
        replay,  # torch: loaded when the command runs, so that its --help stays fast
    )

    runs = matrix.expand(scenario.load(scenario_path)).runs
    workloads = {replay.key(r): r for r in runs}
    if len(workloads) != 1:
        raise UserError(
            f"{scenario_path}: its runs have {len(workloads)} workloads (model, batch, data: "
            f"{', '.join(sorted(workloads))}) and a sweep replays one timeline; give a scenario "
            "of one model, batch size and dataset"
        )
    derived = replay.derived(runs[0], tflops, memory_tbps, device)
    atomic_write_json(Path(out), derived.to_dict())
    click.echo(
        f"wrote {out}: forward {derived.forward_s * 1e3:.3g} ms, backward "
        f"{derived.backward_s * 1e3:.3g} ms, step {derived.step_s * 1e3:.3g} ms "
        f"({derived.source})"
    )
