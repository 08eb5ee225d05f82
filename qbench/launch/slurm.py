"""Slurm launcher: one run = one sbatch job (or one task of a job array), or one srun step when
qbench already runs inside an allocation.

* ``sbatch``: qbench writes ``RUN_DIR/slurm-job.sh`` and submits it with ``sbatch --parsable
  --wait``; the script starts the ranks with ``srun`` (gloo, nccl; ``mpi: pmix``) or ``mpirun``
  (mpi: Open MPI finds the allocation through the SLURM_* variables). The job's output goes to
  RUN_DIR/stdout.log and stderr.log.
* job array: one ``sbatch --array=0-(N-1)%M`` for many runs of one shape; task i reads the spec
  path and run directory of run i from list files and redirects its output into that run dir.
* ``srun``: inside an allocation (``salloc``, or qbench started by a batch script) the driver runs
  ``srun`` (or ``mpirun``) itself and waits for it like the local launcher.

Every job script touches ``RUN_DIR/slurm-started`` when it starts and writes the launcher's exit
code to ``RUN_DIR/slurm-exit-code`` when it ends. The driver watches those files: they tell when a
run starts (its timeout counts from there, not from submission: queueing is free) and how it ended
sooner and more reliably than ``sbatch --wait`` (which polls the controller every few seconds and
exits 0 for a cancelled job) or sacct (often not configured). A run past its timeout is cancelled
with scancel; so is every job of ours on Ctrl-C or SIGTERM.

The argv builders are pure and return argument lists. The one shell is the batch script that
sbatch requires; the commands in it are argv lists joined with :func:`shlex.join`.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, MutableMapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from qbench.errors import UserError, did_you_mean, type_name
from qbench.launch import local, procs

if TYPE_CHECKING:
    from qbench.matrix import RunSpec

MODES = ("auto", "sbatch", "srun")
MPI_LAUNCHERS = ("mpirun", "pmix")
SCRIPT = "slurm-job.sh"
STARTED = "slurm-started"
EXIT_CODE = "slurm-exit-code"
STDOUT, STDERR = "stdout.log", "stderr.log"
POLL_S = 0.2
SUBMIT_WAIT_S = 120.0  # for sbatch to print the job id
GONE_WAIT_S = 60.0  # for a cancelled job to leave the queue
TOOLS = ("sbatch", "srun", "scancel", "squeue", "sinfo")
_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE", re.I)
# Picks a free TCP port on the host that runs it (the batch host = the node of rank 0).
FREE_PORT_PY = (
    "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1]); s.close()"
)


# ---------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class SlurmOptions:
    """The scenario's ``slurm:`` mapping (every key optional)."""

    mode: str = "auto"
    """auto (srun inside an allocation, else sbatch), sbatch or srun."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    """Slurm time limit per job ("00:30:00"); default: the run's timeout rounded up + 1 min."""
    nodes: int | None = None
    """Nodes per run; default: the run's ``nodes`` (1)."""
    gpus_per_node: int | None = None
    """GPUs per node; default: one per rank on the node for runs on CUDA, none otherwise."""
    cpus_per_task: int | None = None
    array: bool = False
    """Submit pending runs as job arrays (:func:`run_array`) instead of one job per run."""
    max_parallel: int | None = None
    """Array tasks running at once (``--array=0-N%M``); default: as many as fit."""
    mpi: str = "mpirun"
    """How mpi ranks start: mpirun inside the allocation, or ``srun --mpi=pmix``."""
    extra_args: tuple[str, ...] = ()
    """More sbatch (or allocating srun) arguments, e.g. ["--exclusive", "--mem=8G"]."""
    srun_args: tuple[str, ...] = ()
    """More arguments for every srun step."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> SlurmOptions:
        """Validate the scenario's ``slurm:`` mapping; a mistake is one UserError line."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise UserError(
                f'slurm: must be a mapping like `slurm: {{partition: gpu, time: "00:30:00"}}`, '
                f"got {raw!r} ({type_name(raw)})"
            )
        valid = [f.name for f in fields(cls)]
        for key in raw:
            if key not in valid:
                hint = did_you_mean(key, valid)
                raise UserError(f"slurm: unknown key {key!r}{hint}; valid keys: {', '.join(valid)}")
        return cls(**{k: _check(k, v) for k, v in raw.items()})


_EXAMPLES = {
    "mode": "mode: sbatch", "partition": "partition: gpu", "account": "account: proj42",
    "qos": "qos: normal", "time": 'time: "00:30:00"', "nodes": "nodes: 2",
    "gpus_per_node": "gpus_per_node: 4", "cpus_per_task": "cpus_per_task: 2",
    "array": "array: true", "max_parallel": "max_parallel: 4", "mpi": "mpi: mpirun",
    "extra_args": 'extra_args: ["--exclusive"]', "srun_args": 'srun_args: ["--cpu-bind=cores"]',
}  # fmt: skip


def _check(key: str, value: Any) -> Any:
    example = _EXAMPLES[key]

    def bad(problem: str) -> UserError:
        got = f"{value!r} ({type_name(value)})"
        return UserError(f"slurm.{key} {problem}, got {got}; e.g. `slurm: {{{example}}}`")

    if key in ("mode", "mpi"):
        choices = MODES if key == "mode" else MPI_LAUNCHERS
        if value not in choices:
            raise bad(f"must be one of {', '.join(choices)}")
        return value
    if key in ("partition", "account", "qos"):
        if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
            raise bad("must be a name without spaces")
        return value
    if key == "time":
        if isinstance(value, int) and not isinstance(value, bool):
            # YAML reads an unquoted 1:30:00 as the number 5400: refuse to guess.
            raise bad('must be a quoted Slurm time ("MINUTES", "HH:MM:SS" or "D-HH:MM:SS")')
        if not isinstance(value, str) or not _TIME.fullmatch(value.strip()):
            raise bad('must be a Slurm time ("MINUTES", "HH:MM:SS" or "D-HH:MM:SS")')
        return value.strip()
    if key == "array":
        if not isinstance(value, bool):
            raise bad("must be true or false")
        return value
    if key in ("nodes", "gpus_per_node", "cpus_per_task", "max_parallel"):
        low = 0 if key == "gpus_per_node" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise bad(f"must be an integer >= {low}")
        return value
    # extra_args, srun_args: argument lists, never one shell string to split
    if not isinstance(value, list | tuple) or not all(isinstance(a, str) for a in value):
        raise bad("must be a list of arguments (strings), one per item")
    return tuple(value)


# ---------------------------------------------------------------------------------------------
# Pure argv and script builders


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
        f'exec >"$run_dir/{STDOUT}" 2>"$run_dir/{STDERR}"',
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


# ---------------------------------------------------------------------------------------------
# Inside a task: torch.distributed env:// from SLURM_*


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list ("gpu[07-09,11],cpu1" -> "gpu07"), as the first line
    of ``scontrol show hostnames`` would give it, without running scontrol in every rank."""
    depth, head = 0, []
    for ch in nodelist.strip():
        if ch == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(ch, 0)
        head.append(ch)
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], "".join(head))


def tasks_per_node(value: str) -> list[int]:
    """Expand SLURM_TASKS_PER_NODE ("2(x3),1" -> [2, 2, 2, 1])."""
    out: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"cannot read tasks per node {value!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def default_port(job_id: str) -> int:
    """A port from the job id when the launcher chose none (same on every rank)."""
    return 20000 + int(job_id) % 20000 if job_id.isdigit() else 29500


def torch_env_from_slurm(env: Mapping[str, str]) -> dict[str, str]:
    """torch.distributed's env:// variables for a task started by srun, from its SLURM_* ones.

    RANK = SLURM_PROCID, WORLD_SIZE = the step's task count, LOCAL_RANK = SLURM_LOCALID,
    LOCAL_WORLD_SIZE = tasks on this node, GROUP_RANK = SLURM_NODEID; MASTER_ADDR = the first
    host of the step's node list (rank 0 runs there with srun's block distribution), or
    SLURM_LAUNCH_NODE_IPADDR without one; MASTER_PORT = the one the launcher exported, else
    derived from the job id. MASTER_ADDR / MASTER_PORT already set are kept.
    """
    if "SLURM_PROCID" not in env:
        raise ValueError("SLURM_PROCID is not set: not a task started by srun")
    world = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
    if not world:
        raise ValueError("neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is set")
    node = int(env.get("SLURM_NODEID", "0"))
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    counts = tasks_per_node(per_node) if per_node else []
    local_world = counts[node] if node < len(counts) else int(world)
    nodelist = (
        env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    )
    addr = env.get("MASTER_ADDR") or (
        first_host(nodelist) if nodelist else env.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1")
    )
    port = env.get("MASTER_PORT") or str(default_port(env.get("SLURM_JOB_ID", "")))
    return {
        "RANK": env["SLURM_PROCID"], "WORLD_SIZE": str(int(world)),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"), "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(node), "MASTER_ADDR": addr, "MASTER_PORT": port,
    }  # fmt: skip


def apply_worker_env(environ: MutableMapping[str, str] | None = None) -> bool:
    """At the start of a worker: when srun started it (SLURM_PROCID set) and no launcher set
    RANK (torchrun does) nor started it as an MPI rank (mpirun in a batch job passes on the
    batch step's SLURM_PROCID=0 to every rank), set the env:// variables. True if it did."""
    env = os.environ if environ is None else environ
    if "SLURM_PROCID" not in env or "RANK" in env or "OMPI_COMM_WORLD_RANK" in env:
        return False
    env.update(torch_env_from_slurm(env))
    return True


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


# ---------------------------------------------------------------------------------------------
# Availability


def _missing_tool(tools: Sequence[str] = TOOLS) -> str | None:
    for tool in tools:
        if shutil.which(tool) is None:
            return tool
    return None


def _sinfo() -> tuple[bool, str]:
    """(reachable, nodes by state or the reason) from sinfo."""
    try:
        p = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format", "%N %t"],
            capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"sinfo failed: {e}"
    if p.returncode != 0:
        lines = (p.stderr or p.stdout).strip().splitlines()
        return False, f"sinfo: {lines[-1] if lines else f'exit code {p.returncode}'}"
    states: dict[str, str] = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1].rstrip("*~#!%$@^-")
    if not states:
        return True, "no nodes"
    count: dict[str, int] = {}
    for s in states.values():
        count[s] = count.get(s, 0) + 1
    return True, ", ".join(f"{n} node{'s' if n > 1 else ''} {s}" for s, n in sorted(count.items()))


def check_available() -> None:
    """Fail before any run starts when Slurm cannot run jobs from here."""
    missing = _missing_tool()
    if missing:
        raise UserError(
            f"launcher slurm: {missing} not found; install Slurm (Debian: `make slurm`) or use "
            "--launcher local"
        )
    ok, what = _sinfo()
    if not ok:
        raise UserError(
            f"launcher slurm: cannot reach the Slurm controller ({what}); start slurmctld, "
            "point SLURM_CONF at the cluster's slurm.conf, or use --launcher local"
        )


def describe() -> str:
    """One line for ``qbench info``."""
    missing = _missing_tool()
    if missing:
        return f"slurm: not available ({missing} not found; install Slurm or use --launcher local)"
    ok, what = _sinfo()
    return f"slurm: available (sinfo: {what})" if ok else f"slurm: not available ({what})"


def in_allocation(env: Mapping[str, str] | None = None) -> bool:
    return "SLURM_JOB_ID" in (os.environ if env is None else env)


def resolve_mode(mode: str, env: Mapping[str, str] | None = None) -> str:
    """auto: srun inside an allocation (SLURM_JOB_ID set), else sbatch."""
    if mode == "auto":
        return "srun" if in_allocation(env) else "sbatch"
    return mode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# Running


def run(
    spec: RunSpec, spec_path: Path, run_dir: Path, timeout: float, options: SlurmOptions
) -> tuple[str, int | None]:
    """Run one run under Slurm; same contract as :func:`qbench.launch.procs.run_jobs`: logs in
    run_dir (stdout.log, stderr.log), status ok / failed / timeout, and the exit code."""
    spec_path, run_dir = Path(spec_path).absolute(), Path(run_dir).absolute()
    nodes = options.nodes or _spec_nodes(spec)
    if resolve_mode(options.mode) == "srun":
        return _run_step(spec, spec_path, run_dir, timeout, options, nodes)
    (result,) = _run_batches([_Item(spec, spec_path, run_dir)], timeout, options, array=False)
    return result


def run_array(
    items: list[tuple[RunSpec, Path, Path]],
    timeout: float,
    options: SlurmOptions,
    work_dir: Path | None = None,
) -> list[tuple[str, int | None]]:
    """Run many runs as sbatch job arrays: one array per shape (world size, nodes, how ranks
    start), all submitted at once; task i of an array runs item i. Returns each item's
    (status, exit code) in order. Array files (script, list files, job-level logs) go to
    ``work_dir`` (default: ``.slurm/`` beside the run directories)."""
    if not items:
        return []
    its = [_Item(s, Path(p).absolute(), Path(d).absolute()) for s, p, d in items]
    if work_dir is None:
        work_dir = Path(os.path.commonpath([str(i.run_dir.parent) for i in its])) / ".slurm"
    return _run_batches(its, timeout, options, array=True, work_dir=Path(work_dir).absolute())


def _spec_nodes(spec: RunSpec) -> int:
    return int(getattr(spec, "nodes", 1) or 1)


def gpus_for(spec: RunSpec, options: SlurmOptions, nodes: int) -> int:
    """GPUs per node to ask for: the option when set, else one per rank of the node for a run
    on CUDA (nccl, or ``device: cuda``), else none."""
    if options.gpus_per_node is not None:
        return options.gpus_per_node
    kind = getattr(spec, "device_kind", "cuda" if spec.backend == "nccl" else "cpu")
    return math.ceil(spec.world_size / max(nodes, 1)) if kind == "cuda" else 0


def _run_step(
    spec: RunSpec,
    spec_path: Path,
    run_dir: Path,
    timeout: float,
    options: SlurmOptions,
    nodes: int,
) -> tuple[str, int | None]:
    """srun (or mpirun) from the driver, inside the allocation (or srun allocating itself).
    Ends like a local run: the timeout or Ctrl-C SIGTERMs srun, which cancels its step."""
    inside = in_allocation()
    argv = launch_argv(
        spec.backend, spec_path, spec.world_size, options, nodes=nodes, allocate=not inside,
        time_s=timeout, job_name=job_name(spec.run_id),
        gpus_per_node=gpus_for(spec, options, nodes),
        mpirun=local.find_mpirun() if spec.backend == "mpi" else None,
    )  # fmt: skip
    env = local.worker_env()
    if spec.backend != "mpi":
        env["MASTER_PORT"] = str(free_port())  # the driver runs in the allocation, like rank 0
    with procs.sigterm_as_interrupt():
        return procs.run_jobs([(argv, env)], run_dir, timeout)


@dataclass
class _Item:
    spec: RunSpec
    spec_path: Path
    run_dir: Path
    job: int = 0  # index into the submissions
    ref: str = ""  # what scancel / squeue take: JOBID or JOBID_TASK
    started: float | None = None
    cancelled: float | None = None
    result: tuple[str, int | None] | None = None


@dataclass
class _Job:
    argv: list[str]
    log_dir: Path
    name: str
    proc: subprocess.Popen[bytes] | None = None
    job_id: str = ""
    files: list[IO[bytes]] = field(default_factory=list)
    error_log: Path | None = None  # the job-level stderr (for "DUE TO TIME LIMIT")


def _shape(spec: RunSpec, options: SlurmOptions) -> tuple[int, int, int, str]:
    """What one job of this run asks for and how its ranks start: runs of one shape can share
    a job array. (world size, nodes, GPUs per node, launcher)"""
    how = "mpirun" if spec.backend == "mpi" and options.mpi == "mpirun" else spec.backend
    nodes = options.nodes or _spec_nodes(spec)
    return spec.world_size, nodes, gpus_for(spec, options, nodes), how


def _run_batches(
    items: list[_Item],
    timeout: float,
    options: SlurmOptions,
    *,
    array: bool,
    work_dir: Path | None = None,
) -> list[tuple[str, int | None]]:
    python = sys.executable
    mpirun = local.find_mpirun() if any(i.spec.backend == "mpi" for i in items) else None
    jobs: list[_Job] = []
    for it in items:
        it.run_dir.mkdir(parents=True, exist_ok=True)
        for name in (STARTED, EXIT_CODE):
            (it.run_dir / name).unlink(missing_ok=True)
    if not array:
        (it,) = items
        ws, nodes, gpus, _ = _shape(it.spec, options)
        command = launch_argv(
            it.spec.backend, it.spec_path, ws, options, nodes=nodes, python=python, mpirun=mpirun
        )
        script = it.run_dir / SCRIPT
        script.write_text(
            batch_script(
                command, it.run_dir, torch_env=it.spec.backend != "mpi", python=python,
                title=f"qbench run {it.spec.run_id}",
            )
        )  # fmt: skip
        argv = sbatch_argv(
            script, job_name=job_name(it.spec.run_id), output=it.run_dir / STDOUT,
            error=it.run_dir / STDERR, ntasks=ws, options=options, nodes=nodes, time_s=timeout,
            gpus_per_node=gpus,
        )  # fmt: skip
        jobs.append(_Job(argv, it.run_dir, "slurm-submit", error_log=it.run_dir / STDERR))
    else:
        assert work_dir is not None
        groups: dict[tuple[int, int, int, str], list[_Item]] = {}
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
            backend = members[0].spec.backend
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
            jobs.append(_Job(argv, d, "slurm-submit"))
    env = _submit_env(local.worker_env())
    try:
        with procs.sigterm_as_interrupt():
            for job in jobs:
                _submit(job, env)
            for it in items:
                job_id = jobs[it.job].job_id
                it.ref = f"{job_id}_{it.ref}" if array else job_id
            _wait(jobs, items, timeout)
    except BaseException:
        _stop_sbatch(jobs)  # no more submissions; then what was submitted is cancelled
        _cancel_all(jobs)
        raise
    finally:
        _stop_sbatch(jobs)
    return [it.result or ("failed", None) for it in items]


def _line(path: Path) -> str:
    if "\n" in str(path):
        raise UserError(f"path {str(path)!r} holds a newline; use a plain output directory")
    return str(path)


def _submit_env(base: Mapping[str, str]) -> dict[str, str]:
    """The driver's environment less the SLURM_* / SBATCH_* of an allocation it may run in
    (they would leak into the new job's request); SLURM_CONF stays."""
    return {
        k: v
        for k, v in base.items()
        if not (k.startswith(("SLURM_", "SBATCH_", "SALLOC_")) and k != "SLURM_CONF")
    }


def _submit(job: _Job, env: dict[str, str]) -> None:
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


def _read_job_id(job: _Job) -> bool:
    """The id ``sbatch --parsable`` printed ("JOBID" or "JOBID;CLUSTER"), once it has."""
    if not job.job_id:
        with suppress(OSError):
            text = (job.log_dir / f"{job.name}.out").read_text(errors="replace")
            first = text.split("\n", 1)[0].split(";", 1)[0].strip() if "\n" in text else ""
            job.job_id = first if first.isdigit() else ""
    return bool(job.job_id)


def _wait(jobs: list[_Job], items: list[_Item], timeout: float) -> None:
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


def _hit_time_limit(job: _Job, it: _Item) -> bool:
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


def _cancel_all(jobs: list[_Job]) -> None:
    """Cancel every job we submitted and wait (bounded) until they have left the queue, so no
    rank keeps writing into a run directory that a later sweep redoes."""
    ids = [j.job_id for j in jobs if j.proc is not None and _read_job_id(j)]
    for job_id in ids:
        _scancel(job_id)
    deadline = time.monotonic() + GONE_WAIT_S
    while ids and time.monotonic() < deadline:
        ids = [i for i in ids if _in_queue(i)]
        if ids:
            time.sleep(POLL_S)


def _stop_sbatch(jobs: list[_Job]) -> None:
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
