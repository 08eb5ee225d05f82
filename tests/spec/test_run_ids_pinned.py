"""Every shipped scenario's run ids and exclusion reasons, pinned (issue 45 item 7).

A run id hashes exactly what the matrix resolves for it, so results on disk stay comparable
only while the same scenario keeps giving the same ids. tests/run_ids.txt holds, for every
scenario under scenarios/ and the embedded default, each run id and each excluded
combination with its reason, as ``qbench sweep --dry-run`` would list them. A change that
moves any of them fails here; when the change is meant (a new scenario, a new axis value),
rewrite the file with ``python -m tests.spec.test_run_ids_pinned`` and say why in the commit.
"""

from __future__ import annotations

import sys

from qbench.spec import matrix, scenario
from tests.paths import TESTS
from tests.shipped_results import DEFAULT, REPO, SHIPPED

PINNED = TESTS / "run_ids.txt"


def expansions() -> list[str]:
    """One line per run id and per exclusion, scenario by scenario (paths from the repo)."""
    lines = []
    for path in (*SHIPPED, DEFAULT):
        name = path.relative_to(REPO).as_posix()
        m = matrix.expand(scenario.loads(path.read_text(), str(path)))
        lines += [f"{name} run {r.run_id}" for r in m.runs]
        lines += [f"{name} excluded {e.description}: {e.reason}" for e in m.excluded]
    return lines


def test_every_shipped_scenario_keeps_its_run_ids_and_reasons() -> None:
    want = PINNED.read_text().splitlines()
    got = expansions()
    assert len(got) == len(want), (len(got), len(want))
    changed = [(w, g) for w, g in zip(want, got, strict=True) if w != g]
    assert changed == [], f"{len(changed)} lines differ, first: {changed[:3]}"


if __name__ == "__main__":
    PINNED.write_text("".join(f"{line}\n" for line in expansions()))
    print(f"wrote {PINNED} ({len(expansions())} lines)", file=sys.stderr)
