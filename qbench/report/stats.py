"""Summaries of a results directory: pure pandas over ``run.json``, ``iterations.parquet`` and,
in accuracy mode, ``epochs.parquet``.

Reads files only: never torch, the worker or a launcher. Conventions:

* warm-up rows stay on disk and are dropped here;
* an iteration lasts as long as its slowest rank (max over ranks); the parts of the time
  breakdown, byte counts and loss are means over ranks;
* a run whose files cannot be read gets status ``unreadable`` and the reason in ``error``;
  it never stops the others from being summarized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from qbench.records import interference, memory, view
from qbench.records.schema import (
    EPOCH_COLUMNS,
    ITERATION_COLUMNS,
    LATER_EPOCH_COLUMNS,
    LATER_ITERATION_COLUMNS,
    RunRecord,
    conform,
    epochs_frame,
    iterations_frame,
)
from qbench.records.store import ResultStore
from qbench.records.view import clock, run_specs_each
from qbench.report import accuracy, async_stats, intervals, names, precision, rounds, speedups
from qbench.spec.parts import Replay

UNREADABLE = "unreadable"
PROFILED = "profiled"
"""Status of an ok run traced by the profiler: its times are real but slowed, so it is
measured and shown, never compared (no speedups, no baseline, no speed figure)."""
PARTS = ("t_compute", "t_encode", "t_comm", "t_decode", "t_step")
LABELS = (
    *("model", "dataset", "backend", "scheme", "compressor", "compressor_name", "bits"),
    *("world_size", "batch_size", "global_batch", "simulated", "network", "numel", "seed"),
    *("repeat", "skew", "target_accuracy", "nodes", "price_per_hour", "gflops_per_sample"),
    *("compute", "norm", "weight_bits", "rounding", "overlap", "profiled", "dilation"),
    "codec_time",
)
TYPED_COLUMNS = ("scheme_name", "backward", "link_bits_per_s", "replayed")  # view.columns
RUN_COLUMNS = (
    *("run_id", "status", "error", "exit_code", "git_commit", *LABELS, *TYPED_COLUMNS),
    *("other_cores", "disturbed"),  # what else used the CPUs (qbench.records.interference)
    *memory.PEAK_COLUMNS,  # the largest peak memory of a rank (qbench.records.memory)
)
_INT_COLUMNS = (
    *("exit_code", "world_size", "batch_size", "global_batch", "numel", "seed", "repeat"),
    *("nodes", "peak_ranks"),
)
_LEVELS = ("bytes_intra", "bytes_inter")
"""Bytes a rank sent inside its node and between nodes (hierarchical schemes; NaN: not split)."""
_RANK_MEANS = (*PARTS, "bytes_sent", "payload_bytes", "grad_bytes", "loss", *_LEVELS)
_METRICS = (
    *("t_iteration_median", "t_iteration_p95", *PARTS, "bytes_per_iteration"),
    *(f"{c}_per_iteration" for c in _LEVELS),
    *("_grad_bytes", "_payload_bytes"),
)
"""The catalog name of the asynchronous parameter server (seed 003), whose rows are events."""
RATIOS = speedups.RATIOS
# seed 002 section 5.4: dollars, from the scenario's price of one machine hour (NaN without one)
MONEY_COLUMNS = ("cost_per_iteration", "cost_per_epoch", "cost_to_target")
SUMMARY_COLUMNS = (
    *("run_id", "model", "dataset", "backend", "scheme", "compressor", "world_size", "network"),
    *("precision", "status", "iterations", "samples_per_s", "t_iteration_median"),
    *("t_iteration_p95", *PARTS, "bytes_per_iteration", "compression_ratio", "bits_per_value"),
    *speedups.BEST_COLUMNS,  # over the fastest uncompressed configuration, 16-bit included
    *("speedup_vs_fp32", "baseline", "speedup_vs_flat_fp32", "overlap", "scalability"),
    *(*accuracy.RUN_METRICS, *MONEY_COLUMNS),
    # 95 % intervals of the ratios, per configuration (qbench.report.intervals)
    *(f"{r}_{p}" for r in RATIOS for p in intervals._PARTS),
    # not in the headline list, but needed by figures, failure tables and CSV readers
    *("compressor_name", "bits", "simulated", "global_batch", "repeat", "skew", "exit_code"),
    *("batch_size", "numel", "gflops_per_sample", "nodes", "price_per_hour", "target_accuracy"),
    *precision.SETTINGS,  # what the precision label is made of, typed
    "dilation",  # time dilation: the times above are the measured ones divided by it
    *("profiled", "git_commit", "error"),
    # other processes' CPU use while measured, the rule's verdict (None: not recorded), and
    # whether the run was left out of every comparison for it (qbench.records.interference)
    *("other_cores", "disturbed", "left_out"),
    # steps skipped for a NaN or inf gradient (`nonfinite: skip`); NaN: not recorded
    "skipped_steps",
    # bytes per rank and iteration inside a node and between nodes (hierarchical; else NaN)
    "bytes_intra_per_iteration",
    "bytes_inter_per_iteration",
    # `codec_time:` runs: the device whose codec times were replayed, and the share of measured
    # rank-iterations in which a real codec call outlasted its replayed time (NaN: not replayed)
    "codec_time",
    "codec_overrun_share",
    *memory.PEAK_COLUMNS,  # MiB, the largest over ranks, and its ranks (qbench.records.memory)
)


@dataclass
class Results:
    """Everything read from a results directory.

    runs: one row per run (``RUN_COLUMNS`` first, then any other labels).
    iterations: the raw rows (``ITERATION_COLUMNS``) of every run with a readable parquet.
    """

    runs: pd.DataFrame
    iterations: pd.DataFrame
    epochs: pd.DataFrame = field(default_factory=lambda: epochs_frame([]))
    """Accuracy-mode rows (``EPOCH_COLUMNS``) of the runs that have them."""
    names: names.Vocabulary = field(default_factory=lambda: names.Vocabulary())
    """What these runs' labels stand for: draw them inside ``names.using(results.names)``."""


# -- loading ---------------------------------------------------------------------------------
def load(root: Path | str) -> Results:
    """Read every ``<root>/<run_id>/run.json`` (and its parquet); never raises on bad files."""
    store = ResultStore(root)
    rows: list[dict[str, Any]] = []
    frames: list[pd.DataFrame] = []
    epoch_frames: list[pd.DataFrame] = []
    vocabulary = names.Vocabulary()
    for run_id in store.run_ids():
        row, frame = _load_run(store, run_id, vocabulary)
        rows.append(row)
        frames += [frame] if frame is not None else []
        epochs = _read_epochs(store.epochs_path(run_id), run_id)
        epoch_frames += [epochs] if epochs is not None else []
    iterations = pd.concat(frames, ignore_index=True) if frames else iterations_frame([])
    epochs_all = pd.concat(epoch_frames, ignore_index=True) if epoch_frames else epochs_frame([])
    return Results(_runs_frame(rows), iterations, epochs_all, vocabulary)


def _read_epochs(path: Path, run_id: str) -> pd.DataFrame | None:
    """A run's epoch rows, or None (iteration mode, or an unreadable file: the run's accuracy
    columns then stay empty rather than failing the report)."""
    if not path.exists():
        return None
    try:
        frame = pd.read_parquet(path)
        for column in LATER_EPOCH_COLUMNS:  # files written before these columns existed
            if column not in frame.columns:
                frame[column] = math.nan
        frame = conform(frame, EPOCH_COLUMNS)
    except Exception:  # pyarrow raises many types; a partial file must not stop the report
        return None
    frame["run_id"] = pd.Series(run_id, index=frame.index, dtype="string")
    return frame


def _load_run(
    store: ResultStore, run_id: str, vocabulary: names.Vocabulary
) -> tuple[dict[str, Any], pd.DataFrame | None]:
    try:
        record = _read_record(store, run_id)
        recorded = {"spec": record.spec, "labels": record.labels}
        run_clock = clock(recorded)  # read once: the row's dilation and the times' divisor
        parts = run_specs_each(recorded)  # read once: the typed columns and the names
        row = {**_record_row(run_id, record, run_clock), **view.columns(recorded, parts)}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return _unreadable(run_id, f"run.json: {_reason(exc)}"), None
    # names: what the labels stand for; specs this qbench cannot read (a plug-in that is not
    # installed, UserError) leave the labels shown as they are, never fail the run's row
    vocabulary.learn(record.labels, parts)
    path = store.iterations_path(run_id)
    if not path.exists():
        if row["status"] == "ok":
            row.update(status=UNREADABLE, error="status ok but iterations.parquet is missing")
        return row, None
    try:
        frame = _undilated(_read_iterations(path, run_id), run_clock)
        return row, frame.assign(**{rounds.PERIOD: rounds.period(parts.scheme)})
    except Exception as exc:  # pyarrow raises many types (ArrowInvalid, OSError, ...)
        if row["status"] == "ok":  # a failed run's partial parquet is not worth a status
            row.update(status=UNREADABLE, error=f"iterations.parquet: {_reason(exc)}")
        return row, None


def _undilated(frame: pd.DataFrame, run_clock: Replay) -> pd.DataFrame:
    """A time-dilated run's times as the run's clock undoes them: the times of the system it
    stands for (qbench.run.replay); iterations.parquet keeps the measured ones."""
    if run_clock.dilation != 1:
        times = [c for c in frame.columns if c.startswith("t_")]
        frame[times] = run_clock.undone(frame[times])
    return frame


def _read_record(store: ResultStore, run_id: str) -> RunRecord:
    record = store.read_record(run_id)
    if record is None:
        raise OSError("run.json disappeared while reading")
    if not isinstance(record.labels, dict) or not isinstance(record.status, str):
        raise ValueError("labels must be an object and status a string")
    return record


def _record_row(run_id: str, record: RunRecord, run_clock: Replay) -> dict[str, Any]:
    fixed: dict[str, Any] = {"run_id": run_id, "status": record.status}
    fixed.update(error=record.error, exit_code=record.exit_code)
    cores = record.machine.get("cores") if isinstance(record.machine, dict) else None
    # cores of the host that ran it (per node): the cost model scales CPU time by ranks / cores
    fixed["host_cores"] = cores if isinstance(cores, int) and cores > 0 else None
    fixed["git_commit"] = record.git_commit  # provenance: the report page names the commits
    spec = record.spec if isinstance(record.spec, dict) else {}
    # profile: true (qbench.run.profile): measured, but slowed, so never compared
    fixed["profiled"] = bool(record.labels.get("profiled") or spec.get("profile"))
    fixed["dilation"] = run_clock.dilation  # the clock the times were undone by, not the label
    fixed["other_cores"] = interference.other_cores(record.interference)
    fixed["disturbed"] = interference.disturbed(record.interference)
    fixed.update(memory.peaks(record.memory))
    return {**{k: v for k, v in record.labels.items() if k not in fixed}, **fixed}


def _unreadable(run_id: str, reason: str) -> dict[str, Any]:
    return {"run_id": run_id, "status": UNREADABLE, "error": reason}


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else 'no message'}"


def _read_iterations(path: Path, run_id: str) -> pd.DataFrame:
    frame = pd.read_parquet(path)
    for column in LATER_ITERATION_COLUMNS:  # files written before these columns existed
        if column not in frame.columns:
            frame[column] = math.nan
    missing = [c for c in ITERATION_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"missing columns {', '.join(missing)}")
    frame = conform(frame, ITERATION_COLUMNS)
    frame["run_id"] = pd.Series(run_id, index=frame.index, dtype="string")  # directory wins
    return frame


def _runs_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    runs = pd.DataFrame(rows)
    for column in RUN_COLUMNS:
        if column not in runs.columns:
            runs[column] = None
    extra = [c for c in runs.columns if c not in RUN_COLUMNS]
    runs = runs[[*RUN_COLUMNS, *extra]].copy()
    for column in _INT_COLUMNS:
        runs[column] = _as_int(runs[column])
    runs["bits"] = pd.to_numeric(runs["bits"], errors="coerce")
    runs["skew"] = pd.to_numeric(runs["skew"], errors="coerce").fillna(0.0)  # older runs: IID
    runs = runs.assign(**precision.settings(runs))
    runs["precision"] = precision.label(runs)
    for flag in ("simulated", "profiled", "backward", "replayed"):
        runs[flag] = runs[flag].map(_truthy).astype(bool)
    runs["disturbed"] = runs["disturbed"].astype("boolean")  # <NA>: not recorded
    runs["nodes"] = runs["nodes"].fillna(1)  # run.json from before multi-node: one host
    runs["dilation"] = pd.to_numeric(runs["dilation"], errors="coerce").fillna(1.0)
    numeric = ("price_per_hour", "gflops_per_sample", "target_accuracy", "other_cores")
    for column in (*numeric, "link_bits_per_s", *memory.PEAKS):
        runs[column] = pd.to_numeric(runs[column], errors="coerce")
    return runs


def _as_int(values: pd.Series) -> pd.Series:
    numbers = pd.to_numeric(values, errors="coerce")
    whole = numbers.dropna()
    return numbers.astype("Int64") if (whole == whole.round()).all() else numbers


def _truthy(value: Any) -> bool:
    if isinstance(value, bool | int):
        return bool(value)
    return isinstance(value, str) and value.strip().lower() in ("true", "yes", "1")


# -- summarizing -----------------------------------------------------------------------------
def per_iteration(iterations: pd.DataFrame) -> pd.DataFrame:
    """One row per (run_id, iteration) of measured iterations (per complete round for periodic
    runs, ``qbench.report.rounds``): the slowest rank's iteration time, means for the rest."""
    measured = iterations[~iterations["warmup"].astype(bool)]
    spec: dict[str, tuple[str, str]] = {"ranks": ("rank", "nunique")}
    spec["t_iteration"] = ("t_iteration", "max")
    spec.update({c: (c, "mean") for c in (*_RANK_MEANS, *rounds.present(measured))})
    per_it = measured.groupby(["run_id", "iteration"], as_index=False, sort=True).agg(**spec)
    return rounds.collapse(per_it, ("t_iteration",), _RANK_MEANS)


def summarize(results: Results, include_disturbed: bool = False) -> pd.DataFrame:
    """One row per run (``SUMMARY_COLUMNS``); runs that are not ok keep NaN metrics. A
    disturbed run is measured and shown but ``left_out`` of every speedup, baseline and
    interval, unless ``include_disturbed``. Runs are told apart by what their labels stand
    for in ``results.names`` (an async-ps run, an uncompressed baseline)."""
    with names.using(results.names):
        return _summarize(results, include_disturbed)


def _summarize(results: Results, include_disturbed: bool) -> pd.DataFrame:
    iterations = results.iterations
    is_async = iterations["run_id"].isin(async_stats.runs(results.runs))
    per_it = per_iteration(iterations[~is_async])
    metrics = _run_metrics(per_it)
    if is_async.any():
        events = async_stats.metrics(iterations[is_async], _METRICS, PARTS)
        metrics = pd.concat([metrics, events], ignore_index=True)
    else:
        metrics["_samples_per_s"] = math.nan
    table = results.runs.merge(metrics, "left", "run_id")
    table["skipped_steps"] = table["run_id"].map(_skipped_steps(iterations, is_async))
    table["codec_overrun_share"] = table["run_id"].map(_codec_overrun_share(iterations))
    table["iterations"] = table["iterations"].fillna(0).astype("Int64")
    table.loc[table["status"] != "ok", [*_METRICS, "_samples_per_s"]] = math.nan
    table.loc[table["profiled"] & (table["status"] == "ok"), "status"] = PROFILED
    disturbed = table["disturbed"].fillna(False).astype(bool) & (table["status"] == "ok")
    table["left_out"] = disturbed & (not include_disturbed)
    table["compressor"] = _display_compressor(table)
    per_update = table["_samples_per_s"].astype(float) * table["batch_size"].astype(float)
    table["samples_per_s"] = per_update.fillna(_global_batch(table) / table["t_iteration_median"])
    table["compression_ratio"] = table["_grad_bytes"] / table["_payload_bytes"].where(
        table["_payload_bytes"] > 0
    )
    table["bits_per_value"] = 32 / table["compression_ratio"]  # what was actually sent
    table["overlap"] = table["overlap"].fillna("none")  # runs recorded before DDP: flat
    table = speedups.add(table, per_it, _global_batch(table))
    targets = pd.to_numeric(table.set_index("run_id")["target_accuracy"], errors="coerce")
    table = table.merge(accuracy.run_metrics(results.epochs, targets), "left", "run_id")
    table = _add_money(table, results.epochs)
    return _sorted(table)[[*SUMMARY_COLUMNS, *TYPED_COLUMNS]].reset_index(drop=True)


def throughputs(results: Results, summary: pd.DataFrame) -> intervals.Throughputs:
    """Per-iteration samples/s of every lock-step run (async-ps rows are events, not
    iterations), for intervals of ratios the summary has no column for."""
    is_async = results.iterations["run_id"].isin(async_stats.runs(results.runs))
    batch = pd.Series(_global_batch(summary).to_numpy(), index=summary["run_id"].astype(str))
    return intervals.Throughputs(per_iteration(results.iterations[~is_async]), batch)


def _run_metrics(per_it: pd.DataFrame) -> pd.DataFrame:
    spec: dict[str, tuple[str, Any]] = {"iterations": ("iteration", "nunique")}
    spec["t_iteration_median"] = ("t_iteration", "median")
    spec["t_iteration_p95"] = ("t_iteration", lambda s: s.quantile(0.95))
    spec.update({p: (p, "median") for p in PARTS})
    spec["bytes_per_iteration"] = ("bytes_sent", "median")
    spec.update({f"{c}_per_iteration": (c, "median") for c in _LEVELS})
    spec.update(_grad_bytes=("grad_bytes", "median"), _payload_bytes=("payload_bytes", "median"))
    return per_it.groupby("run_id", as_index=False).agg(**spec)


def _skipped_steps(iterations: pd.DataFrame, is_async: pd.Series) -> pd.Series:
    """Per run, the steps skipped for a NaN or inf gradient (``nonfinite: skip``), warm-up
    included (a skipped step changes the training wherever it falls): the iterations of a
    lock-step run (every rank skips the same ones) or the pushes async-ps workers dropped
    (each decides alone). NaN for runs recorded before the column existed."""
    rows = iterations[["run_id", "iteration", "skipped"]]
    lock = rows[~is_async].groupby(["run_id", "iteration"])["skipped"].max()
    per_run = [lock.groupby(level="run_id").sum(min_count=1)]
    per_run.append(rows[is_async].groupby("run_id")["skipped"].sum(min_count=1))
    return pd.concat(per_run)


def _codec_overrun_share(iterations: pd.DataFrame) -> pd.Series:
    """Per run with replayed codec time, the share of its measured rank-iterations in which a
    real codec call took longer than the replayed time (qbench.run.replay.codec)."""
    rows = iterations.loc[~iterations["warmup"].astype(bool), ["run_id", "codec_overrun"]]
    rows = rows.dropna(subset=["codec_overrun"])
    return (rows["codec_overrun"] > 0).groupby(rows["run_id"]).mean()


def _display_compressor(table: pd.DataFrame) -> pd.Series:
    label = table["compressor"].fillna(table["compressor_name"]).astype(object)
    simulated = table["simulated"] & label.notna()
    return label.where(~simulated, label.astype(str) + names.SIMULATED)


def _global_batch(table: pd.DataFrame) -> pd.Series:
    fallback = table["batch_size"] * table["world_size"]
    return table["global_batch"].fillna(fallback).astype(float)


def _add_money(table: pd.DataFrame, epochs: pd.DataFrame) -> pd.DataFrame:
    """Dollar columns (seed 002 section 5.4): price of one machine hour x machines (``nodes``)
    x seconds / 3600. An epoch costs the mean epoch, the last cumulative ``train_time_s`` over
    the epochs done (evaluation is not training, so it is not billed). NaN without a price:
    0 would read as "free"."""
    per_second = table["price_per_hour"] * table["nodes"].astype(float) / 3600
    last = epochs.sort_values(["run_id", "epoch"]).groupby("run_id")["train_time_s"].last()
    trained = table["run_id"].map(last).astype(float)
    epochs_done = table["epochs_done"].astype(float)
    return table.assign(
        cost_per_iteration=per_second * table["t_iteration_median"],
        cost_per_epoch=per_second * trained / epochs_done.where(epochs_done > 0),
        cost_to_target=per_second * table["time_to_target_s"].astype(float),
    )


def _sorted(table: pd.DataFrame) -> pd.DataFrame:
    keys = ["model", "dataset", "backend", "network", "precision", "scheme", "world_size", "bits"]
    keys += ["compressor", "run_id"]
    ascending = [k != "bits" for k in keys]  # fp32 (32 bits) first, then fewer bits
    return table.sort_values(keys, ascending=ascending, na_position="last", kind="stable")
