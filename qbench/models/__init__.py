"""The model zoo (torch), built from the facts in ``qbench.catalog.models``.

``qbench models`` lists the zoo. Most models take no parameters; ``lstm``, ``gpt`` and
``synthetic`` do
(``check_params`` validates them; ``{}`` means the defaults). The API other modules use::

    check_params(name, params) -> dict       # validated, normalised, defaults filled in
    info(name, params=None) -> ModelInfo     # input shape/dtype/classes for these parameters
    build(name, params=None) -> nn.Module
    from_factory(label, spec) -> (ModelInfo, nn.Module)   # a user's model by import path
    parameter_count(name, params=None) -> int
    flops_per_sample(name, params=None) -> float   # forward FLOPs of one sample (2 per MAC)
    count_flops(model, x) -> float           # forward FLOPs of any model on x

Nothing here downloads weights: torchvision models are built with ``weights=None``. Counts and
FLOPs are measured on the meta device (no memory, no arithmetic) and cached, in memory and on
disk (``qbench.models.cache``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from qbench.catalog import models as zoo
from qbench.models import cache, gpt, imagenet, small, synthetic, workload
from qbench.models.lstm import LSTMLanguageModel


@dataclass(frozen=True)
class ModelInfo:
    name: str
    build: Callable[[], nn.Module]
    """Builds a fresh, randomly initialised model for ``params`` (no arguments)."""
    input_shape: tuple[int, ...]
    """Shape of one sample (no batch dimension)."""
    num_classes: int
    description: str
    input_dtype: torch.dtype = torch.float32
    vocab_size: int = 0
    """For integer (token) inputs: tokens lie in [0, vocab_size). 0 for float inputs."""
    source: str = ""
    """The seed paper(s) the workload comes from, e.g. "002"."""
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The resolved model parameters (``check_params``); empty for models without any."""
    batch: workload.Batch | None = field(default=None, compare=False)
    """A factory's own batch function (``qbench.models.workload``); None: qbench's synthetic
    data of ``input_shape``."""


Params = dict[str, Any]


def _fixed(make: Callable[[], nn.Module]) -> Callable[[Params], nn.Module]:
    return lambda _p: make()


def _lstm_build(p: Params) -> nn.Module:
    return LSTMLanguageModel(p["vocab"], p["hidden"], p["layers"], p["dropout"])


def _gpt_build(p: Params) -> nn.Module:
    return gpt.GPT(p["vocab"], p["width"], p["layers"], p["heads"], p["seq_len"], p["dropout"])


def _synthetic_build(p: Params) -> nn.Module:
    return synthetic.SyntheticModel(zoo.synthetic_layout(p))


# name -> builder of a fresh model from the resolved parameters (facts: qbench.catalog.models)
_BUILDERS: dict[str, Callable[[Params], nn.Module]] = {
    "alexnet": _fixed(imagenet.alexnet), "vgg16": _fixed(imagenet.vgg16),
    "vgg19": _fixed(imagenet.vgg19), "resnet50": _fixed(imagenet.resnet50),
    "resnet152": _fixed(imagenet.resnet152), "bninception": _fixed(imagenet.bninception),
    "googlenet": _fixed(imagenet.googlenet), "resnet20": _fixed(small.resnet20),
    "resnet110": _fixed(small.resnet110), "vgg16-cifar": _fixed(small.vgg16_cifar),
    "lstm": _lstm_build, "logreg": _fixed(small.logreg), "mlp": _fixed(small.mlp),
    "cnn": _fixed(small.cnn), "synthetic": _synthetic_build, "gpt": _gpt_build,
}  # fmt: skip

# name -> its own synthetic batches (targets other than one class per sample), from the params
_BATCHES: dict[str, Callable[[Params], workload.Batch]] = {
    "gpt": lambda p: gpt.bigram_batches(p["vocab"], p["seq_len"]),
}
assert set(_BUILDERS) == set(zoo.MODELS), "every zoo entry has a builder"


def register(name: str, builder: Callable[[Params], nn.Module]) -> None:
    """Make a zoo model buildable; its facts must be in the catalog already
    (``qbench.catalog.models.register``)."""
    zoo.entry(name)  # UserError listing the registered names
    _BUILDERS[name] = builder


CONVEX = zoo.CONVEX
names = zoo.names
check_params = zoo.check_params


def _key(name: str, params: Mapping[str, Any] | None) -> str:
    """Cache key: the resolved parameters as sorted JSON (so {} and the defaults share it)."""
    return json.dumps(check_params(name, params), sort_keys=True)


@functools.cache
def _info(name: str, key: str) -> ModelInfo:
    e = zoo.entry(name)
    p = json.loads(key)
    extra = e.resolve(p) if e.resolve is not None else {}
    base = ModelInfo(
        name=name, build=functools.partial(_BUILDERS[name], p), input_shape=e.input_shape,
        num_classes=e.num_classes, description=e.description,
        input_dtype=getattr(torch, e.input_dtype), source=e.source, params=p,
        batch=_BATCHES[name](p) if name in _BATCHES else None,
    )  # fmt: skip
    return dataclasses.replace(base, **extra)


def info(name: str, params: Mapping[str, Any] | None = None) -> ModelInfo:
    """The workload ``name`` with ``params`` (None or {} = defaults). Raises UserError."""
    return _info(name, _key(name, params))


def build(name: str, params: Mapping[str, Any] | None = None) -> nn.Module:
    """A fresh randomly initialised model (seed torch first for identical models on all ranks)."""
    return info(name, params).build()


def get(name: str) -> ModelInfo:
    """The workload ``name`` with its default parameters."""
    return info(name)


def _on_meta(name: str, key: str) -> tuple[ModelInfo, nn.Module]:
    """The model built on the meta device: shapes only, no memory, no initialisation cost."""
    m = _info(name, key)
    with torch.device("meta"):
        return m, m.build()


@functools.cache
def _numel(name: str, key: str) -> int:
    hit = cache.get(f"{name} {key}", "numel")
    if isinstance(hit, int):
        return hit
    _, model = _on_meta(name, key)
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    cache.put(f"{name} {key}", "numel", n)
    return n


@functools.cache
def _flops(name: str, key: str) -> float:
    hit = cache.get(f"{name} {key}", "flops")
    if isinstance(hit, int | float):
        return float(hit)
    m, model = _on_meta(name, key)
    model.eval()  # same matmul/conv FLOPs as training mode, fewer meta ops (faster to count)
    flops = count_flops(model, torch.zeros((1, *m.input_shape), dtype=m.input_dtype, device="meta"))
    cache.put(f"{name} {key}", "flops", flops)
    return flops


def count_flops(model: nn.Module, x: torch.Tensor) -> float:
    """FLOPs of one forward pass of ``model`` on ``x`` (2 per MAC), without autograd."""
    # torch.utils.flop_counter loads triton (~75 ms): only when FLOPs are counted, which the
    # cache mostly spares a rank
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return float(counter.get_total_flops())


def parameter_count(name: str, params: Mapping[str, Any] | None = None) -> int:
    """Trainable parameters (the gradient's length) of ``name`` with ``params``."""
    return _numel(name, _key(name, params))


def flops_per_sample(name: str, params: Mapping[str, Any] | None = None) -> float:
    """Forward FLOPs of one training-mode sample, matmul/conv FLOPs as counted by
    ``torch.utils.flop_counter`` (2 per multiply-add; elementwise ops are not counted)."""
    return _flops(name, _key(name, params))


def from_factory(label: str, spec: Mapping[str, Any]) -> tuple[ModelInfo, nn.Module]:
    """A user's model by import path (``model: {factory: ...}``), called once: its facts as a
    ``ModelInfo`` (``build`` calls the factory again) and the model it returned. Facts it
    leaves open are empty: ``input_shape`` ``()``, ``num_classes`` 0."""
    made = workload.make(spec)
    info = ModelInfo(
        name=label, build=lambda: workload.make(spec).model, input_shape=made.input_shape or (),
        num_classes=made.num_classes or 0, description=spec["factory"],
        input_dtype=made.input_dtype, vocab_size=made.vocab_size, params=spec.get("params", {}),
        batch=made.batch,
    )  # fmt: skip
    return info, made.model


Workload = workload.Workload
MODELS: dict[str, ModelInfo] = {name: get(name) for name in zoo.MODELS}
"""Every model with its default parameters, in zoo order."""
