"""The launch decision, made here only: which launcher starts the runs and how they are isolated.

``--launcher`` / ``launcher=`` over the scenario's ``launcher:``, ``--isolation`` /
``isolation=`` over ``isolation:``; ``auto`` is ``group`` with the local launcher and ``process``
under Slurm, where each run is a job of its own. The command line (``qbench.cli.console``) and
the Python API (``qbench.api``) both call :func:`launch_for`, so they decide alike; the sweep
driver, rank groups and pre-flight ask :func:`launcher_for` which launcher
(``qbench.launch.launcher.Launcher``) starts each run.
"""

from __future__ import annotations

import dataclasses

from qbench.errors import UserError
from qbench.launch import local, shaped
from qbench.launch.launcher import Launch, Launcher
from qbench.launch.slurm import available as slurm_available
from qbench.launch.slurm.launcher import Slurm
from qbench.launch.slurm.options import SlurmOptions
from qbench.spec import scenario as scenario_mod
from qbench.spec.matrix import Matrix
from qbench.spec.runspec import RunSpec


def launch_for(
    sc: scenario_mod.Scenario, launcher: str | None, m: Matrix, isolation: str | None = None
) -> Launch:
    """The launcher with its options and the isolation the runs get. An override is checked
    as the scenario's own key is (one message for YAML, ``--isolation`` and ``isolation=``)."""
    if launcher is not None:
        scenario_mod.check_launcher(launcher)
    if isolation is not None:
        scenario_mod.check_isolation(isolation)
    kind, iso = launcher or sc.launcher, isolation or sc.isolation
    if kind == "local":
        multi = next(
            (s for s in m.runs if s.placement.nodes > 1 and not s.placement.network.emulates_hosts),
            None,
        )
        if multi is not None:
            raise UserError(
                f"nodes: {multi.placement.nodes} needs a multi-node launcher; use --launcher "
                "slurm, or emulate the nodes on this machine with "
                f"`network: {{nodes: {multi.placement.nodes}}}`"
            )
        return Launch("local", isolation="process" if iso == "process" else "group")
    shaped = next(
        (
            s
            for s in m.runs
            if s.placement.topology.inter.shaped or s.placement.topology.intra.shaped
        ),
        None,
    )
    if shaped is not None:
        raise UserError(
            f"network {shaped.link.label} shapes emulated links on this machine; under Slurm the "
            "links are the cluster's own: use `network: {nodes: N}` (recorded, not shaped) or "
            "--launcher local"
        )
    if iso == "group":
        raise UserError(
            "isolation group runs rank groups with the local launcher; under Slurm every run "
            "is a job (or array task) of its own: use --isolation auto or process with "
            "--launcher slurm, or --launcher local"
        )
    return Launch("slurm", SlurmOptions.parse(sc.slurm), isolation="process")


def launcher_for(launch: Launch, spec: RunSpec) -> Launcher:
    """The launcher that starts ``spec`` in a sweep launched as ``launch``: Slurm's; on this
    host, emulated hosts for a run with ``network:`` (each node a network namespace; a flat
    star: each rank), else torchrun / mpirun."""
    if launch.kind == "slurm":
        return Slurm(launch.slurm)
    if spec.placement.network.emulates_hosts:
        return shaped.Emulated()
    return local.Local()


def check_available(launch: Launch, sc: scenario_mod.Scenario, m: Matrix) -> None:
    """The API's pre-flight: the scenario's backends on this host (root, ip and tc for
    emulated hosts), or Slurm's tools and controller."""
    if launch.kind == "local":
        emulated = any(s.placement.network.emulates_hosts for s in m.runs)
        local.check_available(sc.backend, max(sc.world_size), shaped=emulated)
        return
    slurm_available.check_available()


def resolved(sc: scenario_mod.Scenario, launch: Launch) -> dict[str, object]:
    """The scenario with every default filled in, as the runs saw it."""
    d = dataclasses.asdict(sc)
    d["launcher"], d["isolation"] = launch.kind, launch.effective_isolation
    return d
