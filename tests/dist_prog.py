"""Run aggregations on K ranks (under torchrun or mpirun) and save each rank's results.

usage: python tests/dist_prog.py BACKEND CASES_JSON NUMEL STEPS OUT_DIR
CASES_JSON maps a case name to {"scheme": ..., "compressor": {...}, "params": {...}}; the cases
run one after another on one process group (one launch for many cases: a launch costs seconds),
each with its own compressor and aggregator, and rank r writes ``OUT_DIR/<case>/rank-<r>.pt``
(its results per step and the bytes it sent in that case).
Rank r's gradient at step t is randn(NUMEL) seeded by (r, t), see ``gradient`` (the test's
single-process reference uses the same function).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from qbench import aggregate, comm
from qbench.compress import from_spec
from qbench.timing import PhaseTimer


def gradient(rank: int, step: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * step + rank))


def main() -> None:
    backend, cases_json, numel, steps, out = sys.argv[1:6]
    torch.set_num_threads(1)
    cm = comm.connect(backend, timeout_s=60)
    for name, case in json.loads(cases_json).items():
        compressor = from_spec(case["compressor"])
        agg = aggregate.build(case["scheme"], cm, compressor, int(numel), params=case["params"])
        timer = PhaseTimer(torch.device("cpu"))
        sent_before, results = cm.bytes_sent, []
        for step in range(int(steps)):
            timer.start()
            results.append(agg.aggregate(gradient(cm.rank, step, int(numel)), step, timer).clone())
        (Path(out) / name).mkdir(parents=True, exist_ok=True)
        saved = {"results": results, "bytes_sent": cm.bytes_sent - sent_before}
        torch.save(saved, Path(out) / name / f"rank-{cm.rank}.pt")
        cm.barrier()
    cm.close()


if __name__ == "__main__":
    main()
