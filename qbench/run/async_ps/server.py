"""The async-ps server (rank 0): applies gradients as they arrive, hands out models under the
staleness rule, records one row per update and evaluates in accuracy mode. Overview and
variants: :mod:`qbench.run.async_ps`; messages and the rule: :mod:`qbench.run.async_ps.protocol`."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import torch

from qbench import models
from qbench.comm.base import Comm
from qbench.data import partition
from qbench.run import precision
from qbench.run.async_ps.parts import SERVER, AsyncParts
from qbench.run.async_ps.protocol import (
    HEADER,
    PAYLOAD,
    Push,
    Reply,
    codecs,
    encode_model,
    may_hand_out,
    send_message,
)
from qbench.run.async_ps.protocol import update_budget as _budget
from qbench.run.loops import epochs
from qbench.run.loops.training import weight_draws
from qbench.timing import PhaseTimer


class _Server:
    def __init__(self, r: AsyncParts) -> None:
        self.r, self.cm = r, r.comm
        self.scheme = r.scheme
        self.codec, self.down = codecs(r)
        workers = self.cm.world_size - 1
        self.per_epoch = workers * _steps_per_worker(r, workers) if r.spec.measurement.epochs else 0
        per_worker = r.spec.measurement.warmup + r.spec.measurement.iterations
        self.budget = (
            self.per_epoch * r.spec.measurement.epochs
            if r.spec.measurement.epochs
            else _budget(workers, per_worker)
        )
        self.version = 0
        self.pulled: dict[int, int] = {}  # worker -> version it is computing on
        self.waiting: deque[int] = deque(range(1, workers + 1))
        self.stopped: set[int] = set()
        self.last: dict[int, tuple[float, float]] = {}  # worker -> its last (staleness, version)
        self.up_bytes = self.down_bytes = 0
        accelerated = self.scheme.variant == "accelerated"
        self.velocity = torch.zeros_like(r.params) if accelerated else None
        self.started, self.eval_s = time.perf_counter(), 0.0
        self.weight_draws = weight_draws(r.spec, self.cm.rank)  # one model: the replicas' draws

    def reply_to_waiting(self, timer: PhaseTimer) -> None:
        """Models for waiting workers while the staleness rule allows; stop once every
        remaining update is already in flight."""
        while self.waiting:
            w = self.waiting[0]
            if self.version + len(self.pulled) >= self.budget:
                self._reply(w, timer, stop=True)
                self.stopped.add(w)
            elif may_hand_out(self.version, self.pulled.values(), self.scheme.staleness):
                self._reply(w, timer, stop=False)
                self.pulled[w] = self.version
            else:
                return
            self.waiting.popleft()

    def _reply(self, w: int, timer: PhaseTimer, stop: bool) -> None:
        staleness, applied = self.last.get(w, (math.nan, math.nan))
        wire = torch.empty(0, dtype=torch.uint8)
        if not stop:
            model = self.r.params
            if self.velocity is not None:  # accelerated: the Nesterov look-ahead point
                model = model + self.r.spec.workload.momentum * self.velocity
            wire = encode_model(self.down, model, self.r.sizes, self.version, w)
        timer.mark("encode")
        reply = Reply(self.version, staleness, applied, stop, wire.numel())
        send_message(self.cm, reply.to_tensor(), wire, w)
        timer.mark("comm")

    def receive(self, head: torch.Tensor) -> tuple[Push, torch.Tensor]:
        src = self.cm.recv(head, None, tag=HEADER)
        push = Push.from_tensor(head)
        assert push.worker == src, (push.worker, src)  # per-pair order keeps header + payload
        wire = torch.empty(sum(push.sizes), dtype=torch.uint8)
        if wire.numel():
            self.cm.recv(wire, src, tag=PAYLOAD)
        self.up_bytes += head.numel() * 8 + wire.numel()
        return push, wire.to(self.r.device)

    def apply(self, push: Push, grad: torch.Tensor) -> int:
        """One SGD (or Nesterov) step with the decoded gradient; returns its staleness."""
        staleness = self.version - self.pulled.pop(push.worker)
        x, spec = self.r.params, self.r.spec
        epoch = self.version // self.per_epoch if self.per_epoch else 0
        lr = spec.workload.lr_schedule.lr(spec.workload.lr, epoch)
        if spec.workload.weight_decay:
            grad.add_(x, alpha=spec.workload.weight_decay)
        if self.velocity is None:
            x.sub_(grad, alpha=lr)
        else:
            self.velocity.mul_(spec.workload.momentum).sub_(grad, alpha=lr)
            x.add_(self.velocity)
        if (
            spec.compute.weight_bits
        ):  # seed 000 section 5.4: the server's model itself in low precision
            precision.quantize_weights_(
                x, self.r.sizes, spec.compute.weight_bits, self.weight_draws
            )
        self.version += 1
        self.last[push.worker] = (float(staleness), float(self.version))
        self.waiting.append(push.worker)
        return staleness

    def drop(self, worker: int) -> None:
        """A push without a gradient: nothing to apply; the worker waits for a model again."""
        del self.pulled[worker]
        self.waiting.append(worker)

    def evaluate(self, train_loss: float) -> None:
        """An epoch row after each epoch's worth of updates (accuracy mode), on the server's
        model and its whole test split; not timed as training and not counted as traffic."""
        r, begin = self.r, time.perf_counter()
        assert r.epoch_data is not None
        solo = _Solo()
        scores = epochs.evaluate(r.model, r.epoch_data, solo)
        convex = r.spec.workload.model in models.CONVEX
        gn = epochs.gradient_norm(r.model, r.epoch_data, solo, r.spec.workload.weight_decay)
        epoch = self.version // self.per_epoch
        r.epoch_rows.append({
            "run_id": r.spec.run_id, "epoch": epoch, "iteration": self.version,
            "train_time_s": begin - self.started - self.eval_s,
            "lr": r.spec.workload.lr_schedule.lr(r.spec.workload.lr, epoch - 1),
            "train_loss": train_loss, **scores, "grad_norm": gn if convex else math.nan,
            "bytes_sent": self.down_bytes, "consensus_distance": math.nan,
        })  # fmt: skip
        self.eval_s += time.perf_counter() - begin


def serve(r: AsyncParts) -> None:
    s = _Server(r)
    head = torch.empty(Push.header_len(len(s.codec.groups)), dtype=torch.float64)
    timer = PhaseTimer(r.device)
    while len(s.stopped) < s.cm.world_size - 1:
        s.cm.bytes_sent = 0
        timer.start()
        s.reply_to_waiting(timer)
        s.down_bytes += s.cm.bytes_sent
        if not s.pulled:
            continue  # the last workers were just told to stop
        push, wire = s.receive(head)
        timer.mark("comm")
        if push.skipped:  # the gradient held a NaN or inf (nonfinite: skip): no update
            s.drop(push.worker)
            continue
        s.codec.decode(wire, push.sizes, r.grads)
        timer.mark("decode")
        staleness = s.apply(push, r.grads)
        timer.mark("step")
        r.rows.append(_server_row(s, timer, push, wire.numel(), staleness))
        if s.per_epoch and s.version % s.per_epoch == 0:
            losses = [row["loss"] for row in r.rows[-s.per_epoch :]]
            s.evaluate(sum(losses) / len(losses))


def _server_row(
    s: _Server, timer: PhaseTimer, push: Push, payload: int, staleness: int
) -> dict[str, Any]:
    spec, update = s.r.spec, s.version - 1
    return {
        "run_id": spec.run_id, "rank": SERVER, "iteration": update,
        "warmup": update < spec.measurement.warmup * (s.cm.world_size - 1),
        **{f"t_{k}": v for k, v in timer.totals.items()}, "t_iteration": timer.elapsed(),
        "bytes_sent": s.cm.bytes_sent, "payload_bytes": payload,
        "grad_bytes": 4 * s.r.grads.numel(), "loss": push.loss, "staleness": float(staleness),
        "server_version": float(s.version), "cum_bits": 8.0 * (s.up_bytes + s.down_bytes),
    }  # fmt: skip


def _steps_per_worker(r: AsyncParts, workers: int) -> int:
    """Batches in one worker's partition (every partition has the same size): an epoch is this
    many updates per worker."""
    assert r.epoch_data is not None
    labels = r.epoch_data.train_y.cpu()
    mine = partition.partition(
        labels, workers, 0, skew=r.spec.workload.skew, seed=r.spec.measurement.seed
    )
    steps = max(len(mine) // r.spec.workload.batch_size, 1)
    return (
        min(steps, r.spec.measurement.steps_per_epoch)
        if r.spec.measurement.steps_per_epoch
        else steps
    )


class _Solo(Comm):
    """The server evaluating alone: its 'allreduce' over one rank is the identity."""

    backend, rank, world_size = "solo", 0, 1

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        return None

    def _alltoallv(self, send: torch.Tensor, send_counts: Any, recv_counts: Any) -> torch.Tensor:
        return send

    def barrier(self) -> None:
        return None

    def close(self) -> None:
        return None
