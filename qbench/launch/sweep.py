"""Sweep driver: run each RunSpec of a matrix as its own set of processes, record everything.

Re-running skips runs whose run.json says ok. A run that fails or times out keeps its status,
exit code and the tail of stderr, and is skipped too unless ``retry_failed`` (a deterministic
failure, e.g. out of memory, would only fail again). A run that was interrupted, or whose driver
died mid-run (run.json still says running), is redone.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from qbench.launch import local, machine, procs, shaped
from qbench.records.schema import WORKER_FAILED as FAILED_TAG
from qbench.records.schema import RunRecord
from qbench.records.store import (
    RANK_PARTS,
    ResultStore,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_parquet,
    epochs_part,
    host_parts,
    model_part,
    rank_parts,
)
from qbench.spec.matrix import Matrix, RunSpec

STDERR_TAIL_LINES = 30
SKIPPED = "skipped"  # a prerequisite was missing and the user asked to skip (--skip-unavailable)


@dataclass
class Provenance:
    machine: dict[str, Any]
    versions: dict[str, Any]
    git_commit: str | None

    @classmethod
    def collect(cls) -> Provenance:
        return cls(machine.collect(), machine.versions(), machine.git_commit())


@dataclass(frozen=True)
class Launch:
    """How runs start: ``local`` (torchrun / mpirun on this host) or ``slurm``."""

    kind: str = "local"
    slurm: Any = None
    """qbench.launch.slurm.options.SlurmOptions when kind is slurm."""

    @property
    def array(self) -> bool:
        return self.kind == "slurm" and bool(getattr(self.slurm, "array", False))


@dataclass
class Plan:
    """What a sweep will do: runs to launch, runs already ok, failed runs kept as they are."""

    todo: list[RunSpec]
    done: list[RunSpec]
    kept_failed: list[RunSpec]


@dataclass
class SweepSummary:
    out: Path
    total: int
    skipped: int = 0
    kept_failed: int = 0
    statuses: dict[str, str] = field(default_factory=dict)  # run_id -> status
    unavailable: dict[str, str] = field(default_factory=dict)  # run_id -> what it lacks

    @property
    def failed(self) -> list[str]:
        return [r for r, s in self.statuses.items() if s not in ("ok", SKIPPED)]


def plan(matrix: Matrix, store: ResultStore, retry_failed: bool = False) -> Plan:
    """Sort the matrix by what is on disk. New, interrupted and killed-mid-run (still
    ``running``) runs are launched; failed and timed-out ones only with ``retry_failed``."""
    p = Plan([], [], [])
    for spec in matrix.runs:
        rec = store.read_record(spec.run_id)
        if rec is not None and rec.status == "ok" and store.iterations_path(spec.run_id).exists():
            p.done.append(spec)
        elif rec is not None and rec.status in ("failed", "timeout") and not retry_failed:
            p.kept_failed.append(spec)
        else:
            p.todo.append(spec)
    return p


def pending(matrix: Matrix, store: ResultStore, retry_failed: bool = False) -> list[RunSpec]:
    """The runs a sweep would launch (see :func:`plan`)."""
    return plan(matrix, store, retry_failed).todo


def run_sweep(
    matrix: Matrix,
    out: Path,
    scenario_text: str,
    on_progress: Callable[[RunSpec, RunRecord | None], None] | None = None,
    *,
    launch: Launch = Launch(),
    retry_failed: bool = False,
    resolved: dict[str, Any] | None = None,
    skip: dict[str, str] | None = None,
) -> SweepSummary:
    """Run what :func:`plan` says, holding the directory's lock so that no second driver
    writes into it at the same time. Runs in ``skip`` (run id -> the prerequisites this machine
    lacks, from ``qbench.launch.preflight``) are not started: their run.json says ``skipped``
    with the reason, and the next sweep checks them again."""
    from qbench.records.lock import sweep_lock

    store = ResultStore(out)
    store.root.mkdir(parents=True, exist_ok=True)
    with sweep_lock(store.root):
        prov = Provenance.collect()
        _write_sweep_files(store, matrix, scenario_text, prov, launch, resolved)
        todo = plan(matrix, store, retry_failed)
        summary = SweepSummary(
            out=out, total=len(matrix.runs), skipped=len(todo.done),
            kept_failed=len(todo.kept_failed),
        )  # fmt: skip
        for spec in [s for s in todo.todo if s.run_id in (skip or {})]:
            assert skip is not None
            _record_skipped(spec, store, prov, skip[spec.run_id])
            summary.statuses[spec.run_id] = SKIPPED
            summary.unavailable[spec.run_id] = skip[spec.run_id]
        todo.todo = [s for s in todo.todo if s.run_id not in summary.unavailable]
        if launch.array and todo.todo:
            _run_array(todo.todo, store, prov, launch, summary, on_progress)
            return summary
        for spec in todo.todo:
            if on_progress:
                on_progress(spec, None)
            record = execute(spec, store, prov, launch)
            summary.statuses[spec.run_id] = record.status
            if on_progress:
                on_progress(spec, record)
    return summary


def _write_sweep_files(
    store: ResultStore, matrix: Matrix, scenario_text: str, prov: Provenance, launch: Launch,
    resolved: dict[str, Any] | None,
) -> None:  # fmt: skip
    store.root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(store.scenario_path(), scenario_text.encode())
    atomic_write_json(
        store.resolved_path(),
        {"scenario": resolved or {}, "launcher": launch.kind,
         "runs": [s.to_dict() for s in matrix.runs]},
    )  # fmt: skip
    atomic_write_json(store.machine_path(), _machine_doc(prov))
    atomic_write_json(
        store.sweep_path(),
        {
            "runs": [s.run_id for s in matrix.runs],
            "excluded": [{"run": e.description, "reason": e.reason} for e in matrix.excluded],
            "launcher": launch.kind,
            "machine": prov.machine,
            "versions": prov.versions,
            "git_commit": prov.git_commit,
            "written": _now(),
        },
    )


def _machine_doc(prov: Provenance, spec: RunSpec | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        **prov.machine, "versions": prov.versions, "git_commit": prov.git_commit,
    }  # fmt: skip
    if spec is not None:
        doc["network"] = shaped.describe(spec.network) if spec.network else {"shaped": False}
        doc["driver_host"] = prov.machine.get("hostname")
    return doc


def execute(
    spec: RunSpec, store: ResultStore, prov: Provenance, launch: Launch = Launch()
) -> RunRecord:
    """Launch one run, wait for it (with its timeout) and write run.json + iterations.parquet."""
    record = _start_record(spec, store, prov)
    t0 = time.monotonic()
    with _interrupt_marks(store, [record]):
        status, code = _launch(spec, store, launch)
    return _finish(spec, store, record, status, code, time.monotonic() - t0)


def _start_record(spec: RunSpec, store: ResultStore, prov: Provenance) -> RunRecord:
    _reset_run_dir(store, spec)
    atomic_write_json(store.machine_path(spec.run_id), _machine_doc(prov, spec))
    record = RunRecord(
        run_id=spec.run_id, status="running", labels=spec.labels(), spec=spec.to_dict(),
        started=_now(), machine=prov.machine, versions=prov.versions, git_commit=prov.git_commit,
    )  # fmt: skip
    store.write_record(record)
    return record


def _record_skipped(spec: RunSpec, store: ResultStore, prov: Provenance, reason: str) -> None:
    """A run that cannot start here: its run.json says why (never ``failed``: nothing ran)."""
    _reset_run_dir(store, spec)
    now = _now()
    store.write_record(RunRecord(
        run_id=spec.run_id, status=SKIPPED, labels=spec.labels(), spec=spec.to_dict(),
        started=now, finished=now, machine=prov.machine, versions=prov.versions,
        git_commit=prov.git_commit,
        error=f"skipped: this machine lacks {reason} (--skip-unavailable); install it and "
        "re-run the sweep to run it",
    ))  # fmt: skip


def _launch(spec: RunSpec, store: ResultStore, launch: Launch) -> tuple[str, int | None]:
    run_dir, spec_path = store.run_dir(spec.run_id), store.spec_path(spec.run_id)
    if launch.kind == "slurm":
        from qbench.launch.slurm import runs

        return runs.run(spec, spec_path, run_dir, spec.timeout, launch.slurm)
    if spec.network:  # emulated link: every rank in its own shaped network namespace
        return shaped.run_shaped(spec, spec_path, run_dir, spec.timeout)
    argv = local.argv_for(spec.backend, spec_path, spec.world_size)
    return procs.run_jobs([(argv, local.worker_env())], run_dir, spec.timeout)


def _run_array(
    specs: list[RunSpec], store: ResultStore, prov: Provenance, launch: Launch,
    summary: SweepSummary, on_progress: Callable[[RunSpec, RunRecord | None], None] | None,
) -> None:  # fmt: skip
    """All pending runs as one Slurm job array; the records are finished when it ends."""
    from qbench.launch.slurm import runs

    records = [_start_record(spec, store, prov) for spec in specs]
    items = [(s, store.spec_path(s.run_id), store.run_dir(s.run_id)) for s in specs]
    t0 = time.monotonic()
    for spec in specs:
        if on_progress:
            on_progress(spec, None)
    with _interrupt_marks(store, records):
        results = runs.run_array(
            items, max(s.timeout for s in specs), launch.slurm, work_dir=store.slurm_dir()
        )
    elapsed = time.monotonic() - t0
    for spec, record, (status, code) in zip(specs, records, results, strict=True):
        record = _finish(spec, store, record, status, code, elapsed)
        summary.statuses[spec.run_id] = record.status
        if on_progress:
            on_progress(spec, record)


def _finish(
    spec: RunSpec, store: ResultStore, record: RunRecord, status: str, code: int | None,
    elapsed: float,
) -> RunRecord:  # fmt: skip
    record.duration_s = round(elapsed, 3)
    record.finished = _now()
    record.exit_code = code
    status = _merge_parts(store, spec, status)
    _record_hosts(store, spec)
    record.labels.update(_model_labels(store, spec))
    record.status = status
    if status != "ok":
        record.stderr_tail = _tail(store.stderr_path(spec.run_id))
        record.error = _error_line(status, code, _read(store.stderr_path(spec.run_id)), spec)
    store.write_record(record)
    return record


def _reset_run_dir(store: ResultStore, spec: RunSpec) -> None:
    parts = store.parts_dir(spec.run_id)
    if parts.exists():
        for p in parts.iterdir():
            p.unlink()
    store.iterations_path(spec.run_id).unlink(missing_ok=True)
    for kind in RANK_PARTS:
        store.merged_path(spec.run_id, kind).unlink(missing_ok=True)
    store.epochs_path(spec.run_id).unlink(missing_ok=True)
    atomic_write_json(store.spec_path(spec.run_id), spec.to_dict())


@contextmanager
def _interrupt_marks(store: ResultStore, records: list[RunRecord]) -> Iterator[None]:
    """On Ctrl-C / SIGTERM, mark the runs interrupted before propagating."""
    with procs.sigterm_as_interrupt(replace=True):
        try:
            yield
        except KeyboardInterrupt:
            for record in records:
                record.status, record.finished = "interrupted", _now()
                record.error = (
                    "interrupted by the user (Ctrl-C or SIGTERM); re-run the sweep to redo it"
                )
                store.write_record(record)
            raise


def _merge_parts(store: ResultStore, spec: RunSpec, status: str) -> str:
    """Concatenate per-rank parts into iterations.parquet; a missing rank makes an ok run failed."""
    parts: list[Path] = []
    for kind in RANK_PARTS:
        found = rank_parts(store.parts_dir(spec.run_id), kind)
        if kind == "rank":
            parts = found
        if found:
            frame = pd.concat([pd.read_parquet(p) for p in found], ignore_index=True)
            atomic_write_parquet(store.merged_path(spec.run_id, kind), frame)
    epochs = epochs_part(store.parts_dir(spec.run_id))
    if epochs.exists():  # rank 0's; written once, when the ranks finished
        epochs.replace(store.epochs_path(spec.run_id))
    if status == "ok" and len(parts) != spec.world_size:
        return "failed"
    if status == "ok" and spec.epochs and not store.epochs_path(spec.run_id).exists():
        return "failed"
    return status


def _model_labels(store: ResultStore, spec: RunSpec) -> dict[str, Any]:
    """``numel`` and ``gflops_per_sample`` as rank 0 measured them (the driver never imports
    torch); none when the run died before it wrote them."""
    try:
        doc = json.loads(model_part(store.parts_dir(spec.run_id)).read_text())
    except (OSError, ValueError):
        return {}
    return {k: doc[k] for k in ("numel", "gflops_per_sample") if k in doc}


def _record_hosts(store: ResultStore, spec: RunSpec) -> None:
    """Add the ranks' hosts (parts/host-<r>.json) to the run's machine.json."""
    path = store.machine_path(spec.run_id)
    hosts = []
    for p in host_parts(store.parts_dir(spec.run_id)):
        try:
            hosts.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    doc["ranks"] = sorted(hosts, key=lambda h: int(h.get("rank", 0)))
    doc["hostnames"] = sorted({str(h.get("hostname")) for h in hosts})
    atomic_write_json(path, doc)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _error_line(status: str, code: int | None, stderr: str, spec: RunSpec) -> str:
    """One line: which rank failed, how, and the exception it raised if it printed one."""
    if status == "timeout":
        return f"timed out after {spec.timeout:g} s (scenario `timeout:`); processes killed"
    dead = local.failed_rank(stderr)
    if dead is None:
        return _worker_failure(stderr, None) or (
            f"exit code {code}" if code is not None else status
        )
    rank, rank_code = dead
    what = f"rank {rank} of {spec.world_size} exited with code {rank_code}"
    reason = _worker_failure(stderr, rank)
    return f"{what}: {reason}" if reason else f"{what} (no Python exception: crashed or killed)"


def _worker_failure(stderr: str, rank: int | None) -> str | None:
    """The exception a worker reported on its tagged line (of ``rank`` when given)."""
    prefix = f"{FAILED_TAG} {'' if rank is None else rank}"
    for line in stderr.splitlines():
        if line.startswith(prefix) and " failed: " in line:
            return line.split(" failed: ", 1)[1].strip()[:500]
    return None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
