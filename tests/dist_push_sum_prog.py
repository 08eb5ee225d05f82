"""Run the push-sum cases of ``CASES`` on K ranks (torchrun or mpirun); save each rank's result.

usage: python tests/dist_push_sum_prog.py BACKEND OUT_DIR

Each case mimics the worker on a flat parameter vector split into two slices (two scheme
instances, as layer groups are): per step an optional gradient step on the local quadratic
||z - a_i||^2, then ``after_step`` on each slice (which writes the de-biased z_i back), then the
worker's own metrics combination. Rank r starts from ``initial(r)`` and targets ``target(r)``
(the test's single-process reference uses the same functions). ``skewed`` cases replace the
graph by a directed ring whose ranks keep different shares, so the push-sum weights leave 1.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from qbench import aggregate, comm
from qbench.aggregate.directed import Mixing
from qbench.aggregate.push_sum import PushSum
from qbench.compress import from_spec
from qbench.run.loops.flat import Run
from qbench.timing import PhaseTimer

NUMEL = 1_003
SLICES = (slice(0, 600), slice(600, NUMEL))  # two scheme instances, like two layer groups
QSGD8 = {"name": "qsgd", "bits": 8, "bucket_size": 128}
QSGD4 = {"name": "qsgd", "bits": 4, "bucket_size": 128}
NONE = {"name": "none"}

CASES: dict[str, dict[str, Any]] = {
    # exact push-sum: one step is x = P(0) x; one exponential period (2 steps on 4 ranks) averages
    "sgp-exponential-once": {"topology": "exponential", "comp": NONE, "steps": 1},
    "sgp-exponential-period": {"topology": "exponential", "comp": NONE, "steps": 2},
    # local quadratics: the average follows the mean gradient, then mixing reaches consensus
    "sgp-ring-quadratic": {"topology": "directed-ring", "comp": NONE, "steps": 120,
                           "grad_steps": 60, "lr": 0.1},
    "choco-qsgd8-exponential-quadratic": {"topology": "exponential", "comp": QSGD8,
                                          "steps": 100, "grad_steps": 50, "lr": 0.1},
    "choco-qsgd8-ring-quadratic": {"topology": "directed-ring", "gamma": 0.8, "comp": QSGD8,
                                   "steps": 120, "grad_steps": 60, "lr": 0.1},
    # a column- but not row-stochastic graph: weights move, the de-biased z reach mean(x0)
    "choco-qsgd8-skewed-mix": {"topology": "directed-ring", "comp": QSGD8, "steps": 120,
                               "skewed": True},
    # data-dependent payload sizes: 8 bytes of size to the out-peer first
    "choco-adaptive-exponential-mix": {"topology": "exponential", "comp": {"name": "adaptive"},
                                       "gamma": 0.5, "steps": 20},
    # a few steps with stochastic rounding, against the test's reference with each rank's draws
    "choco-qsgd4-skewed-draws": {"topology": "directed-ring", "comp": QSGD4, "gamma": 0.6,
                                 "steps": 6, "grad_steps": 6, "lr": 0.05, "skewed": True},
    "sgp-fixed6-skewed-draws": {"topology": "directed-ring", "algorithm": "sgp", "steps": 6,
                                "comp": {"name": "fixedpoint", "bits": 6}, "grad_steps": 6,
                                "lr": 0.05, "skewed": True},
}  # fmt: skip


def initial(rank: int) -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(7 + rank))


def target(rank: int) -> torch.Tensor:
    return 3.0 * torch.randn(NUMEL, generator=torch.Generator().manual_seed(100 + rank))


def skewed(rank: int, k: int) -> tuple[Mixing, ...]:
    """Directed ring, rank i keeps 0.2 + 0.6 i / (K - 1) and pushes the rest to i + 1."""
    keep = [0.2 + 0.6 * i / (k - 1) for i in range(k)]
    prev = (rank - 1) % k
    return (Mixing(keep[rank], {(rank + 1) % k: 1 - keep[rank]}, {prev: 1 - keep[prev]}),)


def build(cm: comm.Comm, case: dict[str, Any]) -> list[tuple[slice, PushSum]]:
    params = {k: case[k] for k in ("topology", "gamma", "algorithm") if k in case}
    aggs = []
    for part in SLICES:
        c = from_spec(case["comp"])
        agg = aggregate.build("push-sum", cm, c, part.stop - part.start, part.start, params)
        assert isinstance(agg, PushSum)
        if case.get("skewed"):
            agg.schedule = skewed(cm.rank, cm.world_size)
        aggs.append((part, agg))
    return aggs


def run_case(cm: comm.Comm, case: dict[str, Any]) -> dict[str, Any]:
    aggs = build(cm, case)
    worker = SimpleNamespace(aggs=aggs, comm=cm, device=torch.device("cpu"))
    x, a = initial(cm.rank), target(cm.rank)
    timer = PhaseTimer(torch.device("cpu"))
    out: dict[str, Any] = {"distance": [], "bytes": [], "payload": [], "weight": []}
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
        assert aggs[0][1].weight == aggs[1][1].weight  # slices mix with the same weights
        out["weight"].append(aggs[0][1].weight)
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
