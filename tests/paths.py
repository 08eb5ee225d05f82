"""Where the tests find the repository, named once: tests/ mirrors qbench/'s sub-packages, so
how deep a test file sits says nothing about where the repository's root is."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
"""tests/ itself: the support modules, the programs launched by path and the pinned files
(run_ids.txt, report_bytes.txt)."""
ROOT = TESTS.parent
"""The repository: qbench/, scenarios/, docs/, benchmarks/, kernels/."""
PKG = ROOT / "qbench"
PROJECTION = ROOT / "scenarios" / "projection"
"""Declared clusters and projection studies (``qbench project``): YAML, but not sweeps."""


def sweep_scenarios() -> list[Path]:
    """Every shipped sweep scenario: the YAML under scenarios/ but for scenarios/projection/."""
    found = (ROOT / "scenarios").rglob("*.yaml")
    return sorted(p for p in found if PROJECTION not in p.parents)
