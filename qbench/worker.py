"""Per-rank entry point: ``python -m qbench.worker RUN_DIR/spec.json`` (under torchrun or mpirun).

Builds the parts, runs warm-up then measured iterations, and writes this rank's rows to
``RUN_DIR/parts/rank-<r>.parquet`` (also the rows done so far when it fails). The timed loop holds
no checks and no I/O; losses stay tensors until the loop ends.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch
from torch import nn

from qbench import aggregate, async_ps, comm, models, precision
from qbench.catalog import rules
from qbench.compress import from_spec
from qbench.launch.slurm import apply_worker_env
from qbench.matrix import RunSpec
from qbench.records import WORKER_FAILED as FAILED_TAG
from qbench.records import epochs_frame
from qbench.store import (
    EPOCHS,
    atomic_write_json,
    atomic_write_parquet,
    host_part,
    model_part,
    rank_part,
)
from qbench.telemetry import Telemetry
from qbench.timing import PhaseTimer
from qbench.training import Training


def _flatten(params: list[nn.Parameter]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat parameter and gradient buffers in the given order (group by group, see
    qbench.layers); every parameter and its .grad become views into them, so schemes read and
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


class Run(Training):
    """Flat aggregation (what the seeds measured): backward runs to the end, then each layer
    group's slice of one flat gradient buffer goes through the scheme."""

    def __init__(self, spec: RunSpec, cm: comm.Comm, shard: tuple[int, int] | None = None) -> None:
        super().__init__(spec, cm, shard)
        ordered = [self.named[n] for g in self.groups for n in g.names]
        self.params, self.flat = _flatten(ordered)
        self.sizes = [p.numel() for p in ordered]  # for weights: {bits: N}
        self.aggs = self._aggregators()
        self.telemetry = self._telemetry(self.named) if spec.telemetry else None

    def _aggregators(self) -> list[tuple[slice, aggregate.Aggregator]]:
        out, pos = [], 0
        for g in self.groups:
            c = from_spec(g.compressor, seed=self.spec.seed)
            agg = aggregate.build(
                self.spec.scheme, self.comm, c, g.numel, offset=pos,
                params=self.spec.scheme_params, tensors=g.sizes,
            )  # fmt: skip
            out.append((slice(pos, pos + g.numel), agg))
            pos += g.numel
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
        self.flat.zero_()
        with precision.autocast(self.spec.compute, self.device):
            loss = self.loss_fn(self.model(x), y)
        (loss * self.scaler.scale if self.scaler.enabled else loss).backward()
        if not self.scaler.unscale_(self.flat):
            # fp16 overflow: this rank contributes nothing this step (the others go on, so no
            # collective is skipped and no rank waits), and its loss scale halves.
            self.flat.zero_()
        timer.mark("compute")
        grad = None
        if self.telemetry is not None:
            grad = self.flat.clone()  # for the telemetry pass; not part of training
            timer.skip()
        for part, agg in self.aggs:
            view = self.flat[part]
            mean = agg.aggregate(view, it, timer)
            if mean.data_ptr() != view.data_ptr():
                view.copy_(mean)
        self.opt.step()
        if self.spec.weight_bits:  # seed 000 section 5.4: the model itself in low precision
            precision.quantize_weights_(self.params, self.sizes, self.spec.weight_bits)
        timer.mark("step")
        for part, agg in self.aggs:
            agg.after_step(self.params[part], it, timer)  # decentralized schemes mix models
        self._losses.append(loss.detach())
        self._record(it, timer)
        if self.telemetry is not None and grad is not None:
            self.telemetry.observe(it, grad)

    def _record(self, it: int, timer: PhaseTimer) -> None:
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
                "payload_bytes": sum(agg.payload_bytes for _, agg in self.aggs),
                "grad_bytes": 4 * self.flat.numel(),
                "loss": float("nan"),
                "t_comm_total": comm_total,
                "overlap_fraction": hidden,
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


def _fault_injection(rank: int) -> tuple[int, str] | None:
    """QBENCH_FAULT=RANK:ITERATION[:raise] makes that rank die abruptly (or raise) at that
    iteration, to test that a failed rank fails the run, naming the rank, instead of hanging
    the others. Testing only."""
    fault = os.environ.get("QBENCH_FAULT")
    if not fault:
        return None
    parts = fault.split(":")
    if int(parts[0]) != rank:
        return None
    return int(parts[1]), (parts[2] if len(parts) > 2 else "exit")


def main(argv: list[str] | None = None) -> int:
    apply_worker_env()  # a rank started by srun: torch env:// variables from SLURM_* (else no-op)
    args = sys.argv[1:] if argv is None else argv
    spec_path = Path(args[0])
    spec = RunSpec.from_dict(json.loads(spec_path.read_text()))
    if spec.backend != "nccl":
        torch.set_num_threads(1)  # one thread per CPU rank
    cm = comm.connect(spec.backend, timeout_s=spec.timeout)
    _write_host(spec_path.parent / "parts", cm.rank, spec)
    if cm.rank == 0:
        _write_model(spec_path.parent / "parts", spec)
    run: Training | None = None
    failed = False
    try:
        if spec.scheme == "async-ps":  # no synchronous step: server and workers (seed 003)
            run = Run(spec, cm, shard=async_ps.shard(cm.rank, cm.world_size))
            async_ps.run(run)
            cm.barrier()
            return 0
        run = _training(spec, cm)
        timer = PhaseTimer(run.device)
        fault = _fault_injection(cm.rank)
        for it in range(run.total_iterations):
            if fault is not None and it == fault[0]:
                if fault[1] == "raise":
                    raise RuntimeError(f"injected fault at iteration {it} (QBENCH_FAULT)")
                os._exit(3)  # simulate a crashed rank: no clean-up, no message, no records
            run.before(it)
            run.iteration(it, timer)
            run.after(it)
        cm.barrier()
        return 0
    except Exception as e:
        failed = True
        traceback.print_exc()
        # One tagged line the sweep driver quotes in run.json (see sweep._error_line).
        line = f"{FAILED_TAG} {cm.rank} failed: {type(e).__name__}: {e}"
        print(line, file=sys.stderr, flush=True)
        return 1
    finally:
        if run is not None:
            run.close()
        if run is not None and run.rows:
            _write_parts(spec_path.parent / "parts", cm.rank, run)
        if failed:
            cm.abort(1)  # peers may be blocked in a collective: end the whole job now
        cm.close()


def _training(spec: RunSpec, cm: comm.Comm) -> Training:
    """The loop the spec asks for: DDP's buckets during backward, or flat after it."""
    if rules.overlap(spec.scheme, spec.scheme_params) == "backward":
        from qbench.ddp.training import DDPRun  # torch's DDP machinery only where it runs

        return DDPRun(spec, cm)
    return Run(spec, cm)


def _write_model(parts: Path, spec: RunSpec) -> None:
    """The model's size and forward FLOPs per sample (meta device, cached on disk): the run's
    ``numel`` and ``gflops_per_sample`` labels, the computation side of seed 002's
    communication / computation ratio, for reports that cannot import the models."""
    stats = {
        "numel": models.parameter_count(spec.model, spec.model_params),
        "gflops_per_sample": models.flops_per_sample(spec.model, spec.model_params) / 1e9,
    }
    atomic_write_json(model_part(parts), stats)


def _write_host(parts: Path, rank: int, spec: RunSpec) -> None:
    """Where this rank ran (the driver lists the hosts in the run's machine.json)."""
    import socket

    doc = {"rank": rank, "hostname": socket.gethostname(), "pid": os.getpid(),
           "device": spec.device_kind}  # fmt: skip
    atomic_write_json(host_part(parts, rank), doc)


def _write_parts(parts: Path, rank: int, run: Training) -> None:
    atomic_write_parquet(rank_part(parts, "rank", rank), run.frame())
    if rank == 0 and run.epoch_rows:
        atomic_write_parquet(parts / EPOCHS, epochs_frame(run.epoch_rows))
    if isinstance(run, Run) and run.telemetry is not None:
        atomic_write_parquet(rank_part(parts, "telemetry", rank), run.telemetry.frame())
    buckets = run.buckets_frame()
    if buckets is not None:
        atomic_write_parquet(rank_part(parts, "buckets", rank), buckets)


if __name__ == "__main__":
    sys.exit(main())
