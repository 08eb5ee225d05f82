"""The shipped scenarios that tests/test_scenarios_quick.py leaves to this file (split by time,
so that `make test`'s two workers share them): each runs end to end at a tiny scale."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_scenarios_quick import SHIPPED, runs_end_to_end, seeds_0_to_3


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in SHIPPED if not seeds_0_to_3(p)], ids=lambda p: p.stem)
def test_shipped_scenario_runs_end_to_end(path: Path, tmp_path: Path) -> None:
    runs_end_to_end(path, tmp_path)
