"""The two bars issue 46 sets for predicting seed 002's Figure 10 (samples/s on Amazon p2, MPI,
1-16 K80 GPUs), computed from the published table alone (no qbench model):

* "as 32-bit": each QSGD cell predicted as its 32-bit cell;
* "alpha-beta by hand": per GPU count K, two numbers (alpha_K, beta_K) fitted by least squares
  on the six networks' 32-bit rows, time = compute + alpha_K + beta_K * bytes, where compute is
  the per-GPU batch over the 1-GPU throughput and bytes carry one fp32 scale per bucket; no
  codec time.

The inputs are scenarios/paper/published/: seed002-figure10-mpi.csv (Figure 10, transcribed)
and seed002-networks.csv (Figure 3's parameter counts, Figure 4's batch sizes, which are the
global batch: per-GPU compute is batch / K). Run: `.venv/bin/python
benchmarks/seed002_figure10_bars.py`; it prints, over the 96 QSGD cells at 2-16 GPUs, the
median |error|, the cells within 15 % and the worst.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parents[1] / "scenarios" / "paper" / "published"
BITS = {"QSGD 16bit": 16, "QSGD 8bit": 8, "QSGD 4bit": 4, "QSGD 2bit": 2}


def payload_bytes(params: float, precision: str, bucket: str) -> float:
    if precision == "32bit":
        return 4 * params
    return params * BITS[precision] / 8 + 4 * params / int(bucket)


def bars() -> dict[str, list[float]]:
    """Each bar's |error| per QSGD cell at 2-16 GPUs, in the table's order."""
    cells = pd.read_csv(HERE / "seed002-figure10-mpi.csv")
    nets = pd.read_csv(HERE / "seed002-networks.csv").set_index("network")
    fp32 = cells[cells["precision"] == "32bit"].set_index(["network", "gpus"])["samples_per_s"]
    qsgd = cells[cells["precision"].isin(BITS)]

    def batch(net: str, k: int) -> float:
        return float(nets.loc[net, f"batch_{k}"])

    def compute(net: str, k: int) -> float:
        return batch(net, k) / k / fp32[(net, 1)]

    fits = {}
    for k in (2, 4, 8, 16):
        x = [[1.0, payload_bytes(nets.loc[n, "params"], "32bit", "")] for n in nets.index]
        y = [batch(n, k) / fp32[(n, k)] - compute(n, k) for n in nets.index]
        fits[k] = np.linalg.lstsq(np.array(x), np.array(y), rcond=None)[0]

    def by_hand(r: Any) -> float:  # a row of itertuples()
        alpha, beta = fits[r.gpus]
        size = payload_bytes(nets.loc[r.network, "params"], r.precision, r.bucket_size)
        return batch(r.network, r.gpus) / (compute(r.network, r.gpus) + alpha + beta * size)

    out = {}
    for name, predict in (("as 32-bit", lambda r: fp32[(r.network, r.gpus)]),
                          ("alpha-beta by hand", by_hand)):  # fmt: skip
        out[name] = [abs(predict(r) - r.samples_per_s) / r.samples_per_s for r in qsgd.itertuples()]
    return out


def main() -> None:
    for name, errors in bars().items():
        within = sum(e <= 0.15 for e in errors)
        print(f"{name:>20}: {len(errors)} cells, median |error| {statistics.median(errors):.1%}, "
              f"{within} within 15 %, worst {max(errors):.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
