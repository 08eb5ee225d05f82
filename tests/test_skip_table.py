"""docs/testing.md's table of what skips or fails where names every test file that can skip.

A test that skips (``pytest.skip``, ``skipif``, ``importorskip``, or tests/compiled.py's kernel
checks) in a file the table does not name is a skip nobody has documented: what it needs, when
it is missing and the command that brings it. The table names a file by its name alone:
tests/ mirrors qbench/'s sub-packages (docs/testing.md, "Layout"), and no two files of the
suite share a name.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tests.paths import ROOT, TESTS

SECTION = "## What skips or fails where, and why"
SKIP_CALL = re.compile(r"pytest\.skip\(|\.skipif\(|importorskip\(|compiled\.(?:require_|emulator_)")
NAMED = re.compile(r"`(?:tests/)?(\w+\.py)")


def _table_rows() -> list[str]:
    text = (ROOT / "docs" / "testing.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]


def _named() -> set[str]:
    """Files named in the table's first column (the tests)."""
    return {m for row in _table_rows()[1:] for m in NAMED.findall(row.split(" | ")[0])}


def _files() -> dict[str, Path]:
    """The suite's Python files, in tests/ and its sub-folders (not the plug-in example's
    package), by name: the names the table uses, each naming one file."""
    paths = [p for p in TESTS.rglob("*.py") if "plugin_example" not in p.relative_to(TESTS).parts]
    paths = [p for p in paths if p.name != "__init__.py"]
    shared = [name for name, n in Counter(p.name for p in paths).items() if n > 1]
    assert shared == [], f"files of tests/ share a name the table cannot tell apart: {shared}"
    return {p.name: p for p in paths}


def test_every_file_that_skips_is_in_the_table() -> None:
    here = Path(__file__).name
    skipping = {
        name for name, p in _files().items() if name != here and SKIP_CALL.search(p.read_text())
    }
    assert {"test_native.py", "compiled.py", "slurm_cluster.py", "test_data.py"} <= skipping
    assert skipping - _named() == set(), "docs/testing.md: add a row for each"


def test_every_row_says_when_what_happens_and_how_to_run_it() -> None:
    header, *rows = _table_rows()
    assert header == "| tests | when | outcome | to run them |"
    assert len(rows) >= 15  # a gutted table fails
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 4 and all(cells), row
        assert cells[2].split(",")[0].split(":")[0] in ("skip", "fail"), row
    missing = _named() - set(_files())
    assert missing == set(), "docs/testing.md names test files that do not exist"
