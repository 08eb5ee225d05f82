"""Workload registry: models by name, with their input shape/dtype, class count and parameters.

``qbench models`` lists the zoo. Most models take no parameters; ``lstm`` and ``synthetic`` do
(``check_params`` validates them; ``{}`` means the defaults). The API other modules use::

    check_params(name, params) -> dict       # validated, normalised, defaults filled in
    info(name, params=None) -> ModelInfo     # input shape/dtype/classes for these parameters
    build(name, params=None) -> nn.Module
    parameter_count(name, params=None) -> int
    flops_per_sample(name, params=None) -> float   # forward FLOPs of one sample (2 per MAC)

Nothing here downloads weights: torchvision models are built with ``weights=None``. Counts and
FLOPs are measured on the meta device (no memory, no arithmetic) and cached, in memory and on
disk (``qbench.models.cache``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from qbench.errors import UserError, choice_error
from qbench.models import cache, imagenet, small, synthetic
from qbench.models.lstm import LSTMLanguageModel
from qbench.models.params import Param, count, fraction, human, number


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


Params = dict[str, Any]


@dataclass(frozen=True)
class _Entry:
    name: str
    make: Callable[[Params], nn.Module]
    input_shape: tuple[int, ...]
    num_classes: int
    description: str
    source: str
    params: Mapping[str, Param] = field(default_factory=dict)
    input_dtype: torch.dtype = torch.float32
    resolve: Callable[[Params], dict[str, Any]] | None = None
    """Cross-parameter checks (raise ValueError with the message after "model NAME: ") and the
    parameter-dependent ModelInfo fields (input_shape, num_classes, vocab_size, description)."""


def _fixed(make: Callable[[], nn.Module]) -> Callable[[Params], nn.Module]:
    return lambda _p: make()


# --- lstm -----------------------------------------------------------------------------------------

_LSTM_PARAMS = {
    "vocab": Param(10_000, count(2), "vocabulary size (tokens and output classes)"),
    "hidden": Param(650, count(1), "embedding and LSTM width"),
    "layers": Param(2, count(1, 16), "stacked LSTM layers"),
    "seq_len": Param(35, count(1, 10_000), "tokens per sample (unrolled steps)"),
    "dropout": Param(0.5, fraction, "dropout on embeddings, between layers and before decoder"),
}


def _lstm_build(p: Params) -> nn.Module:
    return LSTMLanguageModel(p["vocab"], p["hidden"], p["layers"], p["dropout"])


def _lstm_resolve(p: Params) -> dict[str, Any]:
    return {
        "input_shape": (p["seq_len"],),
        "num_classes": p["vocab"],
        "vocab_size": p["vocab"],
        "description": (
            f"LSTM language model ({p['layers']} x {p['hidden']}): next token after "
            f"{p['seq_len']}; set vocab, hidden, layers, seq_len, dropout"
        ),
    }


# --- synthetic ------------------------------------------------------------------------------------


def _width(value: Any) -> int | None:
    if value is None or value == "auto":
        return None
    try:
        return count(1, 65_536)(value)
    except ValueError:
        raise ValueError("auto or a count in [1, 65,536]") from None


_SYNTHETIC_PARAMS = {
    "params": Param(10_000_000, count(10_000, 4_000_000_000), "target parameter count"),
    "gflops": Param(0.1, number(0.0), "target forward GFLOPs per sample"),
    "width": Param(None, _width, "layer width; auto (default) picks it from params and gflops"),
}


def _synthetic_layout(p: Params) -> synthetic.Layout:
    return synthetic.plan(p["params"], p["gflops"], p["width"])


def _synthetic_resolve(p: Params) -> dict[str, Any]:
    least = synthetic.min_gflops(p["params"])
    if p["gflops"] < least * 0.99:
        raise ValueError(
            f"gflops must be at least {least:.3g} for params {human(p['params'])} "
            f"(each weight does one multiply-add per sample), got {p['gflops']:g}"
        )
    lay = _synthetic_layout(p)
    return {
        "input_shape": (lay.width,),
        "description": (
            f"{lay.layers} Linear {lay.width}x{lay.width} applied {lay.steps} times; "
            "set params, gflops (seed 002's MB/GFLOPS study)"
        ),
    }


def _synthetic_build(p: Params) -> nn.Module:
    return synthetic.SyntheticModel(_synthetic_layout(p))


# --- the zoo --------------------------------------------------------------------------------------

_IMAGENET = (3, 224, 224)
_CIFAR = (3, 32, 32)

# name, builder, input shape, classes, seed paper(s), description
_FIXED: list[tuple[str, Callable[[], nn.Module], tuple[int, ...], int, str, str]] = [
    ("alexnet", imagenet.alexnet, _IMAGENET, 1000, "002", "AlexNet (torchvision)"),
    ("vgg16", imagenet.vgg16, _IMAGENET, 1000, "002", "VGG-16 (torchvision)"),
    ("vgg19", imagenet.vgg19, _IMAGENET, 1000, "002", "VGG-19 (torchvision)"),
    ("resnet50", imagenet.resnet50, _IMAGENET, 1000, "002", "ResNet-50 (torchvision)"),
    ("resnet152", imagenet.resnet152, _IMAGENET, 1000, "002", "ResNet-152 (torchvision)"),
    ("bninception", imagenet.bninception, _IMAGENET, 1000, "002", "BN-Inception (Ioffe & Szegedy)"),
    ("googlenet", imagenet.googlenet, _IMAGENET, 1000, "002", "GoogLeNet: BN-Inception stand-in"),
    ("resnet20", small.resnet20, _CIFAR, 10, "001", "ResNet-20 for CIFAR-sized input"),
    ("resnet110", small.resnet110, _CIFAR, 10, "002", "ResNet-110 for CIFAR-sized input"),
    ("vgg16-cifar", small.vgg16_cifar, _CIFAR, 10, "000", "VGG-16 with batch norm, CIFAR-sized"),
]
_SMALL: list[tuple[str, Callable[[], nn.Module], tuple[int, ...], int, str, str]] = [
    ("logreg", small.logreg, (784,), 10, "000, 003", "logistic regression (Linear 784->10)"),
    ("mlp", small.mlp, (784,), 10, "004", "784-392-50-10 tanh MLP"),
    ("cnn", small.cnn, (1, 28, 28), 10, "002", "small CNN for 28x28 input (LeNet-like)"),
]

CONVEX = frozenset({"logreg"})
"""Models whose loss is convex: accuracy mode also records the full gradient norm (seed 000)."""

_LSTM = _Entry(
    "lstm", _lstm_build, (35,), 10_000, "LSTM language model", "002",
    params=_LSTM_PARAMS, input_dtype=torch.int64, resolve=_lstm_resolve,
)  # fmt: skip
_SYNTHETIC = _Entry(
    "synthetic", _synthetic_build, (0,), synthetic.CLASSES, "synthetic", "002",
    params=_SYNTHETIC_PARAMS, resolve=_synthetic_resolve,
)  # fmt: skip

_ENTRIES: dict[str, _Entry] = {
    e.name: e
    for e in [
        *(_Entry(n, _fixed(b), shape, c, d, s) for n, b, shape, c, s, d in _FIXED),
        _LSTM,
        *(_Entry(n, _fixed(b), shape, c, d, s) for n, b, shape, c, s, d in _SMALL),
        _SYNTHETIC,
    ]
}


def names() -> list[str]:
    """Model names, in zoo order."""
    return list(_ENTRIES)


def _entry(name: str) -> _Entry:
    if name not in _ENTRIES:
        raise choice_error("model", name, list(_ENTRIES))
    return _ENTRIES[name]


def check_params(name: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate ``params`` for model ``name``; return them normalised with defaults filled in.

    Raises UserError with one line naming the key, the bad value and the fix.
    """
    e = _entry(name)
    if not isinstance(params, Mapping | None):
        raise UserError(
            f"model {name}: parameters must be a mapping like {{params: 25M}}, got {params!r}"
        )
    given = dict(params or {})
    if not e.params:
        if given:
            takes = ", ".join(n for n, x in _ENTRIES.items() if x.params)
            raise UserError(
                f"model {name} takes no parameters, got {given!r}; write just `model: {name}` "
                f"(models with parameters: {takes})"
            )
        return {}
    out: dict[str, Any] = {}
    for key in given:
        if key not in e.params:
            close = difflib.get_close_matches(str(key), list(e.params), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UserError(
                f"model {name}: unknown parameter {key!r}{hint}; valid: {', '.join(e.params)}"
            )
    for key, spec in e.params.items():
        if key not in given:
            out[key] = spec.default
            continue
        try:
            out[key] = spec.parse(given[key])
        except ValueError as exc:
            raise UserError(f"model {name}: {key} must be {exc}, got {given[key]!r}") from None
    if e.resolve is not None:
        try:
            e.resolve(out)
        except ValueError as exc:
            raise UserError(f"model {name}: {exc}") from None
    return out


def _key(name: str, params: Mapping[str, Any] | None) -> str:
    """Cache key: the resolved parameters as sorted JSON (so {} and the defaults share it)."""
    return json.dumps(check_params(name, params), sort_keys=True)


@functools.cache
def _info(name: str, key: str) -> ModelInfo:
    e = _entry(name)
    p = json.loads(key)
    extra = e.resolve(p) if e.resolve is not None else {}
    base = ModelInfo(
        name=name, build=functools.partial(e.make, p), input_shape=e.input_shape,
        num_classes=e.num_classes, description=e.description, input_dtype=e.input_dtype,
        source=e.source, params=p,
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
    from torch.utils.flop_counter import FlopCounterMode

    m, model = _on_meta(name, key)
    model.eval()  # same matmul/conv FLOPs as training mode, fewer meta ops (faster to count)
    x = torch.zeros((1, *m.input_shape), dtype=m.input_dtype, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    flops = float(counter.get_total_flops())
    cache.put(f"{name} {key}", "flops", flops)
    return flops


def parameter_count(name: str, params: Mapping[str, Any] | None = None) -> int:
    """Trainable parameters (the gradient's length) of ``name`` with ``params``."""
    return _numel(name, _key(name, params))


def flops_per_sample(name: str, params: Mapping[str, Any] | None = None) -> float:
    """Forward FLOPs of one training-mode sample, matmul/conv FLOPs as counted by
    ``torch.utils.flop_counter`` (2 per multiply-add; elementwise ops are not counted)."""
    return _flops(name, _key(name, params))


MODELS: dict[str, ModelInfo] = {name: get(name) for name in _ENTRIES}
"""Every model with its default parameters, in zoo order."""
