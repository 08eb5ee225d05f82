"""95 % intervals of throughput ratios (speedups, scaling, A/B changes), so no headline
overstates what was measured.

A ratio compares two sets of runs: a configuration and its baseline (or B and A). Its point
value is the ratio of their throughputs (samples/s: global batch / median iteration time, median
over the runs of a side). The interval is a percentile bootstrap (``RESAMPLES`` draws, a fixed
seed so the same files always give the same interval):

* with two or more runs on both sides (``repeats:`` or seeds), whole runs are resampled: that is
  run-to-run noise, the noise that matters when someone runs it again;
* otherwise the measured iterations of each side are resampled, which only sees the noise within
  a run and is said so (``unit`` "iterations").

The sample count ``n`` is the smaller side's (runs or iterations). A ratio is beyond the noise
when its interval excludes 1; comparisons on fewer than ``FEW_RUNS`` runs per side are flagged.
Pure numpy / pandas: files only, never torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

RESAMPLES = 2000
SEED = 20261122  # fixed: the same inputs always give the same interval
FEW_RUNS = 3
"""Below this many runs per side a comparison is flagged: run-to-run noise is barely measured."""
RUNS, ITERATIONS = "runs", "iterations"


@dataclass(frozen=True)
class Interval:
    """``ratio`` (numerator over baseline) with its 95 % interval [low, high]."""

    ratio: float
    low: float
    high: float
    n_num: int
    n_base: int
    unit: str
    """``runs`` (run-to-run noise) or ``iterations`` (within-run noise only)."""

    @property
    def n(self) -> int:
        return min(self.n_num, self.n_base)

    @property
    def beyond_noise(self) -> bool:
        return self.low > 1.0 or self.high < 1.0

    @property
    def few_runs(self) -> bool:
        return self.unit != RUNS or self.n < FEW_RUNS

    def samples(self) -> str:
        """``3 vs 3 runs`` or ``20 vs 20 iterations``."""
        return f"{self.n_num} vs {self.n_base} {self.unit}"

    def text(self, unit: str = "x") -> str:
        """``1.52x (95 % CI 1.31-1.70, 3 vs 3 runs)``; inside the noise it says so."""
        noise = "" if self.beyond_noise else ", within noise"
        return (
            f"{self.ratio:.2f}{unit} (95 % CI {self.low:.2f}-{self.high:.2f}, "
            f"{self.samples()}{noise})"
        )


def bootstrap(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """95 % percentile interval of median(b*) / median(a*) over resamples of both sides."""
    rng = np.random.default_rng(SEED)
    ra = np.median(rng.choice(a, size=(RESAMPLES, len(a)), replace=True), axis=1)
    rb = np.median(rng.choice(b, size=(RESAMPLES, len(b)), replace=True), axis=1)
    ratios = rb / ra
    return float(np.quantile(ratios, 0.025)), float(np.quantile(ratios, 0.975))


def ratio_interval(
    num: Sequence[np.ndarray], base: Sequence[np.ndarray], point: float | None = None
) -> Interval | None:
    """The interval of a throughput ratio from per-iteration samples/s, one array per run of
    each side (numerator, baseline); None when a side has no samples. ``point``: the ratio to
    report (default: median of the run medians over each side)."""
    num = [a for a in num if len(a)]
    base = [a for a in base if len(a)]
    if not num or not base:
        return None
    med_num = np.array([np.median(a) for a in num])
    med_base = np.array([np.median(a) for a in base])
    value = float(np.median(med_num) / np.median(med_base)) if point is None else point
    if len(num) > 1 and len(base) > 1:
        low, high = bootstrap(med_base, med_num)
        return Interval(value, low, high, len(num), len(base), RUNS)
    pooled_num, pooled_base = np.concatenate(num), np.concatenate(base)
    low, high = bootstrap(pooled_base, pooled_num)
    return Interval(value, low, high, len(pooled_num), len(pooled_base), ITERATIONS)


class Throughputs:
    """Per-iteration throughput (samples/s) of every run: global batch / iteration time, the
    slowest rank's (``stats.per_iteration``); the raw material of every interval."""

    def __init__(self, per_iteration: pd.DataFrame, global_batch: pd.Series) -> None:
        """``per_iteration``: run_id, t_iteration rows; ``global_batch``: run_id -> samples."""
        self.rows = per_iteration
        """The lock-step runs' ``stats.per_iteration`` rows, kept for whoever else reads them."""
        self._samples: dict[str, np.ndarray] = {}
        for run_id, rows in per_iteration.groupby("run_id", sort=False):
            batch = global_batch.get(run_id, math.nan)
            times = rows["t_iteration"].to_numpy(float)
            times = times[np.isfinite(times) & (times > 0)]
            if pd.notna(batch) and len(times):
                self._samples[str(run_id)] = float(batch) / times

    def ratio(self, num: Iterable[str], base: Iterable[str], point: float | None = None
              ) -> Interval | None:  # fmt: skip
        """The interval of the throughput of runs ``num`` over runs ``base``."""
        return ratio_interval(self._of(num), self._of(base), point)

    def _of(self, run_ids: Iterable[str]) -> list[np.ndarray]:
        return [self._samples[r] for r in run_ids if r in self._samples]


def _key(row: pd.Series | dict[str, object], keys: Sequence[str]) -> tuple[object, ...]:
    """Hashable, NaN-safe key of a row (NaN and None are one missing value)."""
    return tuple(None if pd.isna(row[k]) else row[k] for k in keys)


def columns(
    table: pd.DataFrame, throughputs: Throughputs, prefix: str, *, config: Sequence[str],
    base: pd.DataFrame, row_keys: Sequence[str], base_keys: Sequence[str],
) -> pd.DataFrame:  # fmt: skip
    """``<prefix>_low``, ``_high``, ``_n`` and ``_unit`` for every row of ``table`` whose
    ``prefix`` column holds a ratio: the interval of its configuration (the rows sharing
    ``config``, i.e. its repeats and seeds) over the ``base`` rows whose ``base_keys`` equal the
    row's ``row_keys``."""
    measured = table[table["samples_per_s"].notna()]
    runs_of = _run_ids(measured, config)
    base_of = _run_ids(base, base_keys)
    cache: dict[tuple[object, ...], Interval | None] = {}
    out = pd.DataFrame(index=table.index, columns=[f"{prefix}_{c}" for c in _PARTS])
    for index, row in table[table[prefix].notna()].iterrows():
        mine, theirs = _key(row, config), _key(row, row_keys)
        if (mine, theirs) not in cache:
            cache[(mine, theirs)] = throughputs.ratio(
                runs_of.get(mine, []), base_of.get(theirs, [])
            )
        found = cache[(mine, theirs)]
        if found is not None:
            out.loc[index] = [found.low, found.high, found.n_num, found.n_base, found.unit]
    for part in ("low", "high"):
        out[f"{prefix}_{part}"] = pd.to_numeric(out[f"{prefix}_{part}"], errors="coerce")
    for part in ("n", "n_base"):
        out[f"{prefix}_{part}"] = pd.to_numeric(out[f"{prefix}_{part}"]).astype("Int64")
    return out


_PARTS = ("low", "high", "n", "n_base", "unit")
"""Per ratio column: its interval, the samples of the configuration and of its baseline, and
whether those are runs or iterations."""


def _run_ids(frame: pd.DataFrame, keys: Sequence[str]) -> dict[tuple[object, ...], list[str]]:
    found: dict[tuple[object, ...], list[str]] = {}
    for _, row in frame.iterrows():
        found.setdefault(_key(row, keys), []).append(str(row["run_id"]))
    return found


def of_row(row: pd.Series | dict[str, Any], prefix: str) -> Interval | None:
    """The interval ``columns`` stored for ``prefix`` in a summary row (None when it has none)."""
    values: list[Any] = [row.get(f"{prefix}_{part}") for part in _PARTS]
    value: Any = row.get(prefix)
    if any(v is None or pd.isna(v) for v in (*values, value)):
        return None
    low, high, n, n_base, unit = values
    return Interval(float(value), float(low), float(high), int(n), int(n_base), str(unit))
