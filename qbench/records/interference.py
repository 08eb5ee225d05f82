"""What else used the machine while a run was measured, and the one rule that calls a run
*disturbed*. Ranks measure (``qbench.run.interference``); the driver combines their parts per
host into run.json's ``interference`` (:func:`combine`); the report, ``report A B`` and ``sweep
--rerun-disturbed`` all judge a run with :func:`disturbed`, here and nowhere else.

Per host, over the measured iterations (warm-up excluded, the timed loop untouched):

* ``busy_s``: CPU time the host's CPUs that the ranks may run on spent on anything (user,
  nice, system, irq, softirq of ``/proc/stat``), ``steal_s`` what a hypervisor gave to others;
* ``own_s``: the CPU time of the run's ranks on that host (every thread of each rank);
* ``accounted_s``: busy, steal and idle together, which should be ``cpus x wall_s``; in a VM
  it is often 2-8 % less (ticks lost while the hypervisor ran something else), while the ranks'
  own time, from the scheduler's clock, is not short: so the CPUs' busy time is taken as their
  busy share of what was accounted times ``cpus x wall_s``;
* ``other_s = (busy_s + steal_s) / accounted_s x cpus x wall_s - own_s``: everything that was
  not the run; ``other_cores`` is that over the wall time, so 1.0 means one other core busy all
  along. Without the share, quiet runs of ranks that never idle (MPI's busy polling) read
  -0.1 cores (docs/reports.md#disturbed-runs).

``/proc/stat`` counts in ticks of ``1 / hz`` s (10 ms) per CPU, so a short window cannot
resolve much: each CPU's count may be off by one tick, ``resolution_s = cpus / hz``. A run is
disturbed only when the others' time beyond that resolution exceeds ``THRESHOLD_CORES`` cores on
average on some host; a run without the record (older files, a failed run) is unknown (None).
The load average and the CPU frequency governor are recorded beside, for people: neither
enters the rule (the load average counts the run's own ranks and lags by a minute).
"""

from __future__ import annotations

from typing import Any

THRESHOLD_CORES = 0.1
"""Other processes' CPU time, in cores on average over the measured iterations, above which a
run is disturbed. Measured on a 2-CPU machine (docs/reports.md#disturbed-runs): quiet 2-rank
runs saw at most 0.05 cores of others; a loop busy a quarter of the time, 0.21 cores, already
slowed them by 9-16 %."""

RULE = (
    f"other processes used more than {THRESHOLD_CORES:g} cores on average (beyond /proc/stat's "
    "tick resolution)"
)
"""The rule in words (``measured while RULE``), for every message that applies it."""


def combine(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """run.json's ``interference`` from the ranks' parts (``qbench.run.interference``): one
    entry per host, where every CPU the host's ranks watched counts once; None without parts."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for part in sorted(parts, key=lambda p: int(p.get("rank", 0))):
        by_host.setdefault(str(part.get("machine") or part.get("host")), []).append(part)
    if not by_host:
        return None
    hosts = [_host(ranks) for ranks in by_host.values()]
    return {"hosts": hosts, "other_cores": max(h["other_cores"] for h in hosts)}


def _host(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One host: each CPU's counts from the first rank that watched it (the ranks' windows
    differ by the milliseconds between their first collectives), the wall time their mean."""
    cpus: dict[str, list[float]] = {}
    for part in ranks:
        for cpu, counts in part["cpus"].items():
            cpus.setdefault(cpu, counts)
    wall = sum(float(p["wall_s"]) for p in ranks) / len(ranks)
    busy, steal, idle = (sum(float(c[i]) for c in cpus.values()) for i in range(3))
    own = sum(float(p["own_s"]) for p in ranks)
    accounted = busy + steal + idle
    used = (busy + steal) / accounted * len(cpus) * wall if accounted else 0.0
    other = used - own
    first, last = ranks[0], ranks[-1]
    return {
        "host": first.get("host"), "ranks": [int(p["rank"]) for p in ranks], "cpus": len(cpus),
        "wall_s": _r(wall), "busy_s": _r(busy), "steal_s": _r(steal), "idle_s": _r(idle),
        "accounted_s": _r(accounted), "own_s": _r(own), "other_s": _r(other),
        "other_cores": _r(other / wall if wall else 0.0),
        "resolution_s": _r(len(cpus) / float(first["hz"])),
        "loadavg_before": first.get("loadavg_before"), "loadavg_after": last.get("loadavg_after"),
        "governor": first.get("governor"),
    }  # fmt: skip


def _r(x: float) -> float:
    return round(x, 4)


def disturbed(doc: Any) -> bool | None:
    """Whether ``RULE`` holds on some host of a run's ``interference``; None when it was not
    recorded or no host measured any time."""
    hosts = _hosts(doc)
    if not hosts:
        return None
    return any(_beyond(h) for h in hosts)


def _beyond(host: dict[str, Any]) -> bool:
    # The least the others can have used: what /proc/stat counted less its ticks' resolution.
    surest = float(host["other_s"]) - float(host["resolution_s"])
    return surest > THRESHOLD_CORES * float(host["wall_s"])


def other_cores(doc: Any) -> float | None:
    """The largest ``other_cores`` over a run's hosts, None when unknown."""
    hosts = _hosts(doc)
    return max(float(h["other_cores"]) for h in hosts) if hosts else None


def _hosts(doc: Any) -> list[dict[str, Any]]:
    """The hosts that measured some time; malformed entries count as not recorded."""
    if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), list):
        return []
    keys = ("other_s", "resolution_s", "wall_s", "other_cores")
    return [
        h for h in doc["hosts"]
        if isinstance(h, dict) and all(isinstance(h.get(k), int | float) for k in keys)
        and h["wall_s"] > 0
    ]  # fmt: skip


def describe(doc: Any) -> str:
    """``other processes used 1.31 cores (host a, 2 CPUs)``, or why nothing is known."""
    hosts = _hosts(doc)
    if not hosts:
        return "interference not recorded"
    worst = max(hosts, key=lambda h: float(h["other_cores"]))
    return (
        f"other processes used {float(worst['other_cores']):.2f} cores "
        f"(host {worst.get('host')}, {worst.get('cpus')} CPUs)"
    )
