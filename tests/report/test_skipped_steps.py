"""The steps a run skipped for a NaN or inf gradient (``nonfinite: skip``), as the summary counts
them (docs/reports.md, `skipped`): warm-up included; a lock-step run's iterations once, however
many ranks; an async-ps run's dropped pushes, each worker's own; NaN for runs recorded before
the column. The rows and the expected counts are written out here. (The run loops' policy:
tests/run/test_nonfinite.py.)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from qbench.records.schema import RunRecord, iterations_frame
from qbench.records.store import ResultStore
from qbench.report import stats


def _rows(run_id: str, ranks: int, skipped: list[float]) -> list[dict[str, Any]]:
    return [
        {"run_id": run_id, "rank": r, "iteration": i, "warmup": i < 1, "t_iteration": 0.1,
         "t_compute": 0.1, "bytes_sent": 4, "payload_bytes": 4, "grad_bytes": 4, "skipped": s}
        for r in range(ranks) for i, s in enumerate(skipped)
    ]  # fmt: skip


def test_the_summary_counts_skipped_steps_warmup_included(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    lab = {
        "model": "mlp", "dataset": "synthetic", "backend": "gloo", "network": "unshaped",
        "compressor": "fp32", "compressor_name": "none", "bits": 32.0, "world_size": 2,
        "batch_size": 4, "global_batch": 8, "simulated": False, "seed": 0, "repeat": 0,
    }  # fmt: skip
    runs = {
        "sync": ("allreduce", _rows("sync", 2, [1.0, 0.0, 1.0, 1.0, 0.0])),  # 3 steps, 2 ranks
        "async": ("async-ps", _rows("async", 1, [math.nan] * 3)  # the server: no such column
                  + [{**r, "rank": 1} for r in _rows("async", 1, [0.0, 1.0, 0.0])]
                  + [{**r, "rank": 2} for r in _rows("async", 1, [1.0, 1.0, 0.0])]),
        "old": ("allreduce", _rows("old", 2, [math.nan] * 3)),  # written before the column
    }  # fmt: skip
    for run_id, (scheme, rows) in runs.items():
        store.write_record(RunRecord(run_id, "ok", {**lab, "scheme": scheme}, {}))
        store.write_iterations(run_id, iterations_frame(rows))
    summary = stats.summarize(stats.load(tmp_path)).set_index("run_id")
    assert summary.loc["sync", "skipped_steps"] == 3
    assert summary.loc["async", "skipped_steps"] == 3  # 1 + 2 pushes dropped
    assert math.isnan(summary.loc["old", "skipped_steps"])
