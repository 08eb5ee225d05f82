"""Rooms small enough to live in (issue 45 item 6), beside tests/test_architecture.py's folder
and line caps: imports at the top of a module, where a reader looks for them; no lazy module
attributes in the communicators and the DDP hooks; no file-name prefix families standing in
for a sub-package; tests/ laid out as qbench/ is."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from tests.paths import PKG, TESTS

MAX_LOCAL_IMPORTS = 59
"""Imports inside functions: each says why it is there (torch or an optional library loaded
only when needed, or a cycle a planner must not close)."""


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _local_imports(path: Path) -> int:
    """Import statements inside a function (at any depth), each counted once."""

    def count(node: ast.AST, inside: bool) -> int:
        here = inside and isinstance(node, ast.Import | ast.ImportFrom)
        inner = inside or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        return here + sum(count(child, inner) for child in ast.iter_child_nodes(node))

    return count(ast.parse(path.read_text()), False)


def test_fewer_than_60_function_local_imports() -> None:
    counts = Counter({str(p.relative_to(PKG)): n for p in _modules() if (n := _local_imports(p))})
    total = sum(counts.values())
    assert total <= MAX_LOCAL_IMPORTS, f"{total} imports inside functions: {counts.most_common(8)}"


def test_the_counter_sees_nested_imports() -> None:
    code = "import a\ndef f():\n    import b\n    def g():\n        from c import d\n"
    path = Path(__file__).with_name("_rooms_probe.py")
    try:
        path.write_text(code)
        assert _local_imports(path) == 2  # b in f, d in g; a is the module's
    finally:
        path.unlink()


def test_comm_and_ddp_have_no_module_getattr() -> None:
    paths = [p for stage in ("comm", "ddp") for p in sorted((PKG / stage).rglob("*.py"))]
    lazy = [
        str(p.relative_to(PKG)) for p in paths
        if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__"
               for n in ast.parse(p.read_text()).body)
    ]  # fmt: skip
    assert lazy == [], "import the names at the top; a module-level __getattr__ hides them"


def test_no_folder_splits_a_concept_into_prefixed_files() -> None:
    families = []
    for folder in sorted({p.parent for p in _modules()}):
        stems = {p.stem for p in folder.glob("*.py")} - {"__init__", "__main__"}
        for stem in sorted(stems):
            kin = sorted(s for s in stems if s.startswith(stem + "_"))
            if kin:
                families.append(f"{folder.relative_to(PKG)}: {stem} + {', '.join(kin)}")
    assert families == [], "make each family a sub-package named after its concept"


def test_tests_mirror_the_package_layout() -> None:
    """A test file sits in the folder of the qbench package it tests (tests/spec/ for
    qbench/spec/); tests of the whole project in tests/ itself; at most 15 in a folder."""
    folders = {p.parent for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts}
    strays = [str(f.relative_to(TESTS)) for f in folders
              if f != TESTS and not (PKG / f.relative_to(TESTS)).is_dir()]  # fmt: skip
    assert strays == [], "name each tests/ folder after the qbench package its tests test"
    crowded = {str(f.relative_to(TESTS)): n for f in folders
               if (n := len(list(f.glob("test_*.py")))) > 15}  # fmt: skip
    assert crowded == {}, "split a crowded tests/ folder by the sub-package its tests test"
