"""The README's accuracy tables, from a results directory of an accuracy-mode sweep: per
configuration (runs that differ only by seed), the bits per value actually sent, the final
top-1 of the rank-averaged model (mean +/- std over seeds), the difference to fp32, the median
compute time per iteration, and the final gradient norm for convex models (seed 000).

    .venv/bin/python benchmarks/accuracy_table.py results/seed000-logreg-ps
"""

from __future__ import annotations

import math
import sys

import pandas as pd

from qbench.report import accuracy, stats


def table(root: str) -> str:
    summary = stats.summarize(stats.load(root))
    acc = accuracy.table(summary)
    ok = summary[summary["status"] == "ok"].copy()
    ok["skew"] = ok["skew"].fillna(0.0)
    keys = [k for k in accuracy.CONFIG_KEYS if k in accuracy.TABLE_COLUMNS]
    extra = ok.groupby(keys, dropna=False).agg(
        compute_ms=("t_compute", lambda s: 1e3 * s.median()),
        grad_norm=("final_grad_norm", "mean"), grad_norm_std=("final_grad_norm", "std"),
    )  # fmt: skip
    acc = acc.merge(extra.reset_index(), on=keys, how="left")
    show_model = acc["model"].nunique() > 1
    show_precision = acc["precision"].nunique() > 1
    show_skew = acc["skew"].nunique() > 1
    convex = acc["grad_norm"].notna().any()
    head = [*(["model"] if show_model else []), *(["precision"] if show_precision else [])]
    head += ["scheme", "compressor"]
    head += [*(["skew"] if show_skew else []), "runs", "bits/value sent", "top-1 %"]
    head += ["vs fp32 (pt)", "compute ms/iter", *(["gradient norm"] if convex else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in acc.itertuples(index=False):
        cells = [*([r.model] if show_model else []), *([r.precision] if show_precision else [])]
        cells += [r.scheme, r.compressor]
        cells += [*([f"{r.skew:g}"] if show_skew else []), str(r.runs), f"{r.bits_per_value:.2f}"]
        cells += [f"{100 * r.top1_mean:.2f} ± {100 * r.top1_std:.2f}"]
        diff = "-" if math.isnan(r.diff_vs_fp32) else f"{100 * r.diff_vs_fp32:+.2f}"
        cells += [diff, f"{r.compute_ms:.2f}"]
        if convex:
            std = 0.0 if pd.isna(r.grad_norm_std) else r.grad_norm_std
            cells += [f"{r.grad_norm:.3f} ± {std:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(table(sys.argv[1]))
