"""benchmarks/diloco_study.py, which reads issue 47's accuracy study out for
docs/results/diloco.md: final loss per method over seeds with its t-interval, bytes per step,
and the wall time the steps took on the slow link of the other sweep, by hand-computed cases."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest

from qbench.records.schema import RunRecord, iterations_frame
from qbench.records.store import ResultStore
from tests.paths import ROOT

STEPS = 40


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("diloco_study", ROOT / "benchmarks" /
                                                  "diloco_study.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPECS = {
    "ddp": {"scheme": "ddp"},
    "local-sgd+H4": {"scheme": "local-sgd", "scheme_params": {"H": 4}},
}


def _run(store: ResultStore, run_id: str, labels: dict[str, object], rows: list[dict]) -> None:
    spec = {"compressor": {"name": "none"}, **SPECS[str(labels["scheme"])]}
    store.write_record(RunRecord(run_id=run_id, status="ok", labels=labels, spec=spec))
    store.write_iterations(run_id, iterations_frame(rows))


def _row(run_id: str, rank: int, it: int, **values: float) -> dict[str, object]:
    base = {"t_compute": 0.1, "t_iteration": 0.1, "grad_bytes": 400, "payload_bytes": 0,
            "bytes_sent": 0, "loss": 0.0}  # fmt: skip
    return {"run_id": run_id, "rank": rank, "iteration": it, "warmup": False, **base, **values}


def _study(root: Path) -> None:
    """DDP: loss 2 + seed on every step, 100 bytes a step; local SGD (H 4): loss 1 + seed, rank 1
    0.5 higher, 40 bytes every 4th step."""
    store = ResultStore(root)
    for scheme, loss, sent, every in (("ddp", 2.0, 100, 1), ("local-sgd+H4", 1.0, 40, 4)):
        for seed in (0, 1):
            run_id = f"{scheme}-s{seed}"
            labels = {"model": "gpt", "backend": "gloo", "world_size": 2, "scheme": scheme,
                      "compressor": "fp32", "seed": seed, "repeat": 0, "batch_size": 8}  # fmt: skip
            rows = [_row(run_id, rank, it, loss=loss + seed + 0.5 * rank,
                         bytes_sent=sent if (it + 1) % every == 0 else 0)
                    for rank in range(2) for it in range(STEPS)]  # fmt: skip
            _run(store, run_id, labels, rows)


def _links(root: Path) -> None:
    store = ResultStore(root)
    for scheme, step in (("ddp", 0.5), ("local-sgd+H4", 0.125)):
        for network in ("100mbit", "1gbit"):
            run_id = f"{scheme}-{network}"
            labels = {"model": "gpt", "backend": "gloo", "world_size": 2, "scheme": scheme,
                      "compressor": "fp32", "network": network, "seed": 0, "repeat": 0}  # fmt: skip
            wall = step if network == "100mbit" else 0.1
            _run(store, run_id, labels, [_row(run_id, r, i, t_iteration=wall)
                                         for r in range(2) for i in range(8)])  # fmt: skip


def test_the_study_table_holds_final_losses_with_intervals_bytes_and_wall_time(
    tmp_path: Path,
) -> None:
    study, links = tmp_path / "study", tmp_path / "links"
    _study(study)
    _links(links)
    script = _script()
    seconds = script.step_times(str(links), "100mbit")
    assert seconds == {"DDP fp32": 0.5, "local SGD, H 4 · fp32": 0.125}
    table, curves = script.study(str(study), seconds)
    rows = table.set_index("method")
    ddp, local = rows.loc["DDP fp32"], rows.loc["local SGD, H 4 · fp32"]
    # mean over ranks: loss + 0.25; seeds 0 and 1: mean + 0.5, sd 1 / sqrt(2), t(1 df) 12.71
    assert ddp["final loss"] == pytest.approx(2.75) and local["final loss"] == pytest.approx(1.75)
    assert ddp["95 % CI"] == pytest.approx(12.71 * (1 / math.sqrt(2)) / math.sqrt(2))
    assert local["vs DDP"] == pytest.approx(-1.0) and ddp["seeds"] == 2
    assert local["vs DDP 95 % CI"] == pytest.approx(0.0)  # paired by seed: always 1 lower
    assert ddp["bytes/step"] == 100 and local["bytes/step"] == 10
    assert ddp["wall s on the link"] == pytest.approx(STEPS * 0.5)
    assert local["wall s on the link"] == pytest.approx(STEPS * 0.125)
    curve = curves["DDP fp32"]
    # tokens: steps x 8 a rank x 2 ranks x 64 bytes of context
    assert list(curve["tokens"].iloc[:2]) == [8 * 2 * 64, 2 * 8 * 2 * 64]
    assert curve["mean"].iloc[-1] == pytest.approx(2.75)
