"""Disturbed runs in the report (issue 31, item 9): shown and flagged in the summary, left out
of every speedup, baseline and verdict on the page and in ``report A B`` unless asked for, and
named where they were left out. Results directories are built here with hand-computable times.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from qbench.records.schema import RunRecord, iterations_frame
from qbench.records.store import INDEX_MD, SUMMARY_MD, ResultStore, atomic_write_json
from qbench.report import names, stats
from qbench.report import tables as report
from qbench.report.ab import report as comparison_mod
from qbench.report.ab import stats as compare
from qbench.report.plots import utility as plots_utility
from tests.records.test_interference import _doc

BATCH, WARMUP, MEASURED = 32, 1, 6


def _labels(comp: str, repeat: int) -> dict[str, Any]:
    name, bits = {"fp32": ("none", 32.0), "qsgd-4b-b512": ("qsgd", 4.0)}[comp]
    return {"model": "mlp", "dataset": "synthetic", "numel": 1000, "compressor": comp,
            "compressor_name": name, "bits": bits, "simulated": False, "backend": "gloo",
            "scheme": "allreduce", "network": "unshaped", "world_size": 2,
            "batch_size": BATCH, "global_batch": 2 * BATCH, "seed": 0,
            "repeat": repeat}  # fmt: skip


def _rows(run_id: str, seconds: float) -> list[dict[str, Any]]:
    """2 ranks; measured iterations alternate 1 +- 1 % of ``seconds``."""
    return [
        {"run_id": run_id, "rank": r, "iteration": it, "warmup": it < WARMUP,
         "t_iteration": seconds * (1 + 0.01 * (-1) ** it), "t_compute": seconds / 2,
         "t_encode": 0.0, "t_comm": seconds / 2, "t_decode": 0.0, "t_step": 0.0,
         "bytes_sent": 4000, "payload_bytes": 4000, "grad_bytes": 4000, "loss": 1.0}
        for r in range(2) for it in range(WARMUP + MEASURED)
    ]  # fmt: skip


def _add(store: ResultStore, run_id: str, comp: str, seconds: float, other_s: float | None,
         repeat: int = 0) -> None:  # fmt: skip
    doc = None if other_s is None else _doc(other_s)
    store.write_record(RunRecord(run_id=run_id, status="ok", labels=_labels(comp, repeat),
                                 spec={}, interference=doc))  # fmt: skip
    store.write_iterations(run_id, iterations_frame(_rows(run_id, seconds)))


def _issue_case(root: Path) -> Path:
    """The issue's case: the fp32 baseline measured at 2.2x its time while other processes
    took 1.5 cores (6 s of 4 s); QSGD at the quiet 20 ms, as fp32 takes when undisturbed."""
    store = ResultStore(root)
    _add(store, "fp32", "fp32", 0.044, other_s=6.0)
    _add(store, "qsgd", "qsgd-4b-b512", 0.020, other_s=0.2)
    return root


def test_a_disturbed_baseline_gives_no_verdict_and_is_named(tmp_path: Path) -> None:
    root = _issue_case(tmp_path)
    summary = stats.summarize(stats.load(root)).set_index("run_id")
    assert list(summary["disturbed"]) == [True, False]
    assert list(summary["left_out"]) == [True, False]
    assert list(summary["other_cores"]) == [1.5, 0.05]
    assert summary.loc["fp32", "status"] == "ok"  # measured and shown, not failed
    assert summary["speedup_vs_fp32"].isna().all()  # no clean fp32 baseline: no speedup
    report.write_report(root, fmt=None, figures=False)
    page = (root / "report" / INDEX_MD).read_text()
    assert "surest gain" not in page
    assert "No compressed multi-rank run has an uncompressed run" in page
    assert "1,454.5" not in page and "3,200.0" in page  # fp32's 64 / 0.044 samples/s: no row
    assert (
        "Left out of every speedup, baseline and verdict as disturbed (measured while other "
        "processes used more than 0.1 cores on average (beyond /proc/stat's tick "
        "resolution)): fp32 (1.50 cores)."
    ) in page
    md = (root / "report" / SUMMARY_MD).read_text()
    assert "| other cores |" in md and "| 1.50 disturbed |" in md and "| 0.05 |" in md


def test_include_disturbed_compares_them_and_says_so(tmp_path: Path) -> None:
    root = _issue_case(tmp_path)
    summary = stats.summarize(stats.load(root), include_disturbed=True).set_index("run_id")
    assert not summary["left_out"].any() and summary.loc["fp32", "disturbed"]
    assert summary.loc["qsgd", "speedup_vs_fp32"] == pytest.approx(0.044 / 0.020, rel=1e-9)
    report.write_report(root, fmt=None, include_disturbed=True, figures=False)
    page = (root / "report" / INDEX_MD).read_text()
    assert "the surest gain is allreduce · QSGD 4-bit" in page  # the issue's false headline
    assert "Compared although disturbed (--include-disturbed): fp32 (1.50 cores)" in page


def test_a_disturbed_repeat_leaves_the_clean_ones_as_baseline(tmp_path: Path) -> None:
    root = _issue_case(tmp_path)
    _add(ResultStore(root), "fp32-r1", "fp32", 0.020, other_s=0.0, repeat=1)
    qsgd = stats.summarize(stats.load(root)).set_index("run_id").loc["qsgd"]
    assert qsgd["speedup_vs_fp32"] == pytest.approx(1.0, rel=1e-9)  # over fp32-r1 alone
    both = stats.summarize(stats.load(root), include_disturbed=True).set_index("run_id")
    # over the median of both repeats' samples/s, 64 / 0.044 and 64 / 0.020
    base = (64 / 0.044 + 64 / 0.020) / 2
    assert both.loc["qsgd", "speedup_vs_fp32"] == pytest.approx(64 / 0.020 / base, rel=1e-9)


def test_older_records_load_with_interference_unknown(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    _add(store, "old", "fp32", 0.02, other_s=None)
    record = store.read_record("old")
    assert record is not None
    doc = record.to_dict()
    del doc["interference"]
    doc["schema_version"] = 1  # as qbench wrote it before the field existed
    atomic_write_json(store.run_dir("old") / "run.json", doc)
    summary = stats.summarize(stats.load(tmp_path))
    assert pd.isna(summary.loc[0, "disturbed"]) and pd.isna(summary.loc[0, "other_cores"])
    assert not summary.loc[0, "left_out"]  # unknown is not disturbed
    report.write_report(tmp_path, fmt=None, figures=False)
    assert (
        "1 of 1 ok runs have no record of what else used the machine"
        in (tmp_path / "report" / INDEX_MD).read_text()
    )


def test_report_a_b_leaves_a_disturbed_side_out(tmp_path: Path) -> None:
    a, b = ResultStore(tmp_path / "a"), ResultStore(tmp_path / "b")
    _add(a, "a-fp32", "fp32", 0.020, other_s=0.0)
    _add(b, "b-fp32", "fp32", 0.044, other_s=6.0)  # 2.2x slower, while others used 1.5 cores
    frame = compare.compare(a.root, b.root)
    assert list(frame["verdict"]) == ["disturbed in B"]
    assert (frame.loc[0, "a_disturbed"], frame.loc[0, "b_disturbed"]) == (0, 1)
    assert compare.regressions(frame, 10).empty  # the CI gate does not fail on it
    both = compare.compare(a.root, b.root, include_disturbed=True)
    assert list(both["verdict"]) == ["slower"] and both.loc[0, "ratio"] == pytest.approx(2.2)
    _, md_path, _ = comparison_mod.write_comparison(a.root, b.root, None)
    assert "B: Left out of every speedup, baseline and verdict as disturbed" in md_path.read_text()


def test_the_utility_figure_takes_no_disturbed_baseline() -> None:
    """test_utility's summary (DDP fp32 at 100 samples/s on every link, QSGD at 100 at
    1 Gbit/s) with a second DDP fp32 run at 1 Gbit/s measured at 50 while disturbed: left out,
    QSGD stays at 100 / 100; taken in, the baseline would be the median 75 (1.33x)."""
    from tests.report.plots.test_utility import VOCABULARY, _summary

    table = _summary().assign(left_out=False)
    shaken = table[
        (table["network"] == "1gbit") & (table["scheme"] == "ddp") & (table["compressor"] == "fp32")
    ].assign(samples_per_s=50.0, left_out=True)
    with names.using(VOCABULARY):
        rows = plots_utility.utility_rows(pd.concat([table, shaken], ignore_index=True))
    at_1g = rows[(rows["compressor"] == "qsgd-4b-b512") & (rows["bps"] == 1e9)]["vs_ddp"]
    assert list(at_1g) == [pytest.approx(1.0)]


def test_the_sentences_in_full_from_a_summary() -> None:
    """Unknown flags (None) count as not disturbed and not left out; a failed disturbed run is
    not "compared"; a run with no core count is named without one."""
    from qbench.report import disturbed

    summary = pd.DataFrame({
        "run_id": ["gone", "kept", "quiet", "unknown", "failed", "nocount"],
        "status": ["ok", "ok", "ok", "ok", "failed", "ok"],
        "disturbed": [True, True, False, None, True, True],
        "left_out": [True, False, False, None, False, False],
        "other_cores": [1.314, 0.8, 0.0, None, 2.0, None],
    })  # fmt: skip
    assert disturbed.warnings(summary) == [
        "Left out of every speedup, baseline and verdict as disturbed (measured while other "
        "processes used more than 0.1 cores on average (beyond /proc/stat's tick resolution)): "
        "gone (1.31 cores). `qbench report --include-disturbed` puts them back; `qbench sweep "
        "--rerun-disturbed N` measures them again.",
        "Compared although disturbed (--include-disturbed): kept (0.80 cores), nocount; their "
        "speedups, and those over them as a baseline, may be off.",
    ]
    assert disturbed.unknown_note(summary) == (
        "1 of 5 ok runs have no record of what else used the machine (results of an older "
        "qbench, or no /proc/stat): whether they were disturbed is unknown."
    )
    assert disturbed.runs_text(summary.iloc[:2], prefix="run ") == (
        "run gone (1.31 cores), run kept (0.80 cores)"
    )
    assert disturbed.warnings(summary[summary["run_id"] == "quiet"]) == []
    assert disturbed.unknown_note(summary[summary["run_id"] == "quiet"]) is None
