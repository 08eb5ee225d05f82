"""Reports and the cost model read parameters from the specs runs record
(``qbench.records.view``), never by parsing labels back (issue 32): no function of
``qbench/report`` or ``qbench/costmodel`` calls a label parser, except the reader of bench JSON,
the only input without a spec.

A label parser here is a call of ``catalog.from_label``, ``catalog.scheme_from_label``, a
``Scheme.parse`` (the cost model's own scheme syntax, removed by issue 32), any ``re``
function, or a compiled regex's ``match`` / ``fullmatch`` / ``search`` / ``findall``, or
``startswith`` / ``endswith`` on something named compressor or scheme, or a pandas string
accessor call that takes a label column apart (``.str.replace``, ``.str.extract``,
``.str.contains``, ``.str.split``, ...: ``STR_PARSERS``) on an expression naming one of
``LABEL_COLUMNS`` (issue 44: ``precision`` read with a ``.str.replace`` regex missed
``fp32+w8+shared-rounding``). ``ALLOWED`` names the exceptions and why; an entry that no longer
parses must be removed."""

from __future__ import annotations

import ast

from tests.calls import callers_in
from tests.paths import PKG

PARSERS = {"from_label", "scheme_from_label"}
STR_PARSERS = {
    "contains", "extract", "extractall", "match", "fullmatch", "findall", "replace", "split",
    "rsplit", "partition", "rpartition", "startswith", "endswith", "removeprefix",
    "removesuffix", "slice", "slice_replace", "get", "find", "rfind", "index", "rindex", "count",
}  # fmt: skip
"""pandas ``Series.str`` methods that read a string's parts (``len``, ``upper``... do not)."""
LABEL_COLUMNS = ("compressor", "scheme", "precision", "network", "run_id", "baseline")
"""Summary columns (``qbench.report.stats``) whose text is a label made of a run's settings."""

ALLOWED = {
    # bench comm JSON rows name compressors and schemes by label only
    ("costmodel/inputs.py", "integer_row"): "bench JSON reader",
    ("costmodel/inputs.py", "bench_scheme"): "bench JSON reader",
    ("costmodel/inputs.py", "bench_compressor"): "bench JSON reader",
    # page text: section anchors and inline code, no labels
    ("report/page/render.py", "slug"): "page text",
    ("report/page/render.py", "_inline"): "page text",
    # strips the marker stats._display_compressor appends, not a part of a recorded label
    ("report/plots/study.py", "_bounds"): "the report's own ' (simulated)' suffix",
}


def _parses_labels(call: ast.Call) -> bool:
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
    if name in PARSERS or name in ("match", "fullmatch", "search", "findall"):  # regexes, too
        return True
    if not isinstance(f, ast.Attribute):
        return False
    if _pandas_str_parser(f):
        return True
    owner = ast.unparse(f.value)
    if owner in ("re", "Scheme"):
        return owner == "re" or name == "parse"
    return name in ("startswith", "endswith") and ("compressor" in owner or "scheme" in owner)


def _pandas_str_parser(f: ast.Attribute) -> bool:
    """``X.str.m(...)``, m in ``STR_PARSERS`` and X naming a label column."""
    accessor = f.value
    if not (isinstance(accessor, ast.Attribute) and accessor.attr == "str"):
        return False
    column = ast.unparse(accessor.value)
    return f.attr in STR_PARSERS and any(name in column for name in LABEL_COLUMNS)


def _all_callers() -> set[tuple[str, str]]:
    paths = [p for stage in ("report", "costmodel") for p in sorted((PKG / stage).rglob("*.py"))]
    return callers_in(paths, _parses_labels)


def test_no_report_or_costmodel_function_parses_labels() -> None:
    extra = _all_callers() - set(ALLOWED)
    assert not extra, f"these parse labels; read the run's spec (qbench.records.view): {extra}"


def test_the_allowed_list_names_only_parsers() -> None:
    stale = set(ALLOWED) - _all_callers()
    assert not stale, f"these no longer parse labels; remove them from ALLOWED: {stale}"


def test_pandas_string_accessors_on_label_columns_are_parsers() -> None:
    def parses(code: str) -> bool:
        call = ast.parse(code).body[0]
        assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
        return _parses_labels(call.value)

    # what report/accuracy.py did before issue 44, and its relatives
    assert parses("""out["precision"].astype(str).str.replace(r"\\+w\\d+$", "", regex=True)""")
    for call in ("contains('qsgd')", "extract(r'(\\d+)b')", "match('fp32')", "split('+')"):
        assert parses(f"summary['compressor'].str.{call}"), call
    assert parses("runs.scheme.str.startswith('gossip')")
    assert parses("frame['run_id'].astype(str).str.partition('-')")
    # string accessors that read no label, and label columns without the accessor
    assert not parses("rows['line'].str.len()")
    assert not parses("rows['model'].str.split('-')")
    assert not parses("out['precision'].astype(str)")
    assert not parses("out['precision'].replace({'fp32': 'full'})")
