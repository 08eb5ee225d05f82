"""A compressor or scheme spec is parsed where user input or an old record is read, and passed
on typed from there (issue 45): ``catalog.compressor(`` and ``catalog.scheme(`` are called only
by the functions ``PARSE_SITES`` names, each with the input it parses. Anywhere else the
``CompressorSpec`` / ``SchemeSpec`` already made is handed on (``SchemeSpec.codecs`` for a
scheme's own codecs, ``catalog.FP32`` for the uncompressed baseline). An entry that no longer
calls them must be removed."""

from __future__ import annotations

import ast

from tests.calls import callers_in
from tests.paths import PKG

PARSERS = {"compressor", "scheme"}

PARSE_SITES = {
    # the scenario YAML
    ("spec/scenario.py", "_entry"): "scenario YAML: a compressor or scheme entry",
    ("spec/layers.py", "_override"): "scenario YAML: a per-layer override",
    ("spec/matrix.py", "_check"): "scenario YAML: the axes' entries, parsed once for the points",
    ("spec/matrix.py", "_run_spec"): "the canonical scheme a planned point runs",
    # old records and spec.json files
    ("spec/runspec.py", "from_dict"): "spec.json and run.json of any schema",
    ("records/view.py", "run_specs"): "run.json of any schema",
    # the command line and bench's own input
    ("cli/cost/configs.py", "scheme_option"): "qbench cost --scheme",
    ("cli/cost/configs.py", "compressor_info"): "qbench cost --compressor",
    ("bench/comm/__init__.py", "settings"): "bench comm's --scheme / --compressor",
    ("bench/comm/__init__.py", "plan"): "bench comm's JSON settings (its results file keeps them)",
    # a projection's study file (qbench project)
    ("cluster/study.py", "parse"): "a projection study's methods",
    # the Python API: a user's own arguments
    ("compress/__init__.py", "from_spec"): "compress.build / from_spec arguments",
    ("compress/base.py", "__init__"): "a codec's constructor, QSGD(bits=4)",
    ("fsdp/__init__.py", "register"): "fsdp.register(model, name, **params)",
    ("aggregate/__init__.py", "check_params"): "aggregate.build(name, params=...)",
}


def _parses(call: ast.Call) -> bool:
    f = call.func
    return isinstance(f, ast.Attribute) and f.attr in PARSERS and ast.unparse(f.value) == "catalog"


def _all_callers() -> set[tuple[str, str]]:
    paths = [p for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).parts[0] != "catalog"]
    return callers_in(paths, _parses)  # the catalog defines them


def test_specs_are_parsed_only_where_user_input_or_old_records_are_read() -> None:
    extra = _all_callers() - set(PARSE_SITES)
    assert not extra, f"these re-parse a spec; hand on the typed spec instead: {sorted(extra)}"


def test_the_parse_sites_still_parse() -> None:
    stale = set(PARSE_SITES) - _all_callers()
    assert not stale, f"these no longer call catalog.compressor/scheme; remove them: {stale}"
