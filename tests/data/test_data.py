"""Real datasets (IDX reader, loaders, conform) and the non-IID partitioner of seed 001."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from qbench.data import real
from qbench.data.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx, write_idx
from qbench.data.partition import label_histogram, partition, skew_measure
from qbench.errors import UserError

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


def _tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p / p.sum() - q / q.sum()).abs().sum())


def _write_mnist(root: Path, n_train: int = 12, n_test: int = 5, gz: bool = False) -> None:
    """A tiny MNIST-layout directory: random 28x28 uint8 images and labels 0..9."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        write_idx(root / f"{prefix}-images-idx3-ubyte{suffix}", images)
        write_idx(
            root / f"{prefix}-labels-idx1-ubyte{suffix}", (np.arange(n) % 10).astype(np.uint8)
        )


# --- digits ---------------------------------------------------------------------------------


def test_digits_shapes_classes_and_deterministic_split() -> None:
    d = real.load("digits")
    assert d.name == "digits" and d.num_classes == 10
    assert d.train.x.shape == (1437, 1, 8, 8) and d.test.x.shape == (360, 1, 8, 8)
    assert d.train.x.dtype == torch.float32 and d.train.y.dtype == torch.int64
    assert set(d.train.y.tolist()) == set(range(10)) == set(d.test.y.tolist())
    assert abs(d.train.x.mean().item()) < 1e-4 and abs(d.train.x.std().item() - 1) < 1e-3
    assert real.load("digits", root="/ignored") is d  # cached; root does not matter
    real._load.cache_clear()
    again = real.load("digits")
    assert again is not d
    assert torch.equal(again.test.y, d.test.y) and torch.equal(again.train.x, d.train.x)


# --- IDX ------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path: Path, suffix: str) -> None:
    images = np.random.default_rng(1).integers(0, 256, (7, 5, 3), dtype=np.uint8)
    labels = np.arange(7, dtype=np.uint8)
    write_idx(tmp_path / f"i{suffix}", images)
    write_idx(tmp_path / f"l{suffix}", labels)
    assert np.array_equal(read_idx(tmp_path / f"i{suffix}", magic=IMAGES_MAGIC), images)
    assert np.array_equal(read_idx(tmp_path / f"l{suffix}", magic=LABELS_MAGIC), labels)
    floats = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    write_idx(tmp_path / f"f{suffix}", floats)
    assert np.array_equal(read_idx(tmp_path / f"f{suffix}"), floats)
    if suffix:
        assert (tmp_path / "i.gz").read_bytes()[:2] == b"\x1f\x8b"  # really gzip


# Hand-made IDX files (the format as published with MNIST): a 4-byte magic 0x0000TTNN, big-endian
# (TT the element type: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E
# float64; NN the number of dimensions), NN big-endian uint32 sizes, then the elements,
# big-endian, in C order. Sizes above 255 and multi-byte elements tell the byte orders apart.
LABELS_258 = (
    b"\x00\x00\x08\x01"  # magic: uint8, 1 dimension
    + (258).to_bytes(4, "big")  # 00 00 01 02; little-endian it would read 0x02010000
    + bytes(range(256)) + b"\xfe\xff"
)  # fmt: skip
IMAGES_2X2X3 = (
    b"\x00\x00\x08\x03"  # magic: uint8, 3 dimensions
    + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x03"
    + bytes([0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255])
)  # fmt: skip
FLOATS_2X2 = (
    b"\x00\x00\x0d\x02"  # magic: float32, 2 dimensions
    + (2).to_bytes(4, "big") + (2).to_bytes(4, "big")
    + b"\x3f\x80\x00\x00"  # 1.0 (sign 0, exponent 127, mantissa 0)
    + b"\xc0\x00\x00\x00"  # -2.0
    + b"\x3e\x20\x00\x00"  # 0.15625 = 1.25 * 2^-3
    + b"\x00\x00\x00\x01"  # 2^-149, the smallest float32 denormal
)  # fmt: skip
INTS_AND_DOUBLES = {
    "int16": (b"\x00\x00\x0b\x01" + (3).to_bytes(4, "big") + b"\x01\x02\xff\xfe\x80\x00",
              np.array([258, -2, -32768], dtype=np.int16)),
    "int32": (b"\x00\x00\x0c\x01" + (2).to_bytes(4, "big") + b"\x00\x01\x00\x00\xff\xff\xff\xff",
              np.array([65536, -1], dtype=np.int32)),
    "float64": (b"\x00\x00\x0e\x01" + (1).to_bytes(4, "big") + b"\x3f\xf0" + b"\x00" * 6,
                np.array([1.0], dtype=np.float64)),
    "int8": (b"\x00\x00\x09\x01" + (2).to_bytes(4, "big") + b"\x7f\x80",
             np.array([127, -128], dtype=np.int8)),
}  # fmt: skip


@pytest.mark.parametrize("gz", [False, True])
def test_idx_reader_on_hand_made_big_endian_bytes(tmp_path: Path, gz: bool) -> None:
    def put(name: str, raw: bytes) -> Path:
        path = tmp_path / (name + (".gz" if gz else ""))
        path.write_bytes(gzip.compress(raw) if gz else raw)
        return path

    labels = read_idx(put("labels", LABELS_258), magic=LABELS_MAGIC)
    assert labels.shape == (258,) and labels.dtype == np.uint8
    assert labels[:3].tolist() == [0, 1, 2] and labels[-3:].tolist() == [255, 254, 255]
    images = read_idx(put("images", IMAGES_2X2X3), magic=IMAGES_MAGIC)
    assert images.tolist() == [[[0, 1, 2], [3, 4, 5]], [[250, 251, 252], [253, 254, 255]]]
    floats = read_idx(put("floats", FLOATS_2X2))
    assert floats.dtype == np.float32
    assert floats.tolist() == [[1.0, -2.0], [0.15625, 2.0**-149]]
    for name, (raw, want) in INTS_AND_DOUBLES.items():
        got = read_idx(put(name, raw))
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), name


def test_idx_writer_produces_the_hand_made_bytes(tmp_path: Path) -> None:
    """The writer's bytes, not just the round trip: a reader and writer that both switched
    to little-endian would still agree with each other, but not with these."""
    cases = {
        "labels": (np.concatenate([np.arange(256), [254, 255]]).astype(np.uint8), LABELS_258),
        "images": (np.array([0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255], dtype=np.uint8)
                   .reshape(2, 2, 3), IMAGES_2X2X3),
        "floats": (np.array([[1.0, -2.0], [0.15625, 2.0**-149]], dtype=np.float32), FLOATS_2X2),
        **{name: (array, raw) for name, (raw, array) in INTS_AND_DOUBLES.items()},
    }  # fmt: skip
    for name, (array, raw) in cases.items():
        write_idx(tmp_path / name, array)
        assert (tmp_path / name).read_bytes() == raw, name
    write_idx(tmp_path / "floats.gz", cases["floats"][0])
    assert gzip.decompress((tmp_path / "floats.gz").read_bytes()) == FLOATS_2X2


def _corrupt_files(tmp_path: Path) -> dict[str, tuple[Path, int]]:
    """Each bad file and the magic it is read with."""
    good = np.zeros((4, 3, 3), dtype=np.uint8)
    write_idx(tmp_path / "good", good)
    raw = (tmp_path / "good").read_bytes()
    cases = {
        "empty": b"",
        "bad magic": b"\x00\x00\x08\x02" + raw[4:],
        "truncated header": raw[:9],
        "truncated data": raw[:-1],
        "trailing bytes": raw + b"\x00",
    }
    out = {}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        out[name] = (tmp_path / name, IMAGES_MAGIC)
    (tmp_path / "labels-as-images").write_bytes(raw)
    out["labels-as-images"] = (tmp_path / "labels-as-images", LABELS_MAGIC)
    gz = gzip.compress(raw)
    (tmp_path / "truncated.gz").write_bytes(gz[: len(gz) // 2])
    (tmp_path / "not-gzip.gz").write_bytes(raw)
    out["truncated gzip"] = (tmp_path / "truncated.gz", IMAGES_MAGIC)
    out["not gzip"] = (tmp_path / "not-gzip.gz", IMAGES_MAGIC)
    return out


def test_corrupt_or_truncated_idx_is_value_error(tmp_path: Path) -> None:
    accepted = []
    for name, (path, magic) in _corrupt_files(tmp_path).items():
        try:
            read_idx(path, magic=magic)
            accepted.append(name)
        except ValueError as e:
            assert str(e).startswith(f"IDX file {path}:")
    assert accepted == []
    with pytest.raises(ValueError, match="not an IDX header"):
        (tmp_path / "nd0").write_bytes(b"\x00\x00\x08\x00")
        read_idx(tmp_path / "nd0")


def test_idx_header_and_size_errors_word_for_word(tmp_path: Path) -> None:
    """The format (big-endian): magic 0x0000TTNN (two zero bytes, type code, number of dims),
    then NN uint32 dims, then exactly prod(dims) items. Bytes written out here."""
    uint8_2x3 = b"\x00\x00\x08\x02" + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x03"
    cases = {
        "high-byte": (b"\x01\x00\x08\x01\x00\x00\x00\x00", "magic 0x01000801 is not an IDX header"),
        "bit-16": (b"\x00\x01\x08\x01\x00\x00\x00\x00", "magic 0x00010801 is not an IDX header"),
        "short": (uint8_2x3 + bytes(5), "truncated: dims [2, 3] need 6 data bytes, found 5"),
        "long": (uint8_2x3 + bytes(8), "trailing bytes: dims [2, 3] need 6 data bytes, found 8"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError) as err:
            read_idx(tmp_path / name)
        assert str(err.value) == f"IDX file {tmp_path / name}: {message}"
    # a header with a zero dimension and nothing after it is a valid empty array
    (tmp_path / "empty").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x00")
    empty = read_idx(tmp_path / "empty")
    assert empty.shape == (0,) and empty.dtype == np.uint8


def test_idx_writer_rejects_what_the_format_cannot_hold(tmp_path: Path) -> None:
    # IDX has element types u1 i1 i2 i4 f4 f8 only, and at least one dimension
    for array, what in [
        (np.zeros(3, dtype=np.int64), "dtype int64 with 1 dims"),
        (np.zeros(3, dtype=np.uint16), "dtype uint16 with 1 dims"),
        (np.array(7, dtype=np.uint8), "dtype uint8 with 0 dims"),
    ]:
        with pytest.raises(ValueError) as e:
            write_idx(tmp_path / "bad", array)
        assert str(e.value) == f"cannot write {what} as IDX"
    assert not (tmp_path / "bad").exists()


def test_mnist_layout_loads_plain_and_gz(tmp_path: Path) -> None:
    _write_mnist(tmp_path / "plain")
    _write_mnist(tmp_path / "gz", gz=True)
    a, b = real.load("mnist", tmp_path / "plain"), real.load("mnist", tmp_path / "gz")
    assert a.train.x.shape == (12, 1, 28, 28) and a.test.x.shape == (5, 1, 28, 28)
    assert a.num_classes == 10 and torch.equal(a.train.x, b.train.x)
    assert abs(a.train.x.mean().item()) < 1e-5


def test_corrupt_dataset_file_is_user_error(tmp_path: Path) -> None:
    _write_mnist(tmp_path)
    path = tmp_path / "t10k-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(UserError, match="t10k-labels-idx1-ubyte: truncated"):
        real.load("mnist", tmp_path)
    write_idx(path, np.zeros(4, dtype=np.uint8))  # 5 images, 4 labels
    with pytest.raises(UserError, match="5 images but t10k-labels-idx1-ubyte has 4 labels"):
        real.load("mnist", tmp_path)


# --- missing data, default roots ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("fashion-mnist", "train-images-idx3-ubyte[.gz]"),
        ("mnist", "train-images-idx3-ubyte[.gz]"),
        ("cifar10", "cifar-10-batches-py/"),
        ("imagenet", "train/"),
    ],
)
def test_missing_dataset_is_one_line_user_error(tmp_path: Path, name: str, expected: str) -> None:
    with pytest.raises(UserError) as e:
        real.load(name, tmp_path / "nothing")
    msg = str(e.value)
    assert "\n" not in msg and f"dataset {name}:" in msg
    assert f"no {expected} in {tmp_path / 'nothing'}" in msg and "QBENCH_DATA" in msg


def test_missing_label_file_is_named(tmp_path: Path) -> None:
    _write_mnist(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(UserError, match=r"no train-labels-idx1-ubyte\[\.gz\] in"):
        real.load("fashion-mnist", tmp_path)


def test_corrupt_cifar10_is_user_error(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"junk")
    with pytest.raises(UserError, match="incomplete or corrupted"):
        real.load("cifar10", tmp_path)


def test_default_roots(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("QBENCH_DATA", raising=False)
    assert real.default_root("fashion-mnist") == DEBIAN_FASHION
    assert real.default_root("mnist") == Path.home() / ".cache/qbench/data/mnist"
    assert real.default_root("cifar10") == Path.home() / ".cache/qbench/data/cifar10"
    monkeypatch.setenv("QBENCH_DATA", str(tmp_path))
    assert real.default_root("fashion-mnist") == tmp_path / "fashion-mnist"
    _write_mnist(tmp_path / "mnist")
    assert real.load("mnist").train.x.shape == (12, 1, 28, 28)
    with pytest.raises(UserError, match="unknown dataset 'svhn'"):
        real.load("svhn")


@pytest.mark.skipif(
    not (DEBIAN_FASHION / "train-images-idx3-ubyte.gz").exists()
    and not (DEBIAN_FASHION / "train-images-idx3-ubyte").exists(),
    reason=f"no Fashion-MNIST in {DEBIAN_FASHION} (apt-get install dataset-fashion-mnist)",
)
def test_fashion_mnist_from_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QBENCH_DATA", raising=False)
    d = real.load("fashion-mnist")
    assert d.train.x.shape == (60000, 1, 28, 28) and d.test.x.shape == (10000, 1, 28, 28)
    assert d.num_classes == 10
    assert torch.bincount(d.train.y).tolist() == [6000] * 10
    assert torch.bincount(d.test.y).tolist() == [1000] * 10


def test_imagenet_loader_on_fake_image_folder(tmp_path: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("val", 1)):
        for cls in ("ant", "bee"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / split / cls / f"{i}.png")
    d = real.load("imagenet", tmp_path)
    assert d.num_classes == 2
    assert d.train.x.shape == (6, 3, 224, 224) and d.test.x.shape == (2, 3, 224, 224)
    assert d.train.y.tolist() == [0, 0, 0, 1, 1, 1] and d.test.y.tolist() == [0, 1]


# --- conform --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(784,), (64,), (1, 28, 28), (3, 32, 32), (1, 8, 8), (192,)])
def test_conform_shapes(shape: tuple[int, ...]) -> None:
    digits = real.load("digits").test.x[:20]
    mnist_like = torch.randn(20, 1, 28, 28)
    cifar_like = torch.randn(20, 3, 32, 32)
    for x in (digits, mnist_like, cifar_like):
        out = real.conform(x, shape)
        assert out.shape == (20, *shape) and out.dtype == torch.float32
        assert torch.isfinite(out).all()


def test_conform_details() -> None:
    x = torch.randn(4, 1, 28, 28)
    assert real.conform(x, (784,)).data_ptr() == x.data_ptr()  # exact fit: a view
    padded = real.conform(x, (3, 32, 32))
    assert torch.equal(padded[:, 0, 2:30, 2:30], x[:, 0]) and torch.equal(
        padded[:, 0], padded[:, 2]
    )
    corner = padded[:, :, 0, 0]
    assert torch.equal(corner, x.amin(dim=(1, 2, 3))[:, None].expand(4, 3))
    flat = torch.randn(4, 10)
    assert real.conform(flat, (10,)) is flat
    for bad in [(3, 5, 5, 5), (783,), (2, 8, 8)]:
        with pytest.raises(ValueError, match="cannot conform"):
            real.conform(torch.randn(2, 3, 8, 8), bad)
    assert real.conform(torch.randn(0, 1, 8, 8), (784,)).shape == (0, 784)


# --- partition ------------------------------------------------------------------------------


def _labels(n: int = 5003, classes: int = 10) -> torch.Tensor:
    return torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("skew", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("world_size", [1, 3, 8])
def test_partition_disjoint_equal_and_covering(skew: float, world_size: int) -> None:
    labels = _labels()
    parts = [partition(labels, world_size, r, skew=skew, seed=3) for r in range(world_size)]
    assert all(p.dtype == torch.int64 for p in parts)
    assert len({len(p) for p in parts}) == 1
    everything = torch.cat(parts)
    assert len(everything.unique()) == len(everything)  # disjoint
    assert len(labels) - len(everything) < world_size
    assert everything.min() >= 0 and everything.max() < len(labels)
    again = [partition(labels, world_size, r, skew=skew, seed=3) for r in range(world_size)]
    assert all(torch.equal(a, b) for a, b in zip(parts, again, strict=True))


def test_partition_depends_on_seed_and_validates() -> None:
    labels = _labels()
    assert not torch.equal(partition(labels, 4, 0, seed=0), partition(labels, 4, 0, seed=1))
    for kwargs in ({"skew": -0.1}, {"skew": 1.5}):
        with pytest.raises(ValueError, match="skew"):
            partition(labels, 4, 0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank 4"):
        partition(labels, 4, 4)


def test_iid_partition_matches_global_distribution() -> None:
    labels = _labels(20000)
    glob = torch.bincount(labels, minlength=10).double()
    for r in range(4):
        mine = torch.bincount(labels[partition(labels, 4, r)], minlength=10).double()
        assert _tv(mine, glob) < 0.03


@pytest.mark.parametrize("world_size", [3, 4, 8, 16])
def test_fully_skewed_ranks_hold_few_classes(world_size: int) -> None:
    labels = _labels()
    hist = label_histogram(labels, world_size, 1.0, 0)
    limit = math.ceil(10 / world_size) + 1
    assert ((hist > 0).sum(dim=1) <= limit).all()
    assert skew_measure(hist) == pytest.approx(1.0)


def test_skew_measure_monotone_in_requested_skew() -> None:
    labels = real.load("digits").train.y
    measures = [skew_measure(label_histogram(labels, 4, s, 0)) for s in (0.0, 0.4, 0.8, 1.0)]
    assert measures == sorted(measures) and len(set(measures)) == 4
    assert measures[0] < 0.1 and measures[-1] == pytest.approx(1.0)
    for got, want in zip(measures[1:3], (0.4, 0.8), strict=True):
        assert abs(got - want) < 0.1  # the measure tracks the requested skew


def test_skew_measure_edge_cases() -> None:
    assert skew_measure(torch.tensor([[5, 5], [5, 5]])) == 0.0
    assert skew_measure(torch.tensor([[10, 0], [0, 10]])) == pytest.approx(1.0)
    assert skew_measure(torch.tensor([[7, 3]])) == 0.0  # one rank
    assert skew_measure(torch.tensor([[4], [4]])) == 0.0  # one class
