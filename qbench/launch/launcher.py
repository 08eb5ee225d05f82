"""How runs start: one small interface every launcher implements, and a sweep's launch.

A sweep asks a launcher five things, whatever it is: start one run and wait for it
(:meth:`Launcher.run`), the processes of a rank group's launch (:meth:`Launcher.group_jobs`),
many runs as one job array (:meth:`Launcher.run_array`), what machine.json records of the
run's network (:meth:`Launcher.network`) and what the run needs on this machine before it
starts (:meth:`Launcher.needs`, names of ``qbench.launch.preflight`` checks). The
implementations: ``qbench.launch.local.Local`` (torchrun / mpirun on this host),
``qbench.launch.shaped.Emulated`` (ranks on emulated hosts: network namespaces and shaped
links) and ``qbench.launch.slurm.launcher.Slurm``. Which one starts a run is decided in one
place, ``qbench.launch.decision``: :func:`~qbench.launch.decision.launch_for` for a sweep
(launcher x isolation, a :class:`Launch`), :func:`~qbench.launch.decision.launcher_for` for a
run, so the sweep driver and rank groups never branch on a launcher's kind.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from qbench.launch.procs import Job
    from qbench.spec.matrix import RunSpec

Outcome = tuple[str, int | None]
"""How a run ended: status (ok, failed, timeout, interrupted) and the exit code."""
Item = tuple["RunSpec", Path, Path]
"""A run of a job array: its spec, spec.json and run directory."""


class Launcher(Protocol):
    """What a sweep needs from any launcher."""

    name: str
    """What sweep.json, resolved.json and the console say launched the runs: local or slurm."""

    def run(self, spec: RunSpec, spec_path: Path, run_dir: Path) -> Outcome:
        """Start one run's ranks on ``spec_path`` and wait for them, within ``spec.timeout``;
        their stdout.log and stderr.log in ``run_dir``."""
        raise NotImplementedError

    def group_jobs(self, spec: RunSpec, plan: Path) -> AbstractContextManager[list[Job]]:
        """The processes of one launch of ``spec``'s rank group, every rank given ``plan``
        (``qbench.launch.group``); valid while the block runs."""
        raise NotImplementedError

    def run_array(self, items: list[Item], work_dir: Path) -> list[Outcome]:
        """Many runs as job arrays, each item's outcome in order (files in ``work_dir``)."""
        raise NotImplementedError

    def network(self, spec: RunSpec) -> dict[str, Any]:
        """machine.json's ``network``: the emulated hosts and links as built, or the hosts'."""
        raise NotImplementedError

    def needs(self, spec: RunSpec) -> tuple[str, ...]:
        """The ``qbench.launch.preflight`` checks this launcher adds for ``spec``, in order."""
        raise NotImplementedError


@dataclass(frozen=True)
class Launch:
    """A sweep's launch decision (``qbench.launch.decision.launch_for``): which launcher, with
    its options, and the isolation its runs get."""

    kind: str = "local"
    """``local`` (this host, emulated hosts included) or ``slurm``."""
    slurm: Any = None
    """qbench.launch.slurm.options.SlurmOptions when kind is slurm."""
    isolation: str = "process"
    """``group``: one launch per rank group runs its configurations in turn
    (qbench.launch.group); ``process``: one launch per run. Slurm runs are always process."""

    @property
    def grouped(self) -> bool:
        """Whether runs start by rank group (only this host's launchers start rank groups)."""
        return self.isolation == "group" and self.kind == "local"

    @property
    def effective_isolation(self) -> str:
        """What the runs get: ``group`` or ``process`` (Slurm runs always the latter)."""
        return "group" if self.grouped else "process"

    @property
    def array(self) -> bool:
        """Whether the pending runs go as job arrays (``slurm: {array: true}``)."""
        return self.kind == "slurm" and bool(getattr(self.slurm, "array", False))


LOCAL = Launch()
"""This host's launchers, one launch per run: what a sweep does when told nothing."""
