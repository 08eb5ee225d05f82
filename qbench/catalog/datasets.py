"""Dataset names (no torch): ``synthetic`` inputs of the model's shape, and the real datasets of
accuracy mode, read from local files by ``qbench.data.real`` (nothing ever downloads).

The one place for the facts about those files: where each dataset is looked for
(:func:`default_root`), which files it reads (:func:`missing` checks them without reading
them: the sweep's pre-flight, ``qbench.launch.preflight``) and how to install them
(:data:`FIXES`). ``qbench.data.real`` reads the same files with the same messages.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

REAL_DATASETS: tuple[str, ...] = (
    *("digits", "mnist", "fashion-mnist", "cifar10", "imagenet"),
    "fortunes",
)
TEXT_DATASETS: tuple[str, ...] = ("fortunes",)
"""Text corpora: read as a stream of bytes (tokens 0-255) that a language model whose every
position predicts the next token is trained on (``qbench.run.loops.epochs`` cuts the windows)."""
TEXT_VOCAB = 256
DATASETS: tuple[str, ...] = ("synthetic", *REAL_DATASETS)

DATA_ENV = "QBENCH_DATA"
"""A directory holding ``<name>/`` per dataset; overrides every default root."""
IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
"""MNIST-format datasets: the images and labels file of each split, plain or ``.gz``."""
IDX_DATASETS = ("mnist", "fashion-mnist")
DEBIAN_ROOTS: dict[str, Path] = {
    "fashion-mnist": Path("/usr/share/datasets/fashion-mnist"),
    "fortunes": Path("/usr/share/games/fortunes"),
}
"""Where Debian packages install a dataset (``make data`` installs both)."""
FIXES: dict[str, str] = {
    "digits": "install scikit-learn (pip install scikit-learn; `make venv` does)",
    "fashion-mnist": "install Debian's dataset-fashion-mnist (apt-get install "
    "dataset-fashion-mnist, or make data)",
    "mnist": "copy the four MNIST IDX files there",
    "cifar10": "unpack cifar-10-python.tar.gz there (it holds cifar-10-batches-py/)",
    "imagenet": "put an ImageFolder tree there (train/<class>/*.JPEG and val/<class>/*.JPEG)",
    "fortunes": "install Debian's fortunes (apt-get install fortunes, or make data)",
}
"""How to get each dataset's files onto this machine."""
MAKE_TARGETS: dict[str, str] = {"fashion-mnist": "data", "fortunes": "data"}
"""Datasets a ``make`` target installs (where apt-get works as root)."""


def default_root(name: str) -> Path:
    """The directory a real dataset is read from: ``$QBENCH_DATA/<name>`` when that variable
    is set; else Debian's directory for fashion-mnist and ``~/.cache/qbench/data/<name>`` for
    the others. ``digits`` is scikit-learn's bundled set and needs no directory."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser() / name
    if name in DEBIAN_ROOTS:
        return DEBIAN_ROOTS[name]
    return Path.home() / ".cache" / "qbench" / "data" / name


def find_idx(root: Path, stem: str) -> Path | None:
    """``root/stem`` or ``root/stem.gz``, whichever exists (plain first)."""
    for candidate in (root / stem, root / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def missing(name: str, root: Path | None = None) -> str | None:
    """What of dataset ``name`` is absent from ``root`` (default :func:`default_root`), as
    "no <file> in <dir>", or None when every file it reads is there. Looks, never reads: a
    corrupt file is found by the loader."""
    if name not in REAL_DATASETS:
        return None
    if name == "digits":
        return None if importlib.util.find_spec("sklearn") else "no scikit-learn"
    root = root if root is not None else default_root(name)
    if name in IDX_DATASETS:
        for images, labels in IDX_FILES.values():
            for stem in (images, labels):
                if find_idx(root, stem) is None:
                    return f"no {stem}[.gz] in {root}"
        return None
    if name in TEXT_DATASETS:
        return None if text_files(root) else f"no fortune files in {root}"
    needed = ("cifar-10-batches-py",) if name == "cifar10" else ("train", "val")
    for sub in needed:
        if not (root / sub).is_dir():
            return f"no {sub}/ in {root}"
    return None


def text_files(root: Path) -> list[Path]:
    """The text files of a fortune-style corpus in ``root``, sorted: every regular file but the
    ``strfile`` indexes (``.dat``) and the UTF-8 links (``.u8``)."""
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.iterdir()
        if p.is_file() and not p.is_symlink() and p.suffix not in (".dat", ".u8")
    )  # fmt: skip


def fix(name: str) -> str:
    """The one-line fix for absent files of dataset ``name``."""
    how = FIXES[name]
    if name == "digits":
        return how
    return f"{how}, or set {DATA_ENV}=/path containing {name}/ with them"
