"""The report page's "Is 1-bit worth it?" (:mod:`qbench.report.page`): 1-bit against the other
compressors on bytes, speed and accuracy, each speed over its best uncompressed baseline (fp32
or a 16-bit cast, ``speedup_vs_best``) and naming it."""

from __future__ import annotations

import pandas as pd

from qbench.report import names
from qbench.report.page import cells
from qbench.report.page.render import Section


def answer(configs: pd.DataFrame, acc: pd.DataFrame) -> Section:
    """1-bit against the other compressors on the three things that matter: bytes, speed
    and accuracy; the verdict is the comparison, not a threshold chosen here."""
    section = Section("Is 1-bit worth it?", [])
    coded = cells.compressed(configs)
    coded = coded[coded["world_size"].fillna(0) > 1]  # 1 rank: no communication to save
    coded = coded[~coded["simulated"].astype(bool)]  # an upper bound, not a training result
    one = coded[coded["bits"] <= 1]
    if one.empty:
        section.sentences.append("No multi-rank 1-bit run (e.g. `compressor: {name: onebit}`).")
        return section
    best = coded.loc[coded.groupby("compressor")["speedup_vs_best"].idxmax()]
    drops = acc[acc["compressor"] != "fp32"].groupby("compressor")["diff_vs_fp32"].min() * 100
    per = best.assign(
        bits_sent=coded.groupby("compressor")["bits_per_value"].median().reindex(
            best["compressor"]).to_numpy(),
        drop=best["compressor"].map(drops),
        speedup=[cells.ratio_cell("speedup_vs_best")(r) for r in best.to_dict("records")],
        over=[cells.best_baseline(r) for r in best.to_dict("records")],
        name=best["compressor"].map(names.compressor),
    )  # fmt: skip
    section.table = cells.format_table(per, {
        "name": ("compressor", cells.text), "bits_sent": ("bits/value", cells.num(".2f")),
        "speedup": ("fastest vs best (95% CI; samples)", cells.text),
        "over": ("best uncompressed baseline", cells.text), "method": ("where", cells.text),
        "drop": ("worst top-1 diff (pt)", cells.num("+.2f")),
    })  # fmt: skip
    is_one = per["compressor"].isin(one["compressor"])
    section.sentences.append(_one_bit_verdict(per[is_one], per[~is_one]))
    return section


def _one_bit_verdict(one: pd.DataFrame, other: pd.DataFrame) -> str:
    top = one.loc[one["speedup_vs_best"].idxmax()]
    text = f"{top['name']} sends {top['bits_sent']:.2f} bits per value and reaches "
    text += _speedup_text(top)
    if other.empty:
        return text + "; no other compressor was run to compare with."
    rival = other.loc[other["speedup_vs_best"].idxmax()]
    text += f", against {_speedup_text(rival)} for {rival['name']} "
    text += f"({rival['bits_sent']:.2f} bits per value)"
    if pd.notna(top["drop"]) and pd.notna(rival["drop"]):
        text += f"; worst top-1 change {top['drop']:+.2f} vs {rival['drop']:+.2f} points"
    return text + "."


def _speedup_text(row: pd.Series) -> str:
    """``1.52x (95 % CI ...) over DDP bf16``: the speedup and the baseline it divides by."""
    found = cells.interval(row, "speedup_vs_best")
    value = found.text() if found is not None else f"{row['speedup_vs_best']:.2f}x"
    return f"{value} over {cells.best_baseline(row)}"
