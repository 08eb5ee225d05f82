"""Local SGD, DiLoCo and Streaming DiLoCo through `qbench sweep` on two gloo ranks (real
processes): bytes only on the exchange steps, replayed compute with real exchanges, and the
report summarizing them per round."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from qbench.report import stats
from tests import invoke

pytestmark = pytest.mark.slow

SCENARIO = """\
name: periodic
model: mlp
world_size: 2
backend: gloo
compute: [fp32, replay]
scheme:
  - {name: local-sgd, H: 4}
  - {name: diloco, H: 4, exchange: reduce-broadcast}
  - {name: streaming-diloco, H: 4, fragments: 2, delay: 1, exchange: reduce-broadcast}
compressor: [none, {name: qsgd, bits: 4, bucket_size: 512}]
exclude:
  - {scheme: {name: local-sgd, H: 4}, compressor: qsgd}
batch_size: 16
warmup: 4
iterations: 16
"""


def test_periodic_schemes_send_only_on_their_exchange_steps_and_report_per_round(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "out"
    run = [sys.executable, "-m", "qbench.cli", "sweep", str(path), "--out", str(out)]
    done = invoke.run(run, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    frames = {p.parent.name: pd.read_parquet(p) for p in out.glob("*/iterations.parquet")}
    assert len(frames) == 10  # 5 methods x (fp32, replay)
    for run_id, frame in frames.items():
        sent = frame[frame["rank"] == 0].set_index("iteration")["bytes_sent"]
        # 20 steps (4 of warm-up): fragment 0 after steps 4, 8, ...; fragment 1 after 6, 10, ...
        want = [4, 6, 8, 10, 12, 14, 16, 18, 20] if "streaming" in run_id else [4, 8, 12, 16, 20]
        assert [i + 1 for i, b in sent.items() if b] == want, run_id
    summary = stats.summarize(stats.load(out), include_disturbed=True)
    assert list(summary["status"]) == ["ok"] * 10
    # the 16 measured iterations (4 to 19) are rounds 1 to 4 of H = 4: 4 rows per run
    per_it = stats.per_iteration(stats.load(out).iterations)
    assert set(per_it.groupby("run_id").size()) == {4}
