"""Run aggregations on K ranks (under torchrun or mpirun) and save each rank's results.

usage: python tests/dist_prog.py BACKEND CASES_JSON NUMEL STEPS OUT_DIR
CASES_JSON maps a case name to {"scheme": ..., "compressor": {...}, "params": {...}} and,
optionally, "ints": true (small integer gradients, ``int_gradient``: fp32 sums of them are exact)
"local_world_size": G (ranks per node, as torchrun's LOCAL_WORLD_SIZE) and "steps" (instead
of STEPS); the cases
run one after another on one process group (one launch for many cases: a launch costs seconds),
each with its own compressor and aggregator, and rank r writes ``OUT_DIR/<case>/rank-<r>.pt``
(its results per step, the bytes it sent in that case and the scheme's metrics per step).
Rank r's gradient at step t is randn(NUMEL) seeded by (r, t), see ``gradient`` (the test's
single-process reference uses the same function).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from qbench import aggregate, comm
from qbench.compress import from_spec
from qbench.timing import PhaseTimer


def gradient(rank: int, step: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * step + rank))


def int_gradient(rank: int, step: int, numel: int) -> torch.Tensor:
    """Integers in [-8, 8] seeded by (r, t): their sums and means over 1, 2 or 4 ranks are exact
    in fp32, so a scheme without compression must reproduce the mean bit for bit."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(-8, 9, (numel,), generator=g).float()


def main() -> None:
    backend, cases_json, numel, steps, out = sys.argv[1:6]
    torch.set_num_threads(1)
    cm = comm.connect(backend, timeout_s=60)
    for name, case in json.loads(cases_json).items():
        os.environ["LOCAL_WORLD_SIZE"] = str(case.get("local_world_size", cm.world_size))
        make = int_gradient if case.get("ints") else gradient
        compressor = from_spec(case["compressor"])
        agg = aggregate.build(case["scheme"], cm, compressor, int(numel), params=case["params"])
        timer = PhaseTimer(torch.device("cpu"))
        sent_before, results, metrics = cm.bytes_sent, [], []
        for step in range(int(case.get("steps", steps))):
            timer.start()
            results.append(agg.aggregate(make(cm.rank, step, int(numel)), step, timer).clone())
            metrics.append(agg.metrics())
        (Path(out) / name).mkdir(parents=True, exist_ok=True)
        saved = {"results": results, "bytes_sent": cm.bytes_sent - sent_before, "metrics": metrics,
                 "payload_bytes": agg.payload_bytes}  # fmt: skip
        torch.save(saved, Path(out) / name / f"rank-{cm.rank}.pt")
        cm.barrier()
    cm.close()


if __name__ == "__main__":
    main()
