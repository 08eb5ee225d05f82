"""A run's files on the driver's side, from its start to its finished run.json.

Every launcher and isolation mode records a run the same way: :func:`start_record` gives it a
clean directory, its spec.json and a run.json saying ``running``; :func:`finish` merges the
ranks' parts, lists the hosts, and writes the status with, when it is not ok, the error line
and the tail of stderr. :func:`interrupt_marks` marks runs interrupted on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from qbench.launch import local, machine, procs
from qbench.records import interference, memory
from qbench.records.schema import WORKER_FAILED as FAILED_TAG
from qbench.records.schema import RunRecord
from qbench.records.store import (
    RANK_PARTS,
    ResultStore,
    atomic_write_json,
    atomic_write_parquet,
    epochs_part,
    host_parts,
    interference_parts,
    memory_parts,
    model_part,
    rank_parts,
    timeline_beside,
)
from qbench.spec.runspec import RunSpec

if TYPE_CHECKING:
    from qbench.launch.launcher import Launcher

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


def machine_doc(prov: Provenance, network: dict[str, Any] | None = None) -> dict[str, Any]:
    """machine.json: the sweep's, or with ``network`` (``Launcher.network``: emulated hosts and
    links as built here, or a Slurm allocation's own) a run's; each rank's host is in its
    ``parts/host-<rank>.json``."""
    doc: dict[str, Any] = {
        **prov.machine, "versions": prov.versions, "git_commit": prov.git_commit,
    }  # fmt: skip
    if network is not None:
        doc["network"] = network
        doc["driver_host"] = prov.machine.get("hostname")
    return doc


def start_record(
    spec: RunSpec, store: ResultStore, prov: Provenance, *, launcher: Launcher,
    isolation: str = "process", group: dict[str, Any] | None = None,
) -> RunRecord:  # fmt: skip
    """A clean run directory (spec.json, machine.json) and run.json saying ``running``."""
    reset_run_dir(store, spec)
    doc = machine_doc(prov, launcher.network(spec))
    atomic_write_json(store.machine_path(spec.run_id), doc)
    record = RunRecord(
        run_id=spec.run_id, status="running", labels=spec.labels(), spec=spec.to_dict(),
        started=now(), machine=prov.machine, versions=prov.versions, git_commit=prov.git_commit,
        isolation=isolation, group=group,
    )  # fmt: skip
    store.write_record(record)
    return record


def record_skipped(spec: RunSpec, store: ResultStore, prov: Provenance, reason: str) -> None:
    """A run that cannot start here: its run.json says why (never ``failed``: nothing ran)."""
    reset_run_dir(store, spec)
    when = now()
    store.write_record(RunRecord(
        run_id=spec.run_id, status=SKIPPED, labels=spec.labels(), spec=spec.to_dict(),
        started=when, finished=when, machine=prov.machine, versions=prov.versions,
        git_commit=prov.git_commit,
        error=f"skipped: this machine lacks {reason} (--skip-unavailable); install it and "
        "re-run the sweep to run it",
    ))  # fmt: skip


def finish(
    spec: RunSpec, store: ResultStore, record: RunRecord, status: str, code: int | None,
    elapsed: float, dead: tuple[int, int | None] | None = None, error: str | None = None,
) -> RunRecord:  # fmt: skip
    """The run's records once its processes are done: parts merged, hosts listed, status and
    (when not ok) the error line and the tail of stderr. ``dead``: (rank, exit code) of the
    rank that failed first when the driver saw it itself (ranks it started one by one); else
    the launcher's report in stderr names it. ``error``: the line, where the driver knows it."""
    record.duration_s = round(elapsed, 3)
    record.finished = now()
    record.exit_code = code
    status = _merge_parts(store, spec, status)
    _record_hosts(store, spec)
    record.interference = _interference(store, spec)
    record.memory = memory.combine(_json_parts(memory_parts(store.parts_dir(spec.run_id))))
    record.labels.update(_model_labels(store, spec))
    record.status = status
    if status != "ok":
        record.stderr_tail = _tail(store.stderr_path(spec.run_id))
        stderr = read_log(store.stderr_path(spec.run_id))
        record.error = error or _error_line(status, code, stderr, spec, dead)
    store.write_record(record)
    return record


def reset_run_dir(store: ResultStore, spec: RunSpec) -> None:
    parts = store.parts_dir(spec.run_id)
    if parts.exists():
        for p in parts.iterdir():
            p.unlink()
    store.iterations_path(spec.run_id).unlink(missing_ok=True)
    for kind in RANK_PARTS:
        store.merged_path(spec.run_id, kind).unlink(missing_ok=True)
    store.epochs_path(spec.run_id).unlink(missing_ok=True)
    timeline_beside(parts).unlink(missing_ok=True)  # the peers of a replayed run wait for it
    for log in (store.stdout_path(spec.run_id), store.stderr_path(spec.run_id)):
        log.unlink(missing_ok=True)  # group mode appends: no lines of an earlier attempt
    atomic_write_json(store.spec_path(spec.run_id), spec.to_dict())


@contextmanager
def interrupt_marks(store: ResultStore, records: list[RunRecord]) -> Iterator[None]:
    """On Ctrl-C / SIGTERM, mark the runs interrupted before propagating (those in
    ``records`` then: the caller may remove the runs it finished meanwhile)."""
    with procs.sigterm_as_interrupt(replace=True):
        try:
            yield
        except KeyboardInterrupt:
            for record in records:
                record.status, record.finished = "interrupted", now()
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
    if status == "ok" and len(parts) != spec.placement.world_size:
        return "failed"
    if status == "ok" and spec.measurement.epochs and not store.epochs_path(spec.run_id).exists():
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


def _interference(store: ResultStore, spec: RunSpec) -> dict[str, Any] | None:
    """What else used each rank host over the measured iterations, from the ranks' parts."""
    docs = _json_parts(interference_parts(store.parts_dir(spec.run_id)))
    try:
        return interference.combine(docs)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):  # a part from another qbench
        return None


def _json_parts(paths: list[Path]) -> list[dict[str, Any]]:
    """The ranks' JSON parts that can be read (a rank killed mid-write leaves none)."""
    docs = []
    for p in paths:
        try:
            docs.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return [d for d in docs if isinstance(d, dict)]


def archive_attempt(store: ResultStore, spec: RunSpec) -> Path:
    """Move the run's files into ``attempts/<n>/`` (n = 1, 2, ...) before it runs again, so
    that every attempt's records stay on disk; returns that directory."""
    attempts = store.attempts_dir(spec.run_id)
    earlier = attempts_of(store, spec)
    target = attempts / str(int(earlier[-1].name) + 1 if earlier else 1)
    target.mkdir(parents=True)
    for p in store.run_dir(spec.run_id).iterdir():
        if p != attempts:
            p.rename(target / p.name)
    return target


def restore_attempt(store: ResultStore, spec: RunSpec, attempt: Path) -> None:
    """Put an archived attempt back as the run (the run's current files archived first)."""
    archive_attempt(store, spec)
    for p in attempt.iterdir():
        p.rename(store.run_dir(spec.run_id) / p.name)
    attempt.rmdir()


def attempts_of(store: ResultStore, spec: RunSpec) -> list[Path]:
    """The run's archived attempts, first to last."""
    attempts = store.attempts_dir(spec.run_id)
    if not attempts.is_dir():
        return []
    found = [p for p in attempts.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found, key=lambda p: int(p.name))


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def read_log(path: Path) -> str:
    """A log's text ('' where there is none yet)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _error_line(
    status: str, code: int | None, stderr: str, spec: RunSpec,
    dead: tuple[int, int | None] | None = None,
) -> str:  # fmt: skip
    """One line: which rank failed, how, and the exception it raised if it printed one."""
    if status == "timeout":
        timeout = spec.measurement.timeout
        return f"timed out after {timeout:g} s (scenario `timeout:`); processes killed"
    dead = dead or local.failed_rank(stderr)
    if dead is None:
        return _worker_failure(stderr, None) or (
            f"exit code {code}" if code is not None else status
        )
    rank, rank_code = dead
    what = f"rank {rank} of {spec.placement.world_size} exited with code {rank_code}"
    reason = _worker_failure(stderr, rank)
    return f"{what}: {reason}" if reason else f"{what} (no Python exception: crashed or killed)"


def _worker_failure(stderr: str, rank: int | None) -> str | None:
    """The exception a worker reported on its tagged line (of ``rank`` when given)."""
    found = _tagged(stderr, rank)
    return found[0][1] if found else None


def tagged_ranks(stderr: str) -> list[int]:
    """The ranks that printed a tagged failure line, in the order of their lines."""
    return [r for r, _ in _tagged(stderr, None) if r is not None]


def _tagged(stderr: str, rank: int | None) -> list[tuple[int | None, str]]:
    """(rank, exception) of each tagged failure line, in order; of ``rank`` when given. A
    rank that failed before it knew its number tags its line ``?`` (rank None here)."""
    found: list[tuple[int | None, str]] = []
    for line in stderr.splitlines():
        if not line.startswith(f"{FAILED_TAG} ") or " failed: " not in line:
            continue
        who, why = line[len(FAILED_TAG) + 1 :].split(" failed: ", 1)
        number = int(who) if who.isdigit() else None
        if rank is None or number == rank:
            found.append((number, why.strip()[:500]))
    return found


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
