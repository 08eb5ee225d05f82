"""Who calls what, read from the source (no import): the guards that keep a kind of call to
named places (tests/test_no_label_parsing.py, tests/test_catalog_parse_sites.py)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.paths import PKG


def callers(path: Path, wanted: Callable[[ast.Call], bool]) -> set[str]:
    """Names of the functions (``<module>`` at top level) in ``path`` that make a ``wanted``
    call; a nested function counts under its own name."""
    found: set[str] = set()

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name
            if isinstance(child, ast.Call) and wanted(child):
                found.add(inner)
            visit(child, inner)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def callers_in(paths: Iterable[Path], wanted: Callable[[ast.Call], bool]) -> set[tuple[str, str]]:
    """(module path under qbench/, function) of every ``wanted`` call in ``paths``."""
    return {(str(p.relative_to(PKG)), fn) for p in paths for fn in callers(p, wanted)}
