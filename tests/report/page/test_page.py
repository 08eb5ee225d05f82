"""The report page never overstates: 1-rank runs never headline, verdicts rest only on
intervals that exclude 1, profiled runs stay out of speed comparisons (issue 21)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from qbench.records.store import INDEX_MD, ResultStore
from qbench.report import stats
from qbench.report import tables as report
from tests.report.test_report import add_run, build, labels, rows_for


def _page(root: Path) -> str:
    report.write_report(root, fmt=None)
    return (root / "report" / INDEX_MD).read_text()


def test_one_rank_runs_never_headline(tmp_path: Path) -> None:
    """test_report's fixture: at 1 rank QSGD and 1-bit run 0.82x-0.94x of fp32 (encoding
    costs, nothing to save); they are named as left out, never as a gain or a loss."""
    build(tmp_path)
    md = _page(tmp_path)
    assert "4 compressed 1-rank configurations are left out of the verdict" in md
    speed = md.split("## Does it hurt accuracy?")[0]
    verdicts = [s for s in speed.split(". ") if "surest gain" in s or "clearest loss" in s]
    assert verdicts and not any("1 rank," in s for s in verdicts)


def _two_configs(root: Path, coded_slow: float, noise: float) -> Path:
    """fp32 and QSGD at 2 ranks, one run each; QSGD's iterations take ``coded_slow`` times
    fp32's, and every iteration is scaled by 1 +- ``noise`` alternately."""
    store = ResultStore(root)
    for comp, slow in (("fp32", 1.0), ("qsgd-4b-b512", coded_slow)):
        rows = rows_for(comp, "mlp", comp, 2)
        for row in rows:  # same compute for both: only the factor differs
            row.update(t_iteration=0.02 * slow * (1 + noise * (-1) ** row["iteration"]))
        add_run(store, comp, labels("mlp", comp, 2), rows)
    return root


def test_verdicts_only_from_intervals_that_exclude_one(tmp_path: Path) -> None:
    pays = _page(_two_configs(tmp_path / "pays", 0.5, 0.01))
    assert "Compression pays here for 1 of them" in pays
    loses = _page(_two_configs(tmp_path / "loses", 2.0, 0.01))
    assert "Compression does not pay here" in loses and "pays here for" not in loses
    noisy = _page(_two_configs(tmp_path / "noisy", 0.97, 0.4))  # 3 % faster, +-40 % noise
    assert "0 are faster than their best uncompressed baseline beyond the noise" in noisy
    assert "No verdict that compression pays" in noisy
    assert "~" in noisy.split("| allreduce · QSGD 4-bit |")[1].split("\n")[0]  # marked


def test_profiled_runs_stay_out_of_speed_comparisons(tmp_path: Path) -> None:
    """A profiled fp32 run twice as fast as the plain one would otherwise be the baseline."""
    store = ResultStore(tmp_path)
    for run_id, comp, slow, profiled in (("fp32", "fp32", 1.0, False),
                                         ("fp32-prof", "fp32", 0.5, True),
                                         ("qsgd-prof", "qsgd-4b-b512", 0.5, True),
                                         ("qsgd", "qsgd-4b-b512", 1.0, False)):  # fmt: skip
        lab = labels("mlp", comp, 2, profiled=profiled, repeat=int(profiled))
        add_run(store, run_id, lab, rows_for(run_id, "mlp", comp, 2, slow))
    summary = stats.summarize(stats.load(tmp_path)).set_index("run_id")
    assert summary.loc["fp32-prof", "status"] == stats.PROFILED
    assert pd.notna(summary.loc["fp32-prof", "samples_per_s"])  # measured, shown
    assert pd.isna(summary.loc["qsgd-prof", "speedup_vs_fp32"])  # never compared
    plain = summary.loc["qsgd", "speedup_vs_fp32"]
    assert plain == pytest.approx(
        summary.loc["qsgd", "samples_per_s"] / summary.loc["fp32", "samples_per_s"]
    )  # the plain fp32 is the baseline, not the twice-as-fast profiled one
    md = _page(tmp_path)
    assert "2 profiled runs" in md and "All runs are ok." in md
    assert "| fp32-prof |" not in md.split("## Failed runs")[1]
