"""The user's own models, by import path, behind the same ``ModelInfo`` as the zoo's.

A zoo model is a builder (``params -> nn.Module``) plus the input facts of its catalog entry; a
model factory (``model: {factory: "mypkg.nets:build", ...}`` in a scenario) is the same with
the input described by the scenario or by the factory itself. ``build(**params)`` returns:

* an ``nn.Module``: the scenario gives ``input_shape`` and ``num_classes`` (synthetic data
  then has that shape, labels in [0, num_classes)), or a dataset factory brings the data;
* a :class:`Workload`: the model with its input (``input_shape``, ``num_classes``,
  ``input_dtype``, ``vocab_size``) and/or a batch function for inputs that are not images or
  vectors with class labels (a language model's token windows and next tokens, a regression):
  ``batch(batch_size, generator) -> (inputs, targets)``, drawn before timing, per rank.

The scenario's values win over the factory's. A factory is called with the torch seed already
set (every rank builds the same model); nothing here downloads anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from qbench.catalog import importpath
from qbench.errors import UserError

Batch = Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
"""``batch(batch_size, generator) -> (inputs, targets)``: one batch drawn with ``generator``."""


@dataclass
class Workload:
    """What a model factory may return instead of a bare ``nn.Module``."""

    model: nn.Module
    input_shape: Sequence[int] | None = None
    """One sample's shape, without the batch dimension."""
    num_classes: int | None = None
    input_dtype: torch.dtype = torch.float32
    vocab_size: int = 0
    """For integer (token) inputs: tokens lie in [0, vocab_size)."""
    batch: Batch | None = None
    """Draws a batch of synthetic inputs and targets (instead of qbench's own)."""


@dataclass(frozen=True)
class Made:
    """A factory's result, normalised: the model and what it said about its input."""

    model: nn.Module
    input_shape: tuple[int, ...] | None
    num_classes: int | None
    input_dtype: torch.dtype
    vocab_size: int
    batch: Batch | None


def make(spec: Mapping[str, Any]) -> Made:
    """Import and call the factory of ``spec`` (``qbench.catalog.workloads.model_factory``);
    the scenario's input description overrides the factory's. UserError naming the factory and
    what was expected when it cannot be imported, raises or returns something else."""
    path = spec["factory"]
    what = f"model factory {path!r}"
    out = importpath.call(path, "model factory", spec.get("params", {}))
    return _normalise(what, out, spec)


def _normalise(what: str, out: Any, spec: Mapping[str, Any]) -> Made:
    if isinstance(out, nn.Module):
        out = Workload(out)
    if not isinstance(out, Workload) or not isinstance(out.model, nn.Module):
        raise UserError(
            f"{what} returned {type(out).__name__}; expected a torch.nn.Module or "
            "qbench.models.Workload(model, input_shape=..., num_classes=...)"
        )
    if out.batch is not None and not callable(out.batch):
        raise UserError(f"{what}: Workload.batch must be a function (batch_size, generator)")
    shape = spec.get("input_shape") or out.input_shape
    dtype = getattr(torch, spec["input_dtype"]) if "input_dtype" in spec else out.input_dtype
    if spec.get("input_dtype") == "float32" and out.input_dtype != torch.float32:
        dtype = out.input_dtype  # float32 is the scenario's default, not a choice it made
    return Made(
        model=out.model,
        input_shape=tuple(int(d) for d in shape) if shape else None,
        num_classes=spec.get("num_classes") or out.num_classes,
        input_dtype=dtype,
        vocab_size=int(spec.get("vocab_size") or out.vocab_size or 0),
        batch=out.batch,
    )
