"""docs/results/sharded.md's table, from the sharded study (scenarios/paper/sharded.yaml): per
network x method, medians over its repeats of the summary's iteration time, exposed
communication, bytes per rank (all-gather and reduce-scatter apart), the state a rank holds,
the speedup over the best uncompressed configuration and over DDP fp32 with their 95 %
intervals, and the median training loss of the last 5 iterations (over ranks and repeats; a
median, as one batch's loss can spike: fp32's iteration 13 on rank 0, docs/results/sharded.md).

    .venv/bin/python benchmarks/sharded_table.py results/sharded
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from qbench.report import names, stats

COLUMNS = ("network", "method", "iter ms", "comm ms", "MB/iter (AG + RS)", "state MiB",
           "vs best [95 % CI]", "vs DDP fp32 [95 % CI]", "loss, median of last 5")  # fmt: skip


def _late_loss(root: Path, run_ids: list[str]) -> tuple[float, dict[str, float]]:
    """The median loss of the last 5 iterations, and the all-gather / reduce-scatter bytes."""
    frames = [pd.read_parquet(root / r / "iterations.parquet") for r in run_ids]
    rows = pd.concat(frames)
    late = rows[rows["iteration"] >= rows["iteration"].max() - 4]
    split = {c: rows[c].median() for c in ("bytes_allgather", "bytes_reduce_scatter")}
    return float(late["loss"].median()), split


def _ratio(r: pd.DataFrame, prefix: str) -> str:
    mid = r[prefix].median()
    if pd.isna(mid):
        return "-"
    return f"{mid:.2f} [{r[f'{prefix}_low'].median():.2f}, {r[f'{prefix}_high'].median():.2f}]"


def table(root: Path) -> str:
    summary = pd.read_csv(root / "report" / "summary.csv")
    ok = summary[summary["status"] == "ok"]
    stats.load(root)  # reading the records teaches names what each label stands for
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for (net, scheme, comp), r in ok.groupby(["network", "scheme", "compressor"], sort=False):
        loss, split = _late_loss(root, list(r["run_id"]))
        mb = r["bytes_per_iteration"].median() / 1e6
        parts = (
            ""
            if pd.isna(split["bytes_allgather"])
            else (
                f" ({split['bytes_allgather'] / 1e6:.2f} + {split['bytes_reduce_scatter'] / 1e6:.2f})"
            )
        )
        lines.append(
            f"| {net} | {names.method(scheme, comp)} | {r['t_iteration_median'].median() * 1e3:.0f}"
            f" | {r['t_comm'].median() * 1e3:.0f} | {mb:.2f}{parts} | {r['state_mib'].median():.1f}"
            f" | {_ratio(r, 'speedup_vs_best')} | {_ratio(r, 'speedup_vs_fp32')} | {loss:.3f} |"
        )  # fmt: skip
    disturbed = ok["disturbed"].fillna(False).astype(bool)
    lines.append(f"\n{len(ok)} ok runs, {int(disturbed.sum())} disturbed (other cores "
                 f"{ok.loc[disturbed, 'other_cores'].max():.2f} at most; the rest median "
                 f"{ok.loc[~disturbed, 'other_cores'].median():.2f})")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
