"""Seed 003's metric for an async-ps results directory: bits through the server until the
training loss (mean of the last WINDOW updates) first falls below THRESHOLD, with the final
top-1 and the staleness of the updates.

    .venv/bin/python benchmarks/async_bits.py results/seed003-asylpg [THRESHOLD] [WINDOW]
"""

from __future__ import annotations

import sys

import pandas as pd

from qbench.records.store import ResultStore
from qbench.run.async_ps.metrics import bits_until_loss


def main(root: str, threshold: float = 0.6, window: int = 100) -> None:
    print(f"| run | Mbit to loss < {threshold:g} | top-1 | updates | staleness mean / max |")
    print("|---|---|---|---|---|")
    store = ResultStore(root)
    for run_id in store.run_ids():
        record = store.read_record(run_id)
        assert record is not None  # run_ids() lists the runs that have a record
        labels = record.labels
        it = pd.read_parquet(store.iterations_path(run_id))
        server = it[it["rank"] == 0]
        reached = bits_until_loss(it, threshold, window=window).iloc[0]
        epochs = store.epochs_path(run_id)
        top1 = pd.read_parquet(epochs)["top1"].iloc[-1] if epochs.exists() else float("nan")
        print(
            f"| {labels['scheme']} {labels['compressor']} | {reached['bits'] / 1e6:.1f} | "
            f"{top1:.3f} | {len(server)} | {server['staleness'].mean():.2f} / "
            f"{server['staleness'].max():.0f} |"
        )


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[0],
        *(float(args[1]),) if len(args) > 1 else (),
        *(int(args[2]),) if len(args) > 2 else (),
    )
