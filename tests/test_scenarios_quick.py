"""Every shipped scenario runs end to end at a tiny scale (``qbench sweep --quick``): every
value of every axis starts, trains, is recorded and reported in at least one run. A scenario
that cannot run on a fresh machine (a dataset nobody installs, a key a change broke) fails
here, in CI, instead of in a user's ``make figures``.

What the machine lacks is judged by the sweep's own pre-flight (``qbench sweep --check``,
``qbench.launch.preflight``), never by a second copy of its rules:

* what no install fixes on a CI runner, GPUs (the GPU smoke scenarios on a CPU runner) and root
  (emulated links as another user): those runs are skipped with the reason
  (``--skip-unavailable``), the others run;
* what ``make test`` does not install but a ``make`` target does where apt-get works as root:
  the data of ``make data``, Slurm of ``make slurm``. The test skips, naming each missing piece
  and its fix, as every other test does without its prerequisite; ``.ci/run`` installs them
  first, so CI runs these scenarios. (Without a C compiler, tests/conftest.py has the sweeps
  use the torch codecs, so the compiler is never missing here.)
* anything else (a dataset nobody installs, ``mpirun`` missing from the venv that ``make venv``
  fills) fails the test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from qbench.cli import cli
from qbench.launch import preflight
from qbench.launch.launcher import Launch
from qbench.spec import matrix, quick, scenario
from tests import paths

ROOT = paths.ROOT / "scenarios"
SHIPPED = paths.sweep_scenarios()
TOLERATED = ("hardware", "privilege")  # no install fixes these on a CI runner


def test_quick_covers_every_axis_value_at_the_first_seed() -> None:
    """--quick: a subset of the first seed's configurations in which every value of every axis
    runs at least once; one repeat, 1 epoch of 2 steps or 1 + 2 iterations."""
    total = 0
    for path in SHIPPED:
        full = matrix.expand(scenario.load(path))
        sc = scenario.loads(quick.quick(path.read_text(), str(path)))
        assert sc.repeats == 1 and sc.seed == scenario.load(path).seed[:1] and sc.cover
        if sc.epochs:
            assert (sc.epochs, sc.steps_per_epoch, sc.warmup) == (1, 2, 1)
        else:
            assert (sc.warmup, sc.iterations) == (1, 2)
        small = matrix.expand(sc).runs

        def config(r: matrix.RunSpec) -> dict[str, object]:
            return {
                "model": r.workload.model,
                "dataset": r.workload.dataset,
                "backend": r.placement.backend,
                "method": (r.method.scheme_label, r.compressor_label),
                "world_size": r.placement.world_size,
                "network": str(r.placement.network.written()),
                "compute": r.compute.name,
                "skew": r.workload.skew,
                "weight_bits": r.compute.weight_bits,
            }

        first = [
            config(r)
            for r in full.runs
            if r.measurement.seed == sc.seed[0] and r.measurement.repeat == 0
        ]
        kept = [config(r) for r in small]
        assert all(c in first for c in kept), path.name
        for axis in first[0]:
            assert {repr(c[axis]) for c in kept} == {repr(c[axis]) for c in first}, (path, axis)
        total += len(kept)
    # the first seeds' cross products hold 375: utility alone 96; sharded's 8 methods (FSDP in
    # this test, issue 35) took the quick runs from 119 to 129; wire-formats' 13 compressors
    # (issue 36) to 142, smoke-1gpu's MXFP4, DDP and FSDP runs to 153, smoke-1gpu-gloo to 156;
    # issue 47's DiLoCo study (12 methods) and its link sweep (11 runs for 7 methods on 4 links)
    # to 179, Streaming DiLoCo with delay 5 beside delay 1 to 180
    assert total <= 181


def seeds_0_to_3(path: Path) -> bool:
    """Half of the scenarios by time (seeds 000-003 and issue 47's two DiLoCo ones), in this
    file; the other half in test_scenarios_quick_rest.py, so that `make test`'s two workers
    (whole files each) share them (about 4 minutes each)."""
    return path.stem.startswith(("seed000", "seed001", "seed002", "seed003", "diloco"))


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in SHIPPED if seeds_0_to_3(p)], ids=lambda p: p.stem)
def test_shipped_scenario_runs_end_to_end(path: Path, tmp_path: Path) -> None:
    runs_end_to_end(path, tmp_path)


def runs_end_to_end(path: Path, tmp_path: Path) -> None:
    sc = scenario.loads(quick.quick(path.read_text(), str(path)))
    runs = matrix.expand(sc).runs
    verdicts = preflight.check(runs, launch=Launch(sc.launcher))
    missing = [m for m in verdicts.missing() if m.kind not in TOLERATED]
    broken = [m.line() for m in missing if not m.make]
    assert not broken, f"{path.name} cannot run on this machine: {broken}"
    if missing:  # each installed by a make target
        targets = " and ".join(sorted({f"`make {m.make}`" for m in missing}))
        lines = " | ".join(m.line() for m in missing)
        pytest.skip(f"{path.name}: run {targets} (root, apt-get); this machine lacks {lines}")

    out = tmp_path / "out"
    # `qbench sweep` and `qbench report` in this process: the driver's imports are paid once
    # per test worker, and the rank server one sweep started serves the next (the ranks are
    # processes of their own as always); each command's own start is tested in test_cli.py
    sweep = _cli("sweep", str(path), "--quick", "--skip-unavailable", "--out", str(out))
    records = [json.loads(p.read_text()) for p in out.glob("*/run.json")]
    bad = {r["run_id"]: r.get("error") for r in records if r["status"] not in ("ok", "skipped")}
    assert sweep.exit_code == 0 and not bad, f"{bad or ''}\n{sweep.output[-3000:]}"
    assert len(records) == len(runs)
    skipped = [r for r in records if r["status"] == "skipped"]
    assert {r["run_id"] for r in skipped} == set(verdicts.unavailable())
    if len(skipped) == len(records):
        pytest.skip(f"{path.name}: every run needs {verdicts.tags(skipped[0]['run_id'])}")
    # no figures: drawing them was a third of each test's CPU; each shipped scenario's figures
    # are built in tests/report/plots/test_figure_styles.py and drawn from a real sweep in
    # tests/cli/test_cli.py
    report = _cli("report", str(out), "--format", "csv", "--no-figures")
    assert report.exit_code == 0, report.output[-3000:]
    assert (out / "report" / "summary.csv").is_file()


def _cli(*argv: str) -> Result:
    """``qbench ARGV`` as the command line runs it (its exit code, its output and errors),
    without the variable pytest sets to each test's name: a rank server serves only sweeps that
    give their ranks the environment it was started with."""
    name = os.environ.pop("PYTEST_CURRENT_TEST", None)
    try:
        return CliRunner().invoke(cli, list(argv), catch_exceptions=False)
    finally:
        if name is not None:
            os.environ["PYTEST_CURRENT_TEST"] = name
