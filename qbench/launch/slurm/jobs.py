"""The Slurm launcher's job state machine: submit with sbatch, watch each run's marker files
until it ends, cancel what runs past its timeout, and cancel everything on Ctrl-C or SIGTERM.

Every job script touches ``RUN_DIR/slurm-started`` when it starts and writes the launcher's exit
code to ``RUN_DIR/slurm-exit-code`` when it ends (:mod:`qbench.launch.slurm.argv`). Those files
tell when a run starts (its timeout counts from there, not from submission: queueing is free)
and how it ended, sooner and more reliably than ``sbatch --wait`` (which polls the controller
every few seconds and exits 0 for a cancelled job) or sacct (often not configured). A run past
its timeout is cancelled with scancel; so is every job of ours on Ctrl-C or SIGTERM.

Per run (an :class:`Item`): waiting (no start marker) -> running (marker seen, its timeout
counting) -> ended (exit-code file: ok or failed), or cancelled (past its timeout; timeout once
it has left the queue), or gone without an exit code (failed, or timeout when Slurm's log says
``DUE TO TIME LIMIT``).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from qbench.errors import UserError
from qbench.launch import local, procs
from qbench.launch.slurm.argv import EXIT_CODE, STARTED, scancel_argv

if TYPE_CHECKING:
    from qbench.spec.matrix import RunSpec

POLL_S = 0.2
SUBMIT_WAIT_S = 120.0  # for sbatch to print the job id
GONE_WAIT_S = 60.0  # for a cancelled job to leave the queue
Result = tuple[str, int | None]
"""(status ok / failed / timeout, exit code), as :func:`qbench.launch.procs.run_jobs` gives."""


@dataclass
class Item:
    """One run and where it is in the state machine."""

    spec: RunSpec
    spec_path: Path
    run_dir: Path
    job: int = 0  # index into the submissions
    ref: str = ""  # what scancel / squeue take: JOBID or JOBID_TASK
    started: float | None = None
    cancelled: float | None = None
    result: Result | None = None


@dataclass
class Job:
    """One sbatch submission: a single run's job, or a job array of many."""

    argv: list[str]
    log_dir: Path
    name: str
    proc: subprocess.Popen[bytes] | None = None
    job_id: str = ""
    files: list[IO[bytes]] = field(default_factory=list)
    error_log: Path | None = None  # the job-level stderr (for "DUE TO TIME LIMIT")


def submit_and_wait(
    jobs: list[Job], items: list[Item], timeout: float, *, array: bool
) -> list[Result]:
    """Submit every job, wait until every item has ended, and return the items' results in
    order. On any exception (Ctrl-C, SIGTERM) nothing more is submitted and what was is
    cancelled before it propagates."""
    env = _submit_env(local.worker_env())
    try:
        with procs.sigterm_as_interrupt():
            for job in jobs:
                _submit(job, env)
            for it in items:
                job_id = jobs[it.job].job_id
                it.ref = f"{job_id}_{it.ref}" if array else job_id
            _wait(jobs, items, timeout)
        # A job that wrote its exit code may still be completing (CG: ranks being killed,
        # epilog); the next run would start beside its teardown, on a node it still holds.
        _wait_gone([j.job_id for j in jobs if j.job_id])
    except BaseException:
        _stop_sbatch(jobs)  # no more submissions; then what was submitted is cancelled
        _cancel_all(jobs)
        raise
    finally:
        _stop_sbatch(jobs)
    return [it.result or ("failed", None) for it in items]


def _submit_env(base: Mapping[str, str]) -> dict[str, str]:
    """The driver's environment less the SLURM_* / SBATCH_* of an allocation it may run in
    (they would leak into the new job's request); SLURM_CONF stays."""
    return {
        k: v
        for k, v in base.items()
        if not (k.startswith(("SLURM_", "SBATCH_", "SALLOC_")) and k != "SLURM_CONF")
    }


def _submit(job: Job, env: dict[str, str]) -> None:
    """Start ``sbatch --parsable --wait`` and read the job id it prints on submission."""
    out_path = job.log_dir / f"{job.name}.out"
    err_path = job.log_dir / f"{job.name}.err"
    out, err = open(out_path, "wb"), open(err_path, "wb")  # noqa: SIM115 (closed by _stop_sbatch)
    job.files += [out, err]
    # A session of its own: Ctrl-C at the terminal reaches the driver only, which cancels.
    try:
        job.proc = subprocess.Popen(
            job.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )  # fmt: skip
    except FileNotFoundError:
        raise UserError(
            f"launcher slurm: {job.argv[0]} not found; install Slurm (Debian: `make slurm`) or "
            "use --launcher local"
        ) from None
    deadline = time.monotonic() + SUBMIT_WAIT_S
    while True:
        ended = job.proc.poll() is not None  # before reading: what it printed is in the file
        if _read_job_id(job):
            return
        if ended or time.monotonic() > deadline:
            lines = err_path.read_text(errors="replace").strip().splitlines()
            why = lines[-1] if lines else f"exit code {job.proc.returncode}, no job id"
            raise UserError(
                f"sbatch refused the job ({why}); fix the scenario's `slurm:` options "
                "(partition, account, time, nodes, ...) or use --launcher local"
            )
        time.sleep(POLL_S / 4)


def _read_job_id(job: Job) -> bool:
    """The id ``sbatch --parsable`` printed ("JOBID" or "JOBID;CLUSTER"), once it has."""
    if not job.job_id:
        with suppress(OSError):
            text = (job.log_dir / f"{job.name}.out").read_text(errors="replace")
            first = text.split("\n", 1)[0].split(";", 1)[0].strip() if "\n" in text else ""
            job.job_id = first if first.isdigit() else ""
    return bool(job.job_id)


def _wait(jobs: list[Job], items: list[Item], timeout: float) -> None:
    """Until every item has ended: its exit-code file, its job gone without one, or cancelled
    after running past ``timeout`` seconds (counted from its start marker)."""
    while True:
        now = time.monotonic()
        for it in items:
            if it.result is not None:
                continue
            if it.cancelled is not None:
                if not _in_queue(it.ref) or now - it.cancelled > GONE_WAIT_S:
                    it.result = ("timeout", None)
                continue
            code = _exit_code(it.run_dir)
            if code is not None:
                it.result = ("ok" if code == 0 else "failed", code)
                continue
            if it.started is None and (it.run_dir / STARTED).exists():
                it.started = now
            if it.started is not None and now - it.started > timeout:
                _scancel(it.ref)
                it.cancelled = now
                continue
            proc = jobs[it.job].proc
            if proc is not None and proc.poll() is not None:
                code = _exit_code(it.run_dir)  # it may have ended just now
                if code is not None:
                    it.result = ("ok" if code == 0 else "failed", code)
                elif _hit_time_limit(jobs[it.job], it):
                    it.result = ("timeout", None)
                else:  # ended without writing one: killed, node failure, ...
                    it.result = ("failed", proc.returncode or None)
        if all(it.result is not None for it in items):
            return
        time.sleep(POLL_S)


def _exit_code(run_dir: Path) -> int | None:
    try:
        text = (run_dir / EXIT_CODE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.lstrip("-").isdigit() else None


def _hit_time_limit(job: Job, it: Item) -> bool:
    """Slurm killed the job at its --time limit ("CANCELLED ... DUE TO TIME LIMIT")."""
    logs = [job.error_log or job.log_dir / f"slurm-{it.ref}.err"]  # slurm-%A_%a.err
    for log in logs:
        with suppress(OSError):
            if "DUE TO TIME LIMIT" in log.read_text(errors="replace"):
                return True
    return False


def _in_queue(ref: str) -> bool:
    """The job (array task) is still known to the controller: pending, running, completing."""
    try:
        p = subprocess.run(
            ["squeue", "--noheader", "--jobs", ref, "--format", "%T"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return True
    return p.returncode == 0 and bool(p.stdout.strip())


def _scancel(ref: str) -> None:
    with suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(scancel_argv(ref), capture_output=True, timeout=30, stdin=subprocess.DEVNULL)


def _cancel_all(jobs: list[Job]) -> None:
    """Cancel every job we submitted and wait (bounded) until they have left the queue, so no
    rank keeps writing into a run directory that a later sweep redoes."""
    ids = [j.job_id for j in jobs if j.proc is not None and _read_job_id(j)]
    for job_id in ids:
        _scancel(job_id)
    _wait_gone(ids)


def _wait_gone(ids: list[str]) -> None:
    """Until the jobs have left the queue, for at most GONE_WAIT_S seconds."""
    deadline = time.monotonic() + GONE_WAIT_S
    while ids and time.monotonic() < deadline:
        ids = [i for i in ids if _in_queue(i)]
        if ids:
            time.sleep(POLL_S)


def _stop_sbatch(jobs: list[Job]) -> None:
    """sbatch --wait lags the job's end by its polling interval; once the exit-code files have
    told us, it is stopped (SIGTERM ends sbatch only, never the job)."""
    for job in jobs:
        if job.proc is not None and job.proc.poll() is None:
            job.proc.terminate()
        if job.proc is not None:
            try:
                job.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                job.proc.kill()
                job.proc.wait()
        for f in job.files:
            f.close()


_SRUN_FAILED = re.compile(
    r"srun: error: \S+: tasks? (\d+)[\d,-]*: Exited with exit code (\d+)", re.M
)


def failed_rank(stderr: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first task srun reports as failed, or the mpirun / torchrun
    report (see :func:`qbench.launch.local.failed_rank`)."""
    m = _SRUN_FAILED.search(stderr)
    if m:
        return int(m.group(1)), int(m.group(2))
    return local.failed_rank(stderr)
