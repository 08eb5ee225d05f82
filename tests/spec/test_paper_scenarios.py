"""The shipped scenarios: each loads, expands to runs, says how to run it, and (for the paper
ones) moves to GPUs by changing the backend and world sizes only (``make figures``'s promise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qbench.spec import matrix, scenario
from tests import paths

ROOT = paths.ROOT / "scenarios"
SHIPPED = paths.sweep_scenarios()
PAPER = sorted((ROOT / "paper").glob("*.yaml"))


def test_there_are_paper_scenarios_for_every_seed() -> None:
    seeds = {p.name[:7] for p in PAPER if p.name.startswith("seed")}
    assert seeds == {"seed000", "seed001", "seed002", "seed003", "seed004"}
    # beyond the seeds: compression against the baseline users run (PyTorch DDP), and on a
    # cluster of emulated nodes (issue 33)
    assert {p.stem for p in PAPER if not p.name.startswith("seed")} == {
        "utility",
        "cluster",
        "replay-scale",  # replayed compute past the cores (issue 34)
        "sharded",  # FSDP with compressed collectives against 16-bit baselines (issue 35)
        "wire-formats",  # FP8 / MX / NVFP4 next to QSGD: top-1 for the bits (issue 36)
        "diloco",  # local SGD, DiLoCo, Streaming DiLoCo: loss at equal tokens (issue 47)
        "diloco-links",  # their compute utilization against link rate (issue 47)
    }


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_scenario_expands(path: Path) -> None:
    sc = scenario.load(path)
    m = matrix.expand(sc)
    assert m.runs and all(r.scenario == sc.name for r in m.runs)
    assert sc.name == path.stem  # results/<name> is the file's name


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_paper_scenario_names_its_command(path: Path) -> None:
    """The comment line `make figures` follows: sweep this file into results/<name>, report it."""
    lines = path.read_text().splitlines()
    want = f"# Run: qbench sweep scenarios/paper/{path.name} && qbench report results/{path.stem}"
    assert want in lines, f"{path.name} lacks the line {want!r}"


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_paper_scenario_at_seed_zero_keeps_every_configuration(path: Path) -> None:
    """`make figures` runs `--set seed=0`: fewer runs, the same configurations."""
    full = matrix.expand(scenario.load(path)).runs
    text = scenario.with_overrides(path.read_text(), str(path), ["seed=0"])
    quick = matrix.expand(scenario.loads(text)).runs

    def config(r: matrix.RunSpec) -> tuple[str, ...]:
        return (
            r.workload.model,
            r.method.scheme.name,
            str(r.method.compressor.given),
            r.compute.name,
            str(r.workload.skew),
        )

    assert {config(r) for r in quick} == {config(r) for r in full}
    assert {r.measurement.seed for r in quick} == {0} and len(quick) <= len(full)
