"""Per-rank entry point: ``python -m qbench.run.worker RUN_DIR/spec.json`` (torchrun or mpirun),
or ``... OUT/.groups/<launch>/plan.json`` for a warm rank group (``qbench.run.group``).

Builds the parts, runs warm-up then measured iterations, and writes this rank's rows to
``RUN_DIR/parts/rank-<r>.parquet`` (also the rows done so far when it fails). The timed loop holds
no checks and no I/O; losses stay tensors until the loop ends.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from qbench import aggregate, catalog, comm
from qbench.catalog import rules
from qbench.compress import Compressor, from_spec
from qbench.launch.slurm.env import apply_worker_env
from qbench.records.schema import WORKER_FAILED as FAILED_TAG
from qbench.records.schema import epochs_frame
from qbench.records.store import (
    atomic_write_json,
    atomic_write_parquet,
    epochs_part,
    host_part,
    is_group_plan,
    model_part,
    parts_beside,
    rank_part,
    trace_path,
)
from qbench.run import async_ps, interference, nonfinite, precision, profile, workload
from qbench.run.telemetry import Telemetry
from qbench.run.training import Training
from qbench.spec.matrix import RunSpec
from qbench.timing import PhaseTimer


def _flatten(params: list[nn.Parameter]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat parameter and gradient buffers in the given order (group by group, see
    qbench.spec.layers); every parameter and its .grad become views into them, so schemes read and
    write whole slices with no copy per step."""
    numel = sum(p.numel() for p in params)
    flat_p = torch.empty(numel, dtype=torch.float32, device=params[0].device)
    flat_g = torch.zeros_like(flat_p)
    pos = 0
    for p in params:
        flat_p[pos : pos + p.numel()].copy_(p.detach().reshape(-1))
        p.data = flat_p[pos : pos + p.numel()].view_as(p)
        p.grad = flat_g[pos : pos + p.numel()].view_as(p)
        pos += p.numel()
    return flat_p, flat_g


def _flat_model(t: Training) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The model's parameters and gradients as flat buffers in layer-group order, and each
    parameter's size (for weights: {bits: N})."""
    ordered = [t.named[n] for g in t.groups for n in g.names]
    params, grads = _flatten(ordered)
    return params, grads, [p.numel() for p in ordered]


def _slices(t: Training) -> list[tuple[str, slice]]:
    """Each parameter's name and slice of the flat buffers (layer-group order, as _flat_model)."""
    out, pos = [], 0
    for n in (n for g in t.groups for n in g.names):
        out.append((n, slice(pos, pos + t.named[n].numel())))
        pos += t.named[n].numel()
    return out


def _guard(t: Training, cm: comm.Comm | None) -> nonfinite.Guard:
    """The run's non-finite policy over the flat gradient; ``cm``: the ranks that agree on a
    skip (None: this rank alone)."""
    return nonfinite.Guard(t.spec.nonfinite, cm, t.comm.rank, _slices(t), t.device)


def _group_compressors(t: Training) -> Iterator[tuple[slice, Compressor, tuple[int, ...]]]:
    """Each layer group's slice of the flat buffers, its compressor (built as consumed) and the
    sizes of its tensors (per-tensor compressors encode each on its own)."""
    pos = 0
    for g in t.groups:
        yield slice(pos, pos + g.numel), from_spec(g.compressor, seed=t.spec.seed), g.sizes
        pos += g.numel


class Run(Training):
    """Flat aggregation (what the seeds measured): backward runs to the end, then each layer
    group's slice of one flat gradient buffer goes through the scheme."""

    def __init__(self, spec: RunSpec, cm: comm.Comm) -> None:
        super().__init__(spec, cm)
        self.params, self.flat, self.sizes = _flat_model(self)
        self.aggs = self._aggregators()
        self.telemetry = self._telemetry(self.named) if spec.telemetry else None
        self.guard = _guard(self, cm)

    def _aggregators(self) -> list[tuple[slice, aggregate.Aggregator]]:
        scheme, params = self.spec.scheme, self.spec.scheme_params
        out = []
        for part, c, sizes in _group_compressors(self):  # each compressor then its aggregator
            numel = part.stop - part.start
            agg = aggregate.build(
                scheme, self.comm, c, numel, offset=part.start, params=params, tensors=sizes
            )
            out.append((part, agg))
        return out

    def _telemetry(self, named: dict[str, nn.Parameter]) -> Telemetry:
        entries, pos = [], 0
        for g in self.groups:
            for n in g.names:
                entries.append((n, slice(pos, pos + named[n].numel()), g.compressor))
                pos += named[n].numel()
        make = lambda c: from_spec(c, seed=self.spec.seed)  # noqa: E731
        return Telemetry(entries, make, self.spec.run_id, self.comm.rank)

    def iteration(self, it: int, timer: PhaseTimer) -> None:
        x, y = self.data.batch(it)
        self.comm.bytes_sent = 0
        timer.start()
        profile.phase("forward")
        self.flat.zero_()
        with precision.autocast(self.spec.compute, self.device):
            loss = self.loss_fn(self.model(x), y)
        profile.phase("backward")
        (loss * self.scaler.scale if self.scaler.enabled else loss).backward()
        # fp16 overflow: this rank contributes nothing this step (the others go on, so no
        # collective is skipped and no rank waits), and its loss scale halves.
        nonfinite.unscale(self.scaler, self.flat)
        timer.mark("compute")
        profile.phase(None)  # encode / comm / decode: ranges of their own
        stepped = self.guard.check(it, self.flat, timer)  # a NaN or inf: fail, or all skip
        if stepped:
            self._step(it, timer)
        self._losses.append(loss.detach())
        self._record(it, timer, skipped=not stepped)

    def _step(self, it: int, timer: PhaseTimer) -> None:
        """The scheme's exchange, the optimizer step and the model mixing of one iteration."""
        grad = None
        if self.telemetry is not None:
            grad = self.flat.clone()  # for the telemetry pass; not part of training
            timer.skip()
        for part, agg in self.aggs:
            view = self.flat[part]
            mean = agg.aggregate(view, it, timer)
            if mean.data_ptr() != view.data_ptr():
                view.copy_(mean)
        profile.phase("step")
        self.opt.step()
        if self.spec.weight_bits:  # seed 000 section 5.4: the model itself in low precision
            precision.quantize_weights_(
                self.params, self.sizes, self.spec.weight_bits, self.weight_draws
            )
        timer.mark("step")
        profile.phase(None)
        for part, agg in self.aggs:
            agg.after_step(self.params[part], it, timer)  # decentralized schemes mix models
        if self.telemetry is not None and grad is not None:  # after the last mark: not timed
            self.telemetry.observe(it, grad)

    def _record(self, it: int, timer: PhaseTimer, skipped: bool = False) -> None:
        t = dict(timer.totals)
        # After backward, every second of communication is exposed: none is hidden.
        comm_total, hidden = t["comm"], 0.0
        if any(agg.overlapped for _, agg in self.aggs):
            # Overlapped mode: phases interleave, so per-phase times would be made up.
            t.update(encode=float("nan"), comm=float("nan"), decode=float("nan"))
            comm_total = hidden = float("nan")
        self.rows.append(
            {
                "run_id": self.spec.run_id,
                "rank": self.comm.rank,
                "iteration": it,
                "warmup": it < self.spec.warmup,
                **{f"t_{k}": v for k, v in t.items()},
                "t_iteration": timer.elapsed(),
                "bytes_sent": self.comm.bytes_sent,
                "payload_bytes": 0 if skipped else sum(agg.payload_bytes for _, agg in self.aggs),
                "grad_bytes": 4 * self.flat.numel(),
                "loss": float("nan"),
                "t_comm_total": comm_total,
                "overlap_fraction": hidden,
                "skipped": float(skipped),
                **self._scheme_metrics(),
            }
        )

    def _scheme_metrics(self) -> dict[str, float]:
        """Per-iteration measurements a scheme offers. Each scheme instance covers one slice of
        the parameters: gossip reports this rank's squared distance to the mean model per slice
        (``consensus_sq``), combined over slices and ranks into ``consensus_distance``."""
        from qbench.aggregate.gossip import consensus_distance

        out: dict[str, float] = {}
        squares: list[float] = []
        for _, agg in self.aggs:
            m = dict(agg.metrics())
            if "consensus_sq" in m:
                squares.append(m.pop("consensus_sq"))
            out.update(m)
        if squares:
            out["consensus_distance"] = consensus_distance(self.comm, squares, self.device)
        return out


def fault_injection(rank: int, run_id: str, index: int | None = None) -> tuple[int, str] | None:
    """QBENCH_FAULT=RANK:ITERATION[:MODE][@RUN] makes that rank die abruptly (MODE ``exit``, the
    default), raise (``raise``) or hang (``hang``) at that iteration, to test that a failed or
    hung rank fails its run, naming the rank, instead of hanging the others; ``leak`` keeps
    LEAK_MB MiB for good and goes on, to test that a group's memory check catches a leak.
    ``@RUN`` limits it to one run: its run id, or in group mode its index in the rank group.
    Testing only."""
    fault = os.environ.get("QBENCH_FAULT")
    if not fault:
        return None
    fault, _, target = fault.partition("@")
    if target and target not in (run_id, str(index)):
        return None
    parts = fault.split(":")
    if int(parts[0]) != rank:
        return None
    return int(parts[1]), (parts[2] if len(parts) > 2 else "exit")


_LEAKED: list[torch.Tensor] = []
LEAK_MB = 16


def _inject(fault: tuple[int, str], it: int) -> None:
    if fault[1] == "leak":  # memory a run never gives back, so tests can see the check fire
        _LEAKED.append(torch.ones(LEAK_MB * 2**18))  # float32: LEAK_MB MiB, every page touched
        return
    if fault[1] == "raise":
        raise RuntimeError(f"injected fault at iteration {it} (QBENCH_FAULT)")
    if fault[1] == "hang":
        while True:  # a rank stuck for good: only the run's timeout ends it
            time.sleep(3600)
    os._exit(3)  # simulate a crashed rank: no clean-up, no message, no records


def connect(spec: RunSpec, timeout_s: float) -> comm.Comm:
    """Join the rank group's communicator, one thread per CPU rank."""
    if spec.backend != "nccl":
        torch.set_num_threads(1)  # one thread per CPU rank
    return comm.connect(spec.backend, timeout_s=timeout_s)


def main(argv: list[str] | None = None) -> int:
    apply_worker_env()  # a rank started by srun: torch env:// variables from SLURM_* (else no-op)
    args = sys.argv[1:] if argv is None else argv
    try:
        return _main(args)
    except Exception as e:  # outside a run (joining the group, say): run_config tags its own
        _tag(_launcher_rank(), e)
        raise


# Where each launcher puts a rank's number before the communicator exists: torchrun, qbench's
# own rank groups and srun (through apply_worker_env): RANK; mpirun: the rest (MPICH: PMI_RANK).
_RANK_VARS = ("RANK", *comm.MPI_RANK_VARS, "PMI_RANK")


def _launcher_rank() -> str:
    return next((os.environ[v] for v in _RANK_VARS if v in os.environ), "?")


def _tag(rank: object, e: BaseException) -> None:
    """The one line the sweep driver quotes in run.json (see runfiles._error_line)."""
    print(f"{FAILED_TAG} {rank} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _main(args: list[str]) -> int:
    if is_group_plan(Path(args[0])):  # a warm rank group: many runs, one launch
        from qbench.run import group

        return group.main(Path(args[0]))
    spec_path = Path(args[0])
    spec = RunSpec.from_dict(json.loads(spec_path.read_text()))
    cm = connect(spec, spec.timeout)
    ok = run_config(spec, spec_path, cm, fault_injection(cm.rank, spec.run_id))
    if not ok:
        cm.abort(1)  # peers may be blocked in a collective: end the whole job now
    cm.close()
    return 0 if ok else 1


def run_config(
    spec: RunSpec, spec_path: Path, cm: comm.Comm, fault: tuple[int, str] | None = None
) -> bool:
    """One run on this rank: build, warm up, measure, write this rank's parts (also the rows
    done so far when it fails). False when it failed, after printing the tagged line the driver
    quotes; the caller then ends the job so that no peer waits for this rank."""
    parts = parts_beside(spec_path)
    _write_host(parts, cm.rank, spec)
    if cm.rank == 0:
        _write_model(parts, spec)
    run: Training | None = None
    tracer: profile.Tracer | None = None
    try:
        watch = interference.Watch(parts, cm.rank, together=cm.barrier)
        if catalog.SCHEMES[spec.scheme].kind == "asynchronous":  # server + workers (seed 003)
            run = Training(spec, cm, shard=async_ps.shard(cm.rank, cm.world_size))
            watch.start()  # its loop is its own: the whole serving time, warm-up included
            async_ps.run(async_parts(run))
            watch.stop()
            cm.barrier()
            return True
        run = _training(spec, cm)
        timer = PhaseTimer(run.device)
        trace = trace_path(parts, cm.rank) if spec.profile else None
        tracer = profile.Tracer(trace, spec.warmup, run.total_iterations - spec.warmup,
                                run.device, cm)  # fmt: skip
        steps = range(run.total_iterations)
        for measured, its in enumerate((steps[: spec.warmup], steps[spec.warmup :])):
            if measured:  # /proc is read here and after the loop: never in a timed iteration
                watch.start()
            for it in its:
                if fault is not None and it == fault[0]:
                    _inject(fault, it)
                run.before(it)
                run.iteration(it, timer)
                tracer.step()
                run.after(it)
        watch.stop()
        cm.barrier()
        return True
    except Exception as e:
        traceback.print_exc()
        _tag(cm.rank, e)
        return False
    finally:
        if tracer is not None:
            tracer.close()
        if run is not None:
            run.close()
        if run is not None and run.rows:
            _write_parts(parts, cm.rank, run)


def async_parts(t: Training) -> async_ps.AsyncParts:
    """What the asynchronous parameter server uses of a rank's set-up: the model as flat
    buffers, each layer group's compressor and the scheme's parameters; the loop is its own."""
    params, grads, sizes = _flat_model(t)
    scheme = catalog.scheme({"name": t.spec.scheme, **t.spec.scheme_params}).params
    return async_ps.AsyncParts(
        spec=t.spec, comm=t.comm, device=t.device, model=t.model, params=params, grads=grads,
        sizes=sizes, groups=list(_group_compressors(t)), scheme=async_ps.AsyncParams(**scheme),
        data=t.data, loss_fn=t.loss_fn, scaler=t.scaler, epoch_data=t.epoch_data, rows=t.rows,
        epoch_rows=t.epoch_rows, guard=_guard(t, None),
    )  # fmt: skip


def _training(spec: RunSpec, cm: comm.Comm) -> Training:
    """The loop the spec asks for: DDP's buckets during backward, or flat after it."""
    if rules.overlap(spec.scheme, spec.scheme_params) == "backward":
        from qbench.run.ddp_loop import DDPRun  # torch's DDP machinery only where it runs

        return DDPRun(spec, cm)
    return Run(spec, cm)


def _write_model(parts: Path, spec: RunSpec) -> None:
    """The model's size and forward FLOPs per sample (meta device, cached on disk): the run's
    ``numel`` and ``gflops_per_sample`` labels, the computation side of seed 002's
    communication / computation ratio, for reports that cannot import the models."""
    atomic_write_json(model_part(parts), workload.model_stats(spec))  # zoo or factory


def _write_host(parts: Path, rank: int, spec: RunSpec) -> None:
    """Where this rank ran (the driver lists the hosts in the run's machine.json)."""
    import socket

    doc = {"rank": rank, "hostname": socket.gethostname(), "pid": os.getpid(),
           "device": spec.device_kind}  # fmt: skip
    atomic_write_json(host_part(parts, rank), doc)


def _write_parts(parts: Path, rank: int, run: Training) -> None:
    atomic_write_parquet(rank_part(parts, "rank", rank), run.frame())
    if rank == 0 and run.epoch_rows:
        atomic_write_parquet(epochs_part(parts), epochs_frame(run.epoch_rows))
    if isinstance(run, Run) and run.telemetry is not None:
        atomic_write_parquet(rank_part(parts, "telemetry", rank), run.telemetry.frame())
    buckets = run.buckets_frame()
    if buckets is not None:
        atomic_write_parquet(rank_part(parts, "buckets", rank), buckets)


if __name__ == "__main__":
    sys.exit(main())
