"""Replayed compute and the bytes it sends (``compute: replay``): a replayed rank hands the
codec its first batch's gradient at every iteration, so its bytes are a real run's only where
the payload's size does not depend on the values. Per compressor, the catalog's
``sized_by_data`` must say which: a replayed run of every codec (one in-process gloo rank)
sends, iteration by iteration, exactly what the real run sends, or the planner refuses it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qbench import catalog
from qbench.catalog.compressors import COMPRESSORS
from qbench.run.loops.flat import Run
from qbench.run.replay.loops import ReplayRun
from qbench.spec import scenario
from qbench.spec.matrix import expand
from qbench.timing import PhaseTimer

ITERATIONS = 4
CODECS = [name for name, e in COMPRESSORS.items() if not e.hook_only]


def _matrix(comp: str, scheme: str = "reduce-broadcast") -> Any:
    text = (
        f"name: t\nmodel: logreg\nworld_size: 1\nscheme: {scheme}\ncompressor: {comp}\n"
        f"compute: [fp32, replay]\nwarmup: 0\niterations: {ITERATIONS}\nbatch_size: 8\n"
    )
    return expand(scenario.loads(text))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One results directory for the module: its runs share one measured timeline."""
    return tmp_path_factory.mktemp("out")


def _bytes(run: Any) -> list[int]:
    timer = PhaseTimer(run.device)
    for it in range(ITERATIONS):
        run.iteration(it, timer)
    run.close()
    return [int(b) for b in run.frame().sort_values("iteration")["payload_bytes"]]


@pytest.mark.parametrize("name", CODECS)
def test_replay_sends_a_real_runs_bytes_or_is_refused(
    name: str, results: Path, process_group: Any
) -> None:
    """Top-k's k is fixed by the size, so its bytes match per iteration; adaptive's Huffman
    stream follows the gradient, so the replayed bytes (run here past the planner) are not a
    real run's, and the planner refuses it with the reason."""
    m = _matrix(name)
    real_spec = next(r for r in m.runs if r.compute.name == "fp32")
    real = _bytes(Run(real_spec, process_group))
    parts = results / name / "parts"
    parts.mkdir(parents=True)
    replayed = _bytes(ReplayRun(real_spec.replaced(compute="replay"), process_group, parts))
    assert len(real) == ITERATIONS and min(real) > 0
    if catalog.compressor(name).entry.sized_by_data:
        assert replayed != real, (real, replayed)  # else the refusal below would be needless
        assert [r.compute.name for r in m.runs] == ["fp32"]
        (excluded,) = m.excluded
        assert excluded.reason.startswith(f"compute replay: {name}'s payload size depends on")
        assert excluded.reason.endswith(f"use `compute: fp32` for {name}")
    else:
        assert replayed == real
        assert sorted(r.compute.name for r in m.runs) == ["fp32", "replay"] and not m.excluded


def test_a_schemes_own_codec_sized_by_data_is_refused_too() -> None:
    m = _matrix("{name: qsgd, bits: 4}", "{name: parameter-server, down: adaptive}")
    assert [r.compute.name for r in m.runs] == ["fp32"]
    (excluded,) = m.excluded
    assert excluded.reason.startswith("compute replay: down: adaptive's payload size depends")
    assert excluded.reason.endswith("use `compute: fp32` for adaptive")
    assert "\n" not in excluded.reason
