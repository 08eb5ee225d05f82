"""What every rank's training loop shares, whatever aggregates its gradients.

:class:`Training` builds the model (with its compute precision), the layer policy's groups, the
data stream, the optimizer and the loss from a :class:`~qbench.spec.runspec.RunSpec`, and does the
work outside the timed iteration: the learning-rate schedule and, in accuracy mode, the
evaluation at the end of each epoch. Subclasses run the iteration itself: flat aggregation
after backward (``qbench.run.loops.flat.Run``) or DDP's buckets during backward
(``qbench.run.loops.ddp.DDPRun``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from qbench import comm, data, models
from qbench.records.schema import iterations_frame
from qbench.run import evonorm, precision, workload
from qbench.run.loops import epochs
from qbench.run.rounding import Draws
from qbench.spec import layers
from qbench.spec.runspec import RunSpec
from qbench.timing import Pacing


def with_precision(model: nn.Module, spec: RunSpec, rank: int) -> nn.Module:
    """Swap in Range-EvoNorm and int8 fake-quantized layers before parameters are flattened;
    the int8 layers round with ``rank``'s draws (qbench.run.rounding)."""
    if spec.compute.norm != "batchnorm":
        evonorm.use_range_evonorm(model, spec.compute.norm)
    if spec.compute.precision in precision.INT8:
        precision.fake_quantize(
            model,
            scheme=precision.INT8[spec.compute.precision],
            seed=spec.measurement.seed,
            rank=rank,
            shared=spec.compute.rounding == "shared",
        )
    return model


def weight_draws(spec: RunSpec, rank: int) -> Draws:
    """The draws ``rank`` rounds its parameters with (``weights: {bits: N}``): its own where
    each rank trains its own model (decentralized and periodic schemes), else the replicas'
    common ones (precision.weight_draws)."""
    own = spec.method.scheme.entry.kind in ("decentralized", "periodic")
    return precision.weight_draws(
        spec.measurement.seed, rank, own, shared=spec.compute.rounding == "shared"
    )


def device_for(kind: str) -> torch.device:
    """The run's device; a CUDA rank takes the GPU of its local rank (torchrun, mpirun, srun)."""
    if kind != "cuda":
        return torch.device("cpu")
    for var in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        if var in os.environ:
            torch.cuda.set_device(int(os.environ[var]) % max(torch.cuda.device_count(), 1))
            break
    return torch.device("cuda", torch.cuda.current_device())


class Training:
    pacing: Pacing | None = None
    """Replayed codec calls' share of the timer's phases (qbench.run.replay.codec); None here."""

    def __init__(self, spec: RunSpec, cm: comm.Comm, shard: tuple[int, int] | None = None) -> None:
        """``shard``: (index, count) of this rank's training partition; default (rank, world
        size). async-ps's server holds no partition of its own (qbench.run.async_ps.shard)."""
        self.spec, self.comm = spec, cm
        part, parts = shard or (cm.rank, cm.world_size)
        self.device = device_for(spec.placement.device_kind)
        torch.manual_seed(spec.measurement.seed)  # same initial model on every rank
        info, model = workload.model(spec)  # the zoo's or a factory's
        self.model = with_precision(model, spec, cm.rank).to(self.device)
        self.weight_draws = weight_draws(spec, cm.rank)
        self.named = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        policy = spec.method.layers or layers.LayerPolicy()
        self.groups = layers.plan(
            [(n, p.numel()) for n, p in self.named.items()],
            spec.method.compressor.given,
            policy,
            column_length={n: p.shape[-1] if p.dim() else 1 for n, p in self.named.items()},
        )
        self.scaler = precision.LossScaler(enabled=spec.compute.precision == "fp16")
        self.epoch_data: epochs.EpochData | None = None
        self.data: data.BatchSource | epochs.EpochBatches
        if spec.workload.data:  # a dataset factory: partitioned like the built-in datasets
            self.epoch_data = workload.epoch_data(
                spec, info, world_size=parts, rank=part, device=self.device
            )
            self.data = epochs.EpochBatches(
                self.epoch_data, spec.workload.batch_size, spec.measurement.seed, part
            )
        elif spec.workload.dataset == "synthetic":
            self.data = data.make(
                spec.workload.dataset,
                info,
                spec.workload.batch_size,
                seed=spec.measurement.seed,
                rank=part,
                device=self.device,
            )
        else:  # a real dataset: this rank's partition of the training split, per-epoch order
            self.epoch_data = epochs.prepare(
                spec.workload.dataset, info.input_shape, world_size=parts, rank=part,
                skew=spec.workload.skew, seed=spec.measurement.seed, device=self.device,
            )  # fmt: skip
            self.data = epochs.EpochBatches(
                self.epoch_data,
                spec.workload.batch_size,
                spec.measurement.seed,
                part,
                spec.measurement.steps_per_epoch,
            )
        self.opt = workload.optimizer(self.model.parameters(), spec)
        self.epoch_rows: list[dict[str, Any]] = []
        self.loss_fn = workload.loss(spec)
        self.rows: list[dict[str, Any]] = []
        self._losses: list[torch.Tensor] = []

    def iteration(self, it: int, timer: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the loop holds beyond the process (threads); default nothing."""
        return None

    @property
    def total_iterations(self) -> int:
        if self.spec.measurement.epochs and isinstance(self.data, epochs.EpochBatches):
            return self.spec.measurement.epochs * self.data.steps
        return self.spec.measurement.warmup + self.spec.measurement.iterations

    def before(self, it: int) -> None:
        """Outside the timed iteration: the epoch's learning rate."""
        batches = self.data
        if (
            self.spec.measurement.epochs
            and isinstance(batches, epochs.EpochBatches)
            and it % batches.steps == 0
        ):
            lr = self.spec.workload.lr_schedule.lr(self.spec.workload.lr, it // batches.steps)
            for group in self.opt.param_groups:
                group["lr"] = lr

    def after(self, it: int) -> None:
        """Outside the timed iteration: evaluate when an epoch ends (accuracy mode)."""
        if not self.spec.measurement.epochs or not isinstance(self.data, epochs.EpochBatches):
            return
        if (it + 1) % self.data.steps == 0:
            self._end_epoch((it + 1) // self.data.steps, it + 1, self.data.steps)

    def _end_epoch(self, epoch: int, done: int, steps: int) -> None:
        assert self.epoch_data is not None
        rows = self.rows[-steps:]
        # A step skipped for a NaN or inf (``nonfinite: skip``) trained nothing: its loss, often
        # the NaN itself, stays out of the epoch's mean (every rank skips the same steps).
        kept = [not r.get("skipped") for r in rows]
        losses = [float(v) for v, k in zip(self._losses[-steps:], kept, strict=True) if k]
        sums = torch.tensor(
            [sum(r["t_iteration"] for r in rows), sum(losses), len(losses)],
            dtype=torch.float64, device=self.device,
        )  # fmt: skip
        slowest = sums[:1].clone()
        epochs.quiet_allreduce(self.comm, slowest, op="max")
        epochs.quiet_allreduce(self.comm, sums)
        avg = self.eval_model()
        scores = epochs.evaluate(
            avg, self.epoch_data, self.comm, self.loss_fn if self.spec.workload.loss else None
        )
        gn = float("nan")  # a full pass over the partition: only where it is the measure
        if (
            self.spec.workload.model in models.CONVEX and not self.spec.workload.factory
        ):  # the same on every rank: all or none call
            gn = epochs.gradient_norm(
                avg, self.epoch_data, self.comm, self.spec.workload.weight_decay
            )
        previous = self.epoch_rows[-1]["train_time_s"] if self.epoch_rows else 0.0
        self.epoch_rows.append({
            "run_id": self.spec.run_id, "epoch": epoch, "iteration": done,
            "train_time_s": previous + float(slowest), "lr": self.opt.param_groups[0]["lr"],
            "train_loss": float(sums[1]) / float(sums[2]) if sums[2] else float("nan"), **scores,
            "grad_norm": gn,
            "bytes_sent": sum(r["bytes_sent"] for r in self.rows),
            "consensus_distance": rows[-1].get("consensus_distance", float("nan")),
        })  # fmt: skip

    def state_mib(self) -> float:
        """MiB of training state this rank holds: parameters, gradients and the optimizer's
        state (a sharded parameter's local shard only)."""
        tensors: list[torch.Tensor] = list(self.model.parameters())
        tensors += [p.grad for p in tensors if p.grad is not None]
        tensors += [v for s in self.opt.state.values() for v in s.values()
                    if isinstance(v, torch.Tensor)]  # fmt: skip
        local = (getattr(t, "to_local", lambda t=t: t)() for t in tensors)  # DTensor: its shard
        return sum(t.numel() * t.element_size() for t in local) / 2**20

    def eval_model(self) -> nn.Module:
        """The model evaluation scores: the replicas' mean (one allreduce, not counted); a
        sharded loop gathers its shards instead."""
        return epochs.averaged(self.model, self.comm)

    def buckets_frame(self) -> Any:
        """Per-bucket rows (records.BUCKET_COLUMNS) for loops that have buckets; else None."""
        return None

    def frame(self) -> Any:
        for row, loss in zip(self.rows, self._losses, strict=False):
            row["loss"] = float(loss)
        return iterations_frame(self.rows)
