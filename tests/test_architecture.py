"""The package's shape, as docs/architecture.md describes it, checked so that it cannot drift.

* Data flows one way: a module imports only packages of its own stage or earlier ones
  (``STAGES``), function-level imports included.
* The planner (catalog, spec) and the readers of results (report, cost model) never import
  torch; ``qbench sweep --dry-run`` runs without it.
* No module imports another's private names; no two modules import each other, directly or
  through others (function-level imports too).
* docs/architecture.md's import table lists what each package imports.
* No module is over 400 lines without saying why at its top ("Why one module:").
* No folder holds more than 15 modules (``__init__.py`` counted): a crowded one gets
  sub-packages named after their concept, not file-name prefixes.
* README's layout section is the one ``layout()`` generates from the packages' docstrings.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import PKG, ROOT

STAGES: dict[str, int] = {
    # shared foundations
    "errors": 0, "timing": 1, "catalog": 1,
    # scenario -> run matrix (no torch)
    "spec": 2,
    # files on disk: written by launchers and ranks, read by reports
    "records": 3,
    # libraries a rank uses (torch)
    "compress": 4, "comm": 4, "models": 4, "data": 5, "aggregate": 6, "ddp": 7,
    "fsdp": 7,
    # matrix -> processes; then one rank's side
    "launch": 8, "run": 9,
    # files -> answers
    "report": 10, "costmodel": 11,
    # declared clusters -> projections checked against published numbers
    "cluster": 11,
    # tools, the command line and the Python API on top of it
    "bench": 12, "cli": 13, "api": 14,
}  # fmt: skip


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _stage(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def _qbench_imports(path: Path) -> set[str]:
    """Top-level qbench packages a module imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "qbench":
                if len(parts) > 1:
                    found.add(parts[1])
                else:  # from qbench import x
                    found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "qbench" and len(parts) > 1:
                    found.add(parts[1])
    return found


def test_every_top_level_entry_has_a_stage() -> None:
    entries = {p.name.removesuffix(".py") for p in PKG.iterdir() if p.suffix == ".py" or (
        p.is_dir() and (p / "__init__.py").exists())} - {"__init__"}  # fmt: skip
    assert entries == set(STAGES)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_to_earlier_stages(path: Path) -> None:
    if path.relative_to(PKG) == Path("__init__.py"):
        return  # the public API may reach every stage
    own = STAGES[_stage(path)]
    later = {m for m in _qbench_imports(path) if m in STAGES and STAGES[m] > own}
    assert not later, f"{path.relative_to(ROOT)} ({_stage(path)}) imports later stages {later}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _module_imports(path: Path) -> set[str]:
    """qbench modules a module imports, anywhere in it: ``from qbench.a import b`` names the
    module ``qbench.a.b`` where there is one, else ``qbench.a`` (b is a name defined there)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "qbench":
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    found.add(sub if _is_module(sub) else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "qbench")
    return found


def import_cycles() -> list[list[str]]:
    """Each set of qbench modules that import each other (directly or through others)."""
    graph = {_module_name(p): _module_imports(p) for p in _modules()}
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            m = todo.pop()
            if m in graph and m not in seen:
                seen.add(m)
                todo.extend(graph[m])
        reach[start] = seen
    cycles = {tuple(sorted(m for m in reach[s] if s in reach[m])) for s in graph if s in reach[s]}
    return sorted(list(c) for c in cycles)


def test_no_import_cycles() -> None:
    """A circle makes import order matter and hides which module is upstream (issue 32 broke
    the last three: the catalog's tables and its plug-in loader, the scenario and its checks,
    the comm bench and its tables)."""
    cycles = import_cycles()
    assert cycles == [], "modules that import each other:\n" + "\n".join(map(str, cycles))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_no_module_imports_private_names(path: Path) -> None:
    """What another module needs of a module is public: a private name stays free to change."""
    private = [
        f"{node.module}.{a.name}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("qbench")
        for a in node.names
        if a.name.startswith("_") and not a.name.startswith("__")
    ]
    assert not private, f"{path.relative_to(ROOT)} imports private names {private}"


def package_imports() -> dict[str, list[str]]:
    """Each top-level entry's imports of other entries, in stage order; ``errors`` (which every
    stage may raise) left out. qbench/__init__.py, the public API's re-exports, is not a stage."""
    found: dict[str, set[str]] = {name: set() for name in STAGES}
    for path in _modules():
        if path.relative_to(PKG) != Path("__init__.py"):
            found[_stage(path)] |= _qbench_imports(path) & set(STAGES)
    return {
        name: sorted(imports - {name, "errors"}, key=lambda n: (STAGES[n], n))
        for name, imports in found.items()
    }


def _import_table() -> dict[str, list[str]]:
    """docs/architecture.md's "Who owns what": package -> its "imports" cell, split."""
    rows = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0] != "package":
            name = cells[0].strip("`").removesuffix("/").removesuffix(".py")
            rows[name] = [] if cells[2] == "nothing" else [
                c.strip().strip("`") for c in cells[2].split(",")]  # fmt: skip
    return rows


def test_architecture_import_table_matches_the_code() -> None:
    want = {n: i for n, i in package_imports().items() if n not in ("errors", "timing")}
    cells = {n: ", ".join(f"`{m}`" for m in i) or "nothing" for n, i in want.items()}
    assert _import_table() == want, "docs/architecture.md's imports column should read:\n" + (
        "\n".join(f"{n}: {c}" for n, c in cells.items())
    )


def _loads_torch(code: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print('torch' in sys.modules)"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return out.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize(
    "modules",
    ["qbench.catalog, qbench.spec.rules, qbench.spec.matrix, qbench.spec.scenario",
     "qbench.report.tables, qbench.report.stats, qbench.report.page, qbench.report.ab.stats",
     "qbench.costmodel, qbench.cli.cost", "qbench.launch.sweep, qbench.records.store",
     "qbench.cluster.table, qbench.cluster.calibrate, qbench.cli.project"],
)  # fmt: skip
def test_planners_and_readers_do_not_import_torch(modules: str) -> None:
    assert not _loads_torch(f"import {modules}")


def test_dry_run_does_not_import_torch() -> None:
    code = (
        "import sys\nsys.argv = ['qbench', 'sweep', '--dry-run']\nfrom qbench.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )
    assert not _loads_torch(code)


def test_help_imports_no_command_module() -> None:
    """``qbench --help`` lists the commands from ``qbench.cli.COMMANDS`` (click's lazy
    subcommands), importing none of their modules, nor pandas or torch: it starts fast."""
    code = (
        "import sys\nsys.argv = ['qbench', '--help']\nfrom qbench.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('qbench.cli.', 'pandas', 'torch'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip().splitlines()[-1] == "['qbench.cli.tools']"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_long_modules_say_why(path: Path) -> None:
    lines = path.read_text().splitlines()
    if len(lines) > 400:
        assert any("Why one module:" in line for line in lines[:30]), (
            f"{path.relative_to(ROOT)} has {len(lines)} lines: split it or say why at its top"
        )


MAX_MODULES = 15


def test_no_folder_holds_more_than_15_modules() -> None:
    crowded = {
        str(d.relative_to(ROOT)): n
        for d in [PKG, *(p for p in PKG.rglob("*") if p.is_dir())]
        if "__pycache__" not in d.parts and (n := len(list(d.glob("*.py")))) > MAX_MODULES
    }
    assert crowded == {}, "split these into sub-packages named after their concepts"


def layout() -> str:
    """README's layout: one line per top-level entry, in stage order, from its docstring."""
    rows = []
    for name in sorted(STAGES, key=lambda n: (STAGES[n], n)):
        path = PKG / name / "__init__.py" if (PKG / name).is_dir() else PKG / f"{name}.py"
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")
        shown = f"{name}/" if (PKG / name).is_dir() else f"{name}.py"
        rows.append(f"  {shown:<12} {first}")
    return "qbench/\n" + "\n".join(rows)


def test_readme_layout_is_generated() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```", 2)[1].strip("\n")
    assert block == layout(), (
        "README's layout is stale; paste tests.test_architecture.layout():\n" + layout()
    )
