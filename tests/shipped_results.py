"""Synthetic results directories in the shape of a shipped scenario's runs, nothing launched.

The matrix comes from ``qbench.spec`` (what ``qbench sweep`` would run); each run gets the
labels its RunSpec stores, a model size and FLOPs made up from the model's name (models of
different names differ, so the study figures have several ratios), a few iterations on every
rank with timings that grow with the bytes sent, and, in accuracy mode, epochs whose top-1
rises to 95 % (70 % below 6 bits: those never reach a target of 80 %). Enough for every figure
to draw; no number here is meant to be checked.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from qbench.records.schema import RunRecord, epochs_frame, iterations_frame
from qbench.records.store import EPOCHS, ResultStore, atomic_write_parquet
from qbench.spec import matrix, scenario
from tests import paths

REPO = Path(__file__).resolve().parents[1]
SHIPPED = paths.sweep_scenarios()
DEFAULT = REPO / "qbench" / "spec" / "default.yaml"
"""The embedded scenario ``qbench sweep`` runs without a file (``make demo``)."""
WARMUP, MEASURED = 1, 3


def runs(path: Path, sets: tuple[str, ...] = ()) -> list[matrix.RunSpec]:
    """The scenario's runs, with ``--set`` overrides (``make figures`` uses ``seed=0``)."""
    text = scenario.with_overrides(path.read_text(), str(path), list(sets))
    return matrix.expand(scenario.loads(text, str(path))).runs


def write(root: Path, specs: list[matrix.RunSpec]) -> Path:
    """One ok run per spec under ``root``; returns ``root``."""
    store = ResultStore(root)
    for spec in specs:
        size = _size(spec.workload.model)
        labels = {**spec.labels(), "numel": size, "gflops_per_sample": 0.01}
        record = RunRecord(run_id=spec.run_id, status="ok", labels=labels, spec={})
        store.write_record(record)
        store.write_iterations(spec.run_id, iterations_frame(_iterations(spec, size)))
        if spec.measurement.epochs:
            path = store.run_dir(spec.run_id) / EPOCHS
            atomic_write_parquet(path, epochs_frame(_epochs(spec)))
    return root


def _size(model: str) -> int:
    return 100_000 * (1 + zlib.crc32(model.encode()) % 40)


def _bits(spec: matrix.RunSpec) -> float:
    return float(spec.labels()["bits"] or 32)


def _iterations(spec: matrix.RunSpec, numel: int) -> list[dict[str, object]]:
    payload = int(numel * _bits(spec) / 8)
    rows = []
    for rank in range(spec.placement.world_size):
        for it in range(WARMUP + MEASURED):
            parts = {"t_compute": numel * 2e-8, "t_encode": 1e-4, "t_decode": 1e-4,
                     "t_comm": payload * 1e-9 * (1 + 0.1 * it), "t_step": 1e-4}  # fmt: skip
            rows.append({
                "run_id": spec.run_id, "rank": rank, "iteration": it, "warmup": it < WARMUP,
                **parts, "t_iteration": sum(parts.values()), "bytes_sent": payload,
                "payload_bytes": payload, "grad_bytes": 4 * numel, "loss": 1.0 / (it + 1),
            })  # fmt: skip
    return rows


def _epochs(spec: matrix.RunSpec) -> list[dict[str, object]]:
    final = (
        0.95 if _bits(spec) >= 6 else 0.7
    ) - 0.01 * spec.measurement.seed  # below 6 bits: no target
    return [
        {
            "run_id": spec.run_id,
            "epoch": e,
            "iteration": 10 * e,
            "train_time_s": 5.0 * e,
            "lr": 0.1,
            "train_loss": 1.0 / e,
            "test_loss": 1.0 / e,
            "top1": final * e / spec.measurement.epochs,
            "top5": float("nan"),
            "grad_norm": float("nan"),
            "bytes_sent": 0,
            "consensus_distance": float("nan"),
        }
        for e in range(1, spec.measurement.epochs + 1)
    ]
