"""Seed 002's Figure 10 predicted from what a user knows (issue 46): the numbers
docs/results/validation.md shows are those the named scripts print now, the shipped band is
the one the validation measures, and the command a user runs prints the same summary."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qbench.cluster import calibrate, declared, study, validate
from tests.invoke import qbench
from tests.paths import PROJECTION, ROOT

PAGE = ROOT / "docs" / "results" / "validation.md"
CLUSTER = PROJECTION / "clusters" / "aws-p2-k80.yaml"
STUDY = PROJECTION / "studies" / "seed002-figure10.yaml"
CELLS = ROOT / "scenarios" / "paper" / "published" / "seed002-figure10-mpi.csv"


def _block(name: str) -> str:
    """The page's verbatim output of benchmarks/NAME, between its two markers."""
    text = PAGE.read_text()
    start = text.index(f"<!-- output of benchmarks/{name} -->\n") + len(
        f"<!-- output of benchmarks/{name} -->\n")  # fmt: skip
    return text[start : text.index(f"<!-- end of benchmarks/{name} -->", start)]


@pytest.mark.parametrize("script", ["seed002_validation.py", "h100_projection.py"])
def test_the_page_holds_what_the_scripts_print(script: str) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert _block(script).strip() == out.strip()


def test_the_shipped_band_is_the_validations() -> None:
    cluster, plan = declared.load(CLUSTER), study.load(STUDY)
    rows = validate.table(cluster, plan, CELLS, calibrate.fit(cluster, plan).host)
    want = validate.band(rows, "x")
    shipped = json.loads((PROJECTION / "band-seed002-p2.json").read_text())
    for key in ("cells", "low", "high", "median_abs"):
        assert shipped[key] == pytest.approx(want[key], rel=1e-9), key
    # calibrated on the 24 32-bit cells at 2-16 GPUs, predicted: 96 QSGD + 24 1bitSGD* cells
    assert (rows["role"] == "calibration").sum() == 24 and shipped["cells"] == 120


def test_the_command_prints_the_summary() -> None:
    r = qbench("project", str(CLUSTER), str(STUDY), "--against", str(CELLS), "--format", "csv")
    assert r.returncode == 0, r.stderr
    qsgd = next(line for line in r.stderr.splitlines() if line.startswith("qsgd: "))
    assert qsgd.startswith("qsgd: 96 predicted cells, median |error| ")
    assert qsgd in PAGE.read_text()
    assert len(r.stdout.splitlines()) == 1 + 150  # 6 networks x (5 fp32 + 20 QSGD + 4 1bitSGD*)
