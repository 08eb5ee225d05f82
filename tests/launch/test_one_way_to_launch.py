"""How a run starts is decided in one place (issue 33, "one way to launch"):
``qbench.launch.decision`` picks the launcher (``launch_for`` for a sweep, ``launcher_for`` for
a run) and each launcher (``qbench.launch.launcher.Launcher``) knows its own starts, records and
pre-flight checks. The modules that drive runs only ask the launcher they are given.

A branch on the launcher here is a comparison with, or a condition on, a launcher's ``kind``,
the strings ``local`` / ``slurm``, or a run's ``emulated_hosts`` (which is read nowhere in them:
any use of it decides how a run starts)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import PKG

DRIVERS = ["launch/sweep.py", "launch/group.py", "launch/runfiles.py", "launch/preflight.py",
           "cli/console.py", "api.py"]  # fmt: skip
KINDS = {"local", "slurm"}


def _about_the_launcher(node: ast.AST) -> bool:
    """Whether ``node`` (a condition or a comparison) looks at which launcher starts a run."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == "kind":
            return True
        if isinstance(sub, ast.Constant) and sub.value in KINDS:
            return True
    return False


def _branches(path: Path) -> list[str]:
    """``line: source`` of every launcher branch of the module at ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        tests: list[ast.AST] = []
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
        elif isinstance(node, ast.Compare):
            tests.append(node)
        elif isinstance(node, ast.Attribute) and node.attr in ("emulated_hosts", "emulates_hosts"):
            tests.append(node)
            found.append(f"{node.lineno}: {ast.unparse(node)}")
            continue
        found += [f"{t.lineno}: {ast.unparse(t)}" for t in tests if _about_the_launcher(t)]
    return found


@pytest.mark.parametrize("module", DRIVERS)
def test_drivers_hold_no_branch_on_the_launcher(module: str) -> None:
    found = _branches(PKG / module)
    assert not found, (
        f"{module} decides how runs start at {found}; ask qbench.launch.decision.launcher_for "
        "for the run's launcher and call it (qbench.launch.launcher.Launcher)"
    )


def test_the_check_sees_a_branch() -> None:
    """The rule itself: the decision module branches, so the check must find its branches."""
    found = _branches(PKG / "launch/decision.py")
    assert any("launch.kind == 'slurm'" in f for f in found)
    assert any("spec.placement.network.emulates_hosts" in f for f in found)
