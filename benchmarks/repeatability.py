"""Run-to-run noise of this machine, the floor under any cost-model error: the same 1-rank
configurations measured in two sweeps (a 1-rank run sends nothing, so the link label does not
matter), the ratio of their median iteration times (each the median over the sweep's repeats).

    .venv/bin/python benchmarks/repeatability.py results/seed002-speed-r3 \
        results/seed002-speed-300mbit-r3
"""

from __future__ import annotations

import sys

import pandas as pd

from qbench.costmodel.inputs import run_table

KEYS = ["workload", "backend", "scheme", "compressor", "batch_size"]


def compare(a: str, b: str) -> pd.DataFrame:
    """Per 1-rank configuration in both: median iteration time in each (s) and b / a - 1."""
    medians = []
    for root in (a, b):
        t = run_table(root)
        t = t[t["world_size"] == 1]
        medians.append(t.groupby(KEYS)["t_iteration"].median())
    both = pd.concat(medians, axis=1, keys=["a_s", "b_s"], join="inner").reset_index()
    both["change"] = both["b_s"] / both["a_s"] - 1
    return both


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: repeatability.py RESULTS_A RESULTS_B", file=sys.stderr)
        return 2
    frame = compare(*argv)
    for r in frame.itertuples(index=False):
        print(f"{r.workload} {r.backend} {r.scheme} {r.compressor}: {1e3 * r.a_s:.3g} ms -> "
              f"{1e3 * r.b_s:.3g} ms ({r.change:+.1%})")  # fmt: skip
    change = frame["change"].abs()
    print(f"{len(frame)} configurations: median |change| {change.median():.1%}, "
          f"max {change.max():.1%}, {(change <= 0.15).sum()} within 15%")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
