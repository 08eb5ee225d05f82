"""Runs that exchange every H steps (local SGD, DiLoCo) measured per round, not per iteration.

A DiLoCo run with H = 50 spends 49 iterations computing and one exchanging: the median iteration
is an inner step and would hide the exchange entirely, overstating samples/s by up to the whole
communication time. So before any statistic, each complete round of H measured iterations of a
periodic run becomes one row holding its per-step means (times, bytes), and ``bytes_peak`` keeps
the most one iteration of it sent. Medians, intervals and speedups then read rounds; a run of
any other scheme has period 1 and is unchanged. Rounds cut short by the warm-up or the end are
left out: their share of exchanges is not the run's.
"""

from __future__ import annotations

import pandas as pd

PERIOD = "period"
"""Iteration column: the run's inner steps per exchange (1 for every other scheme)."""
PEAK = "bytes_peak"
"""Per-iteration column: the most bytes one iteration of the row's round sent."""


def period(scheme: object) -> int:
    """H of a periodic scheme's spec (``catalog.SchemeSpec``), else 1; None (unreadable): 1."""
    entry = getattr(scheme, "entry", None)
    if entry is None or entry.kind != "periodic":
        return 1
    return int(scheme.params["H"])  # type: ignore[attr-defined]


def present(iterations: pd.DataFrame) -> tuple[str, ...]:
    """(PERIOD,) when the frame has the column (loaded runs), else () (frames made by hand)."""
    return (PERIOD,) if PERIOD in iterations else ()


def collapse(per_it: pd.DataFrame, times: tuple[str, ...], means: tuple[str, ...]) -> pd.DataFrame:
    """``per_it`` (one row per run and iteration) with each periodic run's complete rounds as
    one row: ``times`` and ``means`` averaged over the round, the iteration its first, PEAK the
    round's largest ``bytes_sent``; without PERIOD, every run has period 1."""
    per_it = per_it.assign(**{PEAK: per_it["bytes_sent"]})
    if PERIOD not in per_it:
        return per_it
    periodic = per_it[PERIOD] > 1
    if not periodic.any():
        return per_it.drop(columns=PERIOD)
    rows = per_it[periodic]
    key = [rows["run_id"], rows["iteration"] // rows[PERIOD]]
    spec = {c: (c, "mean") for c in (*times, *means) if c in rows}
    spec.update(iteration=("iteration", "min"), ranks=("ranks", "max"))
    spec.update({PEAK: ("bytes_sent", "max"), "_n": ("iteration", "size"), PERIOD: (PERIOD, "max")})
    grouped = rows.groupby(key, sort=True).agg(**spec).reset_index(level=0)
    whole = grouped[grouped["_n"] == grouped[PERIOD]].drop(columns=["_n"])
    out = pd.concat([per_it[~periodic], whole], ignore_index=True)
    return out.sort_values(["run_id", "iteration"], ignore_index=True).drop(columns=PERIOD)
