"""Datasets by name (torch): synthetic batches and real local files.

Synthetic data is learnable: labels come from a fixed random teacher.

Inputs have the model's shape and dtype (``ModelInfo.input_shape`` / ``input_dtype``):

* float inputs are standard normal; the label is the argmax of a fixed random linear map of the
  input. Inputs larger than ``_TEACHER_MAX`` teacher weights (ImageNet-sized images) are first
  average-pooled (images to 16x16 per channel, other shapes to 1024 values), so the teacher stays
  small and the labels depend on coarse structure a network can pick up;
* integer (token) inputs are uniform in [0, vocab_size); the label is a fixed random permutation
  of the last token (a random bigram model), which a language model learns quickly;
* a model factory's own batch function (``ModelInfo.batch``) draws the batches instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from qbench.catalog.datasets import DATASETS
from qbench.errors import choice_error
from qbench.models import ModelInfo

__all__ = ["DATASETS", "BatchSource", "make"]
"""``synthetic`` is made here; the others are read from local files (``qbench.data.real``)."""
_POOL = 8  # distinct batches per rank, made before timing and cycled through
_TEACHER_MAX = 1 << 24  # teacher weights (input values x classes) above which inputs are pooled


@dataclass
class BatchSource:
    """Pre-made batches on the run's device; ``batch(i)`` costs nothing in the timed loop."""

    inputs: list[torch.Tensor]
    labels: list[torch.Tensor]

    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = i % len(self.inputs)
        return self.inputs[k], self.labels[k]


def make(
    name: str, model: ModelInfo, batch_size: int, *, seed: int, rank: int, device: torch.device
) -> BatchSource:
    if name != "synthetic":
        raise choice_error("dataset", name, ["synthetic"])  # real ones: qbench.run.loops.epochs
    return _synthetic(model, batch_size, seed=seed, rank=rank, device=device)


def _synthetic(
    model: ModelInfo, batch_size: int, *, seed: int, rank: int, device: torch.device
) -> BatchSource:
    if model.batch is not None:  # a model factory's own batch function
        return _factory_batches(model, batch_size, seed=seed, rank=rank, device=device)
    if model.input_dtype.is_floating_point:
        return _float_batches(model, batch_size, seed=seed, rank=rank, device=device)
    return _token_batches(model, batch_size, seed=seed, rank=rank, device=device)


def _float_batches(
    model: ModelInfo, batch_size: int, *, seed: int, rank: int, device: torch.device
) -> BatchSource:
    dim = 1
    for d in model.input_shape:
        dim *= d
    features = _features(model.input_shape, dim, model.num_classes)
    teacher = torch.randn(
        features(torch.zeros(1, *model.input_shape)).shape[1], model.num_classes,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed * 1000003 + rank + 1)  # different data per rank
    inputs, labels = [], []
    for _ in range(_POOL):
        x = torch.randn(batch_size, *model.input_shape, generator=gen)
        labels.append((features(x) @ teacher).argmax(1).to(device))
        inputs.append(x.to(model.input_dtype).to(device))
    return BatchSource(inputs, labels)


def _features(
    shape: tuple[int, ...], dim: int, classes: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the teacher sees: the flat input, or a pooled version of a large one."""
    if dim * classes <= _TEACHER_MAX:
        return lambda x: x.reshape(x.shape[0], dim)
    if len(shape) == 3 and shape[1] > 16 and shape[2] > 16:  # (C, H, W) image
        return lambda x: F.adaptive_avg_pool2d(x, 16).flatten(1)
    return lambda x: F.adaptive_avg_pool1d(x.reshape(x.shape[0], 1, dim), 1024).flatten(1)


def _token_batches(
    model: ModelInfo, batch_size: int, *, seed: int, rank: int, device: torch.device
) -> BatchSource:
    vocab = model.vocab_size
    if vocab < 1:
        raise ValueError(f"model {model.name}: integer inputs need vocab_size, got {vocab}")
    bigram = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed * 1000003 + rank + 1)  # different data per rank
    inputs, labels = [], []
    for _ in range(_POOL):
        x = torch.randint(0, vocab, (batch_size, *model.input_shape), generator=gen)
        last = x.reshape(batch_size, -1)[:, -1]
        labels.append((bigram[last] % model.num_classes).to(device))
        inputs.append(x.to(model.input_dtype).to(device))
    return BatchSource(inputs, labels)


def _factory_batches(
    model: ModelInfo, batch_size: int, *, seed: int, rank: int, device: torch.device
) -> BatchSource:
    """Batches from ``model.batch(batch_size, generator)``, different per rank."""
    assert model.batch is not None
    gen = torch.Generator().manual_seed(seed * 1000003 + rank + 1)
    inputs, labels = [], []
    for _ in range(_POOL):
        x, y = model.batch(batch_size, gen)
        inputs.append(x.to(device))
        labels.append(y.to(device))
    return BatchSource(inputs, labels)
