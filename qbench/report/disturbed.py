"""Sentences about disturbed runs, the same on the summary, the page and ``report A B``.

A run is disturbed when ``qbench.records.interference.RULE`` holds (the rule and its threshold
live there, nowhere else); ``stats.summarize`` gives every run ``other_cores``, ``disturbed``
(None: not recorded) and ``left_out`` (disturbed and not asked for with
``--include-disturbed``), which these sentences read.
"""

from __future__ import annotations

import pandas as pd

from qbench.records import interference

FIX = (
    "`qbench report --include-disturbed` puts them back; `qbench sweep --rerun-disturbed N` "
    "measures them again"
)


def runs_text(rows: pd.DataFrame, prefix: str = "") -> str:
    """``a (1.31 cores), b (0.80 cores)``: run ids with the other processes' use."""
    return ", ".join(
        f"{prefix}{r}" + ("" if pd.isna(c) else f" ({c:.2f} cores)")
        for r, c in zip(rows["run_id"], rows["other_cores"], strict=True)
    )


def _flag(frame: pd.DataFrame, column: str) -> pd.Series:
    return frame[column].fillna(False).astype(bool)


def warnings(summary: pd.DataFrame) -> list[str]:
    """What the summary left out for interference, or compared although disturbed."""
    out = []
    gone = summary[_flag(summary, "left_out")]
    kept = summary[_flag(summary, "disturbed") & ~_flag(summary, "left_out")
                   & (summary["status"] == "ok")]  # fmt: skip
    if len(gone):
        out.append(
            f"Left out of every speedup, baseline and verdict as disturbed (measured while "
            f"{interference.RULE}): {runs_text(gone)}. {FIX}."
        )
    if len(kept):
        out.append(
            f"Compared although disturbed (--include-disturbed): {runs_text(kept)}; their "
            "speedups, and those over them as a baseline, may be off."
        )
    return out


def unknown_note(summary: pd.DataFrame) -> str | None:
    """How many ok runs have no record of what else used the machine."""
    ok = summary[summary["status"] == "ok"]
    n = int(ok["disturbed"].isna().sum())
    if not n:
        return None
    return (
        f"{n} of {len(ok)} ok runs have no record of what else used the machine (results of "
        "an older qbench, or no /proc/stat): whether they were disturbed is unknown."
    )
