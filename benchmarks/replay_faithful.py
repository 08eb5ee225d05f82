"""Is replayed compute faithful? docs/results/replay.md's table, from a results directory that
holds the same configurations with ``compute: fp32`` and ``compute: replay`` (for instance
benchmarks/replay-faithful.yaml): per configuration, the medians over its repeats of the
iteration time and of each part of the breakdown, real and replayed, and the ratio replayed /
real of the iteration time with its 95 % bootstrap interval over the repeats' medians
(``qbench.report.intervals``). "agrees" when the interval holds 1.

    .venv/bin/python benchmarks/replay_faithful.py results/replay-faithful
    .venv/bin/python benchmarks/replay_faithful.py A B   # pairs made of two directories:
                                                         # A's runs against B's (dilation)
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from qbench.report import intervals, stats

KEYS = ["model", "backend", "world_size", "network", "scheme", "compressor"]
PARTS = ("t_compute", "t_encode", "t_comm", "t_decode", "t_step")


def run_medians(root: str) -> pd.DataFrame:
    """One row per ok run: its labels and the medians over measured iterations (the slowest
    rank's iteration time, the ranks' mean parts: ``stats.per_iteration``)."""
    results = stats.load(root)
    summary = stats.summarize(results, include_disturbed=True)
    per_it = stats.per_iteration(results.iterations)
    med = per_it.groupby("run_id")[["t_iteration", *PARTS]].median().reset_index()
    ok = summary[summary["status"] == "ok"][[*KEYS, "run_id", "precision", "disturbed"]]
    return ok.merge(med, on="run_id")


def table(base: pd.DataFrame, other: pd.DataFrame, names: tuple[str, str], how: str) -> str:
    """Markdown: per configuration, ``other`` against ``base``."""
    head = ["model", "scheme", "compressor", f"iter ms {names[0]}", f"iter ms {names[1]}",
            f"{names[1]} / {names[0]} [95 % CI]", "agrees", "compute ms", "comm ms"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    agree = total = 0
    for key, a in base.groupby(KEYS, sort=False):
        b = other[(other[KEYS] == pd.Series(key, index=KEYS)).all(axis=1)]
        if b.empty:
            continue
        ta, tb = a["t_iteration"].to_numpy(float), b["t_iteration"].to_numpy(float)
        ratio = float(np.median(tb) / np.median(ta))
        low, high = intervals.bootstrap(ta, tb) if len(ta) > 1 and len(tb) > 1 else (ratio,) * 2
        inside = low <= 1.0 <= high
        agree, total = agree + inside, total + 1
        parts = [f"{a[p].median() * 1e3:.1f} / {b[p].median() * 1e3:.1f}"
                 for p in ("t_compute", "t_comm")]  # fmt: skip
        model, _, _, _, scheme, comp = key
        lines.append(f"| {model} | {scheme} | {comp} | {np.median(ta) * 1e3:.1f} | "
                     f"{np.median(tb) * 1e3:.1f} | {ratio:.2f} [{low:.2f}, {high:.2f}] | "
                     f"{'yes' if inside else 'no'} | {parts[0]} | {parts[1]} |")  # fmt: skip
    runs = pd.concat([base, other])
    lines.append(f"\n{agree} of {total} configurations agree (interval holds 1); {len(runs)} "
                 f"runs, {int(runs['disturbed'].fillna(False).astype(bool).sum())} flagged "
                 f"disturbed (kept: {how})")  # fmt: skip
    return "\n".join(lines)


def main(args: list[str]) -> None:
    if len(args) == 1:
        runs = run_medians(args[0])
        real, replayed = runs[runs["precision"] == "fp32"], runs[runs["precision"] == "replay"]
        print(table(real, replayed, ("real", "replayed"), "both sides ran interleaved"))
    else:
        how = "A's sweep ran before B's"
        print(table(run_medians(args[0]), run_medians(args[1]), ("A", "B"), how))


if __name__ == "__main__":
    main(sys.argv[1:])
