"""The Slurm launcher (``qbench.launch.launcher.Launcher``): each run a job of its own, an
srun step inside an allocation, or a task of a job array (:mod:`qbench.launch.slurm.runs`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbench.launch.slurm import runs
from qbench.launch.slurm.options import SlurmOptions

if TYPE_CHECKING:
    from qbench.launch.launcher import Item, Outcome
    from qbench.launch.procs import Job
    from qbench.spec.matrix import RunSpec


@dataclass(frozen=True)
class Slurm:
    options: SlurmOptions
    """The scenario's ``slurm:`` mapping, checked."""

    name = "slurm"

    def run(self, spec: RunSpec, spec_path: Path, run_dir: Path) -> Outcome:
        return runs.run(spec, spec_path, run_dir, spec.measurement.timeout, self.options)

    def group_jobs(self, spec: RunSpec, plan: Path) -> AbstractContextManager[list[Job]]:
        # qbench.launch.decision refuses isolation group under Slurm: never reached
        raise NotImplementedError("under Slurm every run is a job (or array task) of its own")

    def run_array(self, items: list[Item], work_dir: Path) -> list[Outcome]:
        """One array per shape; each task may run as long as the slowest run's timeout."""
        timeout = max(spec.measurement.timeout for spec, _, _ in items)
        return runs.run_array(items, timeout, self.options, work_dir=work_dir)

    def network(self, spec: RunSpec) -> dict[str, Any]:
        """Several nodes are the allocation's own hosts and links, recorded, not shaped."""
        if spec.placement.nodes > 1:
            return {
                "shaped": False,
                "setting": spec.placement.network.written(),
                "nodes": spec.placement.nodes,
                "method": "the Slurm allocation's hosts and links, not emulated",
            }
        return {"shaped": False}

    def needs(self, spec: RunSpec) -> tuple[str, ...]:
        return ("slurm",)  # the GPUs are on the compute nodes: not checked here
