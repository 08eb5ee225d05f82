"""Seed 003's communication metric from async-ps records (pure pandas; reads frames only).

Table 1 of seed 003 reports the "# of transmitted bits until the training loss is first below"
a threshold. The async-ps server writes one row per update it applied (rank 0, non-NaN
``cum_bits``): the bits through the server so far, up and down, and the batch loss of the
worker whose gradient it applied. One batch's loss is noisy, so the loss is first smoothed by a
trailing mean over ``window`` consecutive updates (1: the raw losses).
"""

from __future__ import annotations

import math

import pandas as pd

COLUMNS = ["run_id", "threshold", "window", "update", "bits", "reached"]


def server_updates(iterations: pd.DataFrame) -> pd.DataFrame:
    """The server's update rows (warm-up included: its bits were sent), in update order."""
    rows = iterations[iterations["cum_bits"].notna()]
    return rows.sort_values(["run_id", "iteration"], kind="stable")


def bits_until_loss(iterations: pd.DataFrame, threshold: float, window: int = 1) -> pd.DataFrame:
    """Per run: the first update whose (smoothed) training loss is below ``threshold`` and the
    cumulative bits transmitted when it was applied. Runs that never get there have
    ``reached`` False and NaN ``update`` and ``bits`` (not the total: "not reached" must not
    read as a cost). Runs without server rows (other schemes) are left out."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out = [
        _first_below(run_id, rows, threshold, window)
        for run_id, rows in server_updates(iterations).groupby("run_id", sort=True)
    ]
    return pd.DataFrame(out, columns=COLUMNS)


def _first_below(
    run_id: object, rows: pd.DataFrame, threshold: float, window: int
) -> dict[str, object]:
    smooth = rows["loss"].rolling(window, min_periods=window).mean()
    below = smooth < threshold
    row: dict[str, object] = {"run_id": run_id, "threshold": threshold, "window": window}
    if not below.any():
        return {**row, "update": math.nan, "bits": math.nan, "reached": False}
    first = below.idxmax()  # the label of the first True
    return {
        **row,
        "update": int(rows.at[first, "iteration"]),
        "bits": float(rows.at[first, "cum_bits"]),
        "reached": True,
    }
