"""Run one aggregation on K ranks (under torchrun or mpirun) and save each rank's result.

usage: python tests/dist_prog.py BACKEND SCHEME COMPRESSOR_JSON NUMEL STEPS OUT_DIR [PARAMS_JSON]
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
    backend, scheme, comp_json, numel, steps, out = sys.argv[1:7]
    torch.set_num_threads(1)
    cm = comm.connect(backend, timeout_s=60)
    compressor = from_spec(json.loads(comp_json))
    params = json.loads(sys.argv[7]) if len(sys.argv) > 7 else {}
    agg = aggregate.build(scheme, cm, compressor, int(numel), params=params)
    timer = PhaseTimer(torch.device("cpu"))
    results = []
    for step in range(int(steps)):
        timer.start()
        results.append(agg.aggregate(gradient(cm.rank, step, int(numel)), step, timer).clone())
    torch.save({"results": results, "bytes_sent": cm.bytes_sent}, Path(out) / f"rank-{cm.rank}.pt")
    cm.barrier()
    cm.close()


if __name__ == "__main__":
    main()
