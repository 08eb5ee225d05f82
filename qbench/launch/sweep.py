"""Sweep driver: run the RunSpecs of a matrix, record everything. Each run gets its own set of
processes (``isolation: process``), or runs with the others of its rank group in one launch
(``isolation: group``, ``qbench.launch.group``); the records are the same either way.

Re-running skips runs whose run.json says ok. A run that fails or times out keeps its status,
exit code and the tail of stderr, and is skipped too unless ``retry_failed`` (a deterministic
failure, e.g. out of memory, would only fail again). A run that was interrupted, or whose driver
died mid-run (run.json still says running), is redone. With ``rerun_disturbed`` N, ok runs
measured while other processes used the machine (``qbench.records.interference``) run again,
up to N times each (:class:`Rerun`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qbench.launch import runfiles
from qbench.launch.decision import launcher_for
from qbench.launch.group import run_groups
from qbench.launch.launcher import LOCAL, Launch
from qbench.launch.runfiles import Provenance
from qbench.records import interference
from qbench.records.lock import sweep_lock
from qbench.records.schema import RunRecord
from qbench.records.store import (
    ResultStore,
    atomic_write_bytes,
    atomic_write_json,
)
from qbench.spec.matrix import Matrix
from qbench.spec.runspec import RunSpec


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
    reruns: dict[str, int] = field(default_factory=dict)  # run_id -> disturbed runs re-run
    still_disturbed: list[str] = field(default_factory=list)  # after every rerun allowed

    @property
    def failed(self) -> list[str]:
        return [r for r, s in self.statuses.items() if s not in ("ok", runfiles.SKIPPED)]


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
    launch: Launch = LOCAL,
    retry_failed: bool = False,
    resolved: dict[str, Any] | None = None,
    skip: dict[str, str] | None = None,
    rerun_disturbed: int = 0,
    on_rerun: Callable[[list[RunSpec], int, int], None] | None = None,
) -> SweepSummary:
    """Run what :func:`plan` says, holding the directory's lock so that no second driver
    writes into it at the same time. Runs in ``skip`` (run id -> the prerequisites this machine
    lacks, from ``qbench.launch.preflight``) are not started: their run.json says ``skipped``
    with the reason, and the next sweep checks them again. ``rerun_disturbed``: run disturbed
    runs again up to that many times (:class:`Rerun`; ``on_rerun(specs, attempt, limit)``
    before each pass)."""
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
            runfiles.record_skipped(spec, store, prov, skip[spec.run_id])
            summary.statuses[spec.run_id] = runfiles.SKIPPED
            summary.unavailable[spec.run_id] = skip[spec.run_id]
        todo.todo = [s for s in todo.todo if s.run_id not in summary.unavailable]

        def run_pass(specs: list[RunSpec]) -> None:
            _run_pass(specs, store, prov, launch, summary, on_progress)

        # the rank server a launch started, if any, stays for the next sweep of this process
        run_pass(todo.todo)
        if rerun_disturbed:
            again = Rerun(store, rerun_disturbed, run_pass, summary, on_rerun)
            again.run([*todo.done, *todo.todo])
    return summary


def _run_pass(
    specs: list[RunSpec], store: ResultStore, prov: Provenance, launch: Launch,
    summary: SweepSummary, on_progress: Callable[[RunSpec, RunRecord | None], None] | None,
) -> None:  # fmt: skip
    """Run ``specs`` once, the way ``launch`` says: as job arrays, rank groups or one by one."""
    if launch.array and specs:
        _run_array(specs, store, prov, launch, summary, on_progress)
        return
    if launch.grouped:
        run_groups(specs, store, prov, summary, on_progress, launch)
        return
    for spec in specs:
        if on_progress:
            on_progress(spec, None)
        record = execute(spec, store, prov, launch)
        summary.statuses[spec.run_id] = record.status
        if on_progress:
            on_progress(spec, record)


@dataclass
class Rerun:
    """``--rerun-disturbed N``: every ok run the rule of ``qbench.records.interference`` calls
    disturbed runs again, all of them as one pass, until an attempt is clean or it has run N
    more times. Each earlier attempt's files move to ``attempts/<n>/`` first (nothing is
    lost); the run keeps its last attempt, or its last ok one when a rerun failed."""

    store: ResultStore
    limit: int
    run_pass: Callable[[list[RunSpec]], None]
    summary: SweepSummary
    on_rerun: Callable[[list[RunSpec], int, int], None] | None = None

    def run(self, specs: list[RunSpec]) -> None:
        pending = [s for s in specs if self.disturbed(s)]
        tried = list(pending)
        for attempt in range(1, self.limit + 1):
            if not pending:
                break
            for spec in pending:
                runfiles.archive_attempt(self.store, spec)
                self.summary.reruns[spec.run_id] = attempt
            if self.on_rerun:
                self.on_rerun(pending, attempt, self.limit)
            self.run_pass(pending)
            pending = [s for s in pending if self.disturbed(s)]
        for spec in tried:
            self._keep_usable(spec)
        self.summary.still_disturbed = [s.run_id for s in tried if self.disturbed(s)]

    def disturbed(self, spec: RunSpec) -> bool:
        record = self.store.read_record(spec.run_id)
        return (
            record is not None
            and record.status == "ok"
            and bool(interference.disturbed(record.interference))
        )

    def _keep_usable(self, spec: RunSpec) -> None:
        """A rerun that failed leaves the run's last ok attempt in place (still disturbed,
        but measured), not a failure the first sweep did not have."""
        record = self.store.read_record(spec.run_id)
        if record is not None and record.status == "ok":
            return
        for attempt in reversed(runfiles.attempts_of(self.store, spec)):
            earlier = self.store.read_record_at(attempt)
            if earlier is not None and earlier.status == "ok":
                runfiles.restore_attempt(self.store, spec, attempt)
                self.summary.statuses[spec.run_id] = "ok"
                return


def _write_sweep_files(
    store: ResultStore, matrix: Matrix, scenario_text: str, prov: Provenance,
    launch: Launch, resolved: dict[str, Any] | None,
) -> None:  # fmt: skip
    store.root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(store.scenario_path(), scenario_text.encode())
    atomic_write_json(
        store.resolved_path(),
        {"scenario": resolved or {}, "launcher": launch.kind,
         "isolation": launch.effective_isolation, "runs": [s.to_dict() for s in matrix.runs]},
    )  # fmt: skip
    atomic_write_json(store.machine_path(), runfiles.machine_doc(prov))
    atomic_write_json(
        store.sweep_path(),
        {
            "runs": [s.run_id for s in matrix.runs],
            "excluded": [{"run": e.description, "reason": e.reason} for e in matrix.excluded],
            "launcher": launch.kind,
            "isolation": launch.effective_isolation,
            "machine": prov.machine,
            "versions": prov.versions,
            "git_commit": prov.git_commit,
            "written": runfiles.now(),
        },
    )


def execute(
    spec: RunSpec, store: ResultStore, prov: Provenance, launch: Launch = LOCAL
) -> RunRecord:
    """Launch one run, wait for it (with its timeout) and write run.json + iterations.parquet."""
    launcher = launcher_for(launch, spec)
    record = runfiles.start_record(spec, store, prov, launcher=launcher)
    t0 = time.monotonic()
    with runfiles.interrupt_marks(store, [record]):
        status, code = launcher.run(spec, store.spec_path(spec.run_id), store.run_dir(spec.run_id))
    return runfiles.finish(spec, store, record, status, code, time.monotonic() - t0)


def _run_array(
    specs: list[RunSpec], store: ResultStore, prov: Provenance, launch: Launch,
    summary: SweepSummary, on_progress: Callable[[RunSpec, RunRecord | None], None] | None,
) -> None:  # fmt: skip
    """All pending runs as job arrays; the records are finished when they end."""
    launcher = launcher_for(launch, specs[0])  # the sweep's: arrays are one launcher's
    records = [runfiles.start_record(s, store, prov, launcher=launcher) for s in specs]
    items = [(s, store.spec_path(s.run_id), store.run_dir(s.run_id)) for s in specs]
    t0 = time.monotonic()
    for spec in specs:
        if on_progress:
            on_progress(spec, None)
    with runfiles.interrupt_marks(store, records):
        results = launcher.run_array(items, store.slurm_dir())
    elapsed = time.monotonic() - t0
    for spec, record, (status, code) in zip(specs, records, results, strict=True):
        record = runfiles.finish(spec, store, record, status, code, elapsed)
        summary.statuses[spec.run_id] = record.status
        if on_progress:
            on_progress(spec, record)
