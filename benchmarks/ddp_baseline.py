"""qbench's ``scheme: ddp`` or ``fsdp`` (fp32) against a plain DDP or FSDP2 training loop of the
same model, batch and link, interleaved: the target is qbench's iteration within 5 % of the plain
loop's.

    .venv/bin/python benchmarks/ddp_baseline.py --model vgg16-cifar --batch-size 16 \\
        --bandwidth 1gbit --repeats 5 --json results/bench/ddp_baseline.json
    .venv/bin/python benchmarks/ddp_baseline.py --scheme fsdp --model gpt --batch-size 32 \\
        --repeats 6 --json results/bench/fsdp_baseline.json

Each repeat runs the plain loop (benchmarks/plain_loop.py) and then a one-run qbench sweep, each
a fresh launch of ``--world-size`` gloo ranks; a repeat's ratio is qbench's median iteration
over the plain loop's (each iteration the slowest rank's). Reported: every ratio, their median
and a 95 % bootstrap interval of the median. ``--bandwidth`` needs root (emulated links).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PLAIN = REPO / "benchmarks" / "plain_loop.py"


def plain_loop(args: argparse.Namespace, work: Path) -> float:
    """Median iteration (s) of the plain DDP loop."""
    from qbench.launch import local, shaped
    from qbench.spec import network

    out = work / "plain.json"
    config = {"scheme": args.scheme, "model": args.model, "batch_size": args.batch_size,
              "warmup": args.warmup, "iterations": args.iterations, "out": str(out)}  # fmt: skip
    (work / "plain-config.json").write_text(json.dumps(config))
    program = [sys.executable, str(PLAIN), str(work / "plain-config.json")]
    if args.bandwidth:
        rate = network.bits_per_s(args.bandwidth)
        status, code = shaped.run_program("gloo", args.world_size, rate, program, work, 1800)
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(args.world_size), *program[1:]]  # fmt: skip
        code = subprocess.run(argv, env=local.worker_env(), capture_output=True).returncode
        status = "ok" if code == 0 else "failed"
    if status != "ok":
        raise SystemExit(f"plain {args.scheme} loop {status} (exit {code}); logs in {work}")
    return statistics.median(json.loads(out.read_text()))


def qbench_run(args: argparse.Namespace, work: Path, repeat: int) -> float:
    """Median iteration (s) of a one-run qbench sweep with the scheme, compressor none."""
    from qbench.report import stats

    net = f"{{bandwidth: {args.bandwidth}}}" if args.bandwidth else "unshaped"
    scenario = work / "ddp.yaml"
    scenario.write_text(
        f"name: {args.scheme}-baseline\nmodel: {args.model}\nworld_size: {args.world_size}\n"
        f"backend: gloo\nscheme: {args.scheme}\ncompressor: none\nnetwork: [{net}]\n"
        f"batch_size: {args.batch_size}\nwarmup: {args.warmup}\niterations: {args.iterations}\n"
    )
    out = work / f"qbench-{repeat}"
    cmd = [sys.executable, "-m", "qbench.cli", "sweep", str(scenario), "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    summary = stats.summarize(stats.load(out))
    return float(summary["t_iteration_median"].iloc[0])


def bootstrap_median(ratios: list[float], draws: int = 2000) -> tuple[float, float]:
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scheme", default="ddp", choices=("ddp", "fsdp"))
    p.add_argument("--model", default="vgg16-cifar")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--bandwidth", default="", help="e.g. 1gbit (root); empty: unshaped")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="qbench-ddp-baseline-"))
    rows = []
    for r in range(args.repeats):
        plain = plain_loop(args, work)
        ours = qbench_run(args, work, r)
        rows.append({"repeat": r, "plain_s": plain, "qbench_s": ours, "ratio": ours / plain})
        print(f"repeat {r}: plain {plain * 1e3:.1f} ms, qbench {args.scheme} {ours * 1e3:.1f} ms, "
              f"ratio {ours / plain:.3f}", flush=True)  # fmt: skip
    ratios = [row["ratio"] for row in rows]
    low, high = bootstrap_median(ratios)
    doc = {"settings": vars(args) | {"json": str(args.json)}, "rows": rows,
           "median_ratio": statistics.median(ratios), "interval_95": [low, high],
           "target": "median ratio within 1 +- 0.05"}  # fmt: skip
    print(f"qbench {args.scheme} / plain {args.scheme}: median {doc['median_ratio']:.3f} "
          f"(95 % interval {low:.3f}-{high:.3f}) over {len(rows)} interleaved repeats")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return doc


if __name__ == "__main__":
    main()
