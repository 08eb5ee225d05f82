"""The model zoo's facts: names, inputs, classes, seed papers and parameters (no torch).

``qbench.models`` builds them (torch); the planner validates scenario models here, so that
``qbench sweep --dry-run`` never imports torch. Most models take no parameters; ``lstm``,
``gpt`` and ``synthetic`` do (:func:`check_params` validates them; ``{}`` means the defaults).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from qbench.catalog import synthetic_layout as synthetic
from qbench.catalog.model_params import Param, count, fraction, human, number
from qbench.errors import UserError, choice_error, did_you_mean

Params = dict[str, Any]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    input_shape: tuple[int, ...]
    """Shape of one sample (no batch dimension), at the default parameters."""
    num_classes: int
    description: str
    source: str
    """The seed paper(s) the workload comes from, e.g. "002"."""
    params: Mapping[str, Param] = field(default_factory=dict)
    input_dtype: str = "float32"
    """torch's name for the input's dtype: float32 images / vectors, int64 tokens."""
    resolve: Callable[[Params], dict[str, Any]] | None = None
    """Cross-parameter checks (raise ValueError with the message after "model NAME: ") and the
    parameter-dependent fields (input_shape, num_classes, vocab_size, description)."""
    per_token: bool = False
    """Every position predicts the next token (targets (batch, seq_len)): the models that read
    a text corpus (``qbench.catalog.datasets.TEXT_DATASETS``), and only those."""


# --- lstm -----------------------------------------------------------------------------------------
_LSTM_PARAMS = {
    "vocab": Param(10_000, count(2), "vocabulary size (tokens and output classes)"),
    "hidden": Param(650, count(1), "embedding and LSTM width"),
    "layers": Param(2, count(1, 16), "stacked LSTM layers"),
    "seq_len": Param(35, count(1, 10_000), "tokens per sample (unrolled steps)"),
    "dropout": Param(0.5, fraction, "dropout on embeddings, between layers and before decoder"),
}


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


# --- gpt ------------------------------------------------------------------------------------------
_GPT_PARAMS = {
    "vocab": Param(256, count(2), "vocabulary size (256: bytes, as the text corpora are read)"),
    "width": Param(128, count(1), "embedding width (a multiple of heads)"),
    "layers": Param(4, count(1, 256), "decoder blocks"),
    "heads": Param(4, count(1, 256), "attention heads per block"),
    "seq_len": Param(64, count(1, 65_536), "tokens per sample (context length)"),
    "dropout": Param(0.0, fraction, "dropout on embeddings, attention and residuals"),
}


def _gpt_resolve(p: Params) -> dict[str, Any]:
    if p["width"] % p["heads"]:
        raise ValueError(f"width {p['width']} is not a multiple of heads {p['heads']}")
    return {
        "input_shape": (p["seq_len"],),
        "num_classes": p["vocab"],
        "vocab_size": p["vocab"],
        "description": (
            f"GPT-style decoder ({p['layers']} x {p['width']}, {p['heads']} heads, "
            f"{p['seq_len']} tokens): every next token; set vocab, width, layers, heads, "
            "seq_len, dropout"
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


def synthetic_layout(p: Params) -> synthetic.Layout:
    return synthetic.plan(p["params"], p["gflops"], p["width"])


def _synthetic_resolve(p: Params) -> dict[str, Any]:
    least = synthetic.min_gflops(p["params"])
    if p["gflops"] < least * 0.99:
        raise ValueError(
            f"gflops must be at least {least:.3g} for params {human(p['params'])} "
            f"(each weight does one multiply-add per sample), got {p['gflops']:g}"
        )
    lay = synthetic_layout(p)
    return {
        "input_shape": (lay.width,),
        "description": (
            f"{lay.layers} Linear {lay.width}x{lay.width} applied {lay.steps} times; "
            "set params, gflops (seed 002's MB/GFLOPS study)"
        ),
    }


# --- the zoo --------------------------------------------------------------------------------------
_IMAGENET = (3, 224, 224)
_CIFAR = (3, 32, 32)
_FIXED: list[tuple[str, tuple[int, ...], int, str, str]] = [
    # name, input shape, classes, seed paper(s), description
    ("alexnet", _IMAGENET, 1000, "002", "AlexNet (torchvision)"),
    ("vgg16", _IMAGENET, 1000, "002", "VGG-16 (torchvision)"),
    ("vgg19", _IMAGENET, 1000, "002", "VGG-19 (torchvision)"),
    ("resnet50", _IMAGENET, 1000, "002", "ResNet-50 (torchvision)"),
    ("resnet152", _IMAGENET, 1000, "002", "ResNet-152 (torchvision)"),
    ("bninception", _IMAGENET, 1000, "002", "BN-Inception (Ioffe & Szegedy)"),
    ("googlenet", _IMAGENET, 1000, "002", "GoogLeNet: BN-Inception stand-in"),
    ("resnet20", _CIFAR, 10, "001", "ResNet-20 for CIFAR-sized input"),
    ("resnet110", _CIFAR, 10, "002", "ResNet-110 for CIFAR-sized input"),
    ("vgg16-cifar", _CIFAR, 10, "000", "VGG-16 with batch norm, CIFAR-sized"),
]
_SMALL: list[tuple[str, tuple[int, ...], int, str, str]] = [
    ("logreg", (784,), 10, "000, 003", "logistic regression (Linear 784->10)"),
    ("mlp", (784,), 10, "004", "784-392-50-10 tanh MLP"),
    ("cnn", (1, 28, 28), 10, "002", "small CNN for 28x28 input (LeNet-like)"),
]
CONVEX = frozenset({"logreg"})
"""Models whose loss is convex: accuracy mode also records the full gradient norm (seed 000)."""

MODELS: dict[str, ModelEntry] = {
    e.name: e
    for e in [
        *(ModelEntry(n, shape, c, d, s) for n, shape, c, s, d in _FIXED),
        ModelEntry("lstm", (35,), 10_000, "LSTM language model", "002", _LSTM_PARAMS, "int64",
                   _lstm_resolve),
        ModelEntry("gpt", (64,), 256, "GPT-style decoder", "beyond the papers", _GPT_PARAMS,
                   "int64", _gpt_resolve, per_token=True),
        *(ModelEntry(n, shape, c, d, s) for n, shape, c, s, d in _SMALL),
        ModelEntry("synthetic", (0,), synthetic.CLASSES, "synthetic", "002", _SYNTHETIC_PARAMS,
                   resolve=_synthetic_resolve),
    ]
}  # fmt: skip


def register(e: ModelEntry) -> None:
    """Add a model's facts to the zoo; its builder registers with ``qbench.models.register``."""
    if e.name in MODELS:
        raise UserError(f"model {e.name!r} is already registered; pick another name")
    MODELS[e.name] = e


def names() -> list[str]:
    """Model names, in zoo order."""
    return list(MODELS)


def entry(name: str) -> ModelEntry:
    if name not in MODELS:
        raise choice_error("model", name, list(MODELS))
    return MODELS[name]


def check_params(name: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate ``params`` for model ``name``; return them normalised with defaults filled in.

    Raises UserError with one line naming the key, the bad value and the fix.
    """
    e = entry(name)
    if not isinstance(params, Mapping | None):
        raise UserError(
            f"model {name}: parameters must be a mapping like {{params: 25M}}, got {params!r}"
        )
    given = dict(params or {})
    if not e.params:
        if given:
            takes = ", ".join(n for n, x in MODELS.items() if x.params)
            raise UserError(
                f"model {name} takes no parameters, got {given!r}; write just `model: {name}` "
                f"(models with parameters: {takes})"
            )
        return {}
    for key in given:
        if key not in e.params:
            hint = did_you_mean(key, e.params)
            raise UserError(
                f"model {name}: unknown parameter {key!r}{hint}; valid: {', '.join(e.params)}"
            )
    out = {key: _parse(name, key, spec, given) for key, spec in e.params.items()}
    if e.resolve is not None:
        try:
            e.resolve(out)
        except ValueError as exc:
            raise UserError(f"model {name}: {exc}") from None
    return out


def _parse(name: str, key: str, spec: Param, given: Mapping[str, Any]) -> Any:
    if key not in given:
        return spec.default
    try:
        return spec.parse(given[key])
    except ValueError as exc:
        raise UserError(f"model {name}: {key} must be {exc}, got {given[key]!r}") from None
