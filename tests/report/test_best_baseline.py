"""The headline baseline is the fastest UNCOMPRESSED configuration, 16-bit casts included (issue
35, item 4; Han et al., arXiv 2407.01378): ``speedup_vs_best`` beside the fp32 and flat ratios,
its baseline named in the summary, every table, the page's sentences and the speedup figure.

Speeds by hand, as in tests/report/test_speedups_reference.py (every run: global batch 100, 3 equal
iterations, so samples/s = 100 / t and each interval's bounds are run medians):

    DDP fp32   3 runs: 100, 200, 400   median 200
    DDP bf16   3 runs: 300 each        median 300   (torch's bf16 hook: uncompressed)
    qsgd       3 runs: 450 each
    fp16, simulated-lowprec: 1000      (a speed-only simulation: never a baseline)
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from qbench import catalog
from qbench.records.store import INDEX_MD, ResultStore
from qbench.records.view import RunParts
from qbench.report import names, speedups, stats
from qbench.report import tables as report
from qbench.report.plots import study as plots_study
from tests.report.test_report import add_run, labels, rows_for
from tests.report.test_speedups_reference import DDP, FLAT, QSGD, _add, _col, _run

VOCABULARY = names.Vocabulary()
"""What this file's hand-made labels stand for, as ``stats.load`` learns a results directory's."""


@pytest.fixture(autouse=True)
def _named_by_this_files_vocabulary() -> Iterator[None]:
    with names.using(VOCABULARY):
        yield


BF16 = {"compressor_name": "bf16", "compressor": "bf16"}
FP16 = {"compressor_name": "fp16", "compressor": "fp16"}


def _runs() -> list[dict[str, Any]]:
    rows = [
        *(_run(f"ddp-{i}", s, **DDP) for i, s in ((1, 100), (2, 200), (3, 400))),
        *(_run(f"bf16-{i}", 300, **{**DDP, **BF16}) for i in (1, 2, 3)),
        *(_run(f"q-{i}", 450, scheme="reduce-broadcast", **FLAT, **QSGD) for i in (1, 2, 3)),
        _run("sim", 1000, scheme="simulated-lowprec", **FLAT, **FP16, simulated=True),
    ]
    return [{"left_out": False, "simulated": False, **r} for r in rows]


def test_a_faster_bf16_run_is_the_baseline_of_vs_best() -> None:
    out = _add(_runs())
    assert _col(out, "speedup_vs_best", ["q-1", "bf16-1", "ddp-2"]) == [1.5, 1.0, 200 / 300]
    assert _col(out, "best_baseline", ["q-1", "ddp-1"]) == ["ddp", "ddp"]
    assert _col(out, "best_baseline_compressor", ["q-1", "ddp-1"]) == ["bf16", "bf16"]
    # the fp32 and flat ratios keep their own baselines: DDP fp32 at 200, no flat fp32 here
    assert _col(out, "speedup_vs_fp32", ["q-1", "bf16-1"]) == [2.25, 1.5]
    assert _col(out, "baseline", ["q-1"]) == ["ddp"]
    assert math.isnan(out.loc["q-1", "speedup_vs_flat_fp32"])
    # fp32 and bf16 are uncompressed; qsgd is not, nor a simulation (which ran fastest)
    assert _col(out, "uncompressed", ["ddp-1", "bf16-1", "q-1", "sim"]) == [True, True, False,
                                                                            False]  # fmt: skip


def test_vs_best_has_its_interval_against_the_baseline_runs() -> None:
    q = _add(_runs()).loc["q-1"]
    # 3 runs a side, all at 450 over all at 300: both bounds 1.5
    assert (q["speedup_vs_best_low"], q["speedup_vs_best_high"]) == (1.5, 1.5)
    assert (q["speedup_vs_best_n"], q["speedup_vs_best_n_base"]) == (3, 3)
    assert q["speedup_vs_best_unit"] == "runs"
    assert (q["speedup_vs_fp32_low"], q["speedup_vs_fp32_high"]) == (450 / 400, 4.5)  # unchanged


def test_only_fp32_falls_back_to_fp32() -> None:
    rows = [r for r in _runs() if not r["run_id"].startswith("bf16")]
    out = _add(rows)
    assert _col(out, "speedup_vs_best", ["q-1", "ddp-3"]) == _col(out, "speedup_vs_fp32",
                                                                   ["q-1", "ddp-3"])  # fmt: skip
    assert _col(out, "best_baseline_compressor", ["q-1"]) == ["fp32"]
    assert out.loc["q-1", "speedup_vs_best_low"] == out.loc["q-1", "speedup_vs_fp32_low"]


def test_nothing_uncompressed_gives_no_ratio_and_typed_columns() -> None:
    out = _add([r for r in _runs() if r["run_id"].startswith("q")])
    assert out["speedup_vs_best"].isna().all() and out["best_baseline"].isna().all()
    assert str(out["speedup_vs_best"].dtype) == "float64"
    assert str(out["best_baseline"].dtype) == "object"


def test_the_rule_is_the_catalog_capability_and_the_recorded_scheme() -> None:
    plain = {n for n, e in catalog.COMPRESSORS.items() if e.uncompressed}
    assert plain == {"none", "fp16", "bf16"}  # casts; powersgd, qsgd, topk ... compress
    # a recorded scheme that does not reduce (speed-only) makes even bf16 no baseline
    VOCABULARY.learn({"scheme": "sim-x"}, RunParts(None, catalog.scheme("simulated-lowprec"), None))
    VOCABULARY.learn({"scheme": "ddp-x"}, RunParts(None, catalog.scheme("ddp"), None))
    table = pd.DataFrame({"compressor_name": ["bf16", "bf16", "qsgd", None],
                          "scheme": ["sim-x", "ddp-x", "ddp-x", "ddp-x"]})  # fmt: skip
    assert speedups.uncompressed(table).tolist() == [False, True, False, False]


def test_a_schemes_own_codec_makes_a_run_compressed() -> None:
    """FSDP bf16 is a 16-bit baseline; with a compressed parameter all-gather it is not (nor a
    parameter server whose way down is QSGD); a 16-bit all-gather keeps it a baseline."""
    for key, spec in {
        "fsdp-x": {"name": "fsdp"},
        "fsdp-ag-q": {"name": "fsdp", "all_gather": {"name": "qsgd", "bits": 8}},
        "fsdp-ag-bf16": {"name": "fsdp", "all_gather": "bf16"},
        "ps-down-q": {"name": "parameter-server", "down": {"name": "qsgd", "bits": 8}},
    }.items():
        VOCABULARY.learn({"scheme": key}, RunParts(None, catalog.scheme(spec), None))
    schemes = ["fsdp-x", "fsdp-ag-q", "fsdp-ag-bf16", "ps-down-q"]
    table = pd.DataFrame({"compressor_name": ["bf16", "bf16", "none", "none"], "scheme": schemes})
    assert speedups.uncompressed(table).tolist() == [True, False, True, False]


# -- the report: summary.csv, tables, page, figure ---------------------------------------------
def _results(root: Path, with_bf16: bool = True) -> Path:
    """fp32, bf16 (30 % faster) and QSGD 4-bit (1.21x fp32 on cnn) at 2 ranks, on mlp and cnn
    (two MB/GFLOP ratios for the figure)."""
    store = ResultStore(root)
    for model in ("mlp", "cnn"):
        fp32 = labels(model, "fp32", 2, gflops_per_sample=0.01)
        add_run(store, f"{model}-fp32", fp32, rows_for(f"{model}-fp32", model, "fp32", 2))
        if with_bf16:
            bf16 = {**fp32, **BF16, "bits": 16.0}
            add_run(store, f"{model}-bf16", bf16, rows_for(f"{model}-bf16", model, "fp32", 2, 0.7))
        qsgd = labels(model, "qsgd-4b-b512", 2, gflops_per_sample=0.01)
        add_run(store, f"{model}-q", qsgd, rows_for(f"{model}-q", model, "qsgd-4b-b512", 2))
    return root


def test_summary_csv_has_the_new_columns_and_keeps_the_old(tmp_path: Path) -> None:
    paths = report.write_report(_results(tmp_path), fmt=None, figures=False)
    frame = pd.read_csv(paths.summary_csv).set_index("run_id")
    for column in ("speedup_vs_best", "best_baseline", "best_baseline_compressor", "uncompressed",
                   "speedup_vs_best_low", "speedup_vs_best_n_base", "speedup_vs_fp32",
                   "baseline", "speedup_vs_flat_fp32", "speedup_vs_fp32_low"):  # fmt: skip
        assert column in frame.columns, column
    q = frame.loc["cnn-q"]
    assert (q["best_baseline"], q["best_baseline_compressor"]) == ("allreduce", "bf16")
    assert q["speedup_vs_best"] < 1 < q["speedup_vs_fp32"]  # beats fp32, not bf16
    assert q["speedup_vs_best"] == pytest.approx(
        frame.loc["cnn-q", "samples_per_s"] / frame.loc["cnn-bf16", "samples_per_s"]
    )


def test_tables_name_the_best_baseline(tmp_path: Path) -> None:
    out = io.StringIO()
    paths = report.write_report(_results(tmp_path), fmt="table", out=out, figures=False)
    md = paths.summary_md.read_text()
    assert "| vs best (95% CI; samples) | best uncompressed baseline |" in md
    assert "| allreduce · bf16 |" in md and "`vs best` is the speedup over the fastest" in md
    # one baseline for every row: the terminal names it once, under the table
    assert "best uncompressed baseline: allreduce · bf16; fp32 baseline: allreduce" in (
        " ".join(out.getvalue().split())
    )


def test_page_headline_is_over_the_best_uncompressed_baseline(tmp_path: Path) -> None:
    report.write_report(_results(tmp_path), fmt=None, figures=False)
    speed = (tmp_path / "report" / INDEX_MD).read_text().split("## Does it hurt accuracy?")[0]
    # QSGD beats fp32 (1.21x on cnn) but not bf16: compression does not pay here
    assert "0 are faster than their best uncompressed baseline beyond the noise" in speed
    assert "Compression does not pay here" in speed
    assert "over allreduce · bf16." in speed  # the least slow, and its baseline
    assert "Their best uncompressed baseline is allreduce · bf16." in speed
    assert "Against fp32 alone (vs fp32), 1 of the 2 are faster beyond the noise" in speed
    assert "The fastest 16-bit cast, allreduce · bf16 on cnn" in speed
    assert "| best uncompressed baseline |" in speed and "| fp32 baseline |" in speed
    assert "bf16 on cnn / synthetic, nccl, 2 ranks, unshaped: " not in speed  # no "gain"


def test_page_without_16_bit_says_so(tmp_path: Path) -> None:
    report.write_report(_results(tmp_path, with_bf16=False), fmt=None, figures=False)
    speed = (tmp_path / "report" / INDEX_MD).read_text().split("## Does it hurt accuracy?")[0]
    assert "Their best uncompressed baseline is allreduce · fp32." in speed
    assert "No 16-bit baseline ran here" in speed and "`compressor: bf16`" in speed


def test_speedup_figure_names_its_baseline_and_marks_casts(tmp_path: Path) -> None:
    summary = stats.summarize(stats.load(_results(tmp_path)))
    fig = plots_study.speedup_ratio_figure(summary)
    assert fig is not None
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "1x: fastest fp32 (allreduce)" in texts
    assert "bf16 · nccl · 2 ranks · uncompressed" in texts
    assert "uncompressed baselines" in fig.axes[0].get_title()


def test_no_figures_writes_the_tables_and_page_only(tmp_path: Path) -> None:
    """``qbench report --no-figures`` draws nothing and says so; without it, the same results
    get their figures (png and pdf), so the flag is what leaves them out."""
    from tests.invoke import qbench

    root = _results(tmp_path)
    bare = qbench("report", str(root), "--format", "csv", "--no-figures")
    assert bare.returncode == 0, bare.stderr
    report_dir = root / "report"
    assert sorted(p.name for p in report_dir.glob("*.png")) == []
    assert sorted(p.name for p in report_dir.glob("*.pdf")) == []
    assert (report_dir / "summary.csv").is_file() and (report_dir / INDEX_MD).is_file()
    assert "figures: none (--no-figures)" in " ".join(bare.stderr.split())
    drawn = qbench("report", str(root), "--format", "csv")
    assert drawn.returncode == 0, drawn.stderr
    assert {"breakdown.png", "breakdown.pdf"} <= {p.name for p in report_dir.iterdir()}
    assert "(--no-figures)" not in drawn.stderr
