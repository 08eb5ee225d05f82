"""Per-rank entry of ``qbench bench comm``: ``python -m qbench.bench.comm.worker CONFIG.json``.

Under torchrun / mpirun (or one network namespace per rank). For every size, a deterministic
per-rank gradient and its exact mean (float64 allreduce, untimed); then for every (scheme,
compressor) of the config: warm-up + timed ``aggregate()`` calls, each on a fresh copy of the
gradient, the clock read around the call only (the loop holds no checks). ``sync: barrier``
puts a barrier before every call (every call starts with the ranks aligned); ``sync: stream``
one before the warm-up and one before the timed calls only, which then follow each other as in
a training loop, each rank starting when its previous call returned. ``gap_s`` keeps every
rank's CPU busy that long before each call, as a CPU rank's compute would (the link idles, an
emulated link's token bucket refills, ranks sharing cores compete for them); then
one more, untimed call whose result is compared with the exact mean. Rank 0 appends one JSON
line per combination to ``rows_path`` with every rank's raw samples (gathered by an allreduce of
a zero matrix holding each rank's own row); ``qbench.bench.comm`` summarises them.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from qbench import aggregate, comm
from qbench.bench.comm import scheme_label
from qbench.compress import from_spec
from qbench.timing import PhaseTimer

PHASES = ("encode", "comm", "decode")
_TIME, _BYTES = 0, 4  # columns of a call's record: time, encode, comm, decode, bytes_sent


def _gradient(numel: int, rank: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1_000_003 * rank + numel)
    return torch.randn(numel, generator=gen).to(device)


def _exact_mean(cm: comm.Comm, grad: torch.Tensor) -> torch.Tensor:
    total = grad.double()
    cm.allreduce_(total)
    return total.div_(cm.world_size)


def _gather(cm: comm.Comm, mine: torch.Tensor) -> torch.Tensor:
    """Every rank's ``mine`` stacked (K, ...), by a sum-allreduce of zeros holding own rows."""
    out = torch.zeros((cm.world_size, *mine.shape), dtype=torch.float64, device=mine.device)
    out[cm.rank] = mine
    cm.allreduce_(out)
    return out


def _spin(seconds: float) -> None:
    """Busy for ``seconds``: a stand-in for a training step's compute on a CPU rank."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def barrier_schedule(sync: str, warm: int) -> Callable[[int], bool]:
    """Which calls a barrier precedes: all (``barrier``), or the first warm-up call and the
    first timed one (``stream``)."""
    if sync == "stream":
        return lambda i: i in (0, warm)
    return lambda i: True


def _calls(
    cm: comm.Comm, agg: aggregate.Aggregator, grad: torch.Tensor, calls: int,
    sync: Callable[[], None], barrier_at: Callable[[int], bool], gap_s: float = 0.0,
) -> torch.Tensor:  # fmt: skip
    """Time ``calls`` aggregate() calls; (calls, 5): seconds, encode, comm, decode, bytes.
    A barrier precedes call i where ``barrier_at(i)``; each call waits ``gap_s`` first."""
    work = torch.empty_like(grad)
    timer = PhaseTimer(grad.device)
    rec: list[list[float]] = []
    for i in range(calls):
        work.copy_(grad)
        cm.bytes_sent = 0
        if gap_s > 0:
            _spin(gap_s)
        if barrier_at(i):
            cm.barrier()
        sync()
        t0 = time.perf_counter()
        timer.start()
        agg.aggregate(work, i, timer)
        sync()
        t1 = time.perf_counter()
        rec.append([t1 - t0, *(timer.totals[p] for p in PHASES), float(cm.bytes_sent)])
    return torch.tensor(rec, dtype=torch.float64, device=grad.device)


def _rel_error(
    cm: comm.Comm, agg: aggregate.Aggregator, grad: torch.Tensor, mean: torch.Tensor, step: int
) -> float:
    """||result - exact mean|| / ||exact mean||, max over ranks: the untimed correctness pass."""
    timer = PhaseTimer(grad.device)
    timer.start()
    result = agg.aggregate(grad.clone(), step, timer)
    err = torch.linalg.vector_norm(result.double() - mean) / torch.linalg.vector_norm(mean)
    worst = err.reshape(1).to(torch.float64)
    cm.allreduce_(worst, op="max")
    return float(worst)


def _measure(
    cm: comm.Comm, combo: dict[str, Any], grad: torch.Tensor, mean: torch.Tensor,
    config: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    scheme, spec = combo["scheme"], combo["compressor"]
    head = {
        "backend": config["backend"], "world_size": cm.world_size, "bytes": 4 * grad.numel(),
        "scheme": scheme_label(scheme), "compressor": from_spec(spec).label,
        "scheme_spec": scheme, "compressor_spec": spec,
    }  # fmt: skip
    try:  # the same on every rank: a scheme refusing this size / world size is skipped by all
        params = {k: v for k, v in scheme.items() if k != "name"}
        agg = aggregate.build(scheme["name"], cm, from_spec(spec), grad.numel(), params=params)
    except ValueError as e:  # UserError included
        return {**head, "skipped": str(e)}
    warm, calls = config["warmup"], config["warmup"] + config["repeats"]
    sync = torch.cuda.synchronize if grad.device.type == "cuda" else (lambda: None)
    barrier_at = barrier_schedule(config.get("sync", "barrier"), warm)
    gap = float(config.get("gap_s", 0.0))
    rec = _gather(cm, _calls(cm, agg, grad, calls, sync, barrier_at, gap)).cpu()  # (K, calls, 5)
    rel = _rel_error(cm, agg, grad, mean, calls)
    return {
        **head, "warmup": warm, "payload_bytes": int(agg.payload_bytes),
        "overlapped": bool(agg.overlapped), "rel_error": rel,
        "rank_samples": rec[:, :, _TIME].tolist(),
        "rank_phases": {p: rec[:, :, 1 + i].tolist() for i, p in enumerate(PHASES)},
        "rank_bytes": rec[:, :, _BYTES].tolist(),
    }  # fmt: skip


def run(cm: comm.Comm, config: dict[str, Any], device: torch.device) -> None:
    out = Path(config["rows_path"]) if cm.rank == 0 else None
    for nbytes in config["sizes"]:
        grad = _gradient(nbytes // 4, cm.rank, device)
        mean = _exact_mean(cm, grad)
        for combo in config["combos"]:
            row = _measure(cm, combo, grad, mean, config)
            if out is not None:
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    config = json.loads(Path(args[0]).read_text())
    device = torch.device("cuda" if config["backend"] == "nccl" else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # one thread per CPU rank, as in runs
    cm = comm.connect(config["backend"], timeout_s=config["timeout_s"])
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    try:
        run(cm, config, device)
        cm.barrier()
        return 0
    except Exception:
        traceback.print_exc()
        print(f"qbench bench comm worker rank {cm.rank} failed", file=sys.stderr, flush=True)
        return 1
    finally:
        cm.close()


if __name__ == "__main__":
    sys.exit(main())
