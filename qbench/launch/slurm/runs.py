"""Runs under Slurm: one run as its own sbatch job, many as job arrays (one per shape), or one
srun step when qbench already runs inside an allocation.

* ``sbatch``: qbench writes ``RUN_DIR/slurm-job.sh`` and submits it with ``sbatch --parsable
  --wait``; the script starts the ranks with ``srun`` (gloo, nccl; ``mpi: pmix``) or ``mpirun``
  (mpi: Open MPI finds the allocation through the SLURM_* variables). The job's output goes to
  RUN_DIR/stdout.log and stderr.log.
* job array: one ``sbatch --array=0-(N-1)%M`` for many runs of one shape; task i reads the spec
  path and run directory of run i from list files and redirects its output into that run dir.
* ``srun``: inside an allocation (``salloc``, or qbench started by a batch script) the driver runs
  ``srun`` (or ``mpirun``) itself and waits for it like the local launcher.

This module writes the scripts and builds the submissions; :mod:`qbench.launch.slurm.jobs`
submits them and follows them to the end.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from qbench.errors import UserError
from qbench.launch import local, procs
from qbench.launch.local import free_port
from qbench.launch.slurm.argv import (
    EXIT_CODE,
    SCRIPT,
    SPEC_SLOT,
    STARTED,
    array_range,
    array_script,
    batch_script,
    gpus_for,
    job_name,
    launch_argv,
    sbatch_argv,
    spec_nodes,
)
from qbench.launch.slurm.jobs import Item, Job, Result, submit_and_wait
from qbench.launch.slurm.options import SlurmOptions, in_allocation, resolve_mode
from qbench.records.store import SLURM_DIR, STDERR_LOG, STDOUT_LOG

if TYPE_CHECKING:
    from qbench.spec.matrix import RunSpec

Shape = tuple[int, int, int, str]
"""(world size, nodes, GPUs per node, launcher): runs of one shape can share a job array."""


def run(
    spec: RunSpec, spec_path: Path, run_dir: Path, timeout: float, options: SlurmOptions
) -> Result:
    """Run one run under Slurm; same contract as :func:`qbench.launch.procs.run_jobs`: logs in
    run_dir (stdout.log, stderr.log), status ok / failed / timeout, and the exit code."""
    spec_path, run_dir = Path(spec_path).absolute(), Path(run_dir).absolute()
    nodes = options.nodes or spec_nodes(spec)
    if resolve_mode(options.mode) == "srun":
        return _run_step(spec, spec_path, run_dir, timeout, options, nodes)
    (result,) = _run_batches([Item(spec, spec_path, run_dir)], timeout, options, array=False)
    return result


def run_array(
    items: list[tuple[RunSpec, Path, Path]],
    timeout: float,
    options: SlurmOptions,
    work_dir: Path | None = None,
) -> list[Result]:
    """Run many runs as sbatch job arrays: one array per shape (world size, nodes, how ranks
    start), all submitted at once; task i of an array runs item i. Returns each item's
    (status, exit code) in order. Array files (script, list files, job-level logs) go to
    ``work_dir`` (default: ``.slurm/`` beside the run directories)."""
    if not items:
        return []
    its = [Item(s, Path(p).absolute(), Path(d).absolute()) for s, p, d in items]
    if work_dir is None:
        work_dir = Path(os.path.commonpath([str(i.run_dir.parent) for i in its])) / SLURM_DIR
    return _run_batches(its, timeout, options, array=True, work_dir=Path(work_dir).absolute())


def _run_step(
    spec: RunSpec,
    spec_path: Path,
    run_dir: Path,
    timeout: float,
    options: SlurmOptions,
    nodes: int,
) -> Result:
    """srun (or mpirun) from the driver, inside the allocation (or srun allocating itself).
    Ends like a local run: the timeout or Ctrl-C SIGTERMs srun, which cancels its step."""
    inside = in_allocation()
    argv = launch_argv(
        spec.placement.backend,
        spec_path,
        spec.placement.world_size,
        options,
        nodes=nodes,
        allocate=not inside,
        time_s=timeout,
        job_name=job_name(spec.run_id),
        gpus_per_node=gpus_for(spec, options, nodes),
        mpirun=local.find_mpirun() if spec.placement.backend == "mpi" else None,
    )
    env = local.worker_env()
    if spec.placement.backend != "mpi":
        env["MASTER_PORT"] = str(free_port())  # the driver runs in the allocation, like rank 0
    with procs.sigterm_as_interrupt():
        return procs.run_jobs([(argv, env)], run_dir, timeout)


def _shape(spec: RunSpec, options: SlurmOptions) -> Shape:
    """What one job of this run asks for and how its ranks start: runs of one shape can share
    a job array. (world size, nodes, GPUs per node, launcher)"""
    how = (
        "mpirun"
        if spec.placement.backend == "mpi" and options.mpi == "mpirun"
        else spec.placement.backend
    )
    nodes = options.nodes or spec_nodes(spec)
    return spec.placement.world_size, nodes, gpus_for(spec, options, nodes), how


def _run_batches(
    items: list[Item],
    timeout: float,
    options: SlurmOptions,
    *,
    array: bool,
    work_dir: Path | None = None,
) -> list[Result]:
    mpirun = local.find_mpirun() if any(i.spec.placement.backend == "mpi" for i in items) else None
    for it in items:
        it.run_dir.mkdir(parents=True, exist_ok=True)
        for name in (STARTED, EXIT_CODE):
            (it.run_dir / name).unlink(missing_ok=True)
    if not array:
        (it,) = items
        jobs = [_single_job(it, timeout, options, mpirun)]
    else:
        assert work_dir is not None
        jobs = _array_jobs(items, timeout, options, mpirun, work_dir)
    return submit_and_wait(jobs, items, timeout, array=array)


def _single_job(it: Item, timeout: float, options: SlurmOptions, mpirun: str | None) -> Job:
    """``RUN_DIR/slurm-job.sh`` written, and the sbatch that submits it."""
    python = sys.executable
    ws, nodes, gpus, _ = _shape(it.spec, options)
    command = launch_argv(
        it.spec.placement.backend,
        it.spec_path,
        ws,
        options,
        nodes=nodes,
        python=python,
        mpirun=mpirun,
    )
    script = it.run_dir / SCRIPT
    script.write_text(
        batch_script(
            command, it.run_dir, torch_env=it.spec.placement.backend != "mpi", python=python,
            title=f"qbench run {it.spec.run_id}",
        )
    )  # fmt: skip
    argv = sbatch_argv(
        script, job_name=job_name(it.spec.run_id), output=it.run_dir / STDOUT_LOG,
        error=it.run_dir / STDERR_LOG, ntasks=ws, options=options, nodes=nodes, time_s=timeout,
        gpus_per_node=gpus,
    )  # fmt: skip
    return Job(argv, it.run_dir, "slurm-submit", error_log=it.run_dir / STDERR_LOG)


def _array_jobs(
    items: list[Item], timeout: float, options: SlurmOptions, mpirun: str | None, work_dir: Path
) -> list[Job]:
    """One job array per shape, its files in ``work_dir/array-<time>-<pid>-<g>/``; each item
    learns its array (``job``) and task index (``ref``, the job id is added on submission)."""
    python = sys.executable
    jobs: list[Job] = []
    groups: dict[Shape, list[Item]] = {}
    for it in items:
        groups.setdefault(_shape(it.spec, options), []).append(it)
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for g, ((ws, nodes, gpus, how), members) in enumerate(groups.items()):
        d = work_dir / f"array-{stamp}-{g}"
        d.mkdir(parents=True, exist_ok=True)
        for k, it in enumerate(members):
            it.job, it.ref = len(jobs), str(k)
        (d / "specs.txt").write_text("".join(f"{_line(i.spec_path)}\n" for i in members))
        (d / "run_dirs.txt").write_text("".join(f"{_line(i.run_dir)}\n" for i in members))
        backend = members[0].spec.placement.backend
        command = launch_argv(
            backend, SPEC_SLOT, ws, options, nodes=nodes, python=python, mpirun=mpirun
        )
        script = d / SCRIPT
        script.write_text(
            array_script(
                command, d / "specs.txt", d / "run_dirs.txt", torch_env=how != "mpirun",
                python=python, title=f"qbench job array of {len(members)} runs ({how})",
            )
        )  # fmt: skip
        argv = sbatch_argv(
            script, job_name=f"qbench-array-{how}-w{ws}", output=d / "slurm-%A_%a.out",
            error=d / "slurm-%A_%a.err", ntasks=ws, options=options, nodes=nodes,
            time_s=timeout, array=array_range(len(members), options.max_parallel),
            gpus_per_node=gpus,
        )  # fmt: skip
        jobs.append(Job(argv, d, "slurm-submit"))
    return jobs


def _line(path: Path) -> str:
    if "\n" in str(path):
        raise UserError(f"path {str(path)!r} holds a newline; use a plain output directory")
    return str(path)
