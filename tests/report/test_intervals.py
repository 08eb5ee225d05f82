"""Every speedup carries its 95 % interval and sample count (qbench.report.intervals), and
``report A B --fail-if-slower PCT`` fails CI only on a slowdown beyond the noise."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.records.store import ResultStore
from qbench.report import intervals, stats
from qbench.report.ab import stats as compare
from tests.invoke import qbench
from tests.report.test_report import BATCH, MEASURED, add_run, labels, rows_for


def test_constant_samples_give_a_point_interval() -> None:
    """One run per side of steady iterations: nothing to resample, the interval is the ratio
    itself (2 = 200 / 100 samples/s), counted in iterations."""
    found = intervals.ratio_interval([np.full(7, 200.0)], [np.full(5, 100.0)])
    assert found is not None
    assert (found.ratio, found.low, found.high) == (2.0, 2.0, 2.0)
    assert (found.n_num, found.n_base, found.unit) == (7, 5, "iterations")
    assert found.beyond_noise and found.few_runs


def test_runs_are_resampled_when_both_sides_repeat() -> None:
    """Three runs per side: the run medians are the samples (100, 110, 120 vs 100)."""
    num = [np.full(5, v) for v in (100.0, 110.0, 120.0)]
    base = [np.full(5, 100.0)] * 3
    found = intervals.ratio_interval(num, base)
    assert found is not None and found.unit == "runs" and (found.n_num, found.n_base) == (3, 3)
    assert found.ratio == pytest.approx(1.10)  # median 110 / median 100
    assert found.low == pytest.approx(1.0) and found.high == pytest.approx(1.2)  # the extremes
    assert not found.beyond_noise and not found.few_runs  # 3 runs: not flagged


def test_noise_decides_not_the_point_value() -> None:
    """Iterations scattered +-30 % around the same mean: a 5 % apparent gain is within the
    noise; a 60 % gain is beyond it."""
    rng = np.random.default_rng(0)
    base = 100 * (1 + 0.3 * rng.uniform(-1, 1, 40))
    near = intervals.ratio_interval([1.05 * 100 * (1 + 0.3 * rng.uniform(-1, 1, 40))], [base])
    far = intervals.ratio_interval([1.6 * 100 * (1 + 0.3 * rng.uniform(-1, 1, 40))], [base])
    assert near is not None and not near.beyond_noise and near.low < 1 < near.high
    assert far is not None and far.beyond_noise and far.low > 1
    assert "within noise" in near.text() and "within noise" not in far.text()


def test_no_samples_no_interval() -> None:
    assert intervals.ratio_interval([], [np.ones(3)]) is None
    assert intervals.ratio_interval([np.array([])], [np.ones(3)]) is None


def _repeated(root: Path, repeats: int, slow: dict[str, float]) -> Path:
    """fp32 and QSGD at 2 ranks, ``repeats`` runs each; run r of compressor c is slowed by
    slow[c] x (1 + 0.01 r)."""
    store = ResultStore(root)
    for comp, factor in slow.items():
        for rep in range(repeats):
            run_id = f"{comp}-r{rep}"
            rows = rows_for(run_id, "mlp", comp, 2, factor * (1 + 0.01 * rep))
            add_run(store, run_id, labels("mlp", comp, 2, repeat=rep), rows)
    return root


def test_summary_intervals_per_configuration(tmp_path: Path) -> None:
    one = stats.summarize(
        stats.load(_repeated(tmp_path / "one", 1, {"fp32": 1.0, "qsgd-4b-b512": 1.0}))
    )
    row = one.set_index("run_id").loc["qsgd-4b-b512-r0"]
    assert row["speedup_vs_fp32_unit"] == "iterations"
    assert (row["speedup_vs_fp32_n"], row["speedup_vs_fp32_n_base"]) == (MEASURED, MEASURED)
    assert row["speedup_vs_fp32_low"] <= row["speedup_vs_fp32"] <= row["speedup_vs_fp32_high"]
    three = stats.summarize(
        stats.load(_repeated(tmp_path / "three", 3, {"fp32": 1.0, "qsgd-4b-b512": 0.5}))
    )
    rows = three[three["compressor"] == "qsgd-4b-b512"]
    assert set(rows["speedup_vs_fp32_unit"]) == {"runs"}
    assert set(rows["speedup_vs_fp32_n"]) == {3} and set(rows["speedup_vs_fp32_n_base"]) == {3}
    assert rows["speedup_vs_fp32_low"].nunique() == 1  # one interval for the configuration
    assert (rows["speedup_vs_fp32_low"] > 1).all()  # twice as fast: beyond the noise
    assert three["scalability_low"].isna().all()  # no 1-rank run to scale from


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return qbench("report", *argv)


def test_fail_if_slower_gate(tmp_path: Path) -> None:
    """B 50 % slower: fails at 10 %, passes at 100 %; B 2 % slower with steady iterations is
    beyond the noise, but not by more than 10 %. One run per side is warned about."""
    a = _repeated(tmp_path / "a", 1, {"fp32": 1.0})
    slow = _repeated(tmp_path / "slow", 1, {"fp32": 1.5})
    bit = _repeated(tmp_path / "bit", 1, {"fp32": 1.02})
    frame = compare.compare(a, slow)
    assert len(compare.regressions(frame, 10)) == 1 and compare.regressions(frame, 100).empty
    assert compare.regressions(compare.compare(a, bit), 10).empty
    failed = _cli(str(a), str(slow), "--fail-if-slower", "10", "--format", "csv")
    assert failed.returncode == 1, failed.stderr
    assert "fail: 1 configurations slower by more than 10 %" in failed.stderr
    assert "fewer than 3 runs per side" in failed.stderr
    passed = _cli(str(a), str(slow), "--fail-if-slower", "100", "--format", "csv")
    assert passed.returncode == 0 and "pass:" in passed.stderr
    alone = _cli(str(a), "--fail-if-slower", "5")
    assert alone.returncode == 2 and len(alone.stderr.strip().splitlines()) == 1
    negative = _cli(str(a), str(slow), "--fail-if-slower", "-5")
    assert negative.returncode == 2 and "Traceback" not in negative.stderr


def test_comparison_shows_samples(tmp_path: Path) -> None:
    from qbench.report.ab import report as comparison

    a = _repeated(tmp_path / "a", 3, {"fp32": 1.0})
    b = _repeated(tmp_path / "b", 3, {"fp32": 1.0})
    _, md_path, frame = comparison.write_comparison(a, b, None)
    assert frame["few_runs"].tolist() == [False]
    text = md_path.read_text()
    assert "3 vs 3 runs" in text and "Warning" not in text
    one = _repeated(tmp_path / "one", 1, {"fp32": 1.0})
    _, md_path, _ = comparison.write_comparison(one, b, None)
    assert f"{MEASURED} vs {3 * MEASURED} iterations" in md_path.read_text()
    assert "fewer than 3 runs per side" in md_path.read_text()


def test_throughputs_use_global_batch() -> None:
    per_it = pd.DataFrame({"run_id": ["r"] * 3, "t_iteration": [0.5, 0.5, 0.5]})
    through = intervals.Throughputs(per_it, pd.Series({"r": 2 * BATCH}))
    found = through.ratio(["r"], ["r"])
    assert found is not None and found.ratio == 1.0
    assert through._of(["r"])[0].tolist() == [2 * BATCH / 0.5] * 3
