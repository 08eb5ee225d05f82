"""Replayed compute (``compute: replay``): a rank sleeps through the model's work instead of
doing it, and does everything else for real.

On one machine every rank computes on the same cores, so past the core count a scalability
sweep measures CPU contention, not communication. Network emulation met that wall long ago and
answered it by standing in for the work that is not under study (Gupta et al., "To Infinity and
Beyond: Time-Warped Network Emulation", NSDI 2006; DieCast, NSDI 2008). Here:

* **stood in**: the forward pass, backward's computation and the optimizer step. Each is a
  sleep of the time the **timeline** says: one rank alone, the same model, batch and device,
  measured before the sweep's first replayed run of that workload (:func:`measure`; every rank
  of every replayed run of the sweep then replays the same timeline, so methods compare at equal
  compute). A sleeping rank uses no CPU: 16 ranks fit on 2 cores.
* **real**: this rank's gradient (of its own first batch, computed once before the run, then
  handed over every iteration), the scheme or DDP hook, every collective and codec and their
  bytes, and the instants at which DDP's buckets are handed over during backward (each bucket
  when its last gradient was ready in the timeline, in DDP's bucket order) with the overlap
  that follows. The bytes are a real run's because a payload's size follows from the
  tensors' sizes alone; a codec whose size follows the values (the catalog's
  ``sized_by_data``: adaptive's Huffman stream) would send the first batch's size every
  iteration, so the planner refuses it under replay (``qbench.spec.rules``).

What it cannot stand for: a model that learns (the parameters never change, so accuracy mode
refuses replay), and the CPU the real codecs and collectives still use (at 16 ranks on 2 cores
they share the cores: the timeline stands in for compute only). The timeline of a run is
``timeline.json`` in its run directory, what its compute times rest on.
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from qbench.errors import UserError
from qbench.records.store import atomic_write_json, timeline_beside
from qbench.spec.parts import Replay
from qbench.spec.runspec import RunSpec

MEASURE_WARMUP = 3
MEASURE_ITERATIONS = 20
POLL_S = 0.05
TIMELINES = ".timelines"  # in a results directory: one per workload, shared by its runs


@dataclass(frozen=True)
class ParamTime:
    name: str
    numel: int
    ready_s: float
    """When backward had accumulated its gradient, seconds after backward began."""


@dataclass(frozen=True)
class Timeline:
    """The compute a replayed run stands in for (medians over measured iterations)."""

    forward_s: float
    backward_s: float
    step_s: float
    params: tuple[ParamTime, ...]
    """In the order backward made their gradients ready."""
    source: str
    device: str
    iterations: int
    samples: tuple[tuple[float, float, float], ...] = ()
    """Each measured iteration's (forward, backward, step): replayed iterations draw from
    them (:class:`Draws`), so that ranks differ from iteration to iteration as real ones do."""

    def on(self, clock: Replay) -> Timeline:
        """Every time as ``clock`` runs it (time dilation; the record keeps the real one)."""
        at = clock.stretch
        if at is None:
            return self
        params = tuple(replace(p, ready_s=at(p.ready_s)) for p in self.params)
        samples = tuple((at(f), at(b), at(s)) for f, b, s in self.samples)
        return replace(self, forward_s=at(self.forward_s), backward_s=at(self.backward_s),
                       step_s=at(self.step_s), params=params, samples=samples)  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Timeline:
        params = tuple(ParamTime(**p) for p in d["params"])
        samples = tuple(tuple(x) for x in d.get("samples", ()))
        return cls(**{**d, "params": params, "samples": samples})


class Draws:
    """A rank's replayed iterations: each one of the timeline's measured iterations, drawn
    with replacement from the rank's own stream (seed, rank), so that, as in a real run, the
    ranks' compute times differ from step to step and the faster waits for the slower in the
    exchange (the medians alone would line them up and shorten communication)."""

    def __init__(self, timeline: Timeline, seed: int, rank: int) -> None:
        self.timeline = timeline
        self._rng = random.Random(seed * 100_003 + rank)

    def next(self) -> tuple[float, float, float]:
        """(forward, backward, step) seconds of the next iteration."""
        tl = self.timeline
        if not tl.samples:
            return tl.forward_s, tl.backward_s, tl.step_s
        f, b, s = tl.samples[self._rng.randrange(len(tl.samples))]
        return f, b, s


def key(spec: RunSpec) -> str:
    """Runs whose compute is the same: workload, batch, device and data (not the scheme)."""
    w = spec.workload
    what = {"model": w.model, "params": w.model_params, "workload": w.factory,
            "dataset": w.dataset, "batch": w.batch_size, "device": spec.placement.device_kind,
            "norm": spec.compute.norm}  # fmt: skip
    text = json.dumps(what, sort_keys=True, default=str)
    return f"{w.model}-b{w.batch_size}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gradient(named: dict[str, torch.nn.Parameter], loss: Any) -> None:
    """Fill the parameters' gradients by one backward of ``loss`` (zeroed first, in place, so
    that flat gradient buffers stay the parameters' .grad)."""
    for p in named.values():
        if p.grad is not None:
            p.grad.zero_()
    loss.backward()


def measure(run: Any) -> Timeline:
    """Time ``run``'s model (a ``Training``) on this rank alone: forward, each parameter's
    gradient ready instant during backward, backward, the optimizer step."""
    named, device = run.named, run.device
    ready: dict[str, float] = {}

    def hook(name: str) -> Any:
        return lambda _p: ready.__setitem__(name, time.perf_counter())

    handles = [p.register_post_accumulate_grad_hook(hook(n)) for n, p in named.items()]
    rows: list[tuple[float, float, float, dict[str, float]]] = []
    try:
        for it in range(MEASURE_WARMUP + MEASURE_ITERATIONS):
            x, y = run.data.batch(it)
            _sync(device)
            t0 = time.perf_counter()
            loss = run.loss_fn(run.model(x), y)
            _sync(device)
            t1 = time.perf_counter()
            ready.clear()
            gradient(named, loss)
            _sync(device)
            t2 = time.perf_counter()
            run.opt.step()
            _sync(device)
            t3 = time.perf_counter()
            if it >= MEASURE_WARMUP:
                rows.append((t1 - t0, t2 - t1, t3 - t2, {n: r - t1 for n, r in ready.items()}))
    finally:
        for h in handles:
            h.remove()
    med = lambda xs: float(statistics.median(xs))  # noqa: E731
    params = [ParamTime(n, named[n].numel(), med([r[3][n] for r in rows])) for n in named
              if all(n in r[3] for r in rows)]  # fmt: skip
    params.sort(key=lambda p: p.ready_s)
    return Timeline(
        forward_s=med([r[0] for r in rows]), backward_s=med([r[1] for r in rows]),
        step_s=med([r[2] for r in rows]), params=tuple(params),
        source="measured: one rank alone before the sweep's first replayed run of this "
        "workload", device=str(device), iterations=MEASURE_ITERATIONS,
        samples=tuple((r[0], r[1], r[2]) for r in rows),
    )  # fmt: skip


# A step of SGD with momentum reads the parameter, its gradient and the momentum and writes the
# parameter and the momentum: five float32 per parameter.
STEP_BYTES_PER_PARAM = 20


def derived(spec: RunSpec, tflops: float, tbps: float, device: str) -> Timeline:
    """A timeline from FLOPs and a stated device speed instead of a measurement: forward = the
    model's forward FLOPs per sample (``workload.model_stats``) x batch / ``tflops``, backward
    twice the forward, each gradient ready in reverse registration order after a share of the
    backward proportional to its parameters (a proxy for its layer's FLOPs), the step
    ``STEP_BYTES_PER_PARAM`` bytes per parameter at ``tbps``. Labelled as derived, with every
    assumption, in its ``source``."""
    from qbench.run import workload

    stats = workload.model_stats(spec)
    if not stats["gflops_per_sample"] > 0:
        raise UserError(
            f"{spec.workload.model}: its forward FLOPs cannot be counted on the meta device, so no "
            "timeline can be derived; measure one instead (`compute: replay` without `timeline:`)"
        )
    with torch.device("meta"):
        _, net = workload.model(spec)
    named = [(n, p.numel()) for n, p in net.named_parameters() if p.requires_grad]
    forward = stats["gflops_per_sample"] * 1e9 * spec.workload.batch_size / (tflops * 1e12)
    backward, total = 2 * forward, sum(k for _, k in named)
    params, done = [], 0
    for name, numel in reversed(named):
        done += numel
        params.append(ParamTime(name, numel, backward * done / total))
    step = STEP_BYTES_PER_PARAM * total / (tbps * 1e12)
    source = (
        f"derived: {stats['gflops_per_sample']:.4g} GFLOP/sample forward x batch "
        f"{spec.workload.batch_size} / {tflops:g} TFLOP/s (stated), backward 2x forward, gradients "
        "ready "
        f"in reverse parameter order by parameter count, step {STEP_BYTES_PER_PARAM} B/param / "
        f"{tbps:g} TB/s (stated)"
    )
    return Timeline(forward_s=forward, backward_s=backward, step_s=step, params=tuple(params),
                    source=source, device=device, iterations=0)  # fmt: skip


def shared(run: Any, parts: Path) -> Timeline:
    """The run's timeline: the sweep's for this workload (``OUT/.timelines``) or, for its first
    replayed run, measured by rank 0 once every rank has its gradient (the others sleep, so it
    measures alone). Every rank waits for it; rank 0 copies it into the run directory. Returned
    stretched by the run's ``dilation``."""
    cm, spec = run.comm, run.spec
    cache = parts.parent.parent / TIMELINES / f"{key(spec)}.json"
    atomic_write_json(parts / f"replay-ready-{cm.rank}.json", {"rank": cm.rank})
    if cm.rank == 0 and spec.clock.timeline:  # supplied (scenario `timeline:`), labelled as such
        atomic_write_json(timeline_beside(parts), supplied(spec.clock.timeline, run.named))
    elif cm.rank == 0:
        if not cache.exists():
            _wait(lambda: all((parts / f"replay-ready-{r}.json").exists()
                              for r in range(cm.world_size)), spec.measurement.timeout)  # fmt: skip
            cache.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(cache, measure(run).to_dict())
        atomic_write_json(timeline_beside(parts), json.loads(cache.read_text()))
    else:
        _wait(timeline_beside(parts).exists, spec.measurement.timeout)
    recorded = Timeline.from_dict(json.loads(timeline_beside(parts).read_text()))
    return recorded.on(spec.clock)


def supplied(path: str, named: dict[str, Any]) -> dict[str, Any]:
    """A supplied timeline, its ``source`` saying where it came from; it must time exactly
    this model's parameters (else ValueError naming the difference)."""
    doc = json.loads(Path(path).read_text())
    names = {p["name"] for p in doc["params"]}
    if names != set(named):
        extra, missing = sorted(names - set(named)), sorted(set(named) - names)
        raise ValueError(
            f"timeline {path} does not time this model: parameters it has and the model has "
            f"not: {extra[:3]}, the model has and it has not: {missing[:3]}"
        )
    return {**doc, "source": f"supplied: {path} (it says: {doc.get('source', 'no source')})"}


def _wait(cond: Any, timeout: float) -> None:
    """Poll (sleeping: no CPU while rank 0 measures) until ``cond()``; TimeoutError after."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no replay timeline after {timeout:g} s")
        time.sleep(POLL_S)


def sleep_until(deadline: float) -> None:
    """Sleep to a ``time.perf_counter`` instant (deadlines, so oversleeping never adds up)."""
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


def ddp_buckets(timeline: Timeline, cap_mb: float) -> list[list[str]]:
    """DDP's buckets after its rebuild: gradient-ready order, each bucket closed once it holds
    ``cap_mb`` or more, as torch's own assignment makes them; names per bucket. (DDP's smaller
    first bucket of 1 MiB applies only when ``bucket_cap_mb`` is left unset; qbench always sets
    it, so every bucket has the cap.)"""
    import torch.distributed as dist

    tensors = [torch.empty(p.numel) for p in timeline.params]
    limits = [int(cap_mb * 2**20)]
    indices, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(tensors))
    return [[timeline.params[i].name for i in bucket] for bucket in indices]
