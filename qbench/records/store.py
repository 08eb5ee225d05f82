"""The only module that knows where results live. Writes are atomic (write, fsync, rename).

A results directory::

    DIR/scenario.yaml scenario.resolved.json machine.json sweep.json .qbench.lock
    DIR/<run id>/spec.json run.json machine.json stdout.log stderr.log [timeline.json]
                 iterations.parquet [epochs telemetry buckets].parquet
                 profile/rank-<rank>.pt.trace.json (profile: true)
                 parts/<kind>-<rank>.parquet host-<rank>.json model.json epochs.parquet
                       interference-<rank>.json (what else used the machine, per rank)
                       memory-<rank>.json (the rank's peak memory over the run)
                       done.json (group mode: rank 0, when every rank finished the run)
                 attempts/<n>/ (sweep --rerun-disturbed: an earlier attempt's files, as above)
    DIR/.groups/<launch>/plan.json stdout.log stderr.log (group mode: one per launch)
    DIR/report/summary.{csv,md} accuracy.csv compare.{csv,md} index.{md,html} figures

Launchers add files of their own to a run directory (the Slurm launcher's job script and
markers) under the names they choose. Imports nothing heavy: the launchers use the log names.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    import pandas as pd

    from qbench.records.schema import RunRecord

# -- the results directory
SCENARIO_YAML = "scenario.yaml"  # the scenario as run, --set overrides applied
SCENARIO_RESOLVED = "scenario.resolved.json"  # every default filled in, and the run matrix
MACHINE_JSON = "machine.json"  # the driver's machine; in a run dir, with the ranks' hosts
SWEEP_JSON = "sweep.json"
TIMELINE = "timeline.json"  # in a run dir: the compute a replayed run stood in for
LOCK_FILE = ".qbench.lock"  # one sweep at a time (qbench.records.lock)
SLURM_DIR = ".slurm"  # Slurm job arrays' scripts and logs
GROUPS_DIR = ".groups"  # warm rank groups: each launch's plan and its launcher's logs
GROUP_PLAN = "plan.json"  # the configurations one launch of a rank group runs, in order
# -- a run directory
RUN_JSON = "run.json"
ITERATIONS = "iterations.parquet"
EPOCHS = "epochs.parquet"  # accuracy mode: one row per epoch
TELEMETRY = "telemetry.parquet"  # per-layer compression telemetry, when requested
BUCKETS = "buckets.parquet"  # DDP runs: per-bucket hand-over and ready times
SPEC_JSON = "spec.json"
STDOUT_LOG, STDERR_LOG = "stdout.log", "stderr.log"  # the launcher's (all ranks')
PARTS = "parts"  # per-rank partial records written by workers, merged by the driver
ATTEMPTS = "attempts"  # sweep --rerun-disturbed: each earlier attempt's files, attempts/<n>/
PROFILE = "profile"  # profile: true: a Chrome trace per rank (qbench.run.profile)
# Per-rank parquet parts (parts/<kind>-<rank>.parquet) and the run file each merges into.
RANK_PARTS = {"rank": ITERATIONS, "telemetry": TELEMETRY, "buckets": BUCKETS}
# -- the report directory
REPORT = "report"
SUMMARY_CSV, SUMMARY_MD = "summary.csv", "summary.md"
ACCURACY_CSV = "accuracy.csv"
COMPARE_CSV, COMPARE_MD = "compare.csv", "compare.md"
INDEX_MD, INDEX_HTML = "index.md", "index.html"  # the report page (qbench.report.page)


def _atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write`` into a temporary file beside ``path``, fsync, then rename over ``path``: a
    reader sees the old file or the whole new one, never a torn one, whatever kills us."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    _atomic(path, lambda f: f.write(data))


def strict_json(obj: Any) -> Any:
    """``obj`` for strict JSON readers, which reject NaN and infinities: those become null (a
    phase an overlapped scheme does not have, a fit without points), tuples lists, numpy scalars
    Python numbers."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict_json(v) for v in obj]
    if type(obj).__module__ == "numpy" and hasattr(obj, "item"):  # a numpy scalar
        return strict_json(obj.item())
    return obj


def atomic_write_json(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"
    atomic_write_bytes(path, text.encode())


def atomic_write_parquet(path: Path, frame: pd.DataFrame) -> None:
    _atomic(path, lambda f: frame.to_parquet(f, index=False))


def parts_beside(spec_path: Path) -> Path:
    """The parts directory of the run whose spec a worker was started with."""
    return Path(spec_path).parent / PARTS


def rank_part(parts: Path, kind: str, rank: int) -> Path:
    """Where a worker writes its rank's part of ``kind`` (a key of ``RANK_PARTS``)."""
    return parts / f"{kind}-{rank}.parquet"


def rank_parts(parts: Path, kind: str) -> list[Path]:
    """Every rank's part of ``kind`` found in ``parts``, by rank."""
    found = parts.glob(f"{kind}-*.parquet")
    return sorted(found, key=lambda p: int(p.stem.rpartition("-")[2]))


def host_part(parts: Path, rank: int) -> Path:
    """Where a worker writes the host it ran on (the driver adds them to machine.json)."""
    return parts / f"host-{rank}.json"


def trace_path(parts: Path, rank: int) -> Path:
    """Where a profiled rank writes its Chrome trace: ``<run>/profile/rank-<r>.pt.trace.json``
    (the suffix TensorBoard's profiler plugin looks for)."""
    return parts.parent / PROFILE / f"rank-{rank}.pt.trace.json"


def epochs_part(parts: Path) -> Path:
    """Where rank 0 writes the epoch rows (accuracy mode); the driver moves it into the run."""
    return parts / EPOCHS


def model_part(parts: Path) -> Path:
    """Where rank 0 writes the model's size and FLOPs (labels the driver adds to run.json)."""
    return parts / "model.json"


def timeline_beside(parts: Path) -> Path:
    """A replayed run's compute timeline (``compute: replay``, ``qbench.run.replay``): rank 0
    measures it, every rank replays it; it stays in the run directory as what the run rests on."""
    return parts.parent / TIMELINE


def done_marker(parts: Path) -> Path:
    """Group mode: rank 0 writes it once every rank has finished the run and written its
    parts; the driver then finalizes the run while the group goes on with the next one."""
    return parts / "done.json"


def finished_marker(parts: Path) -> Path:
    """Group mode: the driver writes it once it has finished the run's records (and shown its
    progress); rank 0 waits for it before the group starts the next run, so that none of the
    driver's work shares the CPU with the next run's iterations."""
    return parts / "finished.json"


def ready_marker(plan: Path) -> Path:
    """Group mode: rank 0 writes it beside the plan once every rank has started, imported
    torch and joined the communicator; the driver starts the first run's clock there, as
    starting takes tens of seconds on a loaded machine and measures nothing."""
    return plan.parent / "ready.json"


def is_group_plan(path: Path) -> bool:
    """Whether a worker was started with a group plan (else with one run's spec.json)."""
    return Path(path).name == GROUP_PLAN


def host_parts(parts: Path) -> list[Path]:
    return sorted(parts.glob("host-*.json"), key=lambda p: int(p.stem.rpartition("-")[2]))


def interference_part(parts: Path, rank: int) -> Path:
    """Where a rank writes what else used its machine while the run was measured
    (``qbench.run.interference``; the driver combines them into run.json)."""
    return parts / f"interference-{rank}.json"


def interference_parts(parts: Path) -> list[Path]:
    found = parts.glob("interference-*.json")
    return sorted(found, key=lambda p: int(p.stem.rpartition("-")[2]))


def memory_part(parts: Path, rank: int) -> Path:
    """Where a rank writes its peak memory over the run (``qbench.run.memory``; the driver
    gathers them into run.json)."""
    return parts / f"memory-{rank}.json"


def memory_parts(parts: Path) -> list[Path]:
    found = parts.glob("memory-*.json")
    return sorted(found, key=lambda p: int(p.stem.rpartition("-")[2]))


class ResultStore:
    """A results directory: one sub-directory per run id."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def run_dir(self, run_id: str) -> Path:
        return self.root / run_id

    def spec_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / SPEC_JSON

    def parts_dir(self, run_id: str) -> Path:
        return self.run_dir(run_id) / PARTS

    def report_dir(self) -> Path:
        return self.root / REPORT

    def scenario_path(self) -> Path:
        return self.root / SCENARIO_YAML

    def resolved_path(self) -> Path:
        return self.root / SCENARIO_RESOLVED

    def sweep_path(self) -> Path:
        return self.root / SWEEP_JSON

    def slurm_dir(self) -> Path:
        return self.root / SLURM_DIR

    def group_dir(self, launch: str) -> Path:
        """One launch of a rank group: its plan and the launcher's own logs."""
        return self.root / GROUPS_DIR / launch

    def group_plan(self, launch: str) -> Path:
        return self.group_dir(launch) / GROUP_PLAN

    def stdout_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / STDOUT_LOG

    def machine_path(self, run_id: str | None = None) -> Path:
        """The sweep's machine.json, or with ``run_id`` that run's."""
        return (self.root if run_id is None else self.run_dir(run_id)) / MACHINE_JSON

    def stderr_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / STDERR_LOG

    def epochs_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / EPOCHS

    def attempts_dir(self, run_id: str) -> Path:
        """``sweep --rerun-disturbed``: earlier attempts of a run, ``attempts/<n>/`` each
        holding that attempt's files as the run directory held them."""
        return self.run_dir(run_id) / ATTEMPTS

    def merged_path(self, run_id: str, kind: str) -> Path:
        """The run file the per-rank parts of ``kind`` (a key of ``RANK_PARTS``) merge into."""
        return self.run_dir(run_id) / RANK_PARTS[kind]

    def write_record(self, record: RunRecord) -> None:
        atomic_write_json(self.run_dir(record.run_id) / RUN_JSON, record.to_dict())

    def read_record(self, run_id: str) -> RunRecord | None:
        return self.read_record_at(self.run_dir(run_id))

    def read_record_at(self, directory: Path) -> RunRecord | None:
        """The run.json in ``directory`` (a run's, or one of its ``attempts/<n>/``)."""
        from qbench.records.schema import RunRecord  # pandas: only where records are read

        path = directory / RUN_JSON
        if not path.exists():
            return None
        return RunRecord.from_dict(json.loads(path.read_text()))

    def write_iterations(self, run_id: str, frame: pd.DataFrame) -> None:
        atomic_write_parquet(self.run_dir(run_id) / ITERATIONS, frame)

    def iterations_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / ITERATIONS

    def buckets_path(self, run_id: str) -> Path:
        """DDP runs' per-bucket hand-over and ready times (``records.BUCKET_COLUMNS``)."""
        return self.run_dir(run_id) / BUCKETS

    def run_ids(self) -> Iterator[str]:
        """Run ids with a run.json, sorted."""
        if not self.root.is_dir():
            return iter(())
        return iter(sorted(p.parent.name for p in self.root.glob(f"*/{RUN_JSON}")))
