"""The scenario's ``slurm:`` mapping, checked at the boundary: a misspelt key, a wrong type or a
bad value is one UserError line naming the key, the value and a fix, before anything is
submitted. Also what ``mode: auto`` means where qbench runs (inside an allocation or not)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from qbench.errors import UserError, did_you_mean, type_name

MODES = ("auto", "sbatch", "srun")
MPI_LAUNCHERS = ("mpirun", "pmix")
_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE", re.I)


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


def in_allocation(env: Mapping[str, str] | None = None) -> bool:
    return "SLURM_JOB_ID" in (os.environ if env is None else env)


def resolve_mode(mode: str, env: Mapping[str, str] | None = None) -> str:
    """auto: srun inside an allocation (SLURM_JOB_ID set), else sbatch."""
    if mode == "auto":
        return "srun" if in_allocation(env) else "sbatch"
    return mode
