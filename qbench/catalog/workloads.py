"""The user's own workload as a scenario writes it (no torch): model and dataset factories by
import path, optimizers, losses.

The planner checks spellings, types and ranges here; it never imports a factory (that would
import torch and the user's code). The sweep driver imports and calls each factory once before
the first run (``qbench.run.workload.preflight``), and the ranks build from the same specs.

* ``model: {factory: "mypkg.nets:build", params: {width: 64}, input_shape: [3, 32, 32],
  num_classes: 10}``: ``build(**params)`` returns an ``nn.Module`` (or a
  ``qbench.models.Workload`` that also describes the input, or brings a batch function);
* ``dataset: {factory: "mypkg.data:splits", params: {...}}``: returns a torch ``Dataset`` of
  ``(input, target)`` pairs, or ``(train, test)``, or ``{train: ..., test: ...}``;
* ``optimizer: adam`` or ``{name: adamw, lr: 0.001, weight_decay: 0.01}`` (:data:`OPTIMIZERS`);
* ``loss: cross-entropy`` or ``{name: cross-entropy, label_smoothing: 0.1}`` or
  ``{factory: "mypkg.losses:focal", params: {...}}`` (:data:`LOSSES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qbench.catalog import importpath
from qbench.catalog.params import Param, at_least, between, validate
from qbench.errors import UserError, choice_error, did_you_mean

INPUT_DTYPES = ("float32", "float16", "bfloat16", "int64", "int32")
MODEL_KEYS = ("factory", "params", "input_shape", "num_classes", "input_dtype", "vocab_size",
              "name")  # fmt: skip
DATASET_KEYS = ("factory", "params", "name")


# -- factories -----------------------------------------------------------------------------------
def model_factory(raw: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(label, spec)`` of a ``{factory: ...}`` model: the label names it in run ids and
    reports (``name``, else the factory's attribute), the spec is complete (None where the
    scenario leaves the input to the factory)."""
    spec = _keys(raw, MODEL_KEYS, "model")
    path = importpath.check(spec["factory"], "model factory")
    what = f"model factory {path!r}"
    out: dict[str, Any] = {"factory": path, "params": _params(what, spec.get("params"))}
    shape = spec.get("input_shape")
    if shape is not None and (
        not isinstance(shape, list | tuple) or not shape
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape)
    ):  # fmt: skip
        raise UserError(
            f"{what}: input_shape must be a list of positive sizes without the batch, got "
            f"{shape!r}; e.g. `input_shape: [3, 32, 32]`"
        )
    out["input_shape"] = list(shape) if shape is not None else None
    for key in ("num_classes", "vocab_size"):
        n = spec.get(key)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise UserError(
                f"{what}: {key} must be a whole number >= 1, got {n!r}; e.g. `{key}: 10`"
            )
        out[key] = n
    dtype = spec.get("input_dtype", "float32")
    if dtype not in INPUT_DTYPES:
        raise UserError(
            f"{what}: input_dtype must be one of {', '.join(INPUT_DTYPES)}, got {dtype!r}; "
            "e.g. `input_dtype: int64` for token inputs"
        )
    out["input_dtype"] = dtype
    if dtype.startswith("int") and out["vocab_size"] is None and shape is not None:
        raise UserError(
            f"{what}: integer inputs need vocab_size (tokens are drawn in [0, vocab_size)); "
            "e.g. `vocab_size: 10000`"
        )
    return _label(spec, path), out


def dataset_factory(raw: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(label, spec)`` of a ``{factory: ...}`` dataset."""
    spec = _keys(raw, DATASET_KEYS, "dataset")
    path = importpath.check(spec["factory"], "dataset factory")
    params = _params(f"dataset factory {path!r}", spec.get("params"))
    return _label(spec, path), {"factory": path, "params": params}


def _keys(raw: Mapping[str, Any], valid: tuple[str, ...], what: str) -> dict[str, Any]:
    for key in raw:
        if key not in valid:
            hint = did_you_mean(key, valid)
            raise UserError(f"{what} factory: unknown key {key!r}{hint}; valid: {', '.join(valid)}")
    return dict(raw)


def _params(what: str, params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise UserError(
            f"{what}: params must be a mapping of keyword arguments, got {params!r}; "
            "e.g. `params: {width: 64}`"
        )
    return dict(params)


def _label(spec: Mapping[str, Any], path: str) -> str:
    name = spec.get("name", path.rpartition(":")[2].rpartition(".")[2])
    if not isinstance(name, str) or not name or any(c in name for c in "/\\ \t"):
        raise UserError(
            f"factory {path}: name must be a plain word, got {name!r}; e.g. `name: mynet`"
        )
    return name


# -- optimizers ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Optimizer:
    name: str
    summary: str
    params: tuple[Param, ...]


_LR = Param("lr", 0.05, "learning rate (the scenario's `lr` unless set here)", float,
            "a number in (0, 1000]", lambda v: 0 < v <= 1e3, example=0.01)  # fmt: skip
_ADAM_LR = Param("lr", 0.001, "learning rate", float, "a number in (0, 1000]",
                 lambda v: 0 < v <= 1e3)  # fmt: skip
_MOMENTUM = Param("momentum", 0.9, "momentum (the scenario's `momentum` unless set here)", float,
                  "a number in [0, 1]", between(0.0, 1.0))  # fmt: skip
_WD = Param("weight_decay", 0.0, "L2 penalty (the scenario's `weight_decay` unless set here)",
            float, "a number >= 0", at_least(0.0), example=0.0001)  # fmt: skip
_BETAS = Param("betas", [0.9, 0.999], "decay rates of the moment estimates", list,
               "two numbers in [0, 1)", lambda v: len(v) == 2 and all(
                   isinstance(b, int | float) and not isinstance(b, bool) and 0 <= b < 1
                   for b in v), example="[0.9, 0.99]")  # fmt: skip
_EPS = Param("eps", 1e-8, "added to the denominator", float, "a number > 0", lambda v: v > 0)
_AMSGRAD = Param("amsgrad", False, "the AMSGrad variant", bool)

OPTIMIZERS: dict[str, Optimizer] = {
    o.name: o
    for o in (
        Optimizer("sgd", "plain SGD (no momentum)", (_LR, _WD)),
        Optimizer("momentum", "SGD with heavy-ball momentum (the default)", (_LR, _MOMENTUM, _WD)),
        Optimizer("nesterov", "SGD with Nesterov momentum", (_LR, _MOMENTUM, _WD)),
        Optimizer("adam", "Adam (torch.optim.Adam)", (_ADAM_LR, _BETAS, _EPS, _WD, _AMSGRAD)),
        Optimizer("adamw", "AdamW: decoupled weight decay (torch.optim.AdamW)",
                  (_ADAM_LR, _BETAS, _EPS, Param("weight_decay", 0.01, "decoupled weight decay",
                                                 float, "a number >= 0", at_least(0.0)),
                   _AMSGRAD)),
    )
}  # fmt: skip
"""Optimizers by name; ``momentum`` with the scenario's ``lr``, ``momentum`` and
``weight_decay`` is what runs without an ``optimizer:`` key."""
TOP_LEVEL = ("lr", "momentum", "weight_decay")
"""Scenario keys that set the parameter of that name of every optimizer that takes it."""


def optimizer(raw: Any, top_level: Mapping[str, Any]) -> dict[str, Any]:
    """The optimizer ``raw`` (a name or ``{name: ..., <parameter>: ...}``) with every parameter
    filled in: its own, else the scenario's ``top_level`` keys (``lr``, ``momentum``,
    ``weight_decay`` as written), else the defaults. A top-level ``momentum`` with an optimizer
    that has none (sgd, adam, adamw) is an error, not silently ignored."""
    spec = _named(raw, "optimizer", "{name: adam, lr: 0.001}")
    name = spec.pop("name")
    if name not in OPTIMIZERS:
        raise choice_error("optimizer", name, list(OPTIMIZERS))
    entry = OPTIMIZERS[name]
    takes = {p.name for p in entry.params}
    for key in top_level:
        if key not in takes:
            raise UserError(
                f"optimizer {name} has no {key} (it takes {', '.join(sorted(takes))}); remove "
                f"the scenario's `{key}:`"
            )
    given = {**{k: v for k, v in top_level.items() if k in takes}, **spec}
    params = validate(f"optimizer {name}", entry.params, given)
    if name == "nesterov" and params["momentum"] == 0:
        raise UserError("optimizer nesterov needs momentum > 0, got 0; e.g. `momentum: 0.9`")
    return {"name": name, **params}


# -- losses --------------------------------------------------------------------------------------
LOSSES: dict[str, tuple[str, tuple[Param, ...]]] = {
    "cross-entropy": (
        "softmax cross entropy on class labels (the default); (N, T, C) outputs with (N, T) "
        "targets are flattened, as a language model's",
        (Param("label_smoothing", 0.0, "label smoothing", float, "a number in [0, 1)",
               lambda v: 0 <= v < 1, example=0.1),),
    ),
    "nll": ("negative log likelihood of log-probabilities", ()),
    "mse": ("mean squared error to targets of the output's shape", ()),
    "l1": ("mean absolute error to targets of the output's shape", ()),
    "smooth-l1": ("Huber-like smooth L1", (Param("beta", 1.0, "where it turns linear", float,
                                                 "a number > 0", lambda v: v > 0),)),
    "bce-logits": ("binary cross entropy on logits, targets in [0, 1] of the output's shape", ()),
}  # fmt: skip


def loss(raw: Any) -> dict[str, Any]:
    """The loss: ``{}`` for the default (cross entropy), else ``{name: ..., <parameter>: ...}``
    complete, or ``{factory: "module:fn", params: {...}}`` for the user's own (``fn(**params)``
    returns ``loss(output, target) -> scalar tensor``)."""
    if isinstance(raw, Mapping) and "factory" in raw:
        spec = _keys(raw, ("factory", "params"), "loss")
        path = importpath.check(spec["factory"], "loss factory")
        return {"factory": path, "params": _params(f"loss factory {path!r}", spec.get("params"))}
    spec = _named(raw, "loss", "{name: cross-entropy, label_smoothing: 0.1}")
    name = spec.pop("name")
    if name not in LOSSES:
        raise choice_error("loss", name, list(LOSSES))
    params = validate(f"loss {name}", LOSSES[name][1], spec)
    if name == "cross-entropy" and params == {"label_smoothing": 0.0}:
        return {}  # the default, so its runs keep their ids
    return {"name": name, **params}


def _named(raw: Any, what: str, example: str) -> dict[str, Any]:
    if isinstance(raw, str):
        return {"name": raw}
    if isinstance(raw, Mapping) and isinstance(raw.get("name"), str):
        return dict(raw)
    raise UserError(
        f"{what} must be a name or a mapping with a name, got {raw!r}; e.g. `{what}: {example}`"
    )
