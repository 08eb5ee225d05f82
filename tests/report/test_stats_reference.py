"""qbench.report.stats against values written out by hand: the label columns a run gets from
its run.json (defaults for older files included), the dollar columns, the sort order, and one
two-rank run summarized number by number. Each expected value is computed here from the
definition in the module's docstrings, never by calling the function under test."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from qbench.records.schema import RunRecord, epochs_frame, iterations_frame
from qbench.records.store import ResultStore
from qbench.report import precision, stats
from qbench.spec.parts import Replay


def _write(store: ResultStore, run_id: str, labels: dict[str, Any], rows: list | None,
           **record: Any) -> None:  # fmt: skip
    status = record.pop("status", "ok")
    store.write_record(RunRecord(run_id=run_id, status=status, labels=labels,
                                 spec=record.pop("spec", {}), **record))  # fmt: skip
    if rows is not None:
        store.write_iterations(run_id, iterations_frame(rows))


def _epoch(run_id: str, epoch: int, **values: float) -> dict[str, Any]:
    row: dict[str, Any] = {"run_id": run_id, "epoch": epoch, "iteration": 10 * epoch}
    return {**row, "bytes_sent": 100 * epoch, **values}


def _rows(run_id: str, times: dict[int, list[float]], **extra: Any) -> list[dict[str, Any]]:
    """times[rank] = t_iteration of iterations 0, 1, ...; iteration 0 is the warm-up."""
    out = []
    for rank, series in times.items():
        for it, t in enumerate(series):
            row = {"run_id": run_id, "rank": rank, "iteration": it, "warmup": it == 0}
            row.update(t_iteration=t, t_compute=t / 2, t_encode=0.0, t_comm=t / 4)
            row.update(t_decode=0.0, t_step=0.001 * (rank + 1), loss=1.0 + rank)
            row.update(bytes_sent=1000 + 10 * rank, payload_bytes=500, grad_bytes=4000)
            out.append({**row, **extra})
    return out


BASE = {"model": "mlp", "dataset": "synthetic", "backend": "gloo", "scheme": "allreduce",
        "compressor": "qsgd-4b", "compressor_name": "qsgd", "bits": 4, "world_size": 2,
        "batch_size": 8, "network": "unshaped", "seed": 0, "repeat": 0}  # fmt: skip


# -- labels of a run -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("compute", "norm", "weight_bits", "rounding", "label"),
    [
        (None, None, None, None, "fp32"),  # recorded before the axes existed
        ("int8", None, None, None, "int8"),
        ("bf16", "range-evonorm", None, None, "bf16+range-evonorm"),
        (None, "batchnorm", 8, None, "fp32+w8"),
        ("fp32", "groupnorm", "6", None, "fp32+groupnorm+w6"),
        ("fp32", None, 0, None, "fp32"),
        ("fp32", None, "n/a", None, "fp32"),  # not a number: no weight quantization recorded
        ("int8", "range-evonorm", None, "shared", "int8+range-evonorm+shared-rounding"),
        ("int8", None, 8, "per-rank", "int8+w8"),  # the default is not labelled
    ],
)
def test_precision_label(
    compute: Any, norm: Any, weight_bits: Any, rounding: Any, label: str
) -> None:
    runs = pd.DataFrame(
        {"compute": [compute], "norm": [norm], "weight_bits": [weight_bits],
         "rounding": [rounding]}
    )  # fmt: skip
    assert precision.label(runs).tolist() == [label]


@pytest.mark.parametrize(
    ("value", "truthy"),
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        ("true", True),
        (" Yes ", True),
        ("1", True),
        ("TRUE", True),
        ("no", False),
        ("false", False),
        ("", False),
        (None, False),
        (1.0, False),
        ("2", False),
    ],
)
def test_truthy(value: Any, truthy: bool) -> None:
    assert stats._truthy(value) is truthy


def test_as_int_keeps_fractions_and_missing() -> None:
    whole = stats._as_int(pd.Series([1, None, "3"]))
    assert str(whole.dtype) == "Int64"
    assert whole.tolist()[0] == 1 and whole.tolist()[2] == 3 and whole.isna().tolist()[1]
    fraction = stats._as_int(pd.Series([1.5, 2]))
    assert fraction.tolist() == [1.5, 2.0] and str(fraction.dtype) == "float64"
    garbled = stats._as_int(pd.Series([2, "n/a"]))  # a hand-edited run.json: unknown, not fatal
    assert str(garbled.dtype) == "Int64" and garbled.tolist()[0] == 2 and garbled.isna()[1]


def test_record_row_machine_cores_provenance_and_profile() -> None:
    labels = {"model": "mlp", "status": "ok", "run_id": "other", "profiled": False}
    record = RunRecord(
        run_id="x",
        status="failed",
        labels=labels,
        spec={"profile": True},
        error="boom",
        exit_code=3,
        git_commit="abc",
        machine={"cores": 4},
    )
    row = stats._record_row("dir-name", record, Replay())
    assert row == {
        "model": "mlp",
        "run_id": "dir-name",
        "status": "failed",
        "error": "boom",
        "exit_code": 3,
        "host_cores": 4,
        "git_commit": "abc",
        "profiled": True,
        "dilation": 1.0,  # the clock's: a spec without compute replay runs on the real clock
        "other_cores": None,  # no interference recorded: unknown, not quiet
        "disturbed": None,
        "peak_rss_mib": None,  # no memory recorded (schema before 3): unknown
        "peak_gpu_mib": None,
        "state_mib": None,
        "peak_ranks": None,
    }
    cases: tuple[tuple[Any, int | None], ...] = (
        ({"cores": 0}, None),
        ({"cores": 1}, 1),
        ({"cores": "4"}, None),
        ([], None),
        ({}, None),
    )
    for machine, cores in cases:
        plain = RunRecord(run_id="x", status="ok", labels={}, spec=[], machine=machine)  # type: ignore[arg-type]
        row = stats._record_row("x", plain, Replay())
        assert row["host_cores"] is cores and row["profiled"] is False
    labelled = RunRecord(run_id="x", status="ok", labels={"profiled": True}, spec={})
    assert stats._record_row("x", labelled, Replay())["profiled"] is True


def test_runs_frame_defaults_for_older_records() -> None:
    runs = stats._runs_frame([
        {"run_id": "a", "status": "ok", "bits": "4", "simulated": "yes", "nodes": None,
         "exit_code": 0.0, "price_per_hour": "2.5", "custom": "kept", "skew": "unknown",
         "gflops_per_sample": "n/a", "target_accuracy": "0.9"},
        {"run_id": "b", "status": "ok", "bits": "n/a", "skew": 0.5, "profiled": True, "nodes": 2},
    ])  # fmt: skip
    assert list(runs.columns[: len(stats.RUN_COLUMNS)]) == list(stats.RUN_COLUMNS)
    assert "custom" in runs.columns and runs["custom"].tolist()[0] == "kept"
    assert runs["skew"].tolist() == [0.0, 0.5]  # older runs: IID
    assert runs["nodes"].tolist() == [1, 2]  # older runs: one host
    assert runs["simulated"].tolist() == [True, False]
    assert runs["profiled"].tolist() == [False, True]
    assert runs["bits"].tolist()[0] == 4.0 and math.isnan(runs["bits"].tolist()[1])
    assert runs["precision"].tolist() == ["fp32", "fp32"]
    assert runs["price_per_hour"].tolist()[0] == 2.5 and str(runs["exit_code"].dtype) == "Int64"
    assert math.isnan(runs["gflops_per_sample"].tolist()[0])  # not a number: unknown
    assert runs["target_accuracy"].tolist()[0] == 0.9
    assert runs["model"].isna().all()  # a label no run has is still a column


def test_runs_frame_dilation_and_disturbed_by_hand() -> None:
    runs = stats._runs_frame([
        {"run_id": "a", "dilation": "10", "disturbed": True},
        {"run_id": "b", "dilation": "x"},  # unreadable: the real clock
        {"run_id": "c", "disturbed": False},  # before dilation existed
    ])  # fmt: skip
    assert runs["dilation"].tolist() == [10.0, 1.0, 1.0]
    assert str(runs["disturbed"].dtype) == "boolean"
    assert runs["disturbed"].tolist()[0] is True and runs["disturbed"].tolist()[2] is False
    assert runs["disturbed"].isna().tolist() == [False, True, False]  # <NA>: not recorded


def test_undilated_divides_by_any_factor_but_one() -> None:
    frame = pd.DataFrame({"t_comm": [4.0], "t_iteration": [8.0], "bytes_sent": [100]})
    halved = stats._undilated(frame.copy(), Replay(dilation=2.0))
    assert halved.to_dict("list") == {"t_comm": [2.0], "t_iteration": [4.0], "bytes_sent": [100]}
    assert stats._undilated(frame.copy(), Replay()).equals(frame)


def test_codec_overrun_share_by_hand() -> None:
    """Per run, over its measured rank-iterations with a recorded overrun count: the share with
    at least one overrun (warm-up and rows without the count left out)."""
    iterations = pd.DataFrame({
        "run_id": ["r"] * 6 + ["s"],
        "warmup": [True, False, False, False, False, False, False],
        "codec_overrun": [3, 0, 2, math.nan, 1, 0, 1],
    })  # fmt: skip
    got = stats._codec_overrun_share(iterations)
    assert got.to_dict() == {"r": pytest.approx(2 / 4), "s": 1.0}


def test_skipped_steps_of_a_one_iteration_run() -> None:
    iterations = pd.DataFrame({"run_id": ["a", "b"], "iteration": [0, 0], "skipped": [1, 0]})
    lock = stats._skipped_steps(iterations, pd.Series([False, False]))
    assert lock.to_dict() == {"a": 1, "b": 0}
    events = stats._skipped_steps(iterations, pd.Series([True, True]))
    assert events.to_dict() == {"a": 1, "b": 0}


# -- dollars, batch, display -------------------------------------------------------------------
def test_money_columns_by_hand() -> None:
    table = pd.DataFrame({
        "run_id": ["a", "b", "c", "d"], "price_per_hour": [3.6, 3.6, math.nan, 7.2],
        "nodes": [2, 1, 1, 1], "t_iteration_median": [0.5, 2.0, 1.0, 1.0],
        "epochs_done": [2, 0, 1, 1], "time_to_target_s": [100.0, math.nan, 5.0, math.nan],
    })  # fmt: skip
    epochs = epochs_frame([_epoch("a", 2, train_time_s=30.0), _epoch("a", 1, train_time_s=10.0),
                           _epoch("b", 1, train_time_s=7.0),
                           _epoch("d", 1, train_time_s=50.0)])  # fmt: skip
    out = stats._add_money(table, epochs)
    # a: 3.6 $/h x 2 machines = 0.002 $/s; 0.5 s per iteration; 30 s over 2 epochs; 100 s
    assert out["cost_per_iteration"].tolist()[:2] == pytest.approx([0.001, 0.002])
    assert out["cost_per_epoch"].tolist()[0] == pytest.approx(0.03)
    assert out["cost_to_target"].tolist()[0] == pytest.approx(0.2)
    assert math.isnan(out["cost_per_epoch"].tolist()[1])  # no epoch done: no cost per epoch
    assert math.isnan(out["cost_to_target"].tolist()[1])
    assert all(math.isnan(v) for v in out.iloc[2][list(stats.MONEY_COLUMNS)])  # no price
    assert out["cost_per_epoch"].tolist()[3] == pytest.approx(0.1)  # one epoch: 7.2 $/h x 50 s


def test_global_batch_and_simulated_label() -> None:
    table = pd.DataFrame({"global_batch": [64, None], "batch_size": [8, 8], "world_size": [2, 4],
                          "compressor": ["qsgd-4b", None], "compressor_name": ["qsgd", "fp16"],
                          "simulated": [True, False]})  # fmt: skip
    assert stats._global_batch(table).tolist() == [64.0, 32.0]
    assert stats._display_compressor(table).tolist() == ["qsgd-4b (simulated)", "fp16"]


def test_sorted_order() -> None:
    keys = {"model": "m", "dataset": "d", "backend": "gloo", "network": "n",
            "precision": "fp32", "scheme": "allreduce", "world_size": 2}  # fmt: skip
    table = pd.DataFrame([
        {**keys, "bits": 4.0, "compressor": "q4", "run_id": "r1"},
        {**keys, "bits": 32.0, "compressor": "fp32", "run_id": "r2"},
        {**keys, "bits": math.nan, "compressor": "x", "run_id": "r3"},
        {**keys, "bits": 4.0, "compressor": "a4", "run_id": "r4"},
        {**keys, "bits": 8.0, "compressor": "q8", "run_id": "r5", "world_size": 1},
        {**keys, "bits": 32.0, "compressor": "fp32", "run_id": "r0", "model": "a"},
    ])  # fmt: skip
    assert stats._sorted(table)["run_id"].tolist() == ["r0", "r5", "r2", "r4", "r1", "r3"]


# -- one results directory, read and summarized ---------------------------------------------
def test_load_and_summarize_by_hand(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    # rank 1 is the slower one in iterations 1 and 3; iteration 0 (warm-up) never counts
    _write(store, "ok-run", {**BASE, "global_batch": 16}, _rows("ok-run", {
        0: [9.0, 0.2, 0.4, 0.3], 1: [9.0, 0.3, 0.1, 0.5]}), git_commit="c1")  # fmt: skip
    _write(store, "failed-run", BASE, None, status="failed", error="rank 1 exited 1")
    _write(store, "no-parquet", BASE, None)
    results = stats.load(tmp_path)
    runs = results.runs.set_index("run_id")
    assert runs.loc["no-parquet", "status"] == stats.UNREADABLE
    assert runs.loc["no-parquet", "error"] == "status ok but iterations.parquet is missing"
    assert runs.loc["failed-run", "status"] == "failed"  # a failed run is not unreadable
    assert runs.loc["ok-run", "git_commit"] == "c1"
    assert len(results.iterations) == 8 and set(results.iterations["run_id"]) == {"ok-run"}
    assert str(results.iterations["run_id"].dtype) == "string"

    table = stats.summarize(results).set_index("run_id")
    row = table.loc["ok-run"]
    # slowest rank per measured iteration: 0.3, 0.4, 0.5 -> median 0.4, p95 0.49 (linear)
    assert row["iterations"] == 3 and str(table["iterations"].dtype) == "Int64"
    assert row["t_iteration_median"] == pytest.approx(0.4)
    assert row["t_iteration_p95"] == pytest.approx(0.49)
    # parts are rank means: compute of iteration i = (t0 + t1) / 4 -> 0.125, 0.125, 0.2
    assert row["t_compute"] == pytest.approx(0.125)
    assert row["t_step"] == pytest.approx(0.0015)
    assert row["bytes_per_iteration"] == pytest.approx(1005)
    assert row["compression_ratio"] == pytest.approx(8.0)  # 4000 / 500
    assert row["bits_per_value"] == pytest.approx(4.0)
    assert row["samples_per_s"] == pytest.approx(16 / 0.4)  # global batch per iteration
    assert row["overlap"] == "none" and row["status"] == "ok" and row["precision"] == "fp32"
    assert table.index.tolist() == ["failed-run", "no-parquet", "ok-run"]  # same keys: by id
    for run_id in ("failed-run", "no-parquet"):
        assert table.loc[run_id, "iterations"] == 0
        assert math.isnan(table.loc[run_id, "t_iteration_median"])


def test_loaded_frames_are_indexed_row_by_row(tmp_path: Path) -> None:
    """What load returns is a plain frame to pandas users: one RangeIndex over all runs' rows,
    not each file's own 0..n-1 repeated."""
    store = ResultStore(tmp_path)
    for run_id in ("r1", "r2"):
        _write(store, run_id, BASE, _rows(run_id, {0: [1.0, 0.2], 1: [1.0, 0.3]}))
        epochs_frame([_epoch(run_id, 1), _epoch(run_id, 2)]).to_parquet(store.epochs_path(run_id))
    results = stats.load(tmp_path)
    assert results.iterations.index.tolist() == list(range(8))
    assert results.epochs.index.tolist() == list(range(4))


def test_per_iteration_is_ordered_by_run_and_iteration() -> None:
    """Rows may arrive in any order (ranks write in turn); the per-iteration frame is sorted."""
    rows = _rows("b", {0: [1.0, 0.2, 0.3]}) + _rows("a", {0: [1.0, 0.5], 1: [1.0, 0.6]})
    out = stats.per_iteration(iterations_frame(rows[::-1]))
    assert list(zip(out["run_id"], out["iteration"], strict=True)) == [("a", 1), ("b", 1), ("b", 2)]
    assert out["t_iteration"].tolist() == pytest.approx([0.6, 0.2, 0.3])  # slowest rank


def test_profiled_run_is_measured_not_compared(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    _write(store, "p", {**BASE, "profiled": True}, _rows("p", {0: [1.0, 0.2], 1: [1.0, 0.2]}))
    row = stats.summarize(stats.load(tmp_path)).iloc[0]
    assert row["status"] == stats.PROFILED and row["t_iteration_median"] == pytest.approx(0.2)


def test_unreadable_files_name_their_reason(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    _write(store, "bad-parquet", BASE, None)
    store.iterations_path("bad-parquet").write_bytes(b"not parquet")
    _write(store, "old-columns", BASE, _rows("old-columns", {0: [1.0, 0.2]}))
    frame = pd.read_parquet(store.iterations_path("old-columns")).drop(columns=["t_step"])
    frame.to_parquet(store.iterations_path("old-columns"))
    _write(store, "failed-partial", BASE, None, status="failed")
    store.iterations_path("failed-partial").write_bytes(b"half a file")
    run_dir = store.run_dir("bad-json")
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"run_id": "bad-json", "status": "ok",
                                                  "labels": [], "spec": {}}))  # fmt: skip
    run_dir = store.run_dir("status-not-text")
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"run_id": "status-not-text", "status": 5,
                                                  "labels": {}, "spec": {}}))  # fmt: skip
    runs = stats.load(tmp_path).runs.set_index("run_id")
    assert runs.loc["status-not-text", "error"] == (
        "run.json: ValueError: labels must be an object and status a string"
    )
    with pytest.raises(OSError, match=r"^run\.json disappeared while reading$"):
        stats._read_record(store, "never-written")
    assert runs.loc["bad-parquet", "status"] == stats.UNREADABLE
    assert str(runs.loc["bad-parquet", "error"]).startswith("iterations.parquet: ")
    assert runs.loc["old-columns", "error"] == (
        "iterations.parquet: ValueError: missing columns t_step"
    )
    assert runs.loc["failed-partial", "status"] == "failed"  # its partial parquet: no status
    assert runs.loc["bad-json", "status"] == stats.UNREADABLE
    assert runs.loc["bad-json", "error"] == (
        "run.json: ValueError: labels must be an object and status a string"
    )


def test_reason_is_the_first_line_with_its_type() -> None:
    assert stats._reason(ValueError("first\nsecond")) == "ValueError: first"
    assert stats._reason(OSError("")) == "OSError: no message"
    assert stats._reason(KeyError("  padded  ")) == "KeyError: '  padded  '"  # repr: quoted
    assert stats._reason(ValueError("  padded\n")) == "ValueError: padded"


def test_epochs_read_and_unreadable(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    _write(store, "acc", {**BASE, "target_accuracy": "0.65"}, _rows("acc", {0: [1.0, 0.2]}))
    rows = [
        _epoch("written-under-another-name", e, train_time_s=5.0 * e, top1=0.5 + 0.1 * e)
        for e in (1, 2)
    ]
    epochs_frame(rows).to_parquet(store.epochs_path("acc"))
    _write(store, "broken", BASE, _rows("broken", {0: [1.0, 0.2]}))
    store.epochs_path("broken").write_bytes(b"nope")
    results = stats.load(tmp_path)
    assert results.epochs["run_id"].tolist() == ["acc", "acc"]  # the directory's name wins
    assert str(results.epochs["run_id"].dtype) == "string"
    assert results.epochs["epoch"].tolist() == [1, 2]
    assert results.epochs["train_time_s"].tolist() == [5.0, 10.0]
    summary = stats.summarize(results).set_index("run_id")
    assert summary.loc["acc", "epochs_done"] == 2
    # the first epoch at or over the target top-1 0.65 is epoch 2 (0.7): 10 s, 20 iterations
    assert summary.loc["acc", "time_to_target_s"] == 10.0
    assert summary.loc["acc", "iters_to_target"] == 20
    assert math.isnan(summary.loc["broken", "epochs_done"])


def test_async_run_is_counted_in_updates(tmp_path: Path) -> None:
    """async-ps: rank 0 writes one row per update it applies, the workers one per round."""
    store = ResultStore(tmp_path)
    labels = {**BASE, "scheme": "async-ps", "world_size": 3, "batch_size": 8}
    server = [
        {
            "run_id": "a",
            "rank": 0,
            "iteration": i,
            "warmup": i == 0,
            "t_iteration": t,
            "bytes_sent": b,
            "payload_bytes": 0,
            "grad_bytes": 0,
        }
        for i, (t, b) in enumerate([(9.0, 1), (0.5, 300), (1.5, 500), (2.0, 400)])
    ]
    workers = [{"run_id": "a", "rank": r, "iteration": i, "warmup": i == 0, "t_iteration": t,
                "t_compute": t / 2, "bytes_sent": 100 * r, "payload_bytes": 50, "grad_bytes": 400}
               for r in (1, 2) for i, t in enumerate([9.0, 0.2 * r, 0.4 * r])]  # fmt: skip
    _write(store, "a", labels, server + workers)
    # beside it a lock-step run, and an async run that failed after writing the same rows
    _write(store, "l", BASE, _rows("l", {0: [9.0, 0.2, 0.4], 1: [9.0, 0.2, 0.4]}))
    failed = [{**r, "run_id": "f"} for r in server + workers]
    _write(store, "f", labels, failed, status="failed", error="rank 2 exited with code 1")
    table = stats.summarize(stats.load(tmp_path)).set_index("run_id")
    assert table.loc["l", "iterations"] == 2  # lock-step metrics survive the async ones
    assert table.loc["l", "t_iteration_median"] == pytest.approx(0.3)
    assert table.loc["l", "samples_per_s"] == pytest.approx(8 * 2 / 0.3)
    assert math.isnan(table.loc["f", "t_iteration_median"])  # a failed run has no metrics,
    assert math.isnan(table.loc["f", "samples_per_s"])  # throughput included
    row = table.loc["a"]
    assert row["iterations"] == 3  # the server's measured updates
    # 3 updates in 0.5 + 1.5 + 2.0 = 4 s of the server's time, one worker's batch of 8 each
    assert row["samples_per_s"] == pytest.approx(3 / 4.0 * 8)
    # a worker's round: median of 0.2, 0.4, 0.4, 0.8
    assert row["t_iteration_median"] == pytest.approx(0.4)
    assert row["t_compute"] == pytest.approx(0.2)
    # one update's traffic: median push up (100, 100, 200, 200 -> 150) + mean reply (400)
    assert row["bytes_per_iteration"] == pytest.approx(550)
    assert row["compression_ratio"] == pytest.approx(8.0)


def test_async_run_without_server_rows_has_no_metrics(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    labels = {**BASE, "scheme": "async-ps", "world_size": 2}
    rows = [{"run_id": "a", "rank": 1, "iteration": i, "warmup": False, "t_iteration": 0.1,
             "bytes_sent": 1, "payload_bytes": 1, "grad_bytes": 1} for i in range(3)]  # fmt: skip
    _write(store, "a", labels, rows)
    row = stats.summarize(stats.load(tmp_path)).iloc[0]
    assert row["iterations"] == 0 and math.isnan(row["t_iteration_median"])


def test_precision_labels_keep_the_runs_index_as_objects() -> None:
    runs = pd.DataFrame(
        {"compute": ["int8", None], "norm": [None, "groupnorm"], "weight_bits": [None, 8],
         "rounding": ["shared", None]}, index=[7, 3],
    )  # fmt: skip
    got = precision.label(runs)
    assert got.to_dict() == {7: "int8+shared-rounding", 3: "fp32+groupnorm+w8"}
    assert got.dtype == object  # not pandas' string dtype: the summary's other labels are objects
