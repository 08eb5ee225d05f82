"""What a run trains, from its RunSpec: the model (the zoo's or a factory's), data from a dataset
factory, the optimizer and the loss; and the sweep driver's check of the user's factories.

Zoo models and factories come out the same way (:func:`model`: a ``ModelInfo`` and the model).
The driver calls :func:`preflight` before the first run: it imports and calls every factory the
matrix names once, then runs one forward pass and the loss on two samples, so a factory that
cannot be imported, raises, returns the wrong thing or does not fit the data and loss is one
``UserError`` line naming it (exit 2), never a run that fails on every rank.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from qbench import data, models
from qbench.catalog import importpath
from qbench.data import factory, partition, real
from qbench.errors import UserError
from qbench.run.loops import epochs
from qbench.spec.runspec import RunSpec

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def model(spec: RunSpec) -> tuple[models.ModelInfo, nn.Module]:
    """The run's model, freshly initialised (seed torch first), and its facts."""
    if spec.workload.factory:
        return models.from_factory(spec.workload.model, spec.workload.factory)
    info = models.info(spec.workload.model, spec.workload.model_params)
    return info, info.build()


# -- optimizer and loss --------------------------------------------------------------------------
def optimizer(params: Iterable[nn.Parameter], spec: RunSpec) -> torch.optim.Optimizer:
    """SGD with the spec's lr, momentum and weight decay, unless ``spec.optimizer`` names
    another (``qbench.catalog.workloads.OPTIMIZERS``)."""
    opt = spec.workload.optimizer
    name = opt.get("name", "")
    lr, wd = spec.workload.lr, spec.workload.weight_decay
    if name in ("", "nesterov"):
        return torch.optim.SGD(
            params,
            lr=lr,
            momentum=spec.workload.momentum,
            weight_decay=wd,
            nesterov=name == "nesterov",
        )
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    return cls(
        params, lr=lr, betas=(opt["betas"][0], opt["betas"][1]), eps=opt["eps"],
        weight_decay=wd, amsgrad=opt["amsgrad"],
    )  # fmt: skip


def loss(spec: RunSpec) -> Loss:
    """The loss function ``(output, target) -> scalar``: cross entropy unless ``spec.loss``
    names another, or a factory's."""
    spec_loss = spec.workload.loss
    if "factory" in spec_loss:
        return _loss_factory(spec_loss)
    name = spec_loss.get("name", "cross-entropy")
    if name == "cross-entropy":
        smoothing = float(spec_loss.get("label_smoothing", 0.0))
        return lambda out, y: F.cross_entropy(*_flat_classes(out, y), label_smoothing=smoothing)
    if name == "nll":
        return lambda out, y: F.nll_loss(*_flat_classes(out, y))
    if name == "smooth-l1":
        beta = float(spec_loss["beta"])
        return lambda out, y: F.smooth_l1_loss(out, _like(out, y), beta=beta)
    pointwise: dict[str, Loss] = {"mse": F.mse_loss, "l1": F.l1_loss,
                                  "bce-logits": F.binary_cross_entropy_with_logits}  # fmt: skip
    fn = pointwise[name]
    return lambda out, y: fn(out, _like(out, y))


def _flat_classes(out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T, C) outputs with (N, T) targets, as a language model's, as (N T, C) and (N T)."""
    if out.dim() > 2 and y.dim() == out.dim() - 1:
        return out.reshape(-1, out.shape[-1]), y.reshape(-1)
    return out, y


def _like(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if y.numel() != out.numel():
        raise ValueError(
            f"targets of shape {tuple(y.shape)} do not match outputs of shape {tuple(out.shape)}"
        )
    return y.to(out.dtype).reshape(out.shape)


def _loss_factory(spec: Mapping[str, Any]) -> Loss:
    what = f"loss factory {spec['factory']!r}"
    fn = importpath.call(spec["factory"], "loss factory", spec.get("params", {}))
    if not callable(fn):
        raise UserError(
            f"{what} returned {type(fn).__name__}; expected a function (output, target) -> loss"
        )
    return fn


# -- data from a dataset factory -----------------------------------------------------------------
def epoch_data(
    spec: RunSpec, info: models.ModelInfo, *, world_size: int, rank: int, device: torch.device
) -> epochs.EpochData:
    """This rank's partition of the factory's training split and strided share of its test
    split (empty without one), shaped for the model, as ``qbench.run.loops.epochs.prepare`` does for
    the built-in datasets."""
    splits = factory.load(spec.workload.data)
    train = splits.train
    labels = (
        _class_labels(spec, train)
        if spec.workload.skew
        else torch.zeros(len(train), dtype=torch.long)
    )
    mine = partition.partition(
        labels, world_size, rank, skew=spec.workload.skew, seed=spec.measurement.seed
    )
    train_x, train_y = factory.take(train, mine)
    test = splits.test if splits.test is not None else train
    share = torch.arange(rank, len(test) if splits.test is not None else 0, world_size)
    test_x, test_y = factory.take(test, share)
    classes = info.num_classes
    if not classes and not train_y.is_floating_point() and train_y.numel():
        classes = int(train_y.max()) + 1  # this rank's; evaluation's top-5 only needs > 10
    return epochs.EpochData(
        train_x=_shaped(train_x, info).to(device), train_y=train_y.to(device),
        test_x=_shaped(test_x, info).to(device), test_y=test_y.to(device), num_classes=classes,
    )  # fmt: skip


def _class_labels(spec: RunSpec, train: Any) -> torch.Tensor:
    labels = factory.labels(train)
    if labels.dim() != 1 or labels.is_floating_point():
        raise UserError(
            f"dataset factory {spec.workload.data['factory']!r}: skew sorts samples by class "
            "label, but "
            f"its targets are {labels.dtype} of shape {tuple(labels.shape[1:])} per sample; "
            "use `skew: 0`"
        )
    return labels.long()


def _shaped(x: torch.Tensor, info: models.ModelInfo) -> torch.Tensor:
    """Samples as the model takes them when the scenario says and they differ (images to
    another size, flat vectors; ``qbench.data.real.conform``), else as the factory made them."""
    shape = tuple(info.input_shape)
    if not shape or tuple(x.shape[1:]) == shape or not x.is_floating_point() or not len(x):
        return x
    return real.conform(x, shape)


# -- what rank 0 records about the model ---------------------------------------------------------
def model_stats(spec: RunSpec) -> dict[str, float]:
    """``numel`` (trainable parameters) and ``gflops_per_sample`` (forward, 2 per multiply-add;
    NaN when a factory's input shape is unknown or its model cannot be traced on the meta
    device)."""
    if not spec.workload.factory:
        return {
            "numel": models.parameter_count(spec.workload.model, spec.workload.model_params),
            "gflops_per_sample": models.flops_per_sample(
                spec.workload.model, spec.workload.model_params
            )
            / 1e9,
        }
    try:
        with torch.device("meta"):
            info, net = models.from_factory(spec.workload.model, spec.workload.factory)
    except Exception:  # a factory that needs real tensors (a checkpoint): count on the CPU
        info, net = models.from_factory(spec.workload.model, spec.workload.factory)
    numel = sum(p.numel() for p in net.parameters() if p.requires_grad)
    return {"numel": numel, "gflops_per_sample": _gflops(info, net)}


def _gflops(info: models.ModelInfo, net: nn.Module) -> float:
    try:
        if info.batch is not None:
            x = info.batch(1, torch.Generator().manual_seed(0))[0]
        elif info.input_shape:
            x = torch.zeros((1, *info.input_shape), dtype=info.input_dtype)
        else:
            return math.nan
        device = next(net.parameters(), torch.empty(0)).device
        net.eval()
        return models.count_flops(net, x.to(device)) / 1e9
    except Exception:  # counting is a label, never a reason for a run to fail
        return math.nan


# -- the driver's check before the first run -----------------------------------------------------
def preflight(runs: Sequence[RunSpec]) -> None:
    """Import and call every factory the runs name, once per distinct workload, and run one
    forward pass and the loss on two samples; the first problem is one UserError line naming the
    factory and what was expected. Runs of zoo models on built-in data are not checked."""
    seen: set[str] = set()
    for spec in runs:
        if not (spec.workload.factory or spec.workload.data or "factory" in spec.workload.loss):
            continue
        key = json.dumps(
            [
                spec.workload.model,
                spec.workload.model_params,
                spec.workload.factory,
                spec.workload.dataset,
                spec.workload.data,
                spec.workload.loss,
                spec.workload.optimizer,
                bool(spec.measurement.epochs),
                bool(spec.workload.skew),
            ],
            sort_keys=True,
            default=str,
        )
        if key not in seen:
            seen.add(key)
            _check(spec)


def _check(spec: RunSpec) -> None:
    torch.manual_seed(spec.measurement.seed)
    info, net = model(spec)
    who = _who(spec)
    x, y = _two_samples(spec, info)
    loss_fn = loss(spec)
    optimizer(net.parameters(), spec)
    try:
        value = loss_fn(net(x), y)
    except Exception as e:
        raise UserError(
            f"{who}: one forward pass and the loss on 2 samples of shape {tuple(x.shape[1:])} "
            f"failed ({type(e).__name__}: {importpath.first_line(e)}); check input_shape, "
            "num_classes and loss"
        ) from e
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.is_floating_point():
        raise UserError(
            f"{who}: the loss returned {type(value).__name__} "
            f"{tuple(getattr(value, 'shape', ()))}; expected a scalar float tensor"
        )


def _two_samples(spec: RunSpec, info: models.ModelInfo) -> tuple[torch.Tensor, torch.Tensor]:
    if spec.workload.data:
        splits = factory.load(spec.workload.data)
        if spec.measurement.epochs and splits.test is None:
            raise UserError(
                f"dataset factory {spec.workload.data['factory']!r}: accuracy mode (epochs) "
                "evaluates on "
                "a test split; return (train, test) or {'train': ..., 'test': ...}"
            )
        if spec.workload.skew:
            _class_labels(spec, splits.train)
        x, y = factory.take(splits.train, [0, 1 % len(splits.train)])
        return _shaped(x, info), y
    if info.batch is None and (not info.input_shape or not info.num_classes):
        raise UserError(
            f"model factory {spec.workload.factory['factory']!r} describes no input: give "
            "input_shape "
            "and num_classes in the scenario, return qbench.models.Workload(model, "
            "input_shape=..., num_classes=...), or use a dataset factory"
        )
    return data.make(
        "synthetic", info, 2, seed=spec.measurement.seed, rank=0, device=torch.device("cpu")
    ).batch(0)


def _who(spec: RunSpec) -> str:
    if spec.workload.factory:
        return f"model factory {spec.workload.factory['factory']!r}"
    if spec.workload.data:
        return f"dataset factory {spec.workload.data['factory']!r} with model {spec.workload.model}"
    return f"loss factory {spec.workload.loss['factory']!r} with model {spec.workload.model}"
