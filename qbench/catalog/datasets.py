"""Dataset names (no torch): ``synthetic`` inputs of the model's shape, and the real datasets of
accuracy mode, read from local files by ``qbench.data.real`` (nothing ever downloads)."""

from __future__ import annotations

REAL_DATASETS: tuple[str, ...] = ("digits", "mnist", "fashion-mnist", "cifar10", "imagenet")
DATASETS: tuple[str, ...] = ("synthetic", *REAL_DATASETS)
