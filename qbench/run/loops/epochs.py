"""Epoch mode (``epochs:`` in a scenario): train on a dataset's training split, evaluate after
every epoch.

Each rank owns a partition of the training split (IID, or label-skewed with ``skew``; see
``qbench.data.partition``) and walks it in a fresh random order every epoch, ``batch_size`` at a
time; every rank takes the same number of steps because partitions have equal sizes. After each
epoch the ranks evaluate together: the model is first averaged over ranks (gossip ranks hold
different models, and seed 001 evaluates their average; for the other schemes the ranks already
agree), then each rank scores its share of the test split and the sums are added with one
allreduce. None of this is timed or counted in ``bytes_sent``.

Everything here runs outside the timed loop.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from qbench.catalog.datasets import TEXT_DATASETS
from qbench.comm.base import Comm
from qbench.data import partition, real

EVAL_BATCH = 1024
"""Samples per forward pass when evaluating (memory only; results do not depend on it)."""


@dataclass
class EpochData:
    """This rank's training partition and test share, already shaped for the model."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int

    def steps_per_epoch(self, batch_size: int) -> int:
        return len(self.train_y) // batch_size


def prepare(
    dataset: str, input_shape: tuple[int, ...], *, world_size: int, rank: int, skew: float,
    seed: int, device: torch.device,
) -> EpochData:  # fmt: skip
    ds = real.load(dataset)
    if dataset in TEXT_DATASETS:
        return _text(ds, input_shape[0], world_size=world_size, rank=rank, seed=seed,
                     device=device)  # fmt: skip
    mine = partition.partition(ds.train.y, world_size, rank, skew=skew, seed=seed)
    test = torch.arange(rank, len(ds.test.y), world_size)  # a strided share of the test split
    return EpochData(
        train_x=real.conform(ds.train.x[mine], input_shape).to(device),
        train_y=ds.train.y[mine].to(device),
        test_x=real.conform(ds.test.x[test], input_shape).to(device),
        test_y=ds.test.y[test].to(device),
        num_classes=ds.num_classes,
    )


def _text(
    ds: real.Dataset, seq_len: int, *, world_size: int, rank: int, seed: int, device: torch.device
) -> EpochData:
    """A corpus cut into windows of ``seq_len`` tokens, each target the window one token on:
    the training windows partitioned IID over the ranks, the test windows strided."""
    train_x, train_y = _windows(ds.train.x, seq_len)
    test_x, test_y = _windows(ds.test.x, seq_len)
    ids = torch.zeros(len(train_y), dtype=torch.int64)  # no labels to skew by: IID
    mine = partition.partition(ids, world_size, rank, seed=seed)
    test = torch.arange(rank, len(test_y), world_size)
    return EpochData(
        train_x=train_x[mine].to(device), train_y=train_y[mine].to(device),
        test_x=test_x[test].to(device), test_y=test_y[test].to(device),
        num_classes=ds.num_classes,
    )  # fmt: skip


def _windows(stream: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(0, (len(stream) - 1) // seq_len)
    x = stream[: n * seq_len].view(n, seq_len)
    return x, stream[1 : n * seq_len + 1].view(n, seq_len)


class EpochBatches:
    """Batches in a random order per epoch drawn from (seed, rank, epoch): reproducible, and
    drawn before the iteration's timer starts. ``batch(it)`` takes the global iteration, so
    iteration mode on a real dataset simply walks through epochs too. ``max_steps`` (> 0) ends
    each epoch after that many batches (scenario ``steps_per_epoch``)."""

    def __init__(
        self, data: EpochData, batch_size: int, seed: int, rank: int, max_steps: int = 0
    ) -> None:
        self.steps = data.steps_per_epoch(batch_size)
        if max_steps > 0:
            self.steps = min(self.steps, max_steps)
        if self.steps < 1:
            raise ValueError(
                f"batch_size {batch_size} is larger than this rank's {len(data.train_y)} "
                "training samples; lower batch_size or use fewer ranks"
            )
        self.data, self.batch_size, self.seed, self.rank = data, batch_size, seed, rank
        self.epoch = -1
        self.order = torch.arange(len(data.train_y))

    def batch(self, it: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, step = divmod(it, self.steps)
        if epoch != self.epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rank * 7919 + epoch)
            n = len(self.data.train_y)
            self.order = torch.randperm(n, generator=gen).to(self.data.train_y.device)
            self.epoch = epoch
        idx = self.order[step * self.batch_size : (step + 1) * self.batch_size]
        return self.data.train_x[idx], self.data.train_y[idx]


def averaged(model: nn.Module, comm: Comm) -> nn.Module:
    """A copy of ``model`` whose parameters and float buffers are the mean over ranks (one
    allreduce, not counted in ``bytes_sent``)."""
    avg = copy.deepcopy(model)
    tensors = [t for t in (*avg.parameters(), *avg.buffers()) if t.is_floating_point()]
    if comm.world_size == 1 or not tensors:
        return avg
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    quiet_allreduce(comm, flat)
    flat /= comm.world_size
    pos = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[pos : pos + t.numel()].view_as(t))
            pos += t.numel()
    return avg


def evaluate(
    model: nn.Module, data: EpochData, comm: Comm,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, float]:  # fmt: skip
    """Top-1 (and top-5 when there are more than 10 classes) accuracy and mean loss on the test
    split, summed over the ranks' shares. ``loss_fn``: the run's loss when it is not cross
    entropy (a batch mean); top-1 is then NaN unless outputs are class scores. A language model
    whose every position predicts the next token (targets ``(N, T)``) is scored per token: its
    top-1 is next-token accuracy, and ``perplexity`` is exp(mean loss per token)."""
    sums = torch.zeros(4, dtype=torch.float64, device=data.test_y.device)  # n, loss, top1, top5
    k = max(1, min(5, data.num_classes))
    integral = not data.test_y.is_floating_point()
    tokens = data.test_y.dim() == 2 and integral
    classify = (data.test_y.dim() == 1 or tokens) and integral
    model.eval()
    with torch.no_grad():
        for start in range(0, len(data.test_y), EVAL_BATCH):
            x = data.test_x[start : start + EVAL_BATCH]
            y = data.test_y[start : start + EVAL_BATCH]
            logits = model(x).float()
            if tokens:  # every position is a sample
                logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
            sums[0] += len(y)
            if loss_fn is None:
                sums[1] += F.cross_entropy(logits, y, reduction="sum").double()
            else:
                sums[1] += float(loss_fn(logits, y)) * len(y)
            if classify and logits.dim() == 2:
                top = logits.topk(min(k, logits.shape[1]), dim=1).indices
                sums[2] += (top[:, 0] == y).sum()
                sums[3] += (top == y[:, None]).any(1).sum()
            else:
                classify = False
    model.train()
    quiet_allreduce(comm, sums)
    n = max(float(sums[0]), 1.0)
    out = {"test_loss": float(sums[1]) / n, "top1": float(sums[2]) / n if classify else math.nan}
    out["top5"] = float(sums[3]) / n if classify and data.num_classes > 10 else math.nan
    out["perplexity"] = math.exp(min(out["test_loss"], 700.0)) if tokens else math.nan
    return out


def gradient_norm(model: nn.Module, data: EpochData, comm: Comm, weight_decay: float) -> float:
    """Norm of the full training-set gradient of the (L2-regularised) loss at ``model``: seed
    000's convergence measure for logistic regression. Each rank adds its partition's gradient
    sum; one allreduce makes the mean over all training samples."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    count = torch.zeros(1, dtype=torch.float64, device=data.train_y.device)
    for start in range(0, len(data.train_y), EVAL_BATCH):
        x = data.train_x[start : start + EVAL_BATCH]
        y = data.train_y[start : start + EVAL_BATCH]
        loss = F.cross_entropy(model(x), y, reduction="sum")
        for g, d in zip(grads, torch.autograd.grad(loss, params), strict=True):
            g += d.double()
        count += len(y)
    flat = torch.cat([g.reshape(-1) for g in grads] + [count])
    quiet_allreduce(comm, flat)
    n = max(float(flat[-1]), 1.0)
    full = flat[:-1] / n
    if weight_decay:
        full += weight_decay * torch.cat([p.detach().reshape(-1).double() for p in params])
    return float(full.norm())


def quiet_allreduce(comm: Comm, t: torch.Tensor, op: str = "sum") -> None:
    """Allreduce without counting the bytes: evaluation is not training traffic."""
    sent = comm.bytes_sent
    comm.allreduce_(t, op=op)
    comm.bytes_sent = sent
