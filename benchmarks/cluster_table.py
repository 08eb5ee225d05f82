"""docs/results/cluster.md's table, from a reported cluster study (scenarios/paper/cluster.yaml):
per model x network x method, the medians over its repeats of the summary's iteration time,
exposed communication, bytes per rank (both levels and between nodes) and the speedup over DDP
fp32 with its 95 % interval.

    .venv/bin/python benchmarks/cluster_table.py results/cluster/report/summary.csv
"""

from __future__ import annotations

import sys

import pandas as pd

COLUMNS = ("model", "network", "scheme", "compressor", "iter ms", "comm ms", "MB/iter",
           "MB between nodes", "vs DDP fp32 [95 % CI]")  # fmt: skip


def table(summary: pd.DataFrame) -> str:
    ok = summary[summary["status"] == "ok"]
    keys = ["model", "network", "scheme", "compressor"]
    g = ok.groupby(keys, sort=False).agg(
        iter_s=("t_iteration_median", "median"), comm_s=("t_comm", "median"),
        mb=("bytes_per_iteration", "median"), inter=("bytes_inter_per_iteration", "median"),
        vs=("speedup_vs_fp32", "median"), lo=("speedup_vs_fp32_low", "median"),
        hi=("speedup_vs_fp32_high", "median"),
    )  # fmt: skip
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for (model, net, scheme, comp), r in g.iterrows():
        inter = "-" if pd.isna(r.inter) else f"{r.inter / 2**20:.3f}"
        vs = "-" if pd.isna(r.vs) else f"{r.vs:.2f} [{r.lo:.2f}, {r.hi:.2f}]"
        lines.append(f"| {model} | {net} | {scheme} | {comp} | {r.iter_s * 1e3:.1f} | "
                     f"{r.comm_s * 1e3:.1f} | {r.mb / 2**20:.3f} | {inter} | {vs} |")  # fmt: skip
    disturbed = ok["disturbed"].fillna(False).astype(bool)
    lines.append(f"\n{len(ok)} ok runs, {int(disturbed.sum())} disturbed (median other cores "
                 f"{ok.loc[disturbed, 'other_cores'].median():.2f} vs "
                 f"{ok.loc[~disturbed, 'other_cores'].median():.2f})")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(pd.read_csv(sys.argv[1])))
