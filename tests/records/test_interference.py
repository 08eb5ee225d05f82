"""Measurements that know when they were disturbed (issue 31, item 9): the /proc arithmetic on
fake /proc trees with literal numbers, the ranks' parts combined per host, and the rule at its
threshold. The report's side is tests/report/test_disturbed_report.py, ``sweep --rerun-disturbed``'s
tests/launch/test_rerun_disturbed.py, a real 2-rank run beside a busy loop
tests/run/test_interference_e2e.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from qbench.records import interference
from qbench.records.store import interference_part
from qbench.run.interference import Watch, cpu_ticks, governors, part, sample

# ---- /proc arithmetic ------------------------------------------------------------------------
# /proc/stat columns: user nice system idle iowait irq softirq steal guest guest_nice
STAT_BEFORE = """cpu  900 90 900 9000 90 9 9 9 0 0
cpu0 100 10 100 1000 10 1 1 1 0 0
cpu1 200 20 200 2000 20 2 2 2 0 0
cpu2 300 30 300 3000 30 3 3 3 0 0
intr 144436 0 0
ctxt 231945
"""
# over the window: cpu0 busy +150 ticks (user 100, nice 0, system 40, irq 5, softirq 5), steal
# +10, idle +40 (idle 30, iowait 10); cpu1 busy +100 (user 100), steal +0, idle +100; cpu2
# (not watched) +1000 busy, which must not count
STAT_AFTER = """cpu  999 99 999 9999 99 99 99 99 0 0
cpu0 200 10 140 1030 20 6 6 11 0 0
cpu1 300 20 200 2100 20 2 2 2 0 0
cpu2 1300 30 300 3000 30 3 3 3 0 0
intr 144436 0 0
"""


def _proc(root: Path, stat: str, load: str = "0.50 0.40 0.30 2/108 7266\n") -> Path:
    (root / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(stat)
    (root / "loadavg").write_text(load)
    (root / "sys/kernel/random/boot_id").write_text("boot-a\n")
    return root


def test_cpu_ticks_sum_busy_steal_and_idle_columns_of_watched_cpus() -> None:
    # cpu0: busy 100+10+100+1+1 = 212, steal 1, idle 1000+10 = 1010; the cpu total line and
    # cpu2 (not watched) are not read
    assert cpu_ticks(STAT_BEFORE, [0, 1]) == {0: (212, 1, 1010), 1: (424, 2, 2020)}
    # an old kernel's line without steal and later columns: they count as 0
    assert cpu_ticks("cpu0 5 0 5 50 0\n", [0]) == {0: (10, 0, 50)}


def test_a_rank_part_is_the_difference_of_two_samples_in_seconds(tmp_path: Path) -> None:
    root = _proc(tmp_path / "proc", STAT_BEFORE)
    before = sample([0, 1], root, clock=lambda: 10.0, own=lambda: 1.0)
    _proc(root, STAT_AFTER, "1.75 0.60 0.35 3/110 7300\n")
    after = sample([0, 1], root, clock=lambda: 12.0, own=lambda: 2.5)
    doc = part(before, after, 100, rank=0)
    assert doc["wall_s"] == 2.0 and doc["own_s"] == 1.5 and doc["hz"] == 100
    # ticks / 100: cpu0 busy 150, steal 10, idle 40; cpu1 busy 100, steal 0, idle 100
    assert doc["cpus"] == {"0": [1.5, 0.1, 0.4], "1": [1.0, 0.0, 1.0]}
    assert doc["loadavg_before"] == [0.5, 0.4, 0.3] and doc["loadavg_after"] == [1.75, 0.6, 0.35]


def test_governor_where_readable_else_none(tmp_path: Path) -> None:
    (tmp_path / "cpu0/cpufreq").mkdir(parents=True)
    (tmp_path / "cpu0/cpufreq/scaling_governor").write_text("powersave\n")
    assert governors([0, 1], tmp_path) == ["powersave"]  # cpu1 has none: skipped
    assert governors([1], tmp_path) is None  # a VM or container: nothing to read


def _stat(busy: int, cpus: list[int]) -> str:
    """/proc/stat with every CPU of ``cpus`` at ``busy`` user ticks and 1000 idle."""
    return "".join(f"cpu{c} {busy} 0 0 1000 0 0 0 0 0 0\n" for c in cpus)


def test_a_watch_writes_the_part_the_driver_reads(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    root = _proc(tmp_path / "proc", _stat(100, cpus))
    watch = Watch(tmp_path / "parts", 3, proc=root, sys_cpu=tmp_path / "nosys")
    watch.start()
    _proc(root, _stat(150, cpus))  # 50 busy ticks on every watched CPU meanwhile
    watch.stop()
    doc = json.loads(interference_part(tmp_path / "parts", 3).read_text())
    assert (doc["rank"], doc["machine"], doc["governor"]) == (3, "boot-a", None)
    hz = doc["hz"]
    assert doc["cpus"] == {str(c): [50 / hz, 0.0, 0.0] for c in cpus}
    assert doc["wall_s"] > 0 and doc["own_s"] >= 0


def test_a_watch_reads_after_the_ranks_meet(tmp_path: Path) -> None:
    """Every rank waits for the others before each reading (``together``, the run's barrier):
    here the other ranks' work lands while this one waits, so a reading taken before the wait
    would miss 30 busy ticks at the start and count 70 at the end."""
    cpus = sorted(os.sched_getaffinity(0))
    root = _proc(tmp_path / "proc", _stat(100, cpus))
    ticks = iter([130, 200])  # /proc/stat once the ranks have met, at start and at stop
    met = []

    def together() -> None:
        met.append(True)
        _proc(root, _stat(next(ticks), cpus))

    watch = Watch(tmp_path / "parts", 0, proc=root, sys_cpu=tmp_path / "nosys", together=together)
    watch.start()
    watch.stop()
    doc = json.loads(interference_part(tmp_path / "parts", 0).read_text())
    assert len(met) == 2
    assert doc["cpus"] == {str(c): [70 / doc["hz"], 0.0, 0.0] for c in cpus}


def test_without_proc_stat_a_watch_records_nothing(tmp_path: Path) -> None:
    watch = Watch(tmp_path / "parts", 0, proc=tmp_path / "empty")
    watch.start()
    watch.stop()
    assert not (tmp_path / "parts").exists()  # interference unknown, the run goes on


def _rank(rank: int, own: float, cpus: dict[str, list[float]], machine: str = "boot-a",
          wall: float = 2.0) -> dict[str, Any]:  # fmt: skip
    return {"rank": rank, "host": f"h-{machine}", "machine": machine, "hz": 100, "wall_s": wall,
            "own_s": own, "cpus": cpus, "loadavg_before": [0.5, 0.4, 0.3],
            "loadavg_after": [1.75, 0.6, 0.35], "governor": None}  # fmt: skip


def test_combine_counts_each_cpu_once_and_subtracts_every_rank_of_the_host() -> None:
    shared = {"0": [1.5, 0.1, 0.4], "1": [1.0, 0.0, 1.0]}
    # two ranks on one machine watching the same CPUs (rank 1's counts differ slightly: its
    # window is a few ms off; the first rank's are taken), and a third rank on another host
    doc = interference.combine([
        _rank(1, 1.0, {"0": [1.6, 0.1, 0.3], "1": [1.0, 0.0, 1.0]}),
        _rank(0, 0.8, shared),
        _rank(2, 0.5, {"0": [0.6, 0.0, 1.4]}, machine="boot-b"),
    ])  # fmt: skip
    assert doc is not None
    a, b = doc["hosts"]
    # host a: busy 1.5 + 1.0 = 2.5, steal 0.1, own 0.8 + 1.0 = 1.8: others 0.8 s over 2 s
    assert a["ranks"] == [0, 1] and a["cpus"] == 2
    assert (a["busy_s"], a["steal_s"], a["idle_s"], a["own_s"]) == (2.5, 0.1, 1.4, 1.8)
    assert a["other_s"] == pytest.approx(0.8, abs=1e-9)
    assert a["other_cores"] == pytest.approx(0.4, abs=1e-9)
    assert a["resolution_s"] == 0.02  # 2 CPUs x 1 tick of 1/100 s
    # host b: busy 0.6 - own 0.5 = 0.1 s over 2 s
    assert b["ranks"] == [2] and b["other_cores"] == pytest.approx(0.05, abs=1e-9)
    assert doc["other_cores"] == pytest.approx(0.4, abs=1e-9)
    assert interference.combine([]) is None


def test_busy_time_is_the_busy_share_of_what_proc_stat_accounted() -> None:
    """A VM's /proc/stat accounts less time than passed (here 3.6 of 2 CPUs x 2 s): ranks that
    never idle, 4.0 s of their own, are not "-0.2 cores of others"; the share counts."""
    never_idle = interference.combine([_rank(0, 2.0, {"0": [1.8, 0.0, 0.0]}),
                                       _rank(1, 2.0, {"1": [1.8, 0.0, 0.0]})])  # fmt: skip
    assert never_idle is not None
    (host,) = never_idle["hosts"]
    assert host["accounted_s"] == 3.6
    assert host["other_s"] == pytest.approx(0.0, abs=1e-9)
    # busy 3.0 of 3.6 accounted: 5/6 of 4.0 CPU-seconds, 3.333 s, of which 2.0 the run's
    busy = interference.combine([_rank(0, 2.0, {"0": [1.5, 0.0, 0.3], "1": [1.5, 0.0, 0.3]})])
    assert busy is not None
    assert busy["hosts"][0]["other_s"] == pytest.approx(4.0 * 3.0 / 3.6 - 2.0, abs=1e-4)
    assert busy["other_cores"] == pytest.approx((4.0 * 3.0 / 3.6 - 2.0) / 2.0, abs=1e-4)


# ---- the rule --------------------------------------------------------------------------------
def _doc(other_s: float, wall: float = 4.0, resolution: float = 0.25) -> dict[str, Any]:
    return {"hosts": [{"host": "a", "cpus": 2, "wall_s": wall, "other_s": other_s,
                       "resolution_s": resolution,
                       "other_cores": other_s / wall if wall else 0.0}]}  # fmt: skip


def test_disturbed_past_the_threshold_beyond_the_tick_resolution() -> None:
    assert interference.THRESHOLD_CORES == 0.1
    # 10 s measured, 0.5 s of tick resolution: others must exceed 0.1 * 10 + 0.5 = 1.5 s
    assert interference.disturbed(_doc(1.5, wall=10.0, resolution=0.5)) is False  # at it
    assert interference.disturbed(_doc(1.51, wall=10.0, resolution=0.5)) is True
    # 0.125 cores counted, but 0.5 s of it may be the ticks' rounding: not sure enough
    assert interference.disturbed(_doc(1.25, wall=10.0, resolution=0.5)) is False
    # a quiet host beside a disturbed one: the run is disturbed
    both = {"hosts": [*_doc(0.0)["hosts"], *_doc(2.0)["hosts"]]}
    assert interference.disturbed(both) is True
    assert interference.other_cores(both) == 0.5


@pytest.mark.parametrize("doc", [None, {}, {"hosts": []}, _doc(2.0, wall=0.0), {"hosts": "x"},
                                 {"hosts": [{"wall_s": 1.0}]}])  # fmt: skip
def test_not_recorded_is_unknown_not_quiet(doc: Any) -> None:
    assert interference.disturbed(doc) is None and interference.other_cores(doc) is None


def test_a_host_entry_keeps_its_names_and_survives_empty_counts() -> None:
    """The host, governor and wall time come from the ranks; a window in which /proc/stat
    counted no tick (or no time passed) reads 0 cores of others, not a division by zero."""
    rank = {**_rank(0, 0.5, {"0": [1.0, 0.0, 1.0]}), "governor": ["performance"]}
    (host,) = interference.combine([rank, _rank(1, 0.5, {"0": [9.0, 0.0, 9.0]})])["hosts"]  # type: ignore[index]
    assert (host["host"], host["governor"], host["wall_s"]) == ("h-boot-a", ["performance"], 2.0)
    assert host["loadavg_before"] == [0.5, 0.4, 0.3] and host["loadavg_after"] == [1.75, 0.6, 0.35]
    (idle,) = interference.combine([_rank(0, 0.0, {"0": [0.0, 0.0, 0.0]})])["hosts"]  # type: ignore[index]
    assert (idle["accounted_s"], idle["other_s"], idle["other_cores"]) == (0.0, 0.0, 0.0)
    (instant,) = interference.combine([_rank(0, 0.0, {"0": [0.0, 0.0, 0.0]}, wall=0.0)])["hosts"]  # type: ignore[index]
    assert instant["other_cores"] == 0.0


def test_ranks_are_grouped_by_machine_else_host_and_ordered_by_rank() -> None:
    """Two network namespaces of one machine share a boot id (one host entry); where no boot id
    was readable the hostname groups."""
    no_id = [{**_rank(3, 0.1, {"0": [1.0, 0.0, 1.0]}), "machine": None, "host": "x"},
             {**_rank(0, 0.1, {"0": [1.0, 0.0, 1.0]}), "machine": None, "host": "y"}]  # fmt: skip
    doc = interference.combine(no_id)
    assert doc is not None and [h["ranks"] for h in doc["hosts"]] == [[0], [3]]
    one = [{**_rank(2, 0.1, {"0": [1.0, 0.0, 1.0]}), "host": "ns-b"},
           {**_rank(1, 0.1, {"0": [1.0, 0.0, 1.0]}), "host": "ns-a"}]  # fmt: skip
    (host,) = interference.combine(one)["hosts"]  # type: ignore[index]
    assert host["ranks"] == [1, 2] and host["host"] == "ns-a"  # the first rank's name


def test_host_values_are_rounded_to_four_places() -> None:
    (host,) = interference.combine([_rank(0, 0.123456, {"0": [1.0, 0.0, 1.0]})])["hosts"]  # type: ignore[index]
    assert host["own_s"] == 0.1235 and host["other_s"] == 0.8765


def test_a_short_window_still_counts() -> None:
    """A run measured for 0.5 s is judged like any other (only 0 s means nothing measured)."""
    assert interference.disturbed(_doc(0.3, wall=0.5, resolution=0.02)) is True
    assert interference.other_cores(_doc(0.3, wall=0.5, resolution=0.02)) == pytest.approx(0.6)


def test_describe_names_the_worst_host_or_says_nothing_was_recorded() -> None:
    quiet, busy = _doc(0.0)["hosts"][0], {**_doc(5.24)["hosts"][0], "host": "b", "cpus": 4}
    assert interference.describe({"hosts": [quiet, busy]}) == (
        "other processes used 1.31 cores (host b, 4 CPUs)"
    )
    assert interference.describe(None) == "interference not recorded"
    assert interference.describe({"hosts": []}) == "interference not recorded"


def test_a_cpu_without_a_governor_does_not_hide_the_next(tmp_path: Path) -> None:
    (tmp_path / "cpu1/cpufreq").mkdir(parents=True)
    (tmp_path / "cpu1/cpufreq/scaling_governor").write_text("performance\n")
    assert governors([0, 1], tmp_path) == ["performance"]


def test_a_sample_without_loadavg_says_none(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text(STAT_BEFORE)
    assert sample([0], root).loadavg is None


def test_a_watch_watches_its_own_cpus_and_names_its_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    asked = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: asked.append(pid) or {0})
    root = _proc(tmp_path / "proc", _stat(100, [0]))
    (tmp_path / "sys/cpu0/cpufreq").mkdir(parents=True)
    (tmp_path / "sys/cpu0/cpufreq/scaling_governor").write_text("ondemand\n")
    watch = Watch(tmp_path / "parts", 1, proc=root, sys_cpu=tmp_path / "sys")
    assert asked == [0] and watch.cpus == [0]
    watch.start()
    watch.stop()
    doc = json.loads(interference_part(tmp_path / "parts", 1).read_text())
    assert doc["host"] == socket.gethostname() and doc["governor"] == ["ondemand"]


def test_a_watch_that_could_not_start_records_nothing_at_stop(tmp_path: Path) -> None:
    """/proc/stat unreadable at start but readable at stop: no window, so no part (half a
    window would read as a run with no time)."""
    watch = Watch(tmp_path / "parts", 0, proc=tmp_path / "proc")
    assert watch.before is None
    watch.start()
    assert watch.before is None
    _proc(tmp_path / "proc", _stat(100, watch.cpus))
    watch.stop()
    assert not (tmp_path / "parts").exists()
    never = Watch(tmp_path / "parts", 0, proc=tmp_path / "proc")
    never.stop()  # stop without start
    assert not (tmp_path / "parts").exists()
