"""Real datasets for accuracy (epoch) mode, read from local files only: nothing ever downloads.

Every loader returns whole splits as in-memory tensors: float32 samples ``(N, C, H, W)``
scaled to [0, 1] and normalised per channel by the training split's mean and std (ImageNet by
its usual published constants), and int64 labels. ``conform`` then reshapes samples to what a
model takes (flat vectors, other sizes, more channels), so any dataset can feed any model of
the zoo that takes images or flat vectors.

Where the files live, which ones are read and how to install them are facts of
``qbench.catalog.datasets`` (``default_root``, ``IDX_FILES``, ``FIXES``), which the sweep's
pre-flight checks too. ``digits`` is scikit-learn's bundled 8x8 set and needs no files, which is
what makes it the dataset of fast tests.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.nn import functional as F

from qbench.catalog import datasets as facts
from qbench.catalog.datasets import REAL_DATASETS
from qbench.data.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx
from qbench.errors import UserError, choice_error
from qbench.models.imagenet import torchvision

if TYPE_CHECKING:
    from torchvision.datasets import ImageFolder


@dataclass(frozen=True)
class Split:
    """One split; ``x`` float32 ``(N, *sample_shape)``, ``y`` int64 ``(N,)``; a text corpus
    (``TEXT_DATASETS``): ``x`` its int64 byte stream ``(L,)`` and ``y`` empty."""

    x: torch.Tensor
    y: torch.Tensor


@dataclass(frozen=True)
class Dataset:
    """Both splits of a dataset. Loads are cached and shared: never modify the tensors in place."""

    name: str
    train: Split
    test: Split
    num_classes: int


_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_PAD_LIMIT = 4 / 3  # pad (not resize) images that fill at least 3/4 of each target side


def default_root(name: str) -> Path:
    """The directory ``load(name)`` reads when given no root (see the module docstring)."""
    _check_name(name)
    return facts.default_root(name)


def load(name: str, root: str | Path | None = None) -> Dataset:
    """Dataset ``name`` from ``root`` (default ``default_root(name)``), cached in-process.

    Every rank of a run loads the full dataset once and then takes its partition, so the cache
    (keyed on name and absolute root) makes repeated loads in one process free.
    """
    _check_name(name)
    if name == "digits":
        return _load("digits", None)  # bundled with scikit-learn: root is ignored
    path = Path(root).expanduser() if root is not None else default_root(name)
    return _load(name, path.absolute())


@functools.cache
def _load(name: str, root: Path | None) -> Dataset:
    if name == "digits":
        return _digits()
    assert root is not None
    if name in ("mnist", "fashion-mnist"):
        return _idx_dataset(name, root)
    if name == "cifar10":
        return _cifar10(root)
    if name in facts.TEXT_DATASETS:
        return _corpus(name, root)
    return _imagenet(root)


TEST_EVERY = 10
"""A text corpus's test split: every 10th fortune (the rest train), so both splits sample every
file of it."""


def _corpus(name: str, root: Path) -> Dataset:
    """A fortune-style corpus: the files' texts are cut at lines holding only ``%``; fortune i
    goes to the test split when i % TEST_EVERY == TEST_EVERY - 1; each split is its fortunes
    joined by blank lines, as bytes (tokens 0-255)."""
    files = facts.text_files(root)
    if not files:
        raise _missing(name, "fortune files", root)
    fortunes: list[bytes] = []
    for path in files:
        text = path.read_bytes().replace(b"\r\n", b"\n")
        fortunes += [f.strip(b"\n") for f in text.split(b"\n%\n") if f.strip()]
    test = [f for i, f in enumerate(fortunes) if i % TEST_EVERY == TEST_EVERY - 1]
    train = [f for i, f in enumerate(fortunes) if i % TEST_EVERY != TEST_EVERY - 1]
    empty = torch.empty(0, dtype=torch.int64)
    return Dataset(name, Split(_bytes(train), empty), Split(_bytes(test), empty), facts.TEXT_VOCAB)


def _bytes(parts: list[bytes]) -> torch.Tensor:
    data = bytearray(b"\n\n".join(parts))
    if not data:  # frombuffer refuses an empty buffer
        return torch.empty(0, dtype=torch.int64)
    return torch.frombuffer(data, dtype=torch.uint8).to(torch.int64)


def _check_name(name: str) -> None:
    if name not in REAL_DATASETS:
        raise choice_error("dataset", name, REAL_DATASETS)


def _missing(name: str, what: str, root: Path) -> UserError:
    """The one-line error for absent files: what, where, and how to fix it."""
    return UserError(f"dataset {name}: no {what} in {root}; {facts.fix(name)}")


def _normalized(name: str, train: Split, test: Split, classes: int) -> Dataset:
    """Normalise both splits per channel by the training split's statistics (no test leak)."""
    mean = train.x.mean(dim=(0, 2, 3), keepdim=True)
    std = train.x.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return Dataset(
        name,
        Split((train.x - mean) / std, train.y),
        Split((test.x - mean) / std, test.y),
        classes,
    )


def _digits() -> Dataset:
    """scikit-learn's 1797 8x8 digits; a fixed seed-0 permutation, the last 20 % for test."""
    images, target = _digits_arrays()
    x = torch.as_tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.as_tensor(target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    return _normalized("digits", Split(x[train], y[train]), Split(x[test], y[test]), 10)


def _digits_arrays() -> tuple[Any, Any]:
    """The digits as (images N x 8 x 8, labels), read straight from scikit-learn's bundled
    ``digits.csv.gz`` (64 pixels and the label per line, as ``load_digits`` reads it): importing
    sklearn costs ~1 s per rank, a third of a short run's start-up. Falls back to load_digits."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise UserError("dataset digits needs scikit-learn; install it (pip install scikit-learn)")
    for root in spec.submodule_search_locations or []:
        csv = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            table = np.loadtxt(csv, delimiter=",")
            return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits  # ~1 s: only where the csv is not found

    bunch = load_digits()
    return bunch.images, bunch.target


def _idx_dataset(name: str, root: Path) -> Dataset:
    """MNIST-format IDX files: plain or ``.gz``; bad files are a UserError naming the file."""
    splits = {}
    for split, (images_stem, labels_stem) in facts.IDX_FILES.items():
        images, labels = _find_idx(name, root, images_stem), _find_idx(name, root, labels_stem)
        try:
            x = read_idx(images, magic=IMAGES_MAGIC)
            y = read_idx(labels, magic=LABELS_MAGIC)
        except ValueError as e:
            raise UserError(f"dataset {name}: {e}; replace the file ({facts.FIXES[name]})") from e
        if len(x) != len(y):
            raise UserError(
                f"dataset {name}: {images.name} has {len(x)} images but {labels.name} has "
                f"{len(y)} labels; replace the files ({facts.FIXES[name]})"
            )
        splits[split] = Split(
            torch.from_numpy(x).unsqueeze(1).float() / 255.0, torch.from_numpy(y).long()
        )
    classes = int(max(s.y.max().item() for s in splits.values() if len(s.y)) + 1)
    return _normalized(name, splits["train"], splits["test"], classes)


def _find_idx(name: str, root: Path, stem: str) -> Path:
    """``root/stem`` or ``root/stem.gz``, whichever exists (plain first)."""
    found = facts.find_idx(root, stem)
    if found is None:
        raise _missing(name, f"{stem}[.gz]", root)
    return found


def _cifar10(root: Path) -> Dataset:
    """torchvision's CIFAR10 reader on ``root/cifar-10-batches-py`` (``download=False``)."""
    if not (root / "cifar-10-batches-py").is_dir():
        raise _missing("cifar10", "cifar-10-batches-py/", root)
    datasets = torchvision().datasets
    splits = []
    for train in (True, False):
        try:
            ds = datasets.CIFAR10(str(root), train=train, download=False)
        except RuntimeError as e:  # torchvision's "Dataset not found or corrupted."
            raise UserError(
                f"dataset cifar10: {root / 'cifar-10-batches-py'} is incomplete or corrupted "
                f"({e}); {facts.FIXES['cifar10']} again"
            ) from e
        x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float() / 255.0
        splits.append(Split(x.contiguous(), torch.as_tensor(ds.targets, dtype=torch.int64)))
    return _normalized("cifar10", splits[0], splits[1], 10)


def _imagenet(root: Path) -> Dataset:
    """``root/train`` and ``root/val`` ImageFolder trees, resized and centre-cropped to 224.

    Everything is decoded into memory, so this suits ImageNet subsets (tens of thousands of
    images), not the full 1.28 M-image set.
    """
    tv = torchvision()
    datasets, transforms = tv.datasets, tv.transforms
    tf = transforms.Compose([
        transforms.Resize(224),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize(_IMAGENET_MEAN, _IMAGENET_STD),
    ])  # fmt: skip
    folders = []
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise _missing("imagenet", f"{split}/", root)
        try:
            folders.append(datasets.ImageFolder(str(root / split), transform=tf))
        except FileNotFoundError as e:  # no class folders, or no images in them
            raise UserError(f"dataset imagenet: {e}; {facts.FIXES['imagenet']}") from e
    train, val = folders
    if train.classes != val.classes:
        raise UserError(
            f"dataset imagenet: {root}/train has {len(train.classes)} classes, {root}/val "
            f"has {len(val.classes)} (or other names); give val/ the same class folders"
        )
    return Dataset("imagenet", _stack(train), _stack(val), len(train.classes))


def _stack(folder: ImageFolder) -> Split:
    """Decode every image of an ImageFolder into one tensor."""
    samples = [folder[i] for i in range(len(folder))]
    x = torch.stack([s[0] for s in samples])
    return Split(x, torch.as_tensor([s[1] for s in samples], dtype=torch.int64))


def conform(x: torch.Tensor, input_shape: tuple[int, ...]) -> torch.Tensor:
    """Samples ``x`` (``(N, C, H, W)``, ``(N, H, W)`` or ``(N, D)``) as ``(N, *input_shape)``.

    Flat ``(D,)`` inputs: flattened as they are when sizes match, else resized bilinearly to a
    square with C channels, one (grey) or three (grey repeated) that holds D values, then
    flattened: 8x8 digits to 784 for MNIST MLPs, MNIST to 3072 for CIFAR ones. Image
    ``(C, H, W)`` inputs: grey repeated to C channels (colour averaged for C = 1); images that
    fill at least 3/4 of each side are padded with their own background (minimum), like
    LeNet's 28 -> 32, others resized.
    """
    shape = tuple(input_shape)
    if x.dim() == 2 and shape == (x.shape[1],):
        return x
    if x.dim() not in (3, 4):
        raise ValueError(f"cannot conform samples of shape {tuple(x.shape[1:])}: not images")
    images = (x.unsqueeze(1) if x.dim() == 3 else x).float()
    if len(shape) == 1:
        return _flat(images, shape[0])
    if len(shape) == 3:
        return _fit(_channels(images, shape[0]), (shape[1], shape[2])).contiguous()
    raise ValueError(
        f"cannot conform images of shape {tuple(images.shape[1:])} to input shape {shape}: "
        "only flat (D,) and image (C, H, W) inputs are supported"
    )


def _flat(images: torch.Tensor, d: int) -> torch.Tensor:
    n, c, h, w = images.shape
    if c * h * w == d:
        return images.reshape(n, d)
    for channels in dict.fromkeys((c, 1, 3)):  # as they are, grey, grey repeated to RGB
        side = math.isqrt(d // channels)
        if side > 0 and channels * side * side == d:
            square = _resize(_channels(images, channels), (side, side))
            return square.reshape(n, d)
    raise ValueError(
        f"cannot conform images of shape {(c, h, w)} to {d} inputs: {d} is neither "
        f"{c} x side^2 nor (1 or 3) x side^2"
    )


def _channels(images: torch.Tensor, c: int) -> torch.Tensor:
    have = images.shape[1]
    if have == c:
        return images
    if have == 1:
        return images.expand(-1, c, -1, -1)
    if c == 1:
        return images.mean(dim=1, keepdim=True)
    raise ValueError(f"cannot conform {have}-channel images to {c} channels")


def _fit(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Pad when the target is the same or slightly larger, else resize bilinearly."""
    h, w = images.shape[-2:]
    if (h, w) == size:
        return images
    if h <= size[0] <= h * _PAD_LIMIT and w <= size[1] <= w * _PAD_LIMIT:
        top, left = (size[0] - h) // 2, (size[1] - w) // 2
        floor = images.amin(dim=(2, 3), keepdim=True)  # the background of digit-like images
        padded = floor.expand(-1, -1, *size).clone()
        padded[:, :, top : top + h, left : left + w] = images
        return padded
    return _resize(images, size)


def _resize(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    if tuple(images.shape[-2:]) == size:
        return images
    shrink = size[0] < images.shape[-2] or size[1] < images.shape[-1]
    return F.interpolate(images, size=size, mode="bilinear", align_corners=False, antialias=shrink)
