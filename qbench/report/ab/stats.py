"""A/B comparison of two results directories, like ``pytest-benchmark compare``.

Configurations match on their labels (model, dataset, backend, device, scheme, compressor,
world size, nodes, network, batch size), never on run ids: B may come from another commit, machine
or qbench version. Per matching configuration: A's and B's median iteration time and the ratio
B / A (below 1: B is faster), with a 95 % bootstrap interval of the ratio. The change counts as
beyond the noise when that interval excludes 1.

Noise: when both sides have at least two runs of the configuration (``repeats:`` or seeds), the
bootstrap resamples whole runs (their medians), which is the run-to-run noise. Otherwise it
resamples iterations, which is only the noise within one run and says so (``noise`` column).
``a_n`` / ``b_n`` are the samples each side gave (runs or iterations); ``few_runs`` flags a
comparison on fewer than ``intervals.FEW_RUNS`` runs per side. :func:`regressions` is the CI gate
(``qbench report A B --fail-if-slower PCT``). Pure pandas / numpy; reads files through
:mod:`qbench.report.stats` only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from qbench.report import intervals, stats

MATCH = ("model", "dataset", "backend", "device", "scheme", "compressor", "world_size", "nodes",
         "network", "batch_size")  # fmt: skip
COLUMNS = (
    *MATCH, "a_runs", "b_runs", "a_median_s", "b_median_s", "ratio", "ci_low", "ci_high",
    "a_n", "b_n", "noise", "verdict", "few_runs", "a_disturbed", "b_disturbed",
)  # fmt: skip
"""``a_disturbed`` / ``b_disturbed``: runs of the configuration left out because they were
disturbed (``qbench.records.interference``); ``--include-disturbed`` compares them."""


def compare(a: Path | str, b: Path | str, include_disturbed: bool = False) -> pd.DataFrame:
    """One row per configuration present in A or B (``COLUMNS``); unmatched ones say so, and
    so do those whose every run on a side was disturbed (left out unless asked for)."""
    (ta, xa), (tb, xb) = (_sides(stats.load(d), include_disturbed) for d in (a, b))
    keys = list(MATCH)
    groups_a, groups_b = dict(_groups(ta, keys)), dict(_groups(tb, keys))
    left_a, left_b = _counts(xa, keys), _counts(xb, keys)
    rows = []
    found = set(groups_a) | set(groups_b) | set(left_a) | set(left_b)
    for key in sorted(found, key=lambda k: tuple(map(str, k))):
        row = dict(zip(keys, key, strict=True))
        ga, gb = groups_a.get(key), groups_b.get(key)
        both_gone = {"a_runs": 0, "b_runs": 0}  # every run of both sides disturbed
        row.update(both_gone if ga is None and gb is None else _row(ga, gb))
        row.update(a_disturbed=left_a.get(key, 0), b_disturbed=left_b.get(key, 0))
        gone = [s for s, g, n in (("A", groups_a, left_a), ("B", groups_b, left_b))
                if key not in g and n.get(key)]  # fmt: skip
        if gone:  # not "only in A": B ran it, under interference
            row["verdict"] = f"disturbed in {' and '.join(gone)}"
        rows.append(row)
    frame = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in frame.columns:
            frame[col] = np.nan
    return frame[list(COLUMNS)]


def _sides(results: stats.Results, include_disturbed: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per measured iteration of every ok run that is compared: its time (max over ranks) and
    the run's labels; and the runs left out as disturbed (none with ``include_disturbed``).
    Profiled runs are left out too (the profiler slowed them)."""
    per_it = stats.per_iteration(results.iterations)
    runs = results.runs[(results.runs["status"] == "ok") & ~results.runs["profiled"]].copy()
    runs["compressor"] = runs["compressor"].fillna(runs["compressor_name"])
    for col in MATCH:
        if col not in runs.columns:
            runs[col] = "cpu" if col == "device" else (1 if col == "nodes" else np.nan)
    runs["device"] = runs["device"].fillna("cpu")
    runs["nodes"] = runs["nodes"].fillna(1)
    shaken = runs["disturbed"].fillna(False).astype(bool) & (not include_disturbed)
    times = per_it[["run_id", "t_iteration"]].merge(runs.loc[~shaken, ["run_id", *MATCH]],
                                                    on="run_id")  # fmt: skip
    return times, runs[shaken]


def _counts(runs: pd.DataFrame, keys: list[str]) -> dict[tuple[object, ...], int]:
    return {k: g["run_id"].nunique() for k, g in _groups(runs, keys)}


def _groups(t: pd.DataFrame, keys: list[str]) -> list[tuple[tuple[object, ...], pd.DataFrame]]:
    return [
        (k if isinstance(k, tuple) else (k,), g)
        for k, g in t.groupby(keys, dropna=False, sort=False)
    ]


def _row(a: pd.DataFrame | None, b: pd.DataFrame | None) -> dict[str, object]:
    if a is None or b is None:
        only = "A" if b is None else "B"
        present = a if a is not None else b
        assert present is not None
        runs = present["run_id"].nunique()
        return {
            "a_runs": runs if only == "A" else 0, "b_runs": runs if only == "B" else 0,
            "verdict": f"only in {only}",
        }  # fmt: skip
    ma, mb = _run_medians(a), _run_medians(b)
    ratio = float(np.median(mb) / np.median(ma)) if len(ma) > 1 and len(mb) > 1 else None
    if ratio is not None:
        low, high = intervals.bootstrap(ma, mb)
        noise, na, nb = "runs", len(ma), len(mb)
    else:
        ia, ib = a["t_iteration"].to_numpy(float), b["t_iteration"].to_numpy(float)
        ratio = float(np.median(ib) / np.median(ia))
        low, high = intervals.bootstrap(ia, ib)
        noise = "iterations (one run per side: run-to-run noise not measured)"
        na, nb = len(ia), len(ib)
    if low > 1.0:
        verdict = "slower"
    elif high < 1.0:
        verdict = "faster"
    else:
        verdict = "within noise"
    return {
        "a_runs": len(ma), "b_runs": len(mb),
        "a_median_s": float(np.median(a["t_iteration"])),
        "b_median_s": float(np.median(b["t_iteration"])),
        "ratio": ratio, "ci_low": low, "ci_high": high, "a_n": na, "b_n": nb, "noise": noise,
        "verdict": verdict, "few_runs": min(len(ma), len(mb)) < intervals.FEW_RUNS,
    }  # fmt: skip


def _run_medians(g: pd.DataFrame) -> np.ndarray:
    return g.groupby("run_id")["t_iteration"].median().to_numpy(float)


def regressions(frame: pd.DataFrame, percent: float) -> pd.DataFrame:
    """The configurations where B is slower than A by more than ``percent`` % beyond the noise:
    the lower end of the ratio's 95 % interval (B / A time) is above 1 + percent / 100, so even
    the most favourable reading of the noise leaves a slowdown larger than allowed."""
    low = pd.to_numeric(frame["ci_low"], errors="coerce")
    return frame[low > 1.0 + percent / 100.0]


def few_runs(frame: pd.DataFrame) -> int:
    """How many compared configurations rest on fewer than ``FEW_RUNS`` runs per side."""
    matched = frame[frame["ratio"].notna()]
    return int(matched["few_runs"].astype(bool).sum())


_K = intervals.FEW_RUNS
FEW_RUNS_NOTE = (
    f"rest on fewer than {_K} runs per side, so run-to-run noise is barely measured; sweep "
    f"both sides with `repeats: {_K}` (or more seeds) before trusting a small change"
)
