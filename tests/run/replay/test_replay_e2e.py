"""Replayed compute end to end (``compute: replay``): a sweep of two gloo ranks runs each method
with real and with replayed compute; the replayed runs send exactly the bytes the real ones
send, keep their timeline, and say replayed in their ids, records and report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests import invoke as qbench_cli

SCENARIO = """\
name: replay-e2e
model: mlp
world_size: 2
backend: gloo
compute: [fp32, replay]
scheme: [reduce-broadcast, ddp]
compressor: [{name: qsgd, bits: 4}, none, {name: powersgd, rank: 2}]
exclude: [{scheme: reduce-broadcast, compressor: [none, powersgd]}, {scheme: ddp, compressor: qsgd}]
warmup: 2
iterations: 5
timeout: 300
"""


@pytest.mark.slow
def test_replayed_runs_send_what_real_runs_send(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SCENARIO)
    out = tmp_path / "out"
    cli = [sys.executable, "-m", "qbench.cli"]
    proc = qbench_cli.run([*cli, "sweep", str(tmp_path / "s.yaml"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in out.glob("*/run.json")]
    assert len(records) == 6 and {r["status"] for r in records} == {"ok"}
    by_method: dict[tuple[str, str], dict[str, pd.DataFrame]] = {}
    for r in records:
        compute = r["labels"]["compute"]
        assert ("-replay-" in r["run_id"]) == (compute == "replay")
        assert (out / r["run_id"] / "timeline.json").exists() == (compute == "replay")
        rows = pd.read_parquet(out / r["run_id"] / "iterations.parquet")
        method = (r["labels"]["scheme"], r["labels"]["compressor"])
        by_method.setdefault(method, {})[compute] = rows.sort_values(["rank", "iteration"])
    assert len(by_method) == 3
    for method, runs in by_method.items():
        real, replayed = runs["fp32"], runs["replay"]
        for column in ("bytes_sent", "payload_bytes", "grad_bytes"):
            assert list(replayed[column]) == list(real[column]), (method, column)
        assert (replayed["bytes_sent"] > 0).all()
        assert replayed["loss"].isna().all() and real["loss"].notna().all()

    report = subprocess.run([*cli, "report", str(out), "--format", "csv"], capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert report.returncode == 0, report.stderr[-3000:]
    summary = pd.read_csv(out / "report" / "summary.csv")
    assert sorted(summary["precision"]) == ["fp32"] * 3 + ["replay"] * 3
    assert "replayed compute" in (out / "report" / "index.md").read_text()
