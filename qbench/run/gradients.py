"""Real per-rank gradients of a zoo model, in one process (``qbench bench numerics``).

The model is built once (torch seeded with ``seed``: the same weights for every rank, as after
a broadcast); rank r's gradient at repeat t is the model's flattened float32 gradient, cross
entropy as a sweep's default loss, on its own synthetic mini-batch (``qbench.data``: the
sweep's synthetic data, learnable labels from a fixed teacher), drawn for (t, r) alone, so no
two (repeat, rank) pairs share data. Only the first ``numel`` values are kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.nn import functional as F

from qbench import data, models

RANK_STRIDE = 1 << 20
"""Data rank of (repeat t, rank r): t * RANK_STRIDE + r, distinct for every pair."""


class ModelGradients:
    """``gradients(repeat, ranks)`` -> [ranks, numel] float32, one backward pass per row."""

    rows: int | None = None  # any number of ranks

    def __init__(
        self, name: str, params: Mapping[str, Any] | None = None, *, numel: int = 0,
        batch_size: int = 32, seed: int = 0,
    ) -> None:  # fmt: skip
        self.info = models.info(name, params)  # UserError for an unknown model or parameter
        torch.manual_seed(seed)
        self.model = self.info.build()
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.total = sum(p.numel() for p in self.params)
        self.numel = min(numel, self.total) if numel else self.total
        self.batch_size = batch_size
        self.seed = seed

    def gradients(self, repeat: int, ranks: int) -> torch.Tensor:
        out = torch.empty(ranks, self.numel)
        for r in range(ranks):
            out[r] = self._gradient(repeat * RANK_STRIDE + r)
        return out

    def _gradient(self, data_rank: int) -> torch.Tensor:
        batches = data.make("synthetic", self.info, self.batch_size, seed=self.seed,
                            rank=data_rank, device=torch.device("cpu"))  # fmt: skip
        x, y = batches.batch(0)
        self.model.zero_grad(set_to_none=True)
        loss(self.model(x), y).backward()
        return flat(self.params, self.numel)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "model", "model": self.info.name, "params": dict(self.info.params),
            "parameters": self.total, "numel": self.numel, "batch_size": self.batch_size,
            "seed": self.seed, "data": "synthetic (qbench.data), one batch per (repeat, rank)",
            "loss": "cross-entropy",
        }  # fmt: skip


def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross entropy; (N, T, C) outputs with (N, T) targets (a language model's) per token."""
    if out.dim() > 2 and y.dim() == out.dim() - 1:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.cross_entropy(out, y)


def flat(params: list[torch.nn.Parameter], numel: int) -> torch.Tensor:
    """The first ``numel`` values of the parameters' gradients, in parameter order (a parameter
    the loss did not reach counts as zeros)."""
    parts, have = [], 0
    for p in params:
        if have >= numel:
            break
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        parts.append(g.detach().reshape(-1)[: numel - have].float())
        have += parts[-1].numel()
    return torch.cat(parts)
