"""`qbench report` of stored results gives the same bytes (issue 45 item 7: nothing a user sees
changes while the code under it is reorganised).

Stored results are made by tests/shipped_results.py for a few shipped scenarios that together
draw every figure kind (breakdown, scalability, speedup, accuracy, pareto, utility); their
report's summary.csv, accuracy.csv, index.md and PNG figures are hashed and compared with
tests/report_bytes.txt. The PDFs and the pages carry a creation time or a provenance line, so
they differ on every run and are not compared. PNG bytes depend on matplotlib: under another
version than the one recorded, the figures are skipped (saying so) and the tables still compared.
The reports are made in a fresh process, as ``qbench report`` makes them: report/names.py keeps
what it learned in module state (issue 45 item 5), so a worker that ran other report tests
first once wrote another index.md.

``python -m tests.test_report_bytes`` rewrites the file; do that only for a change meant to
alter a report, and say so in the commit.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib
import pytest

from qbench import api
from tests import shipped_results
from tests.paths import TESTS

PINNED = TESTS / "report_bytes.txt"
SCENARIOS = (
    "qbench/spec/default.yaml", "scenarios/paper/seed002-speed.yaml",
    "scenarios/paper/seed002-cnn-qsgd.yaml", "scenarios/paper/seed004-mlp-adaptive.yaml",
    "scenarios/paper/utility.yaml", "scenarios/paper/cluster.yaml",
)  # fmt: skip
COMPARED = ("summary.csv", "accuracy.csv", "index.md")
"""Besides every PNG: the report's files whose bytes do not carry a time."""


def report_hashes(root: Path) -> dict[str, str]:
    """``scenario report/file`` -> sha256 of each compared file of each scenario's report."""
    hashes = {}
    for name in SCENARIOS:
        results = shipped_results.write(
            root / name.replace("/", "_"),
            shipped_results.runs(shipped_results.REPO / name, ("seed=0",)),
        )
        report = api.report(results).summary_csv.parent
        for f in sorted(report.iterdir()):
            if f.suffix == ".png" or f.name in COMPARED:
                hashes[f"{name} {f.name}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return hashes


def _pinned() -> tuple[str, dict[str, str]]:
    lines = PINNED.read_text().splitlines()
    version = lines[0].removeprefix("matplotlib ")
    return version, dict(line.rsplit(" ", 1) for line in lines[1:])


def test_report_bytes_are_unchanged_on_stored_results() -> None:
    version, pinned = _pinned()
    made = json.loads(
        subprocess.run(
            [sys.executable, "-m", "tests.test_report_bytes", "--print"],
            cwd=shipped_results.REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    tables = {k: v for k, v in made.items() if not k.endswith(".png")}
    assert tables == {k: v for k, v in pinned.items() if not k.endswith(".png")}
    assert any(k.endswith(".png") for k in made)
    if matplotlib.__version__ != version:
        pytest.skip(f"figures pinned under matplotlib {version}, {matplotlib.__version__} here")
    assert made == pinned


if __name__ == "__main__":  # rewrite the pinned hashes; --print: print them as JSON
    with tempfile.TemporaryDirectory() as tmp:
        made = report_hashes(Path(tmp))
    if sys.argv[1:] == ["--print"]:
        print(json.dumps(made))
        sys.exit(0)
    PINNED.write_text(
        f"matplotlib {matplotlib.__version__}\n" + "".join(f"{k} {v}\n" for k, v in made.items())
    )
    print(f"{PINNED}: {len(made)} files of {len(SCENARIOS)} scenarios' reports", file=sys.stderr)
