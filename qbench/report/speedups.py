"""Speedups and their 95 % intervals: which baseline each ratio of a summary divides by.

* ``speedup_vs_fp32`` (reports' ``vs fp32``): samples/s over the FASTEST fp32 configuration
  with the same ``SPEEDUP_KEYS`` (median over its repeats): PyTorch DDP where it ran, which is
  what users train with; ``baseline`` names that configuration's scheme;
* ``speedup_vs_flat_fp32``: over fp32 aggregated after backward (flat allreduce first), the
  seeds' baseline;
* ``scalability``: over the 1-rank run of the same configuration.

Each ratio gets ``<ratio>_low``, ``_high``, ``_n``, ``_n_base`` and ``_unit``: the interval of
its configuration (repeats and seeds together) against the same baseline rows, from
:mod:`qbench.report.intervals`. Pure pandas on a summary table (``stats.summarize`` calls
:func:`add`).
"""

from __future__ import annotations

import math

import pandas as pd

from qbench.report import intervals

RATIOS = ("speedup_vs_fp32", "speedup_vs_flat_fp32", "scalability")
"""Ratio columns that carry a 95 % interval and sample counts (``<ratio>_low`` ...)."""


def add(table: pd.DataFrame, per_it: pd.DataFrame, global_batch: pd.Series) -> pd.DataFrame:
    """``table`` (one row per run with ``samples_per_s``) with every ratio, its baseline and
    its interval; ``per_it``: measured iterations (``stats.per_iteration``)."""
    table = table.copy()
    compared = table["status"] == "ok"  # not profiled runs,
    if "left_out" in table:  # nor disturbed ones the summary leaves out (stats.summarize)
        compared &= ~table["left_out"].astype(bool)
    speed = table["samples_per_s"].where(compared)
    table["samples_per_s"], kept = speed, table["samples_per_s"]
    table["speedup_vs_fp32"], table["baseline"] = _speedup_vs_fp32(table)
    table["speedup_vs_flat_fp32"] = _speedup_vs_flat_fp32(table)
    table["scalability"] = _scalability(table)
    table = _add_intervals(table, per_it, global_batch)
    table["samples_per_s"] = kept
    return table


SPEEDUP_KEYS = ["model", "dataset", "backend", "world_size", "network", "skew", "precision"]
"""A speedup compares runs that differ only in how gradients are communicated."""


def _speedup_vs_fp32(table: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """samples/s over the FASTEST fp32 configuration with the same keys (median over its
    repeats): DDP's bucketed allreduce overlapped with backward where it ran, which is what
    users train with, else the flat allreduce; and that baseline's scheme label."""
    base = table[(table["compressor_name"] == "none") & table["samples_per_s"].notna()]
    by_config = base.groupby([*SPEEDUP_KEYS, "scheme"], dropna=False)["samples_per_s"].median()
    if by_config.empty:
        nan = pd.Series(math.nan, index=table.index, dtype=float)
        return nan, pd.Series(None, index=table.index, dtype=object)
    best = by_config.reset_index().sort_values("samples_per_s", ascending=False)
    best = best.drop_duplicates(SPEEDUP_KEYS).rename(
        columns={"samples_per_s": "_ref", "scheme": "_baseline"}
    )
    matched = table[SPEEDUP_KEYS].merge(best, how="left", on=SPEEDUP_KEYS)
    speedup = table["samples_per_s"] / pd.Series(matched["_ref"].to_numpy(float), table.index)
    return speedup, pd.Series(matched["_baseline"].to_numpy(object), index=table.index)


def _speedup_vs_flat_fp32(table: pd.DataFrame) -> pd.Series:
    """samples/s over fp32 aggregated after backward (flat allreduce, else any flat scheme):
    the baseline of the seeds' studies, kept as its own column."""
    return table["samples_per_s"] / _reference(table, _flat_fp32(table), SPEEDUP_KEYS)


def _flat_fp32(table: pd.DataFrame) -> pd.DataFrame:
    """The rows ``vs flat fp32`` divides by: fp32 after backward, allreduce where it ran."""
    keys = SPEEDUP_KEYS
    base = table[
        (table["compressor_name"] == "none")
        & table["samples_per_s"].notna()
        & (table["overlap"] == "none")
    ]
    not_allreduce = base["scheme"] != "allreduce"  # prefer allreduce, else any scheme
    # dropna=False: a missing key value is a configuration too, as in the other baselines
    fewest = not_allreduce.groupby([base[k] for k in keys], dropna=False).transform("min")
    return base[not_allreduce == fewest]


_SCALE_KEYS = [
    "model",
    "dataset",
    "backend",
    "scheme",
    "compressor",
    "network",
    "skew",
    "precision",
]


def _scalability(table: pd.DataFrame) -> pd.Series:
    base = table[(table["world_size"] == 1) & table["samples_per_s"].notna()]
    return table["samples_per_s"] / _reference(table, base, _SCALE_KEYS)


CONFIG_KEYS = [*SPEEDUP_KEYS, "scheme", "compressor"]
"""One configuration: its repeats and seeds differ in nothing else."""


def _add_intervals(
    table: pd.DataFrame, per_it: pd.DataFrame, global_batch: pd.Series
) -> pd.DataFrame:
    """Each ratio's 95 % interval and sample counts (``qbench.report.intervals``), per
    configuration against the same baseline rows the ratio divides by."""
    batch = pd.Series(global_batch.to_numpy(), index=table["run_id"].astype(str))
    through = intervals.Throughputs(per_it, batch)
    measured = table["samples_per_s"].notna()
    fp32 = table[(table["compressor_name"] == "none") & measured]
    ones = table[(table["world_size"] == 1) & measured]
    found = [
        intervals.columns(table, through, "speedup_vs_fp32", config=CONFIG_KEYS, base=fp32,
                          row_keys=[*SPEEDUP_KEYS, "baseline"],
                          base_keys=[*SPEEDUP_KEYS, "scheme"]),
        intervals.columns(table, through, "speedup_vs_flat_fp32", config=CONFIG_KEYS,
                          base=_flat_fp32(table), row_keys=SPEEDUP_KEYS, base_keys=SPEEDUP_KEYS),
        intervals.columns(table, through, "scalability", config=CONFIG_KEYS, base=ones,
                          row_keys=_SCALE_KEYS, base_keys=_SCALE_KEYS),
    ]  # fmt: skip
    return pd.concat([table, *found], axis=1)


def _reference(table: pd.DataFrame, base: pd.DataFrame, keys: list[str]) -> pd.Series:
    """samples_per_s of the matching baseline row for every row (median over repeats)."""
    ref = base.groupby(keys, dropna=False)["samples_per_s"].median().rename("_ref")
    matched = table[keys].merge(ref, how="left", left_on=keys, right_index=True)
    return pd.Series(matched["_ref"].to_numpy(dtype=float), index=table.index)
