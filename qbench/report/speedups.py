"""Speedups and their 95 % intervals: which baseline each ratio of a summary divides by.

* ``speedup_vs_best`` (reports' ``vs best``, the page's headline): samples/s over the
  FASTEST uncompressed configuration with the same ``SPEEDUP_KEYS`` (median over its repeats):
  fp32 or a plain 16-bit cast (DDP's bf16 hook, say), whatever :func:`uncompressed` accepts,
  since a compression study must beat 16-bit communication too (Han et al., arXiv
  2407.01378); ``best_baseline`` and ``best_baseline_compressor`` name it (scheme, compressor);
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

from qbench import catalog
from qbench.report import intervals, names

RATIOS = ("speedup_vs_fp32", "speedup_vs_flat_fp32", "scalability", "speedup_vs_best")
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
    table["uncompressed"] = uncompressed(table)
    best = _speedup_vs_best(table)
    table[best.columns] = best
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


BEST_NAMES = ["best_baseline", "best_baseline_compressor"]
"""The configuration ``speedup_vs_best`` divides by: its scheme and compressor labels."""
BEST_COLUMNS = ("speedup_vs_best", *BEST_NAMES, "uncompressed")
"""What :func:`add` writes for ``speedup_vs_best``; ``uncompressed``: whether a row can be a
baseline of it."""


def uncompressed(table: pd.DataFrame) -> pd.Series:
    """Which rows are uncompressed baselines: the one rule ``speedup_vs_best``, the page and
    the figures read (through the summary's ``uncompressed`` column). A speed-only simulation
    never is one: it moves the bytes without reducing, so nobody trains with it."""
    simulated = table["simulated"] if "simulated" in table else pd.Series(False, table.index)
    rows = zip(table["compressor_name"], table["scheme"], strict=True)
    plain = [_is_uncompressed(c, names.scheme_spec(s)) for c, s in rows]
    return pd.Series(plain, index=table.index, dtype=bool) & ~simulated.fillna(False).astype(bool)


def _is_uncompressed(compressor_name: object, scheme: catalog.SchemeSpec | None) -> bool:
    """A run whose compressor is a plain cast (the catalog entry's ``uncompressed``: fp32,
    fp16, bf16) and whose scheme, as the run recorded it (None: a record without its spec),
    reduces the gradient in it."""
    entry = catalog.COMPRESSORS.get(compressor_name) if isinstance(compressor_name, str) else None
    if entry is None or not entry.uncompressed:
        return False
    if scheme is None:
        return True
    # a scheme's own codec (fsdp's parameter all-gather, a parameter server's way down) that
    # is not a plain cast makes the run compressed, whatever the gradient's compressor
    coded = any(not c.entry.uncompressed for c in scheme.codecs.values())
    return scheme.entry.reduces and not coded


def _speedup_vs_best(table: pd.DataFrame) -> pd.DataFrame:
    """``speedup_vs_best`` and ``BEST_NAMES``: samples/s over the FASTEST uncompressed
    configuration with the same keys (median over its repeats), and its labels."""
    base = table[table["uncompressed"] & table["samples_per_s"].notna()]
    config = ["scheme", "compressor"]
    ref = base.groupby([*SPEEDUP_KEYS, *config], dropna=False)["samples_per_s"].median()
    best = ref.reset_index().sort_values("samples_per_s", ascending=False, kind="stable")
    best = best.drop_duplicates(SPEEDUP_KEYS).rename(
        columns={"samples_per_s": "_ref", **dict(zip(config, BEST_NAMES, strict=True))}
    )
    matched = table[SPEEDUP_KEYS].merge(best, how="left", on=SPEEDUP_KEYS)
    out = pd.DataFrame({c: matched[c].to_numpy(object) for c in BEST_NAMES}, index=table.index)
    out.insert(0, "speedup_vs_best", table["samples_per_s"] / matched["_ref"].to_numpy(float))
    return out


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
        intervals.columns(table, through, "speedup_vs_best", config=CONFIG_KEYS,
                          base=table[table["uncompressed"] & measured],
                          row_keys=[*SPEEDUP_KEYS, *BEST_NAMES],
                          base_keys=[*SPEEDUP_KEYS, "scheme", "compressor"]),
    ]  # fmt: skip
    return pd.concat([table, *found], axis=1)


def _reference(table: pd.DataFrame, base: pd.DataFrame, keys: list[str]) -> pd.Series:
    """samples_per_s of the matching baseline row for every row (median over repeats)."""
    ref = base.groupby(keys, dropna=False)["samples_per_s"].median().rename("_ref")
    matched = table[keys].merge(ref, how="left", left_on=keys, right_index=True)
    return pd.Series(matched["_ref"].to_numpy(dtype=float), index=table.index)
