"""Process isolation against warm rank groups, side by side: the same sweep run both ways,
interleaved, with the wall time ratio, the share of time spent in timed iterations, and
``qbench report A B`` between the two (the same numbers within noise?).

    .venv/bin/python benchmarks/isolation.py --repeats 3 --json isolation.json

``--rank-start`` compares instead how a warm group's CPU ranks start: each its own
``python -m qbench.run.worker`` (``exec``, QBENCH_RANK_START=exec) against forked from the rank
server (``fork``, the default; ``qbench.run.rank_server``), both with group isolation.

By default the sweep is the embedded demo scenario (``make demo``); ``--figures`` takes every
``scenarios/paper/*.yaml`` at seed 0 instead (``make figures``), ``SCENARIO ...`` any files;
``--set KEY=VALUE`` goes to every sweep.
Repeat r of every scenario runs once per isolation, the order alternating between repeats, so a
slow spell of a shared machine hits both modes; each repeat is its own slice of the scenario's
``repeats: R`` (an ``exclude`` entry for the other repeats), so that after the last one each
results directory holds R runs per configuration and ``qbench report process group``
bootstraps whole runs.

Per (scenario, repeat, isolation): wall seconds of ``qbench sweep``, the sum of the runs'
durations, and the timed iterations' time (per iteration the slowest rank, warm-up included,
as the issue counted it). Ratios process / group come with a 95 % interval (t on the logs of
the paired ratios; with one repeat, none). The load average before and after every sweep is
recorded: numbers from a busy machine are slower, and say so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
MODES = ("process", "group")  # or RANK_STARTS: the first of the pair is the ratio's numerator
RANK_STARTS = ("exec", "fork")
# mode -> (--isolation, QBENCH_RANK_START)
SETTINGS = {"process": ("process", None), "group": ("group", None), "exec": ("group", "exec"),
            "fork": ("group", "fork")}  # fmt: skip
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def qbench(*argv: str, start: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QBENCH_RANK_START": start} if start else None
    return subprocess.run([sys.executable, "-m", "qbench.cli", *argv], capture_output=True,
                          text=True, cwd=ROOT, env=env)  # fmt: skip


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def scenarios(args: argparse.Namespace) -> list[tuple[str, str | None, list[str]]]:
    """(name, scenario file or None for the embedded default, --set values) per scenario."""
    if args.figures:  # as `make figures` runs them
        paper = sorted((ROOT / "scenarios" / "paper").glob("*.yaml"))
        return [(p.stem, str(p), ["seed=0", *args.sets]) for p in paper]
    if args.scenario:
        return [(Path(s).stem, s, list(args.sets)) for s in args.scenario]
    return [("smoke", None, list(args.sets))]


def slice_of(scenario: str | None, repeat: int, repeats: int, dest: Path) -> Path:
    """The scenario with ``repeats: R`` and an exclude entry that leaves repeat ``repeat`` only
    (appended: the scenario's own include / exclude entries stay)."""
    if scenario is None:
        text = resources.files("qbench.spec").joinpath("default.yaml").read_text()
    else:
        text = Path(scenario).read_text()
    doc = yaml.safe_load(text)
    if repeats > 1:
        others = [r for r in range(repeats) if r != repeat]
        doc["repeats"] = repeats
        doc["exclude"] = [*(doc.get("exclude") or []), {"repeat": others}]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


def sweep(
    name: str, scenario: str | None, sets: list[str], out: Path, mode: str, repeat: int,
    repeats: int,
) -> dict[str, Any]:  # fmt: skip
    """One slice (repeat ``repeat``) of the scenario in ``mode``, timed."""
    path = slice_of(scenario, repeat, repeats, out.parent / f"{name}-r{repeat}.yaml")
    isolation, start = SETTINGS[mode]
    argv = ["sweep", str(path), "--out", str(out), "--isolation", isolation]
    for s in sets:
        argv += ["--set", s]
    before = load()
    t0 = time.monotonic()
    proc = qbench(*argv, start=start)
    wall = time.monotonic() - t0
    row = {"scenario": name, "isolation": mode, "repeat": repeat, "wall_s": round(wall, 2),
           "exit_code": proc.returncode, "load_before": before, "load_after": load()}  # fmt: skip
    row.update(measure(out, repeat))
    if proc.returncode != 0:
        row["stderr_tail"] = proc.stderr[-1500:]
    print(f"{name} repeat {repeat} {mode:7s}: {wall:7.1f} s wall, {row['runs']} runs, "
          f"timed {row['timed_s']:.1f} s ({row['timed_s'] / wall:.0%}), exit "
          f"{proc.returncode}, load {before[0]} -> {row['load_after'][0]}", flush=True)  # fmt: skip
    return row


def measure(out: Path, repeat: int) -> dict[str, Any]:
    """The runs of repeat ``repeat`` in ``out``: count, statuses, summed durations, timed time."""
    durations, timed, statuses = [], 0.0, {}
    for path in sorted(out.glob("*/run.json")):
        rec = json.loads(path.read_text())
        if int(rec.get("spec", {}).get("repeat", 0)) != repeat:
            continue
        statuses[rec["status"]] = statuses.get(rec["status"], 0) + 1
        durations.append(float(rec.get("duration_s") or 0.0))
        its = path.parent / "iterations.parquet"
        if rec["status"] == "ok" and its.exists():
            frame = pd.read_parquet(its, columns=["iteration", "t_iteration"])
            timed += float(frame.groupby("iteration")["t_iteration"].max().sum())
    return {"runs": len(durations), "statuses": statuses, "runs_s": round(sum(durations), 2),
            "timed_s": round(timed, 2)}  # fmt: skip


def interval(values: list[float]) -> dict[str, Any]:
    """Geometric mean of positive ratios with a 95 % t interval on their logs."""
    logs = [math.log(v) for v in values]
    mean = statistics.fmean(logs)
    out: dict[str, Any] = {"mean": round(math.exp(mean), 3), "n": len(values),
                           "values": [round(v, 3) for v in values]}  # fmt: skip
    if len(values) > 1:
        half = T95.get(len(values) - 1, 1.96) * statistics.stdev(logs) / math.sqrt(len(values))
        out.update(low=round(math.exp(mean - half), 3), high=round(math.exp(mean + half), 3))
    return out


def summarize(rows: list[dict[str, Any]], modes: tuple[str, str]) -> dict[str, Any]:
    """Per scenario and over all: wall ratio first / second mode, timed shares, per repeat."""
    frame = pd.DataFrame(rows)
    out: dict[str, Any] = {}
    for name, part in [*frame.groupby("scenario"), ("all", frame)]:
        totals = part.groupby(["repeat", "isolation"])[["wall_s", "runs_s", "timed_s"]].sum()
        wide = totals.unstack("isolation")
        ratios = (wide["wall_s"][modes[0]] / wide["wall_s"][modes[1]]).tolist()
        share_wall = wide["timed_s"] / wide["wall_s"]
        share_runs = wide["timed_s"] / wide["runs_s"]
        out[str(name)] = {
            "wall_s": {m: wide["wall_s"][m].round(1).tolist() for m in modes},
            f"wall_ratio_{modes[0]}_over_{modes[1]}": interval(ratios),
            "timed_share_of_wall": {m: interval(share_wall[m].tolist()) for m in modes},
            "timed_share_of_runs": {m: interval(share_runs[m].tolist()) for m in modes},
        }
    return out


def compare(outs: dict[str, Path], modes: tuple[str, str]) -> dict[str, Any]:
    """``qbench report A B`` of the two modes: verdicts, every configuration beyond the noise."""
    proc = qbench("report", str(outs[modes[0]]), str(outs[modes[1]]), "--format", "json")
    if proc.returncode != 0:
        return {"error": proc.stderr[-1500:]}
    frame = pd.DataFrame(json.loads(proc.stdout))
    beyond = frame[frame["verdict"].isin(["slower", "faster"])]
    keep = ["model", "backend", "scheme", "compressor", "world_size", "ratio", "ci_low",
            "ci_high", "a_n", "b_n", "noise", "verdict"]  # fmt: skip
    return {
        "configurations": len(frame),
        "verdicts": {str(k): int(v) for k, v in frame["verdict"].value_counts().items()},
        "beyond_noise": beyond[[c for c in keep if c in frame.columns]].to_dict("records"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", nargs="*", help="scenario files [the embedded demo scenario]")
    ap.add_argument("--figures", action="store_true", help="every scenarios/paper/*.yaml, seed 0")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to every sweep (qbench sweep --set)")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=3, help="repeats per isolation [3]")
    ap.add_argument("--out", default="results/isolation-bench", help="results root (emptied)")
    ap.add_argument("--json", default=None, help="write the figures here as JSON")
    ap.add_argument("--rank-start", action="store_true",
                    help="compare exec'd with forked CPU ranks (both warm groups)")  # fmt: skip
    args = ap.parse_args(argv)
    modes = RANK_STARTS if args.rank_start else MODES
    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    started, rows = dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), []
    todo = scenarios(args)
    for r in range(args.repeats):
        for name, scenario, sets in todo:
            for mode in modes if r % 2 == 0 else modes[::-1]:
                rows.append(sweep(name, scenario, sets, root / name / mode, mode, r, args.repeats))
    doc = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": started, "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "repeats": args.repeats, "sweeps": rows,
        "summary": summarize(rows, modes),
        "compare": {name: compare({m: root / name / m for m in modes}, modes)
                    for name, _, _ in todo},
    }  # fmt: skip
    text = json.dumps(doc, indent=2, default=str)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(json.dumps({"summary": doc["summary"], "compare": doc["compare"]}, indent=2))
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
