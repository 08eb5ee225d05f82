"""A rank's side of a warm rank group: one launch, many runs.

``python -m qbench.run.worker OUT/.groups/<launch>/plan.json`` (torchrun, mpirun or the shaped
launcher, exactly as for one run) joins the communicator once and then runs the plan's
configurations in order. Each gets what a launch of its own would give it: a fresh model,
optimizer, compressor and data stream built from its spec.json (seeded the same way), its own
warm-up, its own parts, host and model files, and its own stdout.log / stderr.log (the rank's
file descriptors point there while it runs). What is shared is only what costs seconds and
holds no state of the run: the interpreter with torch imported, the process group (rendezvous
done once), the compiled kernels, and the dataset files read into memory (read-only tensors).

Between runs the rank drops every object of the last one (model, DDP and its reducer, the
hooks' threads, the optimizer, the compressors), collects garbage and gives cached CUDA memory
back, then writes its memory use beside its host file (``rss_mb``, ``max_rss_mb``: tests check
that neither grows along a group). Once every rank is there (a barrier), rank 0 writes the
run's done marker (``qbench.records.store.done_marker``), which the driver watches to finish
the run's records, count progress and time the next run; the ranks start the next run once
the driver has written the run's finished marker (its work then never runs beside a measured
iteration).

A rank that fails in a run prints the tagged line, writes what it has and ends the whole job
(as a single run does), so no peer waits for it; the driver marks that run failed and launches
the group again for the runs after it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from qbench.records.store import (
    STDERR_LOG,
    STDOUT_LOG,
    atomic_write_json,
    done_marker,
    finished_marker,
    host_part,
    parts_beside,
    ready_marker,
)
from qbench.run import lifecycle
from qbench.spec.runspec import RunSpec

COMM_SLACK_S = 60.0
WAIT_POLL_S = 0.002


def read_plan(plan: Path) -> list[tuple[Path, int]]:
    """The plan's runs in order: (spec.json path, index of the run in its rank group)."""
    doc = json.loads(Path(plan).read_text())
    return [(Path(c["spec"]), int(c["index"])) for c in doc["configs"]]


def main(plan: Path) -> int:
    configs = read_plan(plan)
    specs = [RunSpec.from_dict(json.loads(path.read_text())) for path, _ in configs]
    # The driver times each run (``timeout``) and kills the group; a collective that gave up
    # first would turn a hung peer into a failure of this rank, so the communicator waits longer.
    lifecycle.slow_start()
    cm = lifecycle.connect(specs[0], max(s.measurement.timeout for s in specs) + COMM_SLACK_S)
    cm.barrier()  # every rank is up: the first run's timeout counts from here
    if cm.rank == 0:
        atomic_write_json(ready_marker(Path(plan)), {"ready": True})
    # What exists now (torch, dynamo, the worker: millions of objects) lives as long as the
    # rank: out of the collector's sight, a collection between runs scans only what the runs
    # made (a full one took 0.6 s a run a rank on a 2-core machine, half of a quick sweep's CPU)
    gc.freeze()
    for k, ((path, index), spec) in enumerate(zip(configs, specs, strict=True)):
        fault = lifecycle.fault_injection(cm.rank, spec.run_id, index)
        with _logs(path.parent):
            ok = lifecycle.run_config(spec, path, cm, fault)
        if not ok:
            cm.abort(1)  # peers may be blocked in a collective: end the whole job now
            cm.close()
            return 1
        release(spec)
        _write_memory(parts_beside(path), cm.rank, spec)
        cm.barrier()  # every rank's parts are on disk
        if cm.rank == 0:
            atomic_write_json(done_marker(parts_beside(path)), {"run_id": spec.run_id})
        if k + 1 < len(configs):
            if cm.rank == 0:
                _wait_for(
                    finished_marker(parts_beside(path)), spec.measurement.timeout + COMM_SLACK_S
                )
            cm.barrier()  # the driver has finished the run's records: the next one starts
    cm.close()
    return 0


def _wait_for(marker: Path, limit_s: float) -> None:
    """Until the driver wrote ``marker`` (milliseconds: it merges a run's parts); past
    ``limit_s`` go on, as the driver kills a group it has given up on anyway."""
    deadline = time.monotonic() + limit_s
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(WAIT_POLL_S)


def release(spec: RunSpec) -> None:
    """Give back what the last run held: its objects are garbage once its loop returned, and
    a collection frees their cycles (DDP's reducer, autograd graphs); CUDA's cached blocks go
    back to the device so the next run starts from the same free memory."""
    gc.collect()
    if spec.placement.device_kind == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def memory() -> dict[str, Any]:
    """This process's resident memory now and its peak since the run began (MiB; each run
    resets the peak, ``qbench.run.memory``), and CUDA's."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    out: dict[str, Any] = {
        "rss_mb": round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda_allocated_mb"] = round(torch.cuda.memory_allocated() / 2**20, 1)
        out["cuda_reserved_mb"] = round(torch.cuda.memory_reserved() / 2**20, 1)
    return out


def _write_memory(parts: Path, rank: int, spec: RunSpec) -> None:
    """Memory after the run and its release, beside the host this rank ran on."""
    path = host_part(parts, rank)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = {"rank": rank}
    doc.update(memory(), isolation="group")
    atomic_write_json(path, doc)


@contextlib.contextmanager
def _logs(run_dir: Path) -> Iterator[None]:
    """This rank's stdout and stderr (file descriptors 1 and 2, so C libraries' messages too)
    appended to the run's own logs while it runs, as if the run had been launched alone."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    files = [os.open(run_dir / name, flags, 0o644) for name in (STDOUT_LOG, STDERR_LOG)]
    try:
        for fd, target in zip(files, (1, 2), strict=True):
            os.dup2(fd, target)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, target in zip(saved, (1, 2), strict=True):
            os.dup2(fd, target)
        for fd in (*files, *saved):
            os.close(fd)
