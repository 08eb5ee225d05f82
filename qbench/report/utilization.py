"""Compute utilization against link rate: the curve low-communication training is judged by.

A run's compute utilization is the share of its wall time spent computing: the sum of its
measured iterations' compute over the sum of their times (per round for schemes that exchange
every H steps, ``qbench.report.rounds``; either way the same ratio of sums). Its 95 % interval
is a percentile bootstrap over those rows (iterations or rounds: the within-run noise, said
so). Per method and panel, the link rate needed for 50, 90 or 99 % utilization is read off the
measured rates, interpolated in log rate between the two around it, for the point and for
each end of the interval (a lower utilization needs a faster link). Pure numpy / pandas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from qbench.report import intervals

TARGETS = (0.5, 0.9, 0.99)
RUN_COLUMNS = ("run_id", "utilization", "low", "high", "n", "bytes_mean", "bytes_peak")


def per_run(per_it: pd.DataFrame) -> pd.DataFrame:
    """run_id, utilization, low, high, n (rows resampled), bytes_mean and bytes_peak (per inner
    step) from ``stats.per_iteration`` rows."""
    out = []
    rng = np.random.default_rng(intervals.SEED)
    for run_id, rows in per_it.groupby("run_id", sort=True):
        compute = rows["t_compute"].to_numpy(float)
        wall = rows["t_iteration"].to_numpy(float)
        if not len(wall) or not np.nansum(wall) > 0:
            continue
        draws = rng.integers(0, len(wall), size=(intervals.RESAMPLES, len(wall)))
        ratios = compute[draws].sum(axis=1) / wall[draws].sum(axis=1)
        out.append({
            "run_id": run_id, "utilization": float(compute.sum() / wall.sum()),
            "low": float(np.quantile(ratios, 0.025)), "high": float(np.quantile(ratios, 0.975)),
            "n": len(wall), "bytes_mean": float(rows["bytes_sent"].mean()),
            "bytes_peak": float(rows["bytes_peak"].max()),
        })  # fmt: skip
    return pd.DataFrame(out, columns=list(RUN_COLUMNS))


@dataclass(frozen=True)
class Needed:
    """The link rate (bit/s) reaching ``target`` utilization, with the rates its interval's
    ends reach it at; None where the measured rates do not bracket it."""

    target: float
    rate: float | None
    low: float | None
    high: float | None

    def text(self) -> str:
        """``12.3 Gbit/s (95 % CI 9.1-20 Gbit/s)``; an end beyond the rates measured is ``?``."""
        if self.rate is None:
            return "beyond the rates measured"
        return f"{_gbit(self.rate)} (95 % CI {_gbit(self.low)} to {_gbit(self.high)})"


def _gbit(bps: float | None) -> str:
    return "?" if bps is None else f"{bps / 1e9:.3g} Gbit/s"


def crossing(bps: list[float], values: list[float], target: float) -> float | None:
    """The lowest rate where ``values`` (sorted by rate) first reach ``target``, interpolated in
    log rate; the first rate when it starts there; None when it never does."""
    for i, (b, v) in enumerate(zip(bps, values, strict=True)):
        if v >= target:
            if i == 0:
                return b
            b0, v0 = bps[i - 1], values[i - 1]
            x0, x1 = math.log10(b0), math.log10(b)
            return float(10 ** (x0 + (target - v0) * (x1 - x0) / (v - v0)))
    return None


def needed(points: pd.DataFrame, target: float) -> Needed:
    """From one method's rows (bps, utilization, low, high; shaped links only, one per rate)."""
    shaped = points.dropna(subset=["bps"]).sort_values("bps")
    bps = list(shaped["bps"])
    at = {c: crossing(bps, list(shaped[c]), target) for c in ("utilization", "high", "low")}
    # the interval's high end reaches the target first (the lowest rate), its low end last
    return Needed(target, at["utilization"], at["high"], at["low"])
