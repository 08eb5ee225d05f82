"""Versioned on-disk record schema. Measurement writes these; reporting only reads them.

Per run directory ``DIR/<run_id>/``:

* ``iterations.parquet``: one row per (rank, iteration), columns ``ITERATION_COLUMNS``.
* ``run.json``: a :class:`RunRecord` (resolved config, status, error, times, provenance).
* ``epochs.parquet`` (accuracy mode only): one row per epoch, columns ``EPOCH_COLUMNS``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

SCHEMA_VERSION = 3
"""2: run.json's ``interference`` (what else used the machine while the run was measured).
3: run.json's ``memory`` (each rank's peak memory over the run, ``qbench.records.memory``).
Readers take older files as they are: their interference or memory is unknown."""

# name -> pandas dtype. Times are seconds; byte counts are per rank per iteration.
ITERATION_COLUMNS: dict[str, str] = {
    "run_id": "string",
    "rank": "int32",
    "iteration": "int32",
    "warmup": "bool",  # warm-up iterations are kept on disk, dropped in summaries
    "t_compute": "float64",  # forward + backward
    "t_encode": "float64",
    "t_comm": "float64",
    "t_decode": "float64",
    "t_step": "float64",  # optimizer step (+ unflatten)
    "t_iteration": "float64",  # whole iteration on this rank
    "bytes_sent": "int64",  # bytes this rank handed to the network (see qbench.comm.base)
    "payload_bytes": "int64",  # encoded size of this rank's own gradient (Payload.nbytes)
    "grad_bytes": "int64",  # fp32 size of the gradient (4 * numel)
    "loss": "float64",
    # Scheme-specific measurements (NaN where a scheme has none):
    "consensus_distance": "float64",  # gossip: mean over ranks of ||x_i - x_bar||
    # async-ps (qbench.run.async_ps): rank 0 is the server, one row per update it applied; workers
    # one row per gradient they pushed. Seed 003's metric reads the server rows
    # (qbench.run.async_ps.metrics).
    "staleness": "float64",  # server version at apply minus the version the gradient saw
    "server_version": "float64",  # model version this update produced (1, 2, ...)
    "cum_bits": "float64",  # server rows: bits through the server (up + down) so far
    # Communication overlapped with backward (qbench.ddp.timeline). t_comm is what the loop
    # waited for (exposed); flat runs hide nothing (total = t_comm, fraction 0).
    "t_forward": "float64",  # DDP runs: forward pass (t_compute = forward + backward compute)
    "t_comm_total": "float64",  # seconds with at least one bucket in flight, hidden or not
    "overlap_fraction": "float64",  # 1 - t_comm / t_comm_total: share hidden behind backward
    "t_codec_total": "float64",  # DDP runs with qbench hooks: encode + decode time, any thread
    # `nonfinite: skip` (qbench.run.nonfinite): 1 when a NaN or inf in a gradient skipped this
    # step (on every rank of a lock-step run; an async-ps worker drops its push), else 0
    "skipped": "float64",
    # Hierarchical schemes: bytes_sent split by level, inside this rank's node and between nodes
    # (qbench.aggregate.hierarchical); NaN for schemes that do not split it
    "bytes_intra": "float64",
    "bytes_inter": "float64",
    # `codec_time:` (qbench.run.replay.codec): codec calls this iteration whose real time
    # exceeded the replayed one (the run then stands for a slower device); NaN without it
    "codec_overrun": "float64",
    # FSDP runs (qbench.run.loops.fsdp): the parameter all-gathers' and the gradient
    # reduce-scatters' seconds in flight and bytes sent, apart; NaN for other schemes
    "t_allgather_total": "float64",
    "t_reduce_scatter_total": "float64",
    "bytes_allgather": "float64",
    "bytes_reduce_scatter": "float64",
}

# Columns added after schema version 1 was first written: readers fill them with NaN when a file
# predates them, so older results stay readable.
LATER_ITERATION_COLUMNS = (
    *("staleness", "server_version", "cum_bits", "t_forward", "t_comm_total"),
    *("overlap_fraction", "t_codec_total", "skipped", "bytes_intra", "bytes_inter"),
    "codec_overrun",
    *("t_allgather_total", "t_reduce_scatter_total", "bytes_allgather", "bytes_reduce_scatter"),
)

LATER_EPOCH_COLUMNS = ("perplexity",)
"""Epoch columns added after ``epochs.parquet`` was first written: NaN in older files."""

# Workers print "<WORKER_FAILED> <rank> failed: <Exception>: <message>" on stderr when they fail.
WORKER_FAILED = "qbench worker rank"

# Accuracy mode (epochs:), one row per epoch, written by rank 0 after the ranks evaluated the
# model averaged over ranks together. Times are seconds of training (evaluation excluded).
EPOCH_COLUMNS: dict[str, str] = {
    "run_id": "string",
    "epoch": "int32",  # 1-based: the row is written after this many passes
    "iteration": "int64",  # iterations done so far, all epochs
    "train_time_s": "float64",  # training time so far: per epoch the slowest rank's sum
    "lr": "float64",  # learning rate during this epoch
    "train_loss": "float64",  # mean training loss of the epoch's iterations over all ranks
    "test_loss": "float64",
    "top1": "float64",  # test accuracy of the averaged model, 0..1
    "top5": "float64",  # NaN with 10 classes or fewer
    # language models scored per token (gpt on a text corpus): exp(test_loss), else NaN
    "perplexity": "float64",
    "grad_norm": "float64",  # full training gradient norm (convex models, seed 000), else NaN
    "bytes_sent": "int64",  # bytes rank 0 handed to the network so far
    "consensus_distance": "float64",  # gossip: at the end of the epoch, else NaN
}

# DDP runs (overlap: backward), one row per rank, iteration and bucket: when DDP handed the
# bucket to the hook and when its mean was ready, in seconds after the forward pass ended
# (qbench.ddp.timeline). The overlap-aware cost model reads the buckets' ready times from here.
BUCKET_COLUMNS: dict[str, str] = {
    "run_id": "string",
    "rank": "int32",
    "iteration": "int32",
    "warmup": "bool",
    "bucket": "int32",  # DDP's bucket index (0 is handed over first)
    "numel": "int64",  # gradient values in the bucket
    "payload_bytes": "int64",  # this rank's encoded bucket
    "t_handed": "float64",  # backward computed the bucket's last gradient
    "t_ready": "float64",  # the bucket's mean was ready (the hook's future completed)
}

STATUSES = ("ok", "failed", "timeout", "interrupted", "running", "skipped")
"""``skipped``: not started, a prerequisite was missing (``qbench sweep --skip-unavailable``)."""


@dataclass
class RunRecord:
    """Contents of run.json. ``labels`` are the flat columns reports group by."""

    run_id: str
    status: str
    labels: dict[str, Any]
    spec: dict[str, Any]
    schema_version: int = SCHEMA_VERSION
    error: str | None = None
    exit_code: int | None = None
    stderr_tail: str | None = None
    started: str | None = None  # ISO-8601 UTC
    finished: str | None = None
    duration_s: float | None = None
    machine: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    git_commit: str | None = None
    isolation: str | None = None
    """How the run's processes started: ``process`` (a launch of its own) or ``group`` (one
    of the configurations a warm rank group ran in one launch); None in older files."""
    group: dict[str, Any] | None = None
    """Group mode: ``launch`` (its directory under ``.groups/``), ``position`` in that launch,
    ``index`` and ``size`` in the rank group."""
    interference: dict[str, Any] | None = None
    """What else used each rank host's CPUs over the measured iterations
    (``qbench.records.interference``, which also holds the rule that calls a run disturbed);
    None in older files and when no rank measured it."""
    memory: dict[str, Any] | None = None
    """Each rank's peak memory over the run, ``{"ranks": [...]}`` (``qbench.records.memory``);
    None in older files and when no rank recorded it."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunRecord:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def conform(frame: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """``frame``'s ``columns``, in order, each of its schema dtype: only the columns of another
    dtype are converted (``DataFrame.astype`` of all of them costs a copy of every column; a
    frame read back from parquet, or built from rows, has most already right)."""
    frame = frame[list(columns)]
    wrong = {c: t for c, t in columns.items() if str(frame[c].dtype) != t}  # "str" is not "string"
    return frame.astype(wrong) if wrong else frame


def iterations_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Build a frame with exactly the schema's columns and dtypes (optional ones NaN)."""
    frame = pd.DataFrame(rows, columns=list(ITERATION_COLUMNS))  # missing columns -> NaN
    return conform(frame, ITERATION_COLUMNS)


def buckets_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(BUCKET_COLUMNS))
    return conform(frame, BUCKET_COLUMNS)


def epochs_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(EPOCH_COLUMNS))
    return conform(frame, EPOCH_COLUMNS)
