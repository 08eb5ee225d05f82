"""Accuracy-mode summaries: pure pandas over ``epochs.parquet`` rows (``records.EPOCH_COLUMNS``).

Per run: final and best top-1 (a language model's: next-token accuracy), final test loss,
perplexity (language models) and gradient norm, and, given a target top-1
accuracy, the training time and iterations until the averaged model first reached it (NaN when
it never did). Per configuration (runs that differ only by seed or repeat): mean and standard
deviation over the runs, the bits per value each sent, and the difference to the fp32 run of
the same model, dataset, scheme family, skew and compute precision (with fp32 weights: a
``weights: {bits: N}`` configuration is compared with the unquantized model). The precision is
read from the runs' typed settings (``compute``, ``norm``, ``weight_bits``, ``rounding``), never
from the ``precision`` label, which is for people.
"""

from __future__ import annotations

import math

import pandas as pd

from qbench.report import precision
from qbench.spec.scenario import ROUNDED_COMPUTE

RUN_METRICS = (
    "epochs_done", "final_top1", "best_top1", "final_top5", "final_test_loss", "final_grad_norm",
    "time_to_target_s", "iters_to_target", "final_perplexity",
)  # fmt: skip
CONFIG_KEYS = [
    "model", "dataset", "backend", "scheme", "compressor", "world_size", "skew", "precision",
]  # fmt: skip
SETTINGS = list(precision.SETTINGS)
"""The typed settings the ``precision`` label is made of."""
BASELINE_KEYS = ["model", "dataset", "family", "skew", "compute", "norm", "base_rounding"]
"""fp32 communication and fp32 weights of the same workload, partition and compute precision."""
TABLE_COLUMNS = (
    *("model", "dataset", "precision", "scheme", "compressor", "skew", "world_size", "runs"),
    *("bits_per_value", "top1_mean", "top1_std", "diff_vs_fp32", "time_to_target_s"),
)


def run_metrics(epochs: pd.DataFrame, targets: pd.Series) -> pd.DataFrame:
    """One row per run_id with ``RUN_METRICS``; ``targets`` maps run_id to its target top-1
    (NaN or missing: no target)."""
    if epochs.empty:
        return pd.DataFrame(columns=["run_id", *RUN_METRICS])
    rows = []
    for run_id, g in epochs.sort_values(["run_id", "epoch"]).groupby("run_id", sort=False):
        last = g.iloc[-1]
        target = targets.get(run_id, math.nan)
        hit = g[g["top1"] >= target] if pd.notna(target) else g.iloc[0:0]
        rows.append({
            "run_id": run_id, "epochs_done": int(last["epoch"]), "final_top1": last["top1"],
            "best_top1": g["top1"].max(), "final_top5": last["top5"],
            "final_test_loss": last["test_loss"], "final_grad_norm": last["grad_norm"],
            "time_to_target_s": hit["train_time_s"].iloc[0] if len(hit) else math.nan,
            "iters_to_target": hit["iteration"].iloc[0] if len(hit) else math.nan,
            "final_perplexity": last["perplexity"],
        })  # fmt: skip
    return pd.DataFrame(rows)


def table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: mean +/- std of the final top-1 over seeds and repeats, bits per value
    actually sent, and the difference of the mean to the matching fp32 configuration."""
    runs = summary[(summary["status"] == "ok") & summary["final_top1"].notna()].copy()
    if runs.empty:
        return pd.DataFrame(columns=list(TABLE_COLUMNS))
    runs["skew"] = runs["skew"].fillna(0.0)
    runs["family"] = runs["scheme"].map(family)
    grouped = runs.groupby([*CONFIG_KEYS, "family", *SETTINGS], dropna=False, sort=False)
    out = grouped.agg(
        runs=("run_id", "count"), bits_per_value=("bits_per_value", "median"),
        top1_mean=("final_top1", "mean"), top1_std=("final_top1", "std"),
        time_to_target_s=("time_to_target_s", "mean"),
    ).reset_index()  # fmt: skip
    out["top1_std"] = out["top1_std"].fillna(0.0)
    # weight quantization (seed 000 section 5.4) is measured against fp32 weights; the draws'
    # setting stays only where the compute itself rounds (a run that rounds nothing records
    # per-rank: qbench.spec.matrix's _rounding)
    rounds = out["compute"].isin(ROUNDED_COMPUTE)
    out["base_rounding"] = out["rounding"].where(rounds, precision.SETTINGS["rounding"])
    full = (out["compressor"] == "fp32") & (out["weight_bits"] == 0)
    fp32 = out[full].set_index(BASELINE_KEYS)
    ref = out.apply(lambda r: _fp32_mean(fp32, r), axis=1)
    out["diff_vs_fp32"] = out["top1_mean"] - ref
    return out[list(TABLE_COLUMNS)]


DECENTRALIZED = ("gossip", "push-sum")


def family(scheme: str) -> str:
    """Schemes whose accuracy compares with the same fp32 baseline: a decentralized scheme
    (gossip, push-sum) against fp32 runs of itself with the same parameters (topology and
    algorithm change what is trained), every centralized scheme against fp32 allreduce."""
    base = str(scheme).split("+")[0]
    return str(scheme) if base in DECENTRALIZED else "centralized"


def _fp32_mean(fp32: pd.DataFrame, row: pd.Series) -> float:
    key = tuple(row[k] for k in BASELINE_KEYS)
    if key not in fp32.index:
        return math.nan
    found = fp32.loc[[key], "top1_mean"]
    return float(found.iloc[0])
