"""The user's workload in the run matrix: model and dataset factories, the optimizer (no torch;
the specs are checked in ``qbench.catalog.workloads``, the factories imported only by the sweep
driver and the ranks)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qbench.catalog import datasets, workloads
from qbench.catalog import models as zoo
from qbench.errors import choice_error

if TYPE_CHECKING:
    from qbench.spec.scenario import Scenario

Model = tuple[str, dict[str, Any], dict[str, Any]]
"""A model as the matrix carries it: label, zoo parameters, factory spec (one of the two)."""


def model(m: dict[str, Any]) -> Model:
    """A scenario's model entry, validated: a zoo name with parameters, or a factory."""
    if "factory" in m:
        label, spec = workloads.model_factory(m)
        return label, {}, spec
    return m["name"], zoo.check_params(m["name"], {k: v for k, v in m.items() if k != "name"}), {}


def datasets_of(sc: Scenario) -> list[tuple[str, dict[str, Any]]]:
    """Each dataset as (label, factory spec or {})."""
    out: list[tuple[str, dict[str, Any]]] = []
    for d in sc.dataset:
        if isinstance(d, dict):
            out.append(workloads.dataset_factory(d))
        elif d not in datasets.DATASETS:
            raise choice_error("dataset", d, list(datasets.DATASETS))
        else:
            out.append((d, {}))
    return out


def optimizer(sc: Scenario) -> tuple[float, float, float, dict[str, Any]]:
    """(lr, momentum, weight_decay, the rest) of the optimizer; the rest is empty for SGD with
    momentum and plain SGD (momentum 0), which ran before ``optimizer:`` existed, so their runs
    keep their ids."""
    opt = sc.optimizer
    if not opt:
        return sc.lr, sc.momentum, sc.weight_decay, {}
    lr, wd, momentum = opt["lr"], opt["weight_decay"], opt.get("momentum", 0.0)
    rest = {k: v for k, v in opt.items() if k not in ("lr", "momentum", "weight_decay")}
    return lr, momentum, wd, ({} if rest["name"] in ("sgd", "momentum") else rest)
