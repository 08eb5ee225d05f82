"""Speedups by hand (qbench/report/speedups.py): every ratio, its baseline and its interval on a
small summary table whose answers are worked out in the comments from the module's docstring.

Every run has a global batch of 100 samples (50 on one rank) and the same iteration time in each
of its 3 measured iterations, so its samples/s is 100 / t and its per-iteration throughputs are
that one number. The configurations (model mlp, dataset synthetic, gloo, 2 ranks unless said):

    fp32 DDP        3 runs: 100, 200, 400 samples/s   median 200 (mean 233.3, max 400)
    fp32 allreduce  3 runs: 125, 250, 62.5            median 125 (flat, after backward)
    fp32 reduce-bc  1 run:  160                        flat too, but not allreduce
    qsgd reduce-bc  3 runs: 250 each
    fp32 DDP, profiled: 1000 (measured, never compared)
    fp32 DDP and qsgd, disturbed (``left_out``, stats.summarize): 1000 each, never compared
    fp32 DDP, 1 rank:   3 runs 100, 200, 50  median 100;  qsgd reduce-bc, 1 rank: 200
    qsgd reduce-bc on MPI: 300, no fp32 run there
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from qbench.report import speedups

KEYS = {"model": "mlp", "dataset": "synthetic", "backend": "gloo", "world_size": 2,
        "network": "unshaped", "skew": 0.0, "precision": "fp32"}  # fmt: skip
FP32 = {"compressor_name": "none", "compressor": "fp32"}
QSGD = {"compressor_name": "qsgd", "compressor": "qsgd-4b-b512"}
DDP = {"scheme": "ddp", "overlap": "backward", **FP32}
FLAT = {"overlap": "none"}


def _run(run_id: str, speed: float, batch: float = 100, **fields: Any) -> dict[str, Any]:
    return {"run_id": run_id, "status": "ok", "samples_per_s": speed, "_batch": batch,
            **KEYS, **fields}  # fmt: skip


def _runs() -> list[dict[str, Any]]:
    rows = [
        _run("ddp-1", 100, **DDP),
        _run("ddp-2", 200, **DDP),
        _run("ddp-3", 400, **DDP),
        _run("ddp-profiled", 1000, **DDP, status="profiled"),
        _run("ar-1", 125, scheme="allreduce", **FLAT, **FP32),
        _run("ar-2", 250, scheme="allreduce", **FLAT, **FP32),
        _run("ar-3", 62.5, scheme="allreduce", **FLAT, **FP32),
        _run("rb-fp32", 160, scheme="reduce-broadcast", **FLAT, **FP32),
        *(_run(f"q-{i}", 250, scheme="reduce-broadcast", **FLAT, **QSGD) for i in (1, 2, 3)),
        _run("q-failed", math.nan, scheme="reduce-broadcast", **FLAT, **QSGD, status="failed"),
        _run("ddp-w1-1", 100, 50, **{**DDP, "world_size": 1}),
        _run("ddp-w1-2", 200, 50, **{**DDP, "world_size": 1}),
        _run("ddp-w1-3", 50, 50, **{**DDP, "world_size": 1}),
        _run("q-w1", 200, 50, scheme="reduce-broadcast", **FLAT, **{**QSGD, "world_size": 1}),
        _run("ddp-disturbed", 1000, **DDP, left_out=True),
        _run("q-disturbed", 1000, scheme="reduce-broadcast", **FLAT, **QSGD, left_out=True),
        _run("q-mpi", 300, scheme="reduce-broadcast", **FLAT, **{**QSGD, "backend": "mpi"}),
    ]
    return [{"left_out": False, **r} for r in rows]


def _add(rows: list[dict[str, Any]], index: list[Any] | None = None) -> pd.DataFrame:
    """speedups.add on ``rows`` (``index``: the table's, 0, 1, ... by default) with 3 measured
    iterations of batch / samples_per_s each."""
    table = pd.DataFrame(rows, index=index)
    per_it = pd.DataFrame(
        [{"run_id": r["run_id"], "iteration": i, "t_iteration": r["_batch"] / r["samples_per_s"]}
         for r in rows if r["status"] != "failed" for i in (1, 2, 3)]
    )  # fmt: skip
    out = speedups.add(table.drop(columns="_batch"), per_it, table["_batch"])
    return out.set_index("run_id")


def _col(out: pd.DataFrame, column: str, run_ids: list[str]) -> list[Any]:
    return [out.loc[r, column] for r in run_ids]


def test_vs_fp32_divides_by_the_fastest_fp32_configuration_median() -> None:
    out = _add(_runs())
    # fastest fp32 configuration: DDP at its median 200 (allreduce 125, reduce-broadcast 160);
    # the profiled DDP run at 1000 is not compared, or the median would be 300
    assert _col(out, "speedup_vs_fp32", ["q-1", "q-2", "q-3"]) == [1.25] * 3  # 250 / 200
    assert _col(out, "baseline", ["q-1", "ar-1", "rb-fp32"]) == ["ddp"] * 3
    assert _col(out, "speedup_vs_fp32", ["ddp-1", "ddp-2", "ddp-3"]) == [0.5, 1.0, 2.0]
    assert _col(out, "speedup_vs_fp32", ["ar-1", "rb-fp32"]) == [0.625, 0.8]
    # one rank is another configuration (world_size is a key): DDP 1 rank, median 100
    assert _col(out, "speedup_vs_fp32", ["ddp-w1-1", "q-w1"]) == [1.0, 2.0]
    assert _col(out, "baseline", ["q-w1"]) == ["ddp"]


def test_vs_flat_fp32_prefers_allreduce_after_backward() -> None:
    out = _add(_runs())
    # flat fp32 (overlap none): allreduce, median of 125, 250, 62.5 = 125, not reduce-broadcast
    assert _col(out, "speedup_vs_flat_fp32", ["q-1", "rb-fp32", "ddp-2"]) == [2.0, 1.28, 1.6]
    assert _col(out, "speedup_vs_flat_fp32", ["ar-1", "ar-2", "ar-3"]) == [1.0, 2.0, 0.5]
    # one rank: only DDP ran fp32, which is not flat
    assert math.isnan(out.loc["q-w1", "speedup_vs_flat_fp32"])


def test_scalability_divides_by_the_one_rank_run_of_the_same_configuration() -> None:
    out = _add(_runs())
    assert _col(out, "scalability", ["ddp-1", "ddp-2", "ddp-3"]) == [1.0, 2.0, 4.0]  # / 100
    assert _col(out, "scalability", ["q-1", "q-w1", "ddp-w1-2"]) == [1.25, 1.0, 2.0]
    assert math.isnan(out.loc["ar-1", "scalability"])  # no one-rank allreduce


def test_runs_not_ok_are_measured_but_never_compared() -> None:
    out = _add(_runs())
    assert out.loc["ddp-profiled", "samples_per_s"] == 1000  # kept in the table
    for run_id in ("ddp-profiled", "q-failed"):
        for ratio in speedups.RATIOS:
            assert math.isnan(out.loc[run_id, ratio]), (run_id, ratio)
            assert math.isnan(out.loc[run_id, f"{ratio}_low"]), (run_id, ratio)
    assert math.isnan(out.loc["q-failed", "samples_per_s"])
    # disturbed runs (left out by the summary) likewise; DDP's median would be 300 with its 1000
    assert out.loc["ddp-disturbed", "samples_per_s"] == 1000
    for run_id in ("ddp-disturbed", "q-disturbed"):
        assert all(math.isnan(out.loc[run_id, ratio]) for ratio in speedups.RATIOS), run_id
    assert out.loc["q-1", "speedup_vs_fp32_n"] == 3  # not 4 with q-disturbed


def test_a_configuration_without_fp32_has_no_ratio() -> None:
    out = _add(_runs())
    q = out.loc["q-mpi"]
    assert math.isnan(q["speedup_vs_fp32"]) and pd.isna(q["baseline"])
    assert math.isnan(q["speedup_vs_flat_fp32"]) and math.isnan(q["scalability"])


def test_rows_keep_their_index() -> None:
    # The table's own index, not 0, 1, ...: every ratio lands on its row.
    rows = _runs()
    out = _add(rows, index=[100 + 3 * i for i in range(len(rows))][::-1])
    assert _col(out, "speedup_vs_fp32", ["q-1", "ddp-1", "ar-1", "q-w1"]) == [1.25, 0.5, 0.625, 2.0]
    assert _col(out, "baseline", ["q-1", "ddp-w1-2"]) == ["ddp", "ddp"]
    assert _col(out, "speedup_vs_flat_fp32", ["q-1", "ar-3", "rb-fp32"]) == [2.0, 0.5, 1.28]
    assert _col(out, "scalability", ["ddp-3", "q-1", "ddp-w1-2"]) == [4.0, 1.25, 2.0]


def test_intervals_against_the_same_baseline_rows() -> None:
    out = _add(_runs())
    q = out.loc["q-1"]
    # 3 runs a side: whole runs are resampled. A resample's median is a side's smallest run
    # median with probability 7/27 (at least 2 of 3 draws), so with 2000 draws both 2.5 %
    # tails are pure: 250 / 400 and 250 / 100 against DDP's runs (the profiled one left out).
    assert (q["speedup_vs_fp32_low"], q["speedup_vs_fp32_high"]) == (0.625, 2.5)
    assert (q["speedup_vs_fp32_n"], q["speedup_vs_fp32_n_base"]) == (3, 3)
    assert q["speedup_vs_fp32_unit"] == "runs"
    # flat: allreduce's runs 250 / 250 and 250 / 62.5
    assert (q["speedup_vs_flat_fp32_low"], q["speedup_vs_flat_fp32_high"]) == (1.0, 4.0)
    assert q["speedup_vs_flat_fp32_n_base"] == 3
    # scalability: one run on one rank, so iterations are resampled, 9 against 3, all equal
    assert (q["scalability_low"], q["scalability_high"]) == (1.25, 1.25)
    assert (q["scalability_n"], q["scalability_n_base"], q["scalability_unit"]) == (
        9, 3, "iterations"
    )  # fmt: skip
    # DDP against itself: 100 / 400 and 400 / 100
    ddp = out.loc["ddp-1"]
    assert (ddp["speedup_vs_fp32_low"], ddp["speedup_vs_fp32_high"]) == (0.25, 4.0)


def test_missing_key_values_match_each_other() -> None:
    # A configuration whose network is missing (None) finds its own baseline, 200, and not
    # the fp32 run of another network.
    rows = [
        _run("fp32", 200, scheme="reduce-broadcast", **FLAT, **FP32, network=None),
        _run("q", 400, scheme="reduce-broadcast", **FLAT, **QSGD, network=None),
        _run("other", 100, scheme="reduce-broadcast", **FLAT, **FP32),
    ]
    out = _add(rows)
    assert out.loc["q", "speedup_vs_fp32"] == 2.0 and out.loc["q", "baseline"] == "reduce-broadcast"
    assert out.loc["q", "speedup_vs_flat_fp32"] == 2.0  # no allreduce: any flat scheme
    assert (out.loc["q", "speedup_vs_fp32_low"], out.loc["q", "speedup_vs_fp32_n"]) == (2.0, 3)


def test_no_fp32_anywhere_gives_no_ratio_and_no_baseline() -> None:
    rows = [_run(f"q-{i}", 250, scheme="reduce-broadcast", **FLAT, **QSGD) for i in (1, 2)]
    out = _add(rows)
    assert out["speedup_vs_fp32"].isna().all() and out["baseline"].isna().all()
    # the columns' types whether or not a baseline exists: numbers and scheme names
    assert (str(out["speedup_vs_fp32"].dtype), str(out["baseline"].dtype)) == ("float64", "object")
    assert out["speedup_vs_flat_fp32"].isna().all() and out["scalability"].isna().all()
    assert out["speedup_vs_fp32_low"].isna().all()
    assert out["samples_per_s"].tolist() == [250, 250]


def test_vs_best_compares_only_the_compared_runs_of_its_baseline() -> None:
    # The fastest uncompressed configuration here is fp32 DDP (median 200; allreduce 125,
    # reduce-broadcast 160), so vs best is vs fp32: 250 / 200, and its interval is against the
    # same 3 DDP runs (250 / 400 and 250 / 100); the profiled and the disturbed DDP runs, 1000
    # each and uncompressed too, are not among its baseline rows.
    q = _add(_runs()).loc["q-1"]
    assert q["speedup_vs_best"] == 1.25
    assert (q["best_baseline"], q["best_baseline_compressor"]) == ("ddp", "fp32")
    assert (q["speedup_vs_best_low"], q["speedup_vs_best_high"]) == (0.625, 2.5)
    assert (q["speedup_vs_best_n"], q["speedup_vs_best_n_base"]) == (3, 3)


def test_vs_best_and_uncompressed_keep_the_rows_index() -> None:
    rows = _runs()
    out = _add(rows, index=[100 + 3 * i for i in range(len(rows))][::-1])
    assert _col(out, "speedup_vs_best", ["q-1", "ddp-1", "ar-1", "q-w1"]) == [1.25, 0.5, 0.625, 2.0]
    assert _col(out, "best_baseline", ["q-1", "ddp-w1-2"]) == ["ddp", "ddp"]
    assert _col(out, "best_baseline_compressor", ["q-1", "rb-fp32"]) == ["fp32", "fp32"]
    # fp32 runs are uncompressed baselines, QSGD's are not
    assert _col(out, "uncompressed", ["ddp-1", "ar-2", "rb-fp32", "q-1", "q-mpi"]) == [
        True, True, True, False, False
    ]  # fmt: skip


def test_vs_best_columns_follow_uncompressed_in_order() -> None:
    columns = list(_add(_runs()).columns)
    at = columns.index("uncompressed")
    assert columns[at : at + 4] == [
        "uncompressed", "speedup_vs_best", "best_baseline", "best_baseline_compressor"
    ]  # fmt: skip


def test_vs_best_matches_missing_key_values_with_each_other() -> None:
    # as test_missing_key_values_match_each_other for vs best: the fp32 run of the missing
    # network (200) is the baseline of the QSGD run there (400), not the other network's 100
    rows = [
        _run("fp32", 200, scheme="reduce-broadcast", **FLAT, **FP32, network=None),
        _run("q", 400, scheme="reduce-broadcast", **FLAT, **QSGD, network=None),
        _run("other", 100, scheme="reduce-broadcast", **FLAT, **FP32),
    ]
    q = _add(rows).loc["q"]
    assert q["speedup_vs_best"] == 2.0
    assert (q["best_baseline"], q["best_baseline_compressor"]) == ("reduce-broadcast", "fp32")


def test_of_equally_fast_baselines_vs_best_names_the_first_by_label() -> None:
    # 17 fp32 configurations s00 ... s16, one run each: s11 and s16 are the fastest, 300
    # samples/s both; the first by label, s11, is the baseline (a quicksort's order of equal
    # values is not their order in the table: with these 17 it would put s16 first)
    levels = [0, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 2, 1, 1, 0, 1, 2]
    rows = [_run(f"s{i:02d}", 100.0 * (v + 1), scheme=f"s{i:02d}", **FLAT, **FP32)
            for i, v in enumerate(levels)]  # fmt: skip
    rows.append(_run("q", 600, scheme="reduce-broadcast", **FLAT, **QSGD))
    q = _add([{"left_out": False, **r} for r in rows]).loc["q"]
    assert (q["best_baseline"], q["best_baseline_compressor"], q["speedup_vs_best"]) == (
        "s11", "fp32", 2.0
    )  # fmt: skip


# pandas 3 warns that filling a float column with False will raise in pandas 4; the summary
# never hands uncompressed() one (stats casts ``simulated`` to bool first): a direct caller may
@pytest.mark.filterwarnings("ignore:'bool' is not supported as a fill value")
def test_a_run_whose_simulated_flag_is_missing_is_not_simulated() -> None:
    # a summary of records with and without the flag: NaN where a record has none
    table = pd.DataFrame({"compressor_name": ["none", "none", "none"], "scheme": ["s"] * 3,
                          "simulated": [math.nan, False, True]})  # fmt: skip
    assert speedups.uncompressed(table).tolist() == [True, True, False]
    assert speedups.uncompressed(table.drop(columns="simulated")).tolist() == [True] * 3
    as_numbers = table.assign(simulated=[math.nan, 0.0, 1.0])  # a float column: NaN, 0, 1
    assert speedups.uncompressed(as_numbers).tolist() == [True, True, False]


def test_a_baseline_without_labels_still_gives_label_columns_of_objects() -> None:
    # records whose scheme and compressor labels are all missing: the baseline is found (by
    # compressor_name), its labels are missing values in columns of objects, not of floats
    unlabelled = {"scheme": None, "compressor": None}
    rows = [_run("fp32", 200, **FLAT, **{**FP32, **unlabelled}),
            _run("q", 400, **FLAT, **{**QSGD, **unlabelled})]  # fmt: skip
    out = _add([{"left_out": False, **r} for r in rows])
    assert out.loc["q", "speedup_vs_best"] == 2.0
    assert [str(out[c].dtype) for c in ("best_baseline", "best_baseline_compressor")] == [
        "object", "object"
    ]  # fmt: skip
    assert out["best_baseline"].isna().all() and out["best_baseline_compressor"].isna().all()
