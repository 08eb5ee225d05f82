"""Reports and the cost model read parameters from the specs runs record
(``qbench.records.view``), never by parsing labels back (issue 32): no function of
``qbench/report`` or ``qbench/costmodel`` calls a label parser, except the reader of bench JSON,
the only input without a spec.

A label parser here is a call of ``catalog.from_label``, ``catalog.scheme_from_label``, a
``Scheme.parse`` (the cost model's own scheme syntax, removed by issue 32), any ``re``
function, or a compiled regex's ``match`` / ``fullmatch`` / ``search`` / ``findall``, or
``startswith`` / ``endswith`` on something named compressor or scheme. ``ALLOWED`` names the
exceptions and why; an entry that no longer parses must be removed."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "qbench"
PARSERS = {"from_label", "scheme_from_label"}

ALLOWED = {
    # bench comm JSON rows name compressors and schemes by label only
    ("costmodel/inputs.py", "integer_row"): "bench JSON reader",
    ("costmodel/inputs.py", "bench_scheme"): "bench JSON reader",
    ("costmodel/inputs.py", "bench_compressor"): "bench JSON reader",
    # page text: section anchors and inline code, no labels
    ("report/page_render.py", "slug"): "page text",
    ("report/page_render.py", "_inline"): "page text",
}


def _parses_labels(call: ast.Call) -> bool:
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
    if name in PARSERS or name in ("match", "fullmatch", "search", "findall"):  # regexes, too
        return True
    if not isinstance(f, ast.Attribute):
        return False
    owner = ast.unparse(f.value)
    if owner in ("re", "Scheme"):
        return owner == "re" or name == "parse"
    return name in ("startswith", "endswith") and ("compressor" in owner or "scheme" in owner)


def _callers(path: Path) -> set[str]:
    """Names of the functions (``<module>`` at top level) that call a label parser."""
    found: set[str] = set()

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = child.name
            if isinstance(child, ast.Call) and _parses_labels(child):
                found.add(inner)
            visit(child, inner)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def _all_callers() -> set[tuple[str, str]]:
    return {
        (str(p.relative_to(PKG)), fn)
        for stage in ("report", "costmodel")
        for p in sorted((PKG / stage).glob("*.py"))
        for fn in _callers(p)
    }


def test_no_report_or_costmodel_function_parses_labels() -> None:
    extra = _all_callers() - set(ALLOWED)
    assert not extra, f"these parse labels; read the run's spec (qbench.records.view): {extra}"


def test_the_allowed_list_names_only_parsers() -> None:
    stale = set(ALLOWED) - _all_callers()
    assert not stale, f"these no longer parse labels; remove them from ALLOWED: {stale}"
