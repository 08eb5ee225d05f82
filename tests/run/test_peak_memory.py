"""Peak memory per rank, recorded for every run and shown in the report (issue 35, item 5): a
rank's peaks are its run's own (``qbench.run.memory`` resets them when a run starts), the driver
gathers them into run.json's ``memory``, the summary takes the largest over ranks
(``qbench.records.memory``), and summary.md and the page show it. End to end (slow): a warm
group's second run does not inherit the first's peak, and a run launched alone records it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from qbench.launch import runfiles
from qbench.records import memory as records_memory
from qbench.records.schema import RunRecord, iterations_frame
from qbench.records.store import INDEX_MD, SUMMARY_MD, ResultStore, atomic_write_json, memory_part
from qbench.report import stats
from qbench.report import tables as report
from qbench.run import memory
from qbench.run.lifecycle import SPIKE_MB
from tests import invoke
from tests.launch.test_group import _specs
from tests.paths import ROOT
from tests.report.test_disturbed_report import _labels, _rows

CPU = torch.device("cpu")


# -- a rank's peak -----------------------------------------------------------------------------
_PEAKS = """
import json, sys
from pathlib import Path
import torch
from qbench.run import memory
from qbench.run.lifecycle import SPIKE_MB
first = memory.Peak(Path(sys.argv[1]), 0, torch.device("cpu"))
if first.note is not None:
    print(json.dumps({"note": first.note, "read": first.read()}))
    raise SystemExit
held = torch.ones(SPIKE_MB * 2**18)  # float32, every page touched
big = first.read()
del held  # mmap'd: back to the kernel
small = memory.Peak(Path(sys.argv[1]), 0, torch.device("cpu")).read()
print(json.dumps({"big": big, "small": small}))
"""


def test_a_peak_is_the_runs_own_not_the_process_s(tmp_path: Path) -> None:
    """What a run held and gave back counts in its peak, and not in the next run's: without the
    reset the second peak would still be the first's (the process's high-water mark). In a
    fresh process, as a rank starts: in a test worker that ran other tests, freed memory the
    allocator kept resident would serve the spike without raising the resident peak."""
    got = subprocess.run([sys.executable, "-c", _PEAKS, str(tmp_path)], capture_output=True,
                         text=True, check=True, cwd=ROOT)  # fmt: skip
    doc = json.loads(got.stdout.strip().splitlines()[-1])
    if "note" in doc:  # no clear_refs here: the record says why instead of a number
        assert doc["read"][records_memory.RSS] is None and "cannot reset" in doc["note"]
        pytest.skip(doc["note"])
    big, small = doc["big"], doc["small"]
    assert big[records_memory.RSS] >= big["rss_start_mib"] + 0.9 * SPIKE_MB, big
    assert small[records_memory.RSS] < big[records_memory.RSS] - 0.9 * SPIKE_MB, (big, small)
    assert records_memory.GPU not in small  # a CPU run has no allocator peak


def test_the_part_is_what_the_driver_reads(tmp_path: Path) -> None:
    memory.Peak(tmp_path, 3, CPU).write()
    doc = json.loads(memory_part(tmp_path, 3).read_text())
    assert doc["rank"] == 3 and doc[records_memory.RSS] >= doc["rss_start_mib"] > 0


def test_status_fields_in_mib_and_a_peak_that_cannot_be_reset(tmp_path: Path) -> None:
    text = "Name:\tpython\nVmHWM:\t  524288 kB\nVmRSS:\t  1024 kB\n"
    assert memory.status_mib(text, "VmHWM") == 512.0 and memory.status_mib(text, "VmRSS") == 1.0
    with pytest.raises(ValueError, match="no VmPeak"):
        memory.status_mib(text, "VmPeak")
    (tmp_path / "clear_refs").mkdir()  # cannot be written: as a kernel without it
    (tmp_path / "status").write_text(text)
    doc = memory.Peak(tmp_path, 0, CPU, proc=tmp_path).read()
    assert doc[records_memory.RSS] is None and doc["rss_start_mib"] is None
    assert doc["rss_note"].startswith("cannot reset the resident peak (IsADirectoryError")


# -- the driver and the record -----------------------------------------------------------------
def test_the_driver_gathers_every_ranks_peak_into_run_json(tmp_path: Path) -> None:
    (spec,) = _specs(compressor="none", world_size=2)
    store = ResultStore(tmp_path)
    record = RunRecord(run_id=spec.run_id, status="running", labels={}, spec={})
    for rank, peak in ((1, 750.5), (0, 812.0)):
        atomic_write_json(memory_part(store.parts_dir(spec.run_id), rank),
                          {"rank": rank, "rss_start_mib": 600.0, "peak_rss_mib": peak})  # fmt: skip
    (store.parts_dir(spec.run_id) / "memory-2.json").write_text("{torn")  # a rank killed mid-write
    runfiles.finish(spec, store, record, "ok", 0, 1.0)
    doc = json.loads((store.run_dir(spec.run_id) / "run.json").read_text())
    assert doc["schema_version"] == 3
    assert [r["rank"] for r in doc["memory"]["ranks"]] == [0, 1]
    assert doc["memory"]["ranks"][0]["peak_rss_mib"] == 812.0


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"ranks": [{"rank": 0, "peak_rss_mib": 700.0, "state_mib": 6.5},
                    {"rank": 1, "peak_rss_mib": 812.5, "state_mib": 6.25}]},
         (812.5, None, 6.5, 2)),
        ({"ranks": [{"rank": 0, "peak_rss_mib": None, "rss_note": "cannot reset"},
                    {"rank": 1, "peak_rss_mib": 640.0, "peak_gpu_mib": 300.0},
                    {"rank": 2, "peak_rss_mib": True, "peak_gpu_mib": 420.0}]},
         (640.0, 420.0, None, 1)),
        (None, (None, None, None, None)),  # older records: not recorded
        ({"ranks": "garbled"}, (None, None, None, None)),
    ],
)  # fmt: skip
def test_a_runs_peak_is_the_largest_over_its_ranks(doc: Any, expected: tuple[Any, ...]) -> None:
    got = records_memory.peaks(doc)
    assert tuple(got[c] for c in records_memory.PEAK_COLUMNS) == expected


# -- summary and report ------------------------------------------------------------------------
def _ranks(*peaks: tuple[float, float | None]) -> dict[str, Any]:
    return {"ranks": [{"rank": r, "peak_rss_mib": rss, "peak_gpu_mib": gpu}
                      for r, (rss, gpu) in enumerate(peaks)]}  # fmt: skip


def _results(root: Path) -> Path:
    """fp32 with both ranks' peaks; QSGD with one rank's (the other's part lost) and GPU
    peaks; an older fp32 repeat without the record."""
    store = ResultStore(root)
    runs = (("fp32", "fp32", 0, _ranks((700.0, None), (812.4, None))),
            ("qsgd", "qsgd-4b-b512", 0, _ranks((650.0, 300.0))),
            ("old", "fp32", 1, None))  # fmt: skip
    for run_id, comp, repeat, doc in runs:
        store.write_record(RunRecord(run_id=run_id, status="ok", labels=_labels(comp, repeat),
                                     spec={}, memory=doc))  # fmt: skip
        store.write_iterations(run_id, iterations_frame(_rows(run_id, 0.02)))
    return root


def test_the_summary_has_each_runs_peak_and_the_ranks_it_rests_on(tmp_path: Path) -> None:
    summary = stats.summarize(stats.load(_results(tmp_path))).set_index("run_id")
    assert summary.loc["fp32", "peak_rss_mib"] == 812.4 and summary.loc["fp32", "peak_ranks"] == 2
    assert pd.isna(summary.loc["fp32", "peak_gpu_mib"])  # CPU: no allocator peak
    assert summary.loc["qsgd", "peak_gpu_mib"] == 300.0 and summary.loc["qsgd", "peak_ranks"] == 1
    assert summary.loc["old", ["peak_rss_mib", "peak_gpu_mib", "peak_ranks"]].isna().all()


def test_the_report_shows_peak_memory_per_rank(tmp_path: Path) -> None:
    root = _results(tmp_path)
    report.write_report(root, fmt=None)
    md = (root / "report" / SUMMARY_MD).read_text()
    assert "| peak RSS MiB | peak GPU MiB |" in md  # the GPU's: some run measured one
    assert "| 812 | - |" in md and "| 650 (1/2 ranks) | 300 (1/2 ranks) |" in md
    assert "the Python interpreter, torch and its libraries hold several hundred MiB" in md
    assert "(torch.cuda.max_memory_allocated)" in md
    page = (root / "report" / INDEX_MD).read_text()
    speed = page.split("## Does low precision help speed?")[1].split("\n## ")[0]
    header = next(line for line in speed.splitlines() if line.startswith("| model"))
    assert header.endswith("| peak RSS MiB | peak GPU MiB |"), header
    assert "| 812 | - |" in speed  # fp32: the median over its runs that recorded one
    assert "several hundred MiB" in speed


def test_without_a_gpu_peak_the_report_has_no_gpu_column(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.write_record(RunRecord(run_id="a", status="ok", labels=_labels("fp32", 0), spec={},
                                 memory=_ranks((700.0, None), (701.0, None))))  # fmt: skip
    store.write_iterations("a", iterations_frame(_rows("a", 0.02)))
    report.write_report(tmp_path, fmt=None)
    md = (tmp_path / "report" / SUMMARY_MD).read_text()
    assert "| peak RSS MiB |" in md and "| 701 |" in md and "| peak GPU MiB |" not in md


# -- end to end (slow) -------------------------------------------------------------------------
TWO = """
name: peaks
model: mlp
world_size: 2
backend: gloo
compressor: [none, {name: qsgd, bits: 4}]
warmup: 1
iterations: 3
timeout: 300
"""


def _sweep(out: Path, *extra: str, env: dict[str, str] | None = None) -> list[dict]:
    """Sweep TWO; its runs' run.json."""
    (out.parent / f"{out.name}.yaml").write_text(TWO)
    argv = [sys.executable, "-m", "qbench.cli", "sweep", str(out.parent / f"{out.name}.yaml"),
            "--out", str(out), *extra]  # fmt: skip
    proc = invoke.run(argv, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(p.read_text()) for p in out.glob("*/run.json")]


def _peak(doc: dict, rank: int) -> float:
    return doc["memory"]["ranks"][rank][records_memory.RSS]


@pytest.mark.slow
def test_a_groups_second_run_does_not_inherit_the_first_runs_peak(tmp_path: Path) -> None:
    """Rank 0 holds SPIKE_MB MiB for a moment in the group's first run (QBENCH_FAULT's
    ``spike``): that run's peak shows it, the second run's (same process) does not; every rank
    of every run has its peak, above where the run started."""
    found = _sweep(tmp_path / "g", "--isolation", "group", env={"QBENCH_FAULT": "0:1:spike@0"})
    runs = sorted(found, key=lambda d: d["group"]["index"])  # @0: the group's first run
    assert [runs[i]["isolation"] for i in (0, 1)] == ["group", "group"]
    assert runs[0]["group"]["launch"] == runs[1]["group"]["launch"]  # one process per rank
    for doc in runs:
        ranks = doc["memory"]["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1], ranks
        assert all(r[records_memory.RSS] >= r["rss_start_mib"] > 100 for r in ranks), ranks
    spiked, next_run = _peak(runs[0], 0), _peak(runs[1], 0)
    assert spiked >= runs[0]["memory"]["ranks"][0]["rss_start_mib"] + 0.9 * SPIKE_MB, runs[0]
    assert next_run < spiked - 0.5 * SPIKE_MB, (spiked, next_run)
    assert _peak(runs[0], 1) < spiked - 0.5 * SPIKE_MB  # rank 1 held no spike


@pytest.mark.slow
def test_a_run_launched_alone_records_its_peak(tmp_path: Path) -> None:
    runs = _sweep(tmp_path / "p", "--isolation", "process")
    assert len(runs) == 2
    for doc in runs:
        assert doc["isolation"] == "process" and doc["schema_version"] == 3
        assert [r["rank"] for r in doc["memory"]["ranks"]] == [0, 1]
        assert all(r[records_memory.RSS] > 100 for r in doc["memory"]["ranks"])
