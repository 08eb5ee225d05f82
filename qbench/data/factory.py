"""The user's own data, by import path: ``dataset: {factory: "mypkg.data:splits", params: {}}``.

The factory, called with ``params``, returns a map-style torch ``Dataset`` of ``(input,
target)`` pairs (the training split), or ``(train, test)``, or ``{"train": ..., "test": ...}``.
Like the built-in datasets, each rank takes its partition of the training split
(``qbench.data.partition``: equal sizes, label skew with ``skew``) and a strided share of the
test split, read into memory before the timed loop; accuracy mode (``epochs``) needs the test
split. Targets for ``skew`` are class labels (integers); other targets (regression, token
sequences) need ``skew: 0``. Labels are read from ``dataset.targets`` when it has them (as
torchvision's datasets do), else from every sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from qbench.catalog import importpath
from qbench.errors import UserError


@dataclass(frozen=True)
class Splits:
    train: Any
    """A map-style dataset: ``len()`` and ``[i] -> (input, target)``."""
    test: Any | None


def load(spec: Mapping[str, Any]) -> Splits:
    """Call the factory; UserError naming it and what was expected when it returns something
    else, or when it or a sample fails."""
    path = spec["factory"]
    what = f"dataset factory {path!r}"
    out = importpath.call(path, "dataset factory", spec.get("params", {}))
    splits = _splits(out)
    if splits is None:
        raise UserError(
            f"{what} returned {type(out).__name__}; expected a torch Dataset of (input, target) "
            "pairs, a (train, test) pair of them, or {'train': ..., 'test': ...}"
        )
    for name, ds in (("train", splits.train), ("test", splits.test)):
        if ds is not None:
            _check_sample(what, name, ds)
    return splits


def _splits(out: Any) -> Splits | None:
    if isinstance(out, Mapping) and "train" in out and set(out) <= {"train", "test"}:
        train, test = out["train"], out.get("test")
    elif isinstance(out, tuple) and len(out) == 2:
        train, test = out
    elif _is_dataset(out):
        return Splits(out, None)
    else:
        return None
    if not _is_dataset(train) or (test is not None and not _is_dataset(test)):
        return None
    return Splits(train, test)


def _is_dataset(ds: Any) -> bool:
    """Map-style: ``len()`` and ``[i]`` (a list of pairs too; a tuple is ``(train, test)``)."""
    plain = isinstance(ds, str | tuple | Mapping | torch.Tensor)
    return hasattr(ds, "__len__") and hasattr(ds, "__getitem__") and not plain


def _check_sample(what: str, split: str, ds: Any) -> None:
    if len(ds) == 0:
        raise UserError(f"{what}: the {split} split is empty")
    try:
        sample = ds[0]
    except Exception as e:
        raise UserError(
            f"{what}: {split}[0] raised {type(e).__name__}: {importpath.first_line(e)}"
        ) from e
    if not isinstance(sample, tuple | list) or len(sample) != 2:
        raise UserError(
            f"{what}: {split}[0] is {type(sample).__name__}; expected an (input, target) pair"
        )


def labels(ds: Any) -> torch.Tensor:
    """Every training target, for partitioning (``targets`` when the dataset has it)."""
    targets = getattr(ds, "targets", None)
    if targets is not None and len(targets) == len(ds):
        return torch.as_tensor(targets)
    return torch.stack([torch.as_tensor(ds[i][1]) for i in range(len(ds))])


def take(ds: Any, indices: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples at ``indices``, stacked: inputs ``(n, ...)`` and targets ``(n, ...)``."""
    pairs = [ds[int(i)] for i in indices]
    if not pairs:
        x0, y0 = ds[0]
        empty_x = torch.as_tensor(x0)[None][:0]
        return empty_x, torch.as_tensor(y0)[None][:0]
    xs = torch.stack([torch.as_tensor(x) for x, _ in pairs])
    ys = torch.stack([torch.as_tensor(y) for _, y in pairs])
    return xs, ys
