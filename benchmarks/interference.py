"""Interference, measured: the same small sweep with nothing, a part-time busy loop or a full one
beside it, interleaved, and what each run recorded about other processes
(``qbench.records.interference``) against how much slower it ran.

    .venv/bin/python benchmarks/interference.py --repeats 3 --json interference.json

Conditions (``--conditions``): ``quiet`` (nothing started), ``dutyP`` (one process busy P % of
every 20 ms, asleep the rest: about P/100 of a core), ``loopsN`` (N processes busy all the
time). Repeat r runs every condition once, the order rotating between repeats, so a slow spell
of a shared machine hits each condition. Each sweep goes to its own results directory (fresh
runs, nothing resumed). Per run: ``other_cores`` as recorded, the rule's verdict, and the median
iteration time; per condition and configuration, that time over the quiet condition's (median
over repeats). The load average before and after every sweep is recorded too: on a machine
shared with other work even ``quiet`` is not quiet, and the records say so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = """name: interference
model: [mlp, resnet20]
world_size: 2
backend: gloo
compressor: [none, {name: qsgd, bits: 4, bucket_size: 512}]
warmup: 5
iterations: 20
"""
PERIOD_S = 0.02
DUTY = """import time
busy = {busy}
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < busy:
        pass
    time.sleep({idle})
"""


def hogs(condition: str) -> list[subprocess.Popen[bytes]]:
    """Start what ``condition`` puts beside the sweep."""
    if condition == "quiet":
        return []
    if condition.startswith("duty"):
        share = int(condition[4:]) / 100
        code = DUTY.format(busy=share * PERIOD_S, idle=(1 - share) * PERIOD_S)
        return [subprocess.Popen([sys.executable, "-c", code])]
    if condition.startswith("loops"):
        loop = [sys.executable, "-c", "while True: pass"]
        return [subprocess.Popen(loop) for _ in range(int(condition[5:]))]
    raise SystemExit(f"unknown condition {condition!r}: quiet, dutyP or loopsN")


def sweep(scenario: Path, out: Path, condition: str) -> dict[str, Any]:
    started = hogs(condition)
    before = os.getloadavg()
    try:
        argv = [sys.executable, "-m", "qbench.cli", "sweep", str(scenario), "--out", str(out)]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    finally:
        for hog in started:
            hog.kill()
            hog.wait()
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed under {condition}:\n{proc.stderr[-2000:]}")
    return {"load_before": [round(x, 2) for x in before],
            "load_after": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip


def runs(out: Path) -> list[dict[str, Any]]:
    from qbench.report import stats

    summary = stats.summarize(stats.load(out), include_disturbed=True)
    return [
        {"config": f"{r['model']} {r['compressor']}", "run_id": r["run_id"],
         "other_cores": r["other_cores"], "disturbed": bool(r["disturbed"]),
         "t_iteration_ms": round(1e3 * r["t_iteration_median"], 3)}
        for r in summary.to_dict("records")
    ]  # fmt: skip


def slowdowns(rows: list[dict[str, Any]], quiet: str = "quiet") -> dict[str, dict[str, float]]:
    """Per condition and configuration: median iteration time over the quiet one's."""

    def median(cond: str, config: str) -> float:
        return statistics.median(r["t_iteration_ms"] for r in rows
                                 if r["condition"] == cond and r["config"] == config)  # fmt: skip

    conds = sorted({r["condition"] for r in rows})
    configs = sorted({r["config"] for r in rows})
    return {c: {k: round(median(c, k) / median(quiet, k), 3) for k in configs} for c in conds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--conditions", default="quiet,duty25,duty50,loops1")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    conditions = args.conditions.split(",")
    rows, sweeps = [], []
    with tempfile.TemporaryDirectory(prefix="qbench-interference-") as tmp:
        scenario = Path(tmp) / "interference.yaml"
        scenario.write_text(SCENARIO)
        for r in range(args.repeats):
            k = r % len(conditions)
            for cond in conditions[k:] + conditions[:k]:
                out = Path(tmp) / f"{cond}-r{r}"
                sweeps.append({"condition": cond, "repeat": r, **sweep(scenario, out, cond)})
                rows += [{"condition": cond, "repeat": r, **run} for run in runs(out)]
                print(json.dumps(sweeps[-1]), flush=True)
    per = {}
    for cond in conditions:
        mine = [r for r in rows if r["condition"] == cond]
        cores = [r["other_cores"] for r in mine]
        per[cond] = {"runs": len(mine), "disturbed": sum(r["disturbed"] for r in mine),
                     "other_cores_min": min(cores), "other_cores_median": statistics.median(cores),
                     "other_cores_max": max(cores)}  # fmt: skip
    doc = {"cpus": os.cpu_count(), "conditions": per, "slowdown_vs_quiet": slowdowns(rows),
           "sweeps": sweeps, "runs": rows}  # fmt: skip
    print(json.dumps({k: doc[k] for k in ("cpus", "conditions", "slowdown_vs_quiet")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
