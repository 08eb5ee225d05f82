"""What the non-finite gradient check costs (``nonfinite:``, qbench.run.nonfinite): the same runs
with the check and without it, interleaved, on 2 gloo ranks.

    .venv/bin/python benchmarks/nonfinite.py --json nonfinite.json

Per model (mlp, resnet20) and loop (flat allreduce, where the check sits between backward and
the scheme and is left out of the timed phases; DDP, where it runs per bucket inside the hook,
during backward), the ranks build the run as the worker does, warm it up, then alternate blocks
of iterations with the check and without it (``--repeats`` pairs of ``--block`` iterations, the
order of each pair alternating), so that a slow spell of a shared machine hits both. "Without"
replaces the check by nothing (flat: the guard's ``check`` returns True at once; DDP: the hook's
``all_finite`` answers True without looking). Rank 0 reports, per configuration:

* ``wall``: the ratio of median wall seconds per iteration, with / without (what the check
  costs in all);
* ``recorded``: the ratio of median recorded ``t_iteration`` (what it does to the breakdown:
  flat loops leave it out, so 1 within noise is the expected answer);
* ``check_us``: the median microseconds of one check of the model's flat gradient, alone, and
  ``mask_us`` of ``torch.isfinite(g).all()`` on it, the obvious alternative.

Then, in this process (one thread), each codec's own check (``require_finite``, for callers of
``encode``): the median encode time of 2^20 values with it and with it replaced by nothing,
interleaved (``--codec-repeats`` of each), as ``codecs``. QSGD and 1bitSGD have no check of
their own because of what this measured: for them "with" adds the check they would make (on
their bucket scales or means) after the encode.

Each ratio comes with a 95 % percentile bootstrap interval over the iterations (2000 draws,
fixed seed). The load average before and after is recorded: a busy machine says so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [("mlp", "allreduce"), ("resnet20", "allreduce"), ("mlp", "ddp"), ("resnet20", "ddp")]
RESAMPLES, SEED = 2000, 20261122


def interval(num: list[float], base: list[float]) -> dict[str, float]:
    """median(num) / median(base) and its 95 % percentile bootstrap interval."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    a, b = np.asarray(num), np.asarray(base)
    draws = [
        np.median(rng.choice(a, a.size)) / np.median(rng.choice(b, b.size))
        for _ in range(RESAMPLES)
    ]
    low, high = np.percentile(draws, [2.5, 97.5])
    return {"ratio": float(np.median(a) / np.median(b)), "low": float(low), "high": float(high)}


def _run(model: str, scheme: str, args: argparse.Namespace, cm: Any) -> dict[str, Any]:
    """One configuration on this rank: blocks with and without the check, interleaved."""
    import torch

    from qbench.compress.base import all_finite
    from qbench.ddp import finite
    from qbench.run import lifecycle
    from qbench.spec import scenario
    from qbench.spec.matrix import expand
    from qbench.timing import PhaseTimer

    text = (f"name: b\nmodel: {model}\nworld_size: 2\nscheme: {scheme}\nwarmup: 0\n"
            f"iterations: 1\nbatch_size: {args.batch}\n")  # fmt: skip
    spec = expand(scenario.loads(text)).runs[0]
    run = lifecycle.training_loop(spec, cm)
    timer, check = PhaseTimer(run.device), run.guard.check
    samples: dict[str, dict[str, list[float]]] = {m: {"wall": [], "recorded": []} for m in "+-"}
    it = 0
    for rep in range(-1, args.repeats):  # -1: the warm-up block, not kept
        for mode in "+-" if rep % 2 == 0 else "-+":
            on = mode == "+"
            run.guard.check = check if on else (lambda *a: True)  # type: ignore[method-assign]
            finite.all_finite = all_finite if on else (lambda t: True)  # type: ignore[assignment]
            for _ in range(args.block):
                start = time.perf_counter()
                run.iteration(it, timer)
                wall = time.perf_counter() - start
                if rep >= 0:
                    samples[mode]["wall"].append(wall)
                    samples[mode]["recorded"].append(run.rows[-1]["t_iteration"])
                it += 1
    finite.all_finite = all_finite
    flat = torch.cat([p.grad.reshape(-1) for p in run.named.values() if p.grad is not None])
    alone = _median_s(lambda: all_finite(flat), 200)
    mask = _median_s(lambda: bool(torch.isfinite(flat).all()), 200)
    run.close()
    return {
        "model": model, "scheme": scheme, "values": flat.numel(),
        "iterations_each": len(samples["+"]["wall"]),
        "wall": interval(samples["+"]["wall"], samples["-"]["wall"]),
        "recorded": interval(samples["+"]["recorded"], samples["-"]["recorded"]),
        "wall_ms_without": 1e3 * statistics.median(samples["-"]["wall"]),
        "check_us": 1e6 * alone, "mask_us": 1e6 * mask,
    }  # fmt: skip


def _median_s(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


PROBES = {"qsgd": "scales", "onebit": "means"}
"""Codecs without a check of their own: the payload buffer their check would read."""
CODECS = [("qsgd", {"bits": 4, "bucket_size": 512}), ("onebit", {}), ("topk", {}),
          ("fixedpoint", {"bits": 8}), ("adaptive", {})]  # fmt: skip


def codecs(repeats: int, only: list[str] | None = None) -> list[dict[str, Any]]:
    """Each codec's encode of 2^20 values with its check and without, interleaved."""
    import torch

    from qbench.compress import base, build

    torch.set_num_threads(1)
    x = torch.randn(2**20, generator=torch.Generator().manual_seed(0))
    check, out = base.require_finite, []
    for name, params in CODECS:
        if only and name not in only:
            continue
        c = build(name, **params)
        module = sys.modules[type(c).__module__]  # it imported require_finite by name
        own = hasattr(module, "require_finite")
        times: dict[str, list[float]] = {"+": [], "-": []}
        for rep in range(repeats):
            for mode in "+-" if rep % 2 == 0 else "-+":
                if own:
                    module.require_finite = check if mode == "+" else (lambda *a, **k: None)
                start = time.perf_counter()
                payload = c.encode(x, name="g")
                if mode == "+" and not own:
                    check(name, x, probe=payload.buffers[PROBES[name]])
                times[mode].append(time.perf_counter() - start)
        if own:
            module.require_finite = check
        out.append({"codec": name, "encode_ms_without": 1e3 * statistics.median(times["-"]),
                    "ratio": interval(times["+"], times["-"])})  # fmt: skip
    return out


def rank_main(args: argparse.Namespace) -> None:
    from qbench import comm

    cm = comm.connect("gloo")
    import torch

    torch.set_num_threads(1)  # one thread per CPU rank, as the worker
    out = [_run(m, s, args, cm) for m, s in CONFIGS]
    if cm.rank == 0:
        Path(args.rank_out).write_text(json.dumps(out, indent=2))
    cm.close()


def _ci(r: dict[str, float]) -> str:
    return f"{r['ratio']:.4f} ({r['low']:.4f}-{r['high']:.4f})"


def show(doc: dict[str, Any]) -> None:
    for c in doc["configs"]:
        print(f"{c['model']:9s} {c['scheme']:9s} {c['values']:>8d} values  check "
              f"{c['check_us']:7.1f} us (mask {c['mask_us']:7.1f} us)  iteration "
              f"{c['wall_ms_without']:8.2f} ms  wall {_ci(c['wall'])}  recorded "
              f"{_ci(c['recorded'])}")  # fmt: skip
    for c in doc["codecs"]:
        print(f"codec {c['codec']:10s} encode {c['encode_ms_without']:8.3f} ms  with check "
              f"{_ci(c['ratio'])}")  # fmt: skip
    print(f"load average before {doc['load_before']}, after {doc['load_after']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=6, help="pairs of blocks (with, without)")
    p.add_argument("--block", type=int, default=10, help="iterations per block")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--codec-repeats", type=int, default=20, help="encodes each way per codec")
    p.add_argument("--parts", nargs="+", choices=("runs", "codecs"), default=["runs", "codecs"])
    p.add_argument("--codecs", nargs="+", default=None, help="only these codecs")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--rank-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_out:
        rank_main(args)
        return
    from qbench.launch import local

    load_before = [round(x, 2) for x in os.getloadavg()]
    out = ROOT / "build" / "nonfinite-rank0.json"
    out.parent.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", __file__, "--rank-out", str(out), "--repeats", str(args.repeats),
           "--block", str(args.block), "--batch", str(args.batch)]  # fmt: skip
    if "runs" in args.parts:
        subprocess.run(cmd, env=local.worker_env(), check=True, cwd=ROOT)
    configs = json.loads(out.read_text()) if "runs" in args.parts else []
    found = codecs(args.codec_repeats, args.codecs) if "codecs" in args.parts else []
    doc = {"command": " ".join(sys.argv), "load_before": load_before, "cores": os.cpu_count(),
           "configs": configs, "codecs": found}  # fmt: skip
    doc["load_after"] = [round(x, 2) for x in os.getloadavg()]
    show(doc)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
