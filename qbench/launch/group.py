"""Warm rank groups, the driver's side: one launch of a rank group runs many runs in turn.

Starting a run costs seconds that measure nothing: processes, importing torch, the rendezvous,
and on GPUs the CUDA context and NCCL communicators. Runs that start their ranks the same way
(same backend, world size, nodes, emulated link and device: :func:`key`) therefore form a rank
group, in matrix order, and one launch of the group (torchrun, mpirun or the shaped launcher,
with ``plan.json`` instead of one spec.json) runs them one after the other
(``qbench.run.group`` is the ranks' side). Each run still gets a fresh model, optimizer,
compressor and data stream, its own warm-up, logs, parts and run.json, exactly as if launched
alone; run.json says ``isolation: group`` and where in the group it ran.

The driver watches each run's done marker (``qbench.records.store.done_marker``, rank 0's) to
finish its records, report progress and start the next run's clock, then writes the run's
finished marker, which the ranks wait for before the next run, so that the driver's merging
and printing (about 10 ms a run) never share the CPU with a measured iteration. Nothing is
blurred:

* a run's ``timeout`` counts from the end of the one before it, or for a launch's first run
  from when its ranks are ready (``ready_marker``): starting processes, importing torch and
  the rendezvous take tens of seconds on a loaded machine and are no part of any run, so they
  have a limit of their own, ``STARTUP_S`` or the timeout if longer. Past either the group is
  killed, the run marked ``timeout`` (saying which), and the group launched again for the rest;
* a rank that fails ends the launch (the worker aborts, as a single run does); that run is
  marked ``failed`` with the rank and its exception, and the group is launched again for the
  runs after it;
* Ctrl-C / SIGTERM marks the unfinished runs ``interrupted``; a SIGKILLed driver leaves them
  ``running``, and the resumed sweep redoes exactly those (the ranks die with the driver).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from qbench.launch import procs, runfiles
from qbench.launch.decision import launcher_for
from qbench.launch.launcher import Launch
from qbench.launch.runfiles import Provenance
from qbench.records.schema import RunRecord
from qbench.records.store import (
    STDERR_LOG,
    STDOUT_LOG,
    ResultStore,
    atomic_write_json,
    done_marker,
    finished_marker,
    ready_marker,
)
from qbench.spec.runspec import RunSpec

POLL_S = 0.05
STARTUP_S = 300.0  # a launch's start seen on a loaded 2-core machine: over 40 s
Progress = Callable[[RunSpec, RunRecord | None], None] | None


def key(spec: RunSpec) -> tuple[Any, ...]:
    """Runs with the same key start their ranks the same way: one launch can run them all."""
    return (
        spec.placement.backend,
        spec.placement.world_size,
        spec.placement.nodes,
        spec.link.label,
        spec.placement.device_kind,
    )


def groups(specs: list[RunSpec]) -> list[list[RunSpec]]:
    """The runs by rank group, groups in the order of their first run, runs in matrix order."""
    found: dict[tuple[Any, ...], list[RunSpec]] = {}
    for spec in specs:
        found.setdefault(key(spec), []).append(spec)
    return list(found.values())


def run_groups(
    specs: list[RunSpec], store: ResultStore, prov: Provenance, summary: Any, on_progress: Progress,
    launch: Launch,
) -> None:  # fmt: skip
    """Every run of ``specs``, one rank group after the other (``summary``: a SweepSummary),
    each launched by the launcher ``launch`` gives its runs (all of a group's alike: same key)."""
    for members in groups(specs):
        Group(members, store, prov, summary, on_progress, launch).run()


@dataclass
class _Outcome:
    """How a launch ended: ``done`` runs finished; the next one, if any, ended as ``status``
    (``rank``: the rank that failed first, where each rank is a process of the launch)."""

    done: int
    status: str = "ok"
    code: int | None = 0
    elapsed: float = 0.0
    rank: int | None = None
    error: str | None = None  # a timeout's own line where the scenario's timeout is not it


class Group:
    """One rank group: launched once, and again for the runs after one that failed."""

    def __init__(
        self, members: list[RunSpec], store: ResultStore, prov: Provenance, summary: Any,
        on_progress: Progress, launch: Launch,
    ) -> None:  # fmt: skip
        self.members, self.store, self.prov = members, store, prov
        self.summary, self.on_progress = summary, on_progress
        self.launcher = launcher_for(launch, members[0])
        self.index = {s.run_id: i for i, s in enumerate(members)}

    def run(self) -> None:
        pending = self.members
        while pending:
            pending = self._launch(pending)

    def _launch(self, pending: list[RunSpec]) -> list[RunSpec]:
        """Launch the group for ``pending``; the runs still to do after this launch."""
        name = pending[0].run_id
        records = [self._start(s, name, k) for k, s in enumerate(pending)]
        plan = self.store.group_plan(name)
        ready_marker(plan).unlink(missing_ok=True)  # a resumed sweep may launch it again
        atomic_write_json(plan, {"configs": [
            {"spec": str(self.store.spec_path(s.run_id)), "index": self.index[s.run_id],
             "run_id": s.run_id} for s in pending
        ]})  # fmt: skip
        live = list(records)  # what Ctrl-C marks interrupted: the runs not finished yet
        with runfiles.interrupt_marks(self.store, live):
            gdir = self.store.group_dir(name)
            jobs_of = self.launcher.group_jobs(pending[0], plan)
            with jobs_of as jobs, _logs(gdir) as (out, err):
                ranks: list[Any] = []
                try:
                    procs.start(jobs, ranks, out, err)
                    per_rank = (
                        len(ranks) == pending[0].placement.world_size
                    )  # else one launcher process
                    outcome = self._watch(pending, records, live, ranks, per_rank, plan)
                finally:
                    procs.kill_group(ranks)
            if outcome.done < len(pending):
                spec, record = pending[outcome.done], records[outcome.done]
                _attach_launcher_log(self.store, spec, gdir / STDERR_LOG)
                dead = None if outcome.rank is None else (outcome.rank, outcome.code)
                self._finish(spec, record, outcome.status, outcome.code, outcome.elapsed, dead,
                             outcome.error)  # fmt: skip
                live.remove(record)
        return pending[outcome.done + 1 :]

    def _start(self, spec: RunSpec, launch: str, position: int) -> RunRecord:
        where = {"launch": launch, "position": position, "index": self.index[spec.run_id],
                 "size": len(self.members)}  # fmt: skip
        return runfiles.start_record(
            spec, self.store, self.prov, isolation="group", group=where, launcher=self.launcher
        )

    def _watch(
        self, pending: list[RunSpec], records: list[RunRecord], live: list[RunRecord],
        ranks: list[Any], per_rank: bool, plan: Path,
    ) -> _Outcome:  # fmt: skip
        """Finish each run as its done marker appears; stop at the first failure or timeout."""
        done, t0, up = 0, time.monotonic(), False
        ended = procs.exit_clock(ranks)
        self._begin(pending[0], records[0])
        while True:
            if not up and ready_marker(plan).exists():
                up, t0 = True, time.monotonic()  # started: the first run's clock starts now
            while done < len(pending) and done_marker(self._parts(pending[done])).exists():
                self._finish(pending[done], records[done], "ok", 0, time.monotonic() - t0)
                live.remove(records[done])
                if done + 1 < len(pending):
                    self._begin(pending[done + 1], records[done + 1])
                # the ranks wait for this before the next run: the driver's work is done now
                atomic_write_json(finished_marker(self._parts(pending[done])), {"ok": True})
                done, t0, up = done + 1, time.monotonic(), True
            if done == len(pending):  # every record is on disk: the ranks are stopped now
                return _Outcome(done)  # (tearing down torch and gloo takes seconds)
            failed = _first_failed(ranks, ended)
            if failed is None and len(ended) < len(ranks):
                timed_out = _timed_out(pending[done].measurement.timeout, time.monotonic() - t0, up)
                if timed_out is not None:
                    return _Outcome(done, "timeout", None, time.monotonic() - t0,
                                    error=timed_out or None)  # fmt: skip
                time.sleep(POLL_S)
                continue
            if done_marker(self._parts(pending[done])).exists():
                continue  # it finished just before the next run failed: take it first
            time.sleep(POLL_S)  # the peers it takes down end too: their exit times come in
            log = runfiles.read_log(self.store.stderr_path(pending[done].run_id))
            failed = _cause(ranks, ended, log)
            code = ranks[failed].returncode if failed is not None else 0
            rank = failed if per_rank else None
            return _Outcome(done, "failed", code, time.monotonic() - t0, rank)

    def _parts(self, spec: RunSpec) -> Path:
        return self.store.parts_dir(spec.run_id)

    def _begin(self, spec: RunSpec, record: RunRecord) -> None:
        record.started = runfiles.now()
        if self.on_progress:
            self.on_progress(spec, None)

    def _finish(
        self, spec: RunSpec, record: RunRecord, status: str, code: int | None, elapsed: float,
        dead: tuple[int, int | None] | None = None, error: str | None = None,
    ) -> None:  # fmt: skip
        record = runfiles.finish(spec, self.store, record, status, code, elapsed, dead, error)
        self.summary.statuses[spec.run_id] = record.status
        if self.on_progress:
            self.on_progress(spec, record)


def _timed_out(timeout: float, elapsed: float, up: bool) -> str | None:
    """None while within the limit; past it, "" for the run's own timeout (the record's usual
    line) or the line saying the ranks did not start."""
    if up:
        return "" if elapsed > timeout else None
    limit = max(timeout, STARTUP_S)
    if elapsed <= limit:
        return None
    return (f"the ranks did not start within {limit:g} s (processes, torch import, rendezvous; "
            f"the limit is {STARTUP_S:g} s or the scenario's `timeout:` if longer); "
            "processes killed")  # fmt: skip


@contextmanager
def _logs(gdir: Path) -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    """The launcher's own output (torchrun's and mpirun's reports); each rank writes its runs'
    output into their run directories."""
    gdir.mkdir(parents=True, exist_ok=True)
    with open(gdir / STDOUT_LOG, "wb") as out, open(gdir / STDERR_LOG, "wb") as err:
        yield out, err


def _attach_launcher_log(store: ResultStore, spec: RunSpec, launcher_log: Path) -> None:
    """The launcher's report (which rank died, its exit code) appended to the failed run's
    stderr.log, where the run's error line and stderr tail are read from, as for a run
    launched alone."""
    try:
        text = launcher_log.read_bytes()
    except OSError:
        return
    with open(store.stderr_path(spec.run_id), "ab") as f:
        f.write(b"\n--- the rank group's launcher ---\n" + text)


def _cause(ranks: list[Any], ended: dict[int, float], stderr: str) -> int | None:
    """The rank whose failure came first. A rank that raised prints its tagged line before it
    closes its connections, so in the run's log (every rank appends to it) that line comes
    before the lines of the peers it took down; those may still exit first, as the failed
    rank's teardown takes seconds. A rank that crashed prints nothing: it is the first to end.
    The rank named is waited for (its exit code), as long as the ranks' clean-up may take."""
    first = _first_failed(ranks, ended)
    tagged = runfiles.tagged_ranks(stderr)
    if first is None or first not in tagged:
        return first
    cause = tagged[0]
    if not 0 <= cause < len(ranks):
        return first
    deadline = time.monotonic() + procs.GRACE_S
    while cause not in ended and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return cause if cause in ended and ranks[cause].returncode != 0 else first


def _first_failed(ranks: list[Any], ended: dict[int, float]) -> int | None:
    """The process that ended first with a non-zero code (None: none has)."""
    bad = [i for i in ended if ranks[i].returncode != 0]
    return min(bad, key=lambda i: ended[i]) if bad else None
