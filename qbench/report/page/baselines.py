"""Baselines in words: the report page's sentences (:mod:`qbench.report.page`) on which
configuration the headline speedups divide by, and fp32 beside it; the notes of the page and of
``summary.md``; the terminal table's caption (``one_each``).

The headline divides by the best uncompressed configuration (``speedup_vs_best``): fp32 or a
plain 16-bit cast, since torch's bf16 hook costs users nothing and a study of gradient
compression must beat it, not only fp32 (Han et al., arXiv 2407.01378). Where a 16-bit cast ran,
the page also says how compression fares against fp32 alone and what the cast itself gains;
where none ran, it says that the comparison lacks it.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from qbench.report import intervals, names
from qbench.report.page import cells

NOTE = (
    "Speedups (vs best) are over the fastest uncompressed configuration of the "
    "same model, ranks, backend and network: fp32 or a plain 16-bit cast such as DDP's bf16 "
    "hook (column best uncompressed baseline), since compression has to beat what 16-bit "
    "communication gives without it (Han et al., arXiv 2407.01378); vs fp32 is over the "
    "fastest fp32 configuration (column fp32 baseline; DDP is PyTorch's "
    "DistributedDataParallel, whose bucketed allreduce overlaps backward, the way users "
    "train); vs flat fp32 is over fp32 aggregated after backward, the baseline of the seed "
    "papers."
)
SUMMARY_NOTE = (
    "`vs best` is the speedup over the fastest uncompressed configuration of the"
    " same model, ranks, backend and network: fp32 or a plain 16-bit cast such as DDP's bf16"
    " hook (`best uncompressed baseline` names it), which a compression study must beat;"
    " `vs fp32` is over the fastest fp32 configuration (`fp32 baseline` names its scheme:"
    " `DDP` is PyTorch DDP, bucketed allreduce overlapped with backward); `vs flat fp32` is"
    " over fp32 aggregated after backward, the seeds' baseline."
)
"""The same for ``summary.md``, whose columns are `vs best`, `vs fp32` and `vs flat fp32`."""
NO_16_BIT = (
    "No 16-bit baseline ran here, so these speedups are over fp32 only; a compression study "
    "should also beat 16-bit communication: add `compressor: bf16` (with `scheme: ddp`, "
    "torch's bf16 hook) to the sweep."
)


def one_each(summary: pd.DataFrame) -> dict[str, str]:
    """The baseline columns (``best_baseline``, ``baseline``) that name one configuration for
    every row with a ratio, each with that name for people (the terminal says it once)."""
    named = {
        "best_baseline": {cells.best_baseline(r) for r in summary.to_dict("records")} - {"-"},
        "baseline": {names.scheme(b) for b in summary["baseline"].dropna()},
    }
    return {column: found.pop() for column, found in named.items() if len(found) == 1}


def sentences(multi: pd.DataFrame, configs: pd.DataFrame) -> list[str]:
    """After the verdict on the compressed multi-rank configurations ``multi``: their
    baselines by name, then fp32 beside them (``configs``: every configuration)."""
    out = [_named(multi)]
    casts = configs[configs["uncompressed"].astype(bool) & (configs["compressor_name"] != "none")]
    casts = casts[(casts["world_size"].fillna(0) > 1) & casts["speedup_vs_fp32"].notna()]
    if casts.empty:
        return [*out, NO_16_BIT]
    return [*out, _against_fp32(multi), _fastest_cast(casts)]


def _named(multi: pd.DataFrame) -> str:
    """``Their baseline is DDP bf16.`` or, by count, ``Their baselines: DDP bf16 (3), ...``."""
    counts = Counter(cells.best_baseline(r) for r in multi.to_dict("records"))
    if len(counts) == 1:
        return f"Their best uncompressed baseline is {next(iter(counts))}."
    listed = ", ".join(f"{name} ({n})" for name, n in counts.most_common())
    return f"Their best uncompressed baselines, by configurations: {listed}."


def _against_fp32(multi: pd.DataFrame) -> str:
    found = [cells.interval(r, "speedup_vs_fp32") for r in multi.to_dict("records")]
    faster = sum(i is not None and i.low > 1 for i in found)
    slower = sum(i is not None and i.high < 1 for i in found)
    return (
        f"Against fp32 alone (vs fp32), {faster} of the {len(found)} are faster beyond the "
        f"noise and {slower} slower beyond it."
    )


def _fastest_cast(casts: pd.DataFrame) -> str:
    top = casts.loc[casts["speedup_vs_fp32"].idxmax()]
    found: intervals.Interval | None = cells.interval(top, "speedup_vs_fp32")
    value = found.text() if found is not None else f"{top['speedup_vs_fp32']:.2f}x"
    over = names.scheme(top["baseline"])
    return f"The fastest 16-bit cast, {cells.describe(top)}, runs at {value} over fp32 ({over})."
