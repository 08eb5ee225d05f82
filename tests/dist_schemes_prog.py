"""Run several aggregation cases on K ranks (under torchrun or mpirun) in one launch.

usage: python tests/dist_schemes_prog.py BACKEND CASES_JSON OUT_DIR
CASES_JSON is a list of {"id", "scheme", "comp", "params", "numel", "steps", "grad"}; each case
builds its own compressor and aggregator, runs ``steps`` steps and records every result, the
bytes it sent and its ``payload_bytes``. Rank r saves ``{id: record}`` to OUT_DIR/rank-r.pt.
The gradients come from ``make_gradient``, which the tests' single-process references share.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from qbench import aggregate, comm
from qbench.compress import from_spec
from qbench.timing import PhaseTimer


def make_gradient(kind: str, rank: int, step: int, numel: int, bucket_size: int) -> torch.Tensor:
    """``randn``: new per (rank, step); ``fixed``: per rank, the same every step; ``extreme``:
    every value is +-(its bucket's max), the same on every rank (the integer sum's worst case)."""
    if kind == "extreme":
        idx = torch.arange(numel)
        magnitude = 0.37 * (1.0 + (idx // bucket_size).to(torch.float32))
        return torch.where(idx % 3 == 0, -magnitude, magnitude)
    seed = 1000 * (0 if kind == "fixed" else step) + rank
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))


def run_case(cm: comm.Comm, case: dict[str, Any]) -> dict[str, Any]:
    compressor = from_spec(case["comp"])
    agg = aggregate.build(
        case["scheme"], cm, compressor, case["numel"], params=case.get("params", {})
    )
    bucket = int(case["comp"].get("bucket_size", 1))
    timer = PhaseTimer(torch.device("cpu"))
    cm.bytes_sent = 0
    results = []
    for step in range(case["steps"]):
        grad = make_gradient(case["grad"], cm.rank, step, case["numel"], bucket)
        timer.start()
        results.append(agg.aggregate(grad, step, timer).clone())
    return {
        "results": torch.stack(results),
        "bytes_sent": cm.bytes_sent,
        "payload_bytes": agg.payload_bytes,
        "dtype": str(getattr(agg, "dtype", "")),
        "phases": dict(timer.totals),
    }


def main() -> None:
    backend, cases_json, out = sys.argv[1:4]
    torch.set_num_threads(1)
    cm = comm.connect(backend, timeout_s=60)
    records = {case["id"]: run_case(cm, case) for case in json.loads(cases_json)}
    torch.save(records, Path(out) / f"rank-{cm.rank}.pt")
    cm.barrier()
    cm.close()


if __name__ == "__main__":
    main()
