"""Summaries of asynchronous parameter-server runs (seed 003's AsyLPG), whose rows are events
(server updates, worker rounds), not lock-step iterations: found by the scheme each run recorded
and summarized into the columns ``qbench.report.stats`` gives every run."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

ASYNC_SCHEME = "async-ps"


def runs(table: pd.DataFrame) -> pd.Series:
    """run_ids of asynchronous parameter-server runs (seed 003), whose rows are not iterations:
    the scheme each recorded (``scheme_name``, from its spec), not its label."""
    return table.loc[table["scheme_name"] == ASYNC_SCHEME, "run_id"]


def metrics(
    iterations: pd.DataFrame, metric_columns: Sequence[str], parts: Sequence[str]
) -> pd.DataFrame:
    """``_run_metrics`` for async-ps, where rows are events, not lock-step iterations: rank 0
    writes one row per model update it applies, each worker one per push-pull round, and row i
    of one rank has nothing to do with row i of another. So: ``iterations`` counts the server's
    updates and samples/s is updates x per-worker batch over the server's busy time; the
    iteration time and its breakdown are a worker's round (median over all workers' rounds);
    bytes per iteration are one update's traffic both ways, a worker's push up plus the server's
    reply down; compression is the pushed gradient's."""
    columns = ["run_id", "iterations", *metric_columns, "_samples_per_s"]
    measured = iterations[~iterations["warmup"].astype(bool)]
    server, workers = measured[measured["rank"] == 0], measured[measured["rank"] != 0]
    if server.empty or workers.empty:
        # typed as the measured frame is, so the summary's metric columns stay float
        return pd.DataFrame(columns=columns).astype(dict.fromkeys(columns[1:], float))
    up = workers.groupby("run_id").agg(
        t_iteration_median=("t_iteration", "median"),
        t_iteration_p95=("t_iteration", lambda s: s.quantile(0.95)),
        **{p: (p, "median") for p in parts},
        _up=("bytes_sent", "median"),
        _grad_bytes=("grad_bytes", "median"),
        _payload_bytes=("payload_bytes", "median"),
    )
    down = server.groupby("run_id").agg(
        iterations=("iteration", "nunique"), _busy=("t_iteration", "sum"),
        _down=("bytes_sent", "mean"),
    )  # fmt: skip
    out = up.join(down, how="inner")
    out["bytes_per_iteration"] = out["_up"] + out["_down"]
    for column in (c for c in metric_columns if c not in out.columns):
        out[column] = math.nan  # bytes per node level: a parameter server has no nodes
    # updates/s; summarize multiplies by the per-worker batch (each update is one worker's batch)
    out["_samples_per_s"] = out["iterations"] / out["_busy"].where(out["_busy"] > 0)
    return out.reset_index()[columns]
