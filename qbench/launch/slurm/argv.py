"""Pure builders of the Slurm launcher: argument lists for sbatch, srun and scancel, the
resources a run asks for, and the batch scripts sbatch runs. Nothing here starts a process or
reads the environment.

The one shell is the batch script that sbatch requires; the commands in it are argv lists
joined with :func:`shlex.join`. Every script touches ``RUN_DIR/slurm-started`` when it starts
and writes the launcher's exit code to ``RUN_DIR/slurm-exit-code`` when it ends; the driver
(:mod:`qbench.launch.slurm.jobs`) watches both.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from qbench.errors import UserError
from qbench.launch import local
from qbench.launch.slurm.options import SlurmOptions
from qbench.records.store import STDERR_LOG, STDOUT_LOG

if TYPE_CHECKING:
    from qbench.spec.matrix import RunSpec

SCRIPT = "slurm-job.sh"
STARTED = "slurm-started"
EXIT_CODE = "slurm-exit-code"
# Picks a free TCP port on the host that runs it (the batch host = the node of rank 0).
FREE_PORT_PY = "from qbench.launch.local import free_port; print(free_port())"


def worker_argv(spec_path: Path | str, python: str = sys.executable) -> list[str]:
    return [python, *local.WORKER, str(spec_path)]


def time_limit(timeout: float) -> str:
    """Slurm --time (minutes) for a run with this timeout: room for start-up, a backstop for
    a driver that died before it could cancel the job."""
    return str(max(1, math.ceil(timeout / 60)) + 1)


def allocation_args(
    options: SlurmOptions,
    ntasks: int,
    nodes: int | None = None,
    time_s: float | None = None,
    gpus_per_node: int | None = None,
) -> list[str]:
    """Resources of one job: what sbatch (or an allocating srun) asks for. ``gpus_per_node``
    (resolved by :func:`gpus_for`) stands in for the option's when given."""
    argv = ["--ntasks", str(ntasks)]
    if nodes:
        argv += ["--nodes", str(nodes)]
    gpus = options.gpus_per_node if gpus_per_node is None else gpus_per_node
    if gpus:
        argv += ["--gpus-per-node", str(gpus)]
    if options.cpus_per_task:
        argv += ["--cpus-per-task", str(options.cpus_per_task)]
    limit = options.time or (time_limit(time_s) if time_s is not None else None)
    if limit:
        argv += ["--time", limit]
    for flag, value in (
        ("--partition", options.partition),
        ("--account", options.account),
        ("--qos", options.qos),
    ):
        if value:
            argv += [flag, value]
    return [*argv, *options.extra_args]


def sbatch_argv(
    script: Path | str,
    *,
    job_name: str,
    output: Path | str,
    error: Path | str,
    ntasks: int,
    options: SlurmOptions,
    nodes: int | None = None,
    time_s: float | None = None,
    array: str | None = None,
    gpus_per_node: int | None = None,
    sbatch: str = "sbatch",
) -> list[str]:
    """``sbatch --parsable --wait ... SCRIPT``: prints the job id, then waits for the job."""
    argv = [
        sbatch, "--parsable", "--wait", "--export=ALL", "--job-name", job_name,
        "--output", str(output), "--error", str(error),
    ]  # fmt: skip
    if array:
        argv.append(f"--array={array}")
    resources = allocation_args(options, ntasks, nodes, time_s, gpus_per_node)
    return [*argv, *resources, str(script)]


def srun_argv(
    program: Sequence[str],
    ntasks: int,
    options: SlurmOptions,
    *,
    nodes: int | None = None,
    mpi: str = "none",
    allocate: bool = False,
    time_s: float | None = None,
    job_name: str | None = None,
    gpus_per_node: int | None = None,
    srun: str = "srun",
) -> list[str]:
    """``srun --ntasks K --kill-on-bad-exit=1 ... PROGRAM``: one step of ``ntasks`` ranks; the
    first rank to fail ends the others. ``allocate``: not inside an allocation, so srun asks for
    one (partition, account, time, ...) itself."""
    if allocate:
        argv = [srun, *allocation_args(options, ntasks, nodes, time_s, gpus_per_node)]
        if job_name:
            argv += ["--job-name", job_name]
    else:
        argv = [srun, "--ntasks", str(ntasks)]
        if nodes:
            argv += ["--nodes", str(nodes)]
        if options.cpus_per_task:  # since Slurm 22.05 a step does not inherit it from the job
            argv += ["--cpus-per-task", str(options.cpus_per_task)]
    return [*argv, "--kill-on-bad-exit=1", f"--mpi={mpi}", *options.srun_args, *program]


def launch_argv(
    backend: str,
    spec_path: Path | str,
    world_size: int,
    options: SlurmOptions,
    *,
    nodes: int | None = None,
    allocate: bool = False,
    time_s: float | None = None,
    job_name: str | None = None,
    gpus_per_node: int | None = None,
    python: str = sys.executable,
    mpirun: str | None = None,
) -> list[str]:
    """The command that starts a run's ranks inside an allocation.

    gloo / nccl: srun, each task a worker that maps SLURM_* to torch's env:// variables
    (:func:`torch_env_from_slurm`). mpi: mpirun, which reads the allocation from SLURM_* and
    starts its daemons with srun on the other nodes (``mpi: mpirun``, the default: works with
    any Slurm), or ``srun --mpi=pmix`` (``mpi: pmix``: needs Slurm's PMIx plugin).
    """
    program = worker_argv(spec_path, python)
    if backend == "mpi" and options.mpi == "mpirun":
        if allocate:
            raise UserError(
                "slurm.mode srun with backend mpi and `mpi: mpirun` needs an allocation: run "
                "qbench inside salloc or a batch job, use `mode: sbatch`, or set `mpi: pmix`"
            )
        return local.mpirun_argv(Path(spec_path), world_size, mpirun or "mpirun", python)
    mpi = "pmix" if backend == "mpi" else "none"
    return srun_argv(
        program, world_size, options, nodes=nodes, mpi=mpi, allocate=allocate, time_s=time_s,
        job_name=job_name, gpus_per_node=gpus_per_node,
    )  # fmt: skip


def _port_line(python: str) -> str:
    return f'export MASTER_PORT="$({shlex.join([python, "-c", FREE_PORT_PY])})"'


def _end_lines(exit_code: str) -> list[str]:
    """Write the launcher's exit code atomically (tmp + mv), then exit with it."""
    return [
        "code=$?",
        f'echo "$code" > {exit_code}.tmp && mv -f {exit_code}.tmp {exit_code}',
        'exit "$code"',
    ]


def batch_script(
    command: Sequence[str],
    run_dir: Path | str,
    *,
    torch_env: bool,
    python: str = sys.executable,
    title: str = "",
) -> str:
    """The script ``sbatch`` runs for one run: marks the start, runs ``command`` (an argv list,
    shlex-joined), writes its exit code. torch_env: choose MASTER_PORT on the batch host, which
    is the first node of the allocation, where rank 0 runs."""
    d = Path(run_dir)
    lines = [
        "#!/bin/bash",
        f"# {title or 'qbench run'}: written by qbench.launch.slurm, submitted with sbatch",
        "set -u",
        f"touch {shlex.quote(str(d / STARTED))}",
    ]
    if torch_env:
        lines.append(_port_line(python))
    lines.append(shlex.join(command))
    return "\n".join([*lines, *_end_lines(shlex.quote(str(d / EXIT_CODE)))]) + "\n"


SPEC_SLOT = "QBENCH_SPEC_PATH"  # stands for the spec path in an array task's command


def array_script(
    command: Sequence[str],
    specs_file: Path | str,
    run_dirs_file: Path | str,
    *,
    torch_env: bool,
    python: str = sys.executable,
    title: str = "",
) -> str:
    """The script of a job array: task i reads line i of both list files (spec path, run dir),
    sends its output to that run dir's logs and runs ``command`` with the spec path in place of
    its last argument (which must be :data:`SPEC_SLOT`)."""
    if not command or command[-1] != SPEC_SLOT:
        raise ValueError(f"an array command must end with {SPEC_SLOT}")
    lines = [
        "#!/bin/bash",
        f"# {title or 'qbench job array'}: written by qbench.launch.slurm, submitted with sbatch",
        "set -u",
        f"mapfile -t specs < {shlex.quote(str(specs_file))}",
        f"mapfile -t run_dirs < {shlex.quote(str(run_dirs_file))}",
        'spec="${specs[$SLURM_ARRAY_TASK_ID]}"',
        'run_dir="${run_dirs[$SLURM_ARRAY_TASK_ID]}"',
        f'exec >"$run_dir/{STDOUT_LOG}" 2>"$run_dir/{STDERR_LOG}"',
        f'touch "$run_dir/{STARTED}"',
    ]
    if torch_env:
        lines.append(_port_line(python))
    lines.append(f'{shlex.join(command[:-1])} "$spec"')
    return "\n".join([*lines, *_end_lines(f'"$run_dir/{EXIT_CODE}"')]) + "\n"


def array_range(n: int, max_parallel: int | None = None) -> str:
    """``--array`` value for n tasks: ``0-(n-1)`` and ``%M`` to run at most M at once."""
    if n < 1:
        raise ValueError("a job array needs at least one task")
    return f"0-{n - 1}" + (f"%{max_parallel}" if max_parallel else "")


def scancel_argv(job: str, scancel: str = "scancel") -> list[str]:
    return [scancel, job]


def job_name(run_id: str) -> str:
    return f"qbench-{run_id}"[:120]


def spec_nodes(spec: RunSpec) -> int:
    return spec.placement.nodes


def gpus_for(spec: RunSpec, options: SlurmOptions, nodes: int) -> int:
    """GPUs per node to ask for: the option when set, else one per rank of the node for a run
    on CUDA (nccl, or ``device: cuda``), else none."""
    if options.gpus_per_node is not None:
        return options.gpus_per_node
    kind = spec.placement.device_kind
    return math.ceil(spec.placement.world_size / max(nodes, 1)) if kind == "cuda" else 0
