"""A rank's reading of what else used its machine while the run was measured.

:class:`Watch` reads ``/proc`` once before the first measured iteration and once after the last
(never inside the timed loop) and writes ``parts/interference-<rank>.json``, which the driver
combines per host (``qbench.records.interference``, where the rule that flags a run lives):

* the ticks of ``/proc/stat``'s ``cpuN`` lines for the CPUs this rank may run on (its affinity
  mask), as busy (user, nice, system, irq, softirq), steal and idle (idle, iowait) seconds;
* this process's CPU time, every thread (``time.process_time``: the kernel's nanosecond count,
  where ``/proc/self/stat`` rounds to ticks);
* ``/proc/loadavg`` at both ends and each watched CPU's frequency governor, where the kernel
  exposes it (``/sys/devices/system/cpu/cpuN/cpufreq``; absent in most VMs and containers:
  then null).

No torch: the arithmetic is tested on fake ``/proc`` trees.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbench.records.store import atomic_write_json, interference_part

PROC = Path("/proc")
SYS_CPU = Path("/sys/devices/system/cpu")
# /proc/stat's cpuN columns: user nice system idle iowait irq softirq steal (guest and
# guest_nice are already inside user and nice)
_BUSY, _IDLE, _STEAL = (0, 1, 2, 5, 6), (3, 4), 7


@dataclass(frozen=True)
class Sample:
    """One reading: wall clock, own CPU seconds, per-CPU (busy, steal, idle) ticks, load."""

    wall: float
    own_s: float
    ticks: dict[int, tuple[int, int, int]]
    loadavg: list[float] | None


def cpu_ticks(stat: str, cpus: Iterable[int]) -> dict[int, tuple[int, int, int]]:
    """(busy, steal, idle) ticks of each of ``cpus`` from the text of ``/proc/stat``; older
    kernels' shorter lines count the missing columns as 0."""
    wanted = set(cpus)
    out: dict[int, tuple[int, int, int]] = {}
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in wanted:
            continue
        v = [int(x) for x in rest.split()] + [0] * 8
        out[int(name[3:])] = (sum(v[i] for i in _BUSY), v[_STEAL], sum(v[i] for i in _IDLE))
    return out


def loadavg(text: str) -> list[float]:
    """The 1, 5 and 15 minute load averages from ``/proc/loadavg``."""
    return [float(x) for x in text.split()[:3]]


def governors(cpus: Iterable[int], sys_cpu: Path = SYS_CPU) -> list[str] | None:
    """The distinct frequency governors of ``cpus``; None where none is readable."""
    found = set()
    for cpu in cpus:
        try:
            found.add((sys_cpu / f"cpu{cpu}/cpufreq/scaling_governor").read_text().strip())
        except OSError:
            continue
    return sorted(found) or None


def sample(
    cpus: Iterable[int], proc: Path = PROC, clock: Callable[[], float] = time.perf_counter,
    own: Callable[[], float] = time.process_time,
) -> Sample:  # fmt: skip
    """Read everything at one moment (a few hundred microseconds)."""
    ticks = cpu_ticks((proc / "stat").read_text(), cpus)
    try:
        load: list[float] | None = loadavg((proc / "loadavg").read_text())
    except OSError:
        load = None
    return Sample(wall=clock(), own_s=own(), ticks=ticks, loadavg=load)


def part(before: Sample, after: Sample, hz: int, **where: Any) -> dict[str, Any]:
    """The rank's part: wall and own CPU seconds between the samples, each CPU's busy, steal
    and idle seconds (ticks / hz), the load averages, and ``where`` (rank, host, ...)."""
    cpus = {
        str(cpu): [(after.ticks[cpu][i] - t[i]) / hz for i in range(3)]
        for cpu, t in sorted(before.ticks.items()) if cpu in after.ticks
    }  # fmt: skip
    return {
        **where, "hz": hz, "wall_s": after.wall - before.wall, "own_s": after.own_s - before.own_s,
        "cpus": cpus, "loadavg_before": before.loadavg, "loadavg_after": after.loadavg,
    }  # fmt: skip


class Watch:
    """``start()`` before the first measured iteration, ``stop()`` after the last: writes the
    rank's part. A machine without ``/proc/stat`` records nothing (interference unknown).

    ``together`` (the run's barrier) is called by every rank before each reading, so that the
    ranks of a host read ``/proc`` at the same moment: the host's CPU time and the ranks' own
    then cover one window (a rank entering the measured loop one iteration before another made
    quiet runs read -0.16 to +0.10 cores of others)."""

    def __init__(
        self, parts: Path, rank: int, proc: Path = PROC, sys_cpu: Path = SYS_CPU,
        together: Callable[[], None] = lambda: None,
    ):  # fmt: skip
        self.parts, self.rank, self.proc, self.sys_cpu = parts, rank, proc, sys_cpu
        self.cpus = sorted(os.sched_getaffinity(0))
        self.together = together
        self.before: Sample | None = None

    def start(self) -> None:
        self.together()
        try:
            self.before = sample(self.cpus, self.proc)
        except (OSError, ValueError):
            self.before = None

    def stop(self) -> None:
        self.together()  # every rank, read or not: the others wait in it
        if self.before is None:
            return
        try:
            after = sample(self.cpus, self.proc)
        except (OSError, ValueError):
            return
        doc = part(self.before, after, os.sysconf("SC_CLK_TCK"), rank=self.rank,
                   host=socket.gethostname(), machine=_machine_id(self.proc),
                   governor=governors(self.cpus, self.sys_cpu))  # fmt: skip
        atomic_write_json(interference_part(self.parts, self.rank), doc)


def _machine_id(proc: Path) -> str | None:
    """The kernel's boot id: the same for every rank on one machine, network namespaces
    (emulated links) included; hostnames may repeat across machines."""
    try:
        return (proc / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
