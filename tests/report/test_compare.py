"""`qbench report A B`: per matching configuration the ratio and whether it is beyond noise."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest

from qbench.errors import UserError
from qbench.records.store import ResultStore
from qbench.report.ab import report
from qbench.report.ab import stats as compare
from tests.invoke import qbench
from tests.report.test_report import add_run, labels, rows_for


def make(root: Path, runs: list[tuple[str, str, str, int, float, int]]) -> Path:
    """runs: (run_id, model, compressor, world_size, slowdown, repeat)."""
    store = ResultStore(root)
    for run_id, model, comp, ws, slow, rep in runs:
        add_run(
            store,
            run_id,
            labels(model, comp, ws, repeat=rep),
            rows_for(run_id, model, comp, ws, slow),
        )
    return root


def row(frame: pd.DataFrame, model: str, comp: str, ws: int) -> pd.Series:
    hit = frame[
        (frame["model"] == model) & (frame["compressor"] == comp) & (frame["world_size"] == ws)
    ]
    assert len(hit) == 1, frame
    return hit.iloc[0]


def test_ratio_verdicts_and_unmatched(tmp_path: Path) -> None:
    a = make(tmp_path / "a", [("a1", "mlp", "fp32", 2, 1.0, 0), ("a2", "cnn", "fp32", 2, 1.0, 0),
                              ("a3", "mlp", "qsgd-4b-b512", 2, 1.0, 0)])  # fmt: skip
    b = make(tmp_path / "b", [("b1", "mlp", "fp32", 2, 1.5, 0), ("b2", "cnn", "fp32", 2, 1.0, 0),
                              ("b4", "mlp", "fp32", 4, 1.0, 0)])  # fmt: skip
    frame = compare.compare(a, b)
    slower = row(frame, "mlp", "fp32", 2)
    assert slower["verdict"] == "slower" and 1.3 < slower["ratio"] < 1.6
    assert slower["ci_low"] > 1.0 and slower["noise"].startswith("iterations")
    same = row(frame, "cnn", "fp32", 2)
    assert same["ratio"] == pytest.approx(1.0) and same["verdict"] == "within noise"
    assert row(frame, "mlp", "qsgd-4b-b512", 2)["verdict"] == "only in A"
    assert row(frame, "mlp", "fp32", 4)["verdict"] == "only in B"
    b_faster = compare.compare(b, a)
    assert row(b_faster, "mlp", "fp32", 2)["verdict"] == "faster"


def test_repeats_bootstrap_whole_runs(tmp_path: Path) -> None:
    """Three runs per side whose medians scatter by +-10 %: a 5 % change is within that noise,
    though each run alone is very steady; a 60 % change is not."""
    a = make(
        tmp_path / "a", [(f"a{i}", "mlp", "fp32", 2, s, i) for i, s in enumerate((0.9, 1.0, 1.1))]
    )
    b = make(
        tmp_path / "b",
        [(f"b{i}", "mlp", "fp32", 2, s * 1.05, i) for i, s in enumerate((0.9, 1.0, 1.1))],
    )
    c = make(
        tmp_path / "c",
        [(f"c{i}", "mlp", "fp32", 2, s * 1.6, i) for i, s in enumerate((0.9, 1.0, 1.1))],
    )
    near = row(compare.compare(a, b), "mlp", "fp32", 2)
    assert (near["a_runs"], near["b_runs"], near["noise"]) == (3, 3, "runs")
    assert near["verdict"] == "within noise"
    assert row(compare.compare(a, c), "mlp", "fp32", 2)["verdict"] == "slower"


def test_comparison_files_and_failed_runs(tmp_path: Path) -> None:
    a = make(tmp_path / "a", [("a1", "mlp", "fp32", 2, 1.0, 0)])
    b = make(tmp_path / "b", [("b1", "mlp", "fp32", 2, 1.0, 0)])
    add_run(ResultStore(b), "bad", labels("cnn", "fp32", 2), None, status="failed",
            error="rank 1 of 2 exited with code 1: RuntimeError: boom", exit_code=1)  # fmt: skip
    out = io.StringIO()
    csv_path, md_path, frame = report.write_comparison(a, b, "md", out)
    assert pd.read_csv(csv_path).shape[0] == len(frame) == 1
    text = md_path.read_text()
    assert text == out.getvalue()
    assert "B: bad" in text and "RuntimeError: boom" in text
    with pytest.raises(UserError, match="does not exist"):
        report.write_comparison(a, tmp_path / "nope", None)


def test_cli_compare_and_one_line_error(tmp_path: Path) -> None:
    a = make(tmp_path / "a", [("a1", "mlp", "fp32", 2, 1.0, 0)])
    b = make(tmp_path / "b", [("b1", "mlp", "fp32", 2, 2.0, 0)])
    ok = qbench("report", str(a), str(b), "--format", "csv")
    assert ok.returncode == 0, ok.stderr
    assert "slower" in ok.stdout and "comparison: 1 slower" in ok.stderr
    bad = qbench("report", str(a), str(tmp_path / "x"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr
