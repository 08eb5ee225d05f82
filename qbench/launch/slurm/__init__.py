"""Slurm launcher: one run = one sbatch job (or one task of a job array), or one srun step when
qbench already runs inside an allocation. See docs/launchers.md.

One module per concept:

* :mod:`~qbench.launch.slurm.options`: the scenario's ``slurm:`` mapping, checked;
* :mod:`~qbench.launch.slurm.argv`: pure builders of argv lists and batch scripts;
* :mod:`~qbench.launch.slurm.env`: inside a task, torch's ``env://`` variables from SLURM_*;
* :mod:`~qbench.launch.slurm.available`: Slurm's tools and controller, checked;
* :mod:`~qbench.launch.slurm.jobs`: the job state machine (submit, wait, cancel);
* :mod:`~qbench.launch.slurm.runs`: one run or job arrays, end to end.

Importing the package loads none of them: each name below loads its module when first used
(``slurm.run``, ``from qbench.launch.slurm import SlurmOptions``). So a rank, which imports
:mod:`~qbench.launch.slurm.env` only, pays for nothing else. Code inside qbench imports from
the modules themselves, which type checkers follow.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "argv": (
        "EXIT_CODE", "SCRIPT", "SPEC_SLOT", "STARTED", "allocation_args", "array_range",
        "array_script", "batch_script", "gpus_for", "job_name", "launch_argv", "sbatch_argv",
        "scancel_argv", "srun_argv", "time_limit", "worker_argv",
    ),
    "available": ("TOOLS", "check_available", "describe"),
    "env": ("apply_worker_env", "first_host", "tasks_per_node", "torch_env_from_slurm"),
    "jobs": ("failed_rank",),
    "options": ("MODES", "MPI_LAUNCHERS", "SlurmOptions", "in_allocation", "resolve_mode"),
    "runs": ("free_port", "run", "run_array"),
}  # fmt: skip
_HOME = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """Load the module that defines ``name`` (PEP 562), once: later lookups find it here."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
