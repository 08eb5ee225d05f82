"""Run the gossip cases of ``CASES`` on K ranks (under torchrun or mpirun); save each rank's result.

usage: python tests/dist_gossip_prog.py BACKEND OUT_DIR

Each case mimics the worker on a flat parameter vector split into two slices (two scheme
instances, as layer groups are): per step an optional gradient step on the local quadratic
||x - a_i||^2, then ``after_step`` on each slice, then the worker's own metrics combination.
Rank r starts from ``initial(r)`` and targets ``target(r)`` (the test's single-process reference
uses the same functions).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from qbench import aggregate, comm
from qbench.compress import from_spec
from qbench.run.loops.flat import Run
from qbench.timing import PhaseTimer

NUMEL = 1_003
SLICES = (slice(0, 600), slice(600, NUMEL))  # two scheme instances, like two layer groups
QSGD4 = {"name": "qsgd", "bits": 4, "bucket_size": 128}
QSGD8 = {"name": "qsgd", "bits": 8, "bucket_size": 128}

CASES: dict[str, dict[str, Any]] = {
    # one mixing step of exact D-PSGD: x = W x
    "dpsgd-ring-once": {"algorithm": "dpsgd", "topology": "ring", "comp": {"name": "none"},
                        "steps": 1},
    "dpsgd-torus-once": {"algorithm": "dpsgd", "topology": "torus", "comp": {"name": "none"},
                         "steps": 1},
    # pure mixing (no gradient): consensus on the initial average
    "dpsgd-mix": {"algorithm": "dpsgd", "topology": "ring", "comp": {"name": "none"},
                  "steps": 40},
    "choco-qsgd4-mix": {"algorithm": "choco", "topology": "ring", "comp": QSGD4, "steps": 60},
    "deepsqueeze-adaptive-mix": {"algorithm": "deepsqueeze", "topology": "ring", "gamma": 0.5,
                                 "comp": {"name": "adaptive"}, "steps": 60},
    # local quadratics: the average follows the mean gradient, then mixing reaches consensus
    "choco-qsgd4-quadratic": {"algorithm": "choco", "topology": "torus", "gamma": 0.8,
                              "comp": QSGD4, "steps": 90, "grad_steps": 50, "lr": 0.1},
    "deepsqueeze-qsgd8-quadratic": {"algorithm": "deepsqueeze", "topology": "ring", "gamma": 0.5,
                                    "comp": QSGD8, "steps": 90, "grad_steps": 50, "lr": 0.1},
    # a few steps with stochastic rounding, against the test's reference with each rank's draws
    "choco-qsgd4-draws": {"algorithm": "choco", "topology": "ring", "gamma": 0.8, "comp": QSGD4,
                          "steps": 4, "reference": True},
    "deepsqueeze-fixed6-draws": {"algorithm": "deepsqueeze", "topology": "torus", "gamma": 0.5,
                                 "comp": {"name": "fixedpoint", "bits": 6}, "steps": 4,
                                 "reference": True},
}  # fmt: skip


def initial(rank: int) -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(7 + rank))


def target(rank: int) -> torch.Tensor:
    return 3.0 * torch.randn(NUMEL, generator=torch.Generator().manual_seed(100 + rank))


def run_case(cm: comm.Comm, case: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {k: case[k] for k in ("algorithm", "topology", "gamma") if k in case}
    aggs = [
        (part, aggregate.build("gossip", cm, from_spec(case["comp"]),
                               part.stop - part.start, offset=part.start, params=params))
        for part in SLICES
    ]  # fmt: skip
    worker = SimpleNamespace(aggs=aggs, comm=cm, device=torch.device("cpu"))
    x, a = initial(cm.rank), target(cm.rank)
    timer = PhaseTimer(torch.device("cpu"))
    out: dict[str, Any] = {"distance": [], "bytes": [], "payload": []}
    for step in range(case["steps"]):
        timer.start()
        grad = 2 * (x - a) if step < case.get("grad_steps", 0) else torch.zeros(NUMEL)
        for part, agg in aggs:
            assert agg.aggregate(grad[part], step, timer) is not None
        x -= case.get("lr", 0.0) * grad
        before = cm.bytes_sent
        for part, agg in aggs:
            agg.after_step(x[part], step, timer)
        out["bytes"].append(cm.bytes_sent - before)
        out["payload"].append(sum(agg.payload_bytes for _, agg in aggs))
        out["distance"].append(Run._scheme_metrics(worker)["consensus_distance"])  # type: ignore[arg-type]
        assert cm.bytes_sent - before == out["bytes"][-1], "metrics must not count bytes"
    out["x"] = x.clone()
    return out


def main() -> None:
    backend, out = sys.argv[1:3]
    torch.set_num_threads(1)
    cm = comm.connect(backend, timeout_s=60)
    results = {name: run_case(cm, case) for name, case in CASES.items()}
    torch.save(results, Path(out) / f"rank-{cm.rank}.pt")
    cm.barrier()
    cm.close()


if __name__ == "__main__":
    main()
