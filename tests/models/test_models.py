"""The model zoo: registry, parameter counts, FLOPs, model parameters, synthetic data."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from qbench import data, models
from qbench.errors import UserError
from qbench.models import cache, synthetic

IMAGENET = ("alexnet", "vgg16", "vgg19", "resnet50", "resnet152", "bninception", "googlenet")
SMALL = (
    *("resnet20", "resnet110", "vgg16-cifar", "lstm", "gpt", "logreg", "mlp", "cnn"),
    "synthetic",
)

# torchvision's published counts (weights=None builds the same architecture), and ours.
COUNTS = {
    "alexnet": 61_100_840,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "resnet50": 25_557_032,
    "resnet152": 60_192_808,
    "googlenet": 6_624_904,  # without the auxiliary classifiers
    "bninception": 11_285_224,  # seed 002: "11M"
    "resnet20": 272_474,  # He et al. 2016: 0.27M
    "cnn": 431_080,  # conv 520 + conv 25,050 + fc 400,500 + fc 5,010
    "resnet110": 1_730_714,  # He et al. 2016: 1.7M
    "vgg16-cifar": 15_253_578,
    "lstm": 19_780_400,  # Zaremba et al. medium: ~20M
    "gpt": 834_304,  # 4 blocks of 12 w^2 + 13 w, (256 + 64) w embeddings, 2 w final LN; w = 128
    "logreg": 7_850,
    "mlp": 327_880,
}


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measure for real: a stale ~/.cache entry must not hide a wrong count."""
    monkeypatch.setenv("QBENCH_NO_CACHE", "1")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Like a CPU rank (worker.py): tiny models are many times slower with threads contending."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_zoo_lists_every_workload() -> None:
    assert set(models.names()) == {*IMAGENET, *SMALL}
    assert list(models.MODELS) == models.names()
    for name, m in models.MODELS.items():
        assert m.name == name and m.description and m.source
        assert models.get(name) == m == models.info(name) == models.info(name, {})


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_parameter_counts(name: str) -> None:
    assert models.parameter_count(name) == COUNTS[name]


def test_imagenet_and_cifar_shapes() -> None:
    for name in IMAGENET:
        m = models.get(name)
        assert (m.input_shape, m.num_classes, m.input_dtype) == ((3, 224, 224), 1000, torch.float32)
    for name in ("resnet20", "resnet110", "vgg16-cifar"):
        assert models.get(name).input_shape == (3, 32, 32)
        assert models.get(name).num_classes == 10


@pytest.mark.parametrize("name", IMAGENET)
def test_imagenet_forward_on_meta(name: str) -> None:
    """Shapes only (no arithmetic): the full-size forward is in the slow set."""
    with torch.device("meta"):
        model = models.build(name)
    assert model(torch.empty(2, 3, 224, 224, device="meta")).shape == (2, 1000)


def test_flops_match_known_values() -> None:
    # FlopCounterMode counts 2 FLOPs per multiply-add: ResNet-50 is 4.1 GMACs, AlexNet 0.71.
    assert models.flops_per_sample("resnet50") / 1e9 == pytest.approx(8.18, rel=0.01)
    assert models.flops_per_sample("alexnet") / 1e9 == pytest.approx(1.43, rel=0.01)
    assert models.flops_per_sample("logreg") == 2 * 784 * 10
    assert models.flops_per_sample("mlp") == 2 * (784 * 392 + 392 * 50 + 50 * 10)


def _forward_backward(name: str, params: dict | None = None, batch: int = 2) -> None:
    torch.manual_seed(0)
    m = models.info(name, params)
    model = models.build(name, params)
    src = data.make("synthetic", m, batch, seed=0, rank=0, device=torch.device("cpu"))
    x, y = src.batch(0)
    out = model(x)
    assert out.shape == (*y.shape, m.num_classes)  # gpt: a class per position, (batch, seq)
    assert y.shape[0] == batch
    nn.CrossEntropyLoss()(out.reshape(-1, m.num_classes), y.reshape(-1)).backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", SMALL)
def test_small_models_train_step(name: str) -> None:
    _forward_backward(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", IMAGENET)
def test_imagenet_models_train_step(name: str) -> None:
    _forward_backward(name, batch=1 if name.startswith("vgg") else 2)


def test_resnet_depths() -> None:
    assert abs(models.parameter_count("resnet20") - 0.27e6) < 0.01e6
    assert abs(models.parameter_count("resnet110") - 1.7e6) < 0.05e6


def test_lstm_takes_tokens() -> None:
    m = models.get("lstm")
    assert m.input_dtype == torch.int64 and m.vocab_size == 10_000 == m.num_classes
    assert m.input_shape == (35,)
    small = {"vocab": 100, "hidden": 32, "layers": 1, "seq_len": 5, "dropout": 0}
    s = models.info("lstm", small)
    assert (s.input_shape, s.num_classes, s.vocab_size) == ((5,), 100, 100)
    assert s.params == {"vocab": 100, "hidden": 32, "layers": 1, "seq_len": 5, "dropout": 0.0}
    model = models.build("lstm", small)
    assert model(torch.randint(0, 100, (3, 5))).shape == (3, 100)
    assert models.parameter_count("lstm", small) == 100 * 32 + 4 * (2 * 32 * 32 + 2 * 32) + 3300
    with pytest.raises((RuntimeError, IndexError)):
        model(torch.randn(3, 5))  # float input is not tokens
    # seed 002's speech LSTM is ~13M parameters
    n = models.parameter_count("lstm", {"layers": 3, "hidden": 600, "vocab": 4000})
    assert 13e6 < n < 14e6


@pytest.mark.parametrize("params", [10_000, 12_345, 50_000, 10**6, 10**7, 25_000_000, 10**8])
@pytest.mark.parametrize("ratio", [1.0, 1.5, 5, 50])  # gflops as a multiple of the least
def test_synthetic_layout_hits_targets(params: int, ratio: float) -> None:
    gflops = synthetic.min_gflops(params) * ratio
    lay = synthetic.plan(params, gflops)
    assert lay.parameters == pytest.approx(params, rel=0.05)
    assert lay.flops / 1e9 == pytest.approx(gflops, rel=0.10)
    assert lay.steps >= lay.layers >= 1


@pytest.mark.parametrize(
    ("params", "gflops"), [("25M", 0.5), (10**6, 0.01), ("200k", 0.0005), ("2.5M", 0.005)]
)
def test_synthetic_model_measured(params: object, gflops: float) -> None:
    p = {"params": params, "gflops": gflops}
    target = models.check_params("synthetic", p)["params"]
    assert models.parameter_count("synthetic", p) == pytest.approx(target, rel=0.05)
    assert models.flops_per_sample("synthetic", p) / 1e9 == pytest.approx(gflops, rel=0.10)
    lay = synthetic.plan(target, gflops)
    assert models.parameter_count("synthetic", p) == lay.parameters  # the docstring's formula
    assert models.flops_per_sample("synthetic", p) == lay.flops
    assert models.info("synthetic", p).input_shape == (lay.width,)


def test_synthetic_defaults_and_width() -> None:
    d = models.check_params("synthetic", {})
    assert d == {"params": 10_000_000, "gflops": 0.1, "width": None}
    assert models.parameter_count("synthetic") == pytest.approx(10e6, rel=0.05)
    assert models.flops_per_sample("synthetic") / 1e9 == pytest.approx(0.1, rel=0.1)
    w = models.check_params("synthetic", {"params": "4M", "width": 512})
    lay = synthetic.plan(w["params"], w["gflops"], w["width"])
    assert lay.width == 512 and lay.parameters == pytest.approx(4e6, rel=0.05)
    assert models.info("synthetic", {"params": "4M", "width": "512"}).input_shape == (512,)


def test_synthetic_gradients_stay_bounded() -> None:
    """Many weight-shared steps: activations and gradients neither explode nor vanish."""
    torch.manual_seed(0)
    p = {"params": "100k", "gflops": 0.02}  # ~100 steps through few layers
    model = models.build("synthetic", p)
    m = models.info("synthetic", p)
    x = torch.randn(8, *m.input_shape)
    out = model(x)
    assert torch.isfinite(out).all() and out.abs().max() < 100
    out.square().mean().backward()
    g = torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None])
    assert torch.isfinite(g).all() and 0 < g.norm() < 1e4


@pytest.mark.parametrize(
    ("name", "params", "words"),
    [
        ("synthetic", {"params": "abc"}, ["params", "'abc'", "25M"]),
        ("synthetic", {"params": True}, ["params", "True"]),
        ("synthetic", {"params": 10}, ["params", "10", "10,000"]),
        ("synthetic", {"gflops": -1}, ["gflops", "-1", "> 0"]),
        ("synthetic", {"gflops": "fast"}, ["gflops", "'fast'"]),
        ("synthetic", {"params": "1G", "gflops": 0.1}, ["gflops", "at least 2", "0.1"]),
        ("synthetic", {"params": "1M", "width": 4096}, ["width", "4096", "auto"]),
        ("synthetic", {"width": 0}, ["width", "0", "auto"]),
        ("synthetic", {"parms": "25M"}, ["'parms'", "did you mean 'params'", "valid"]),
        ("lstm", {"dropout": 1.5}, ["dropout", "1.5", "[0, 1)"]),
        ("lstm", {"layers": 0}, ["layers", "0"]),
        ("lstm", {"vocab": 2.5}, ["vocab", "2.5"]),
        ("resnet50", {"params": "25M"}, ["resnet50", "no parameters", "'params'", "synthetic"]),
        ("mlp", {"depth": 3}, ["mlp", "no parameters", "depth"]),
        ("synthetic", ["25M"], ["synthetic", "mapping", "'25M'"]),
        ("resnet99", {}, ["unknown model", "'resnet99'", "resnet50"]),
    ],
)
def test_check_params_errors_are_one_line(name: str, params: object, words: list[str]) -> None:
    with pytest.raises(UserError) as exc:
        models.check_params(name, params)  # type: ignore[arg-type]
    msg = str(exc.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)
    with pytest.raises(UserError):  # the other entry points validate the same way
        models.info(name, params)  # type: ignore[arg-type]


def test_check_params_normalises() -> None:
    assert models.check_params("resnet50", {}) == {}
    assert models.check_params("resnet50", None) == {}
    cases = [("25M", 25_000_000), (25e6, 25_000_000), ("2.5M", 2_500_000), ("12.5k", 12_500),
             ("1,000,000", 10**6), ("25_000_000", 25_000_000), ("1e6", 10**6),
             (" 3 m ", 3_000_000), (40960, 40960)]  # fmt: skip
    for raw, n in cases:
        assert models.check_params("synthetic", {"params": raw})["params"] == n, raw
    p = models.check_params("synthetic", {"params": "25M", "gflops": "0.5"})
    assert p == {"params": 25_000_000, "gflops": 0.5, "width": None}
    json.dumps(p)  # goes into run.json as is
    assert models.check_params("lstm", {"vocab": "10k"})["vocab"] == 10_000
    # equal resolved parameters share one model description
    assert models.info("synthetic", {"params": "10M"}) is models.info("synthetic")


def test_parameters_change_the_model() -> None:
    small = {"params": "1M", "gflops": 0.01}
    assert models.parameter_count("synthetic", small) == pytest.approx(1e6, rel=0.05)
    assert models.parameter_count("synthetic") == pytest.approx(10e6, rel=0.05)
    assert models.info("synthetic", small).params["params"] == 1_000_000
    built = models.build("synthetic", small)
    assert sum(p.numel() for p in built.parameters()) == models.parameter_count("synthetic", small)


@pytest.mark.parametrize("name", models.names())
def test_synthetic_data_matches_the_model(name: str) -> None:
    m = models.get(name)
    src = data.make("synthetic", m, 2, seed=1, rank=0, device=torch.device("cpu"))
    for i in range(len(src.inputs)):
        x, y = src.batch(i)
        assert x.shape == (2, *m.input_shape) and x.dtype == m.input_dtype
        per_token = m.batch is not None  # gpt: the next token at every position
        assert y.shape == ((2, *m.input_shape) if per_token else (2,)) and y.dtype == torch.int64
        assert int(y.min()) >= 0 and int(y.max()) < m.num_classes
        if not m.input_dtype.is_floating_point:
            assert int(x.min()) >= 0 and int(x.max()) < m.vocab_size


def test_float_data_unchanged_for_small_inputs() -> None:
    """Earlier results stay reproducible: the MLP/ResNet-20 data is what it always was."""
    m = models.get("mlp")
    src = data.make("synthetic", m, 4, seed=3, rank=1, device=torch.device("cpu"))
    teacher = torch.randn(784, 10, generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3 * 1000003 + 1 + 1)
    x = torch.randn(4, 784, generator=gen)
    assert torch.equal(src.inputs[0], x)
    assert torch.equal(src.labels[0], (x @ teacher).argmax(1))


def test_token_labels_are_a_bigram_function() -> None:
    m = models.info("lstm", {"vocab": 50, "seq_len": 4})
    a = data.make("synthetic", m, 64, seed=0, rank=0, device=torch.device("cpu"))
    b = data.make("synthetic", m, 64, seed=0, rank=1, device=torch.device("cpu"))
    assert not torch.equal(a.inputs[0], b.inputs[0])  # ranks see different data
    seen: dict[int, int] = {}
    for src in (a, b):
        for x, y in zip(src.inputs, src.labels, strict=True):
            for last, label in zip(x[:, -1].tolist(), y.tolist(), strict=True):
                assert seen.setdefault(last, label) == label  # same teacher on every rank


@pytest.mark.parametrize(
    ("name", "params", "steps", "lr"),
    [
        ("logreg", None, 60, 0.5),
        ("mlp", None, 60, 0.2),
        ("lstm", {"vocab": 20, "hidden": 32, "layers": 1, "seq_len": 3, "dropout": 0}, 80, 1.0),
        ("synthetic", {"params": "20k", "gflops": 0.0001}, 60, 0.2),
    ],
)
def test_training_reduces_loss(name: str, params: dict | None, steps: int, lr: float) -> None:
    torch.manual_seed(0)
    m = models.info(name, params)
    model = models.build(name, params)
    src = data.make("synthetic", m, 64, seed=0, rank=0, device=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def mean_loss() -> float:
        with torch.no_grad():
            pairs = zip(src.inputs, src.labels, strict=True)
            return sum(loss_fn(model(x), y).item() for x, y in pairs) / len(src.inputs)

    before = mean_loss()
    for i in range(steps):
        x, y = src.batch(i)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    after = mean_loss()
    assert math.isfinite(after) and after < 0.7 * before, (before, after)


def test_disk_cache_roundtrip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QBENCH_NO_CACHE", "0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cache, "_memory", None)
    assert cache.get("k", "flops") is None
    cache.put("k", "flops", 1.5)
    cache.put("k", "numel", 7)
    monkeypatch.setattr(cache, "_memory", None)  # as a new process would
    assert cache.get("k", "flops") == 1.5 and cache.get("k", "numel") == 7
    doc = json.loads(cache.path().read_text())
    assert doc["version"] == cache.version()
    doc["version"] = "stale"
    cache.path().write_text(json.dumps(doc))
    monkeypatch.setattr(cache, "_memory", None)
    assert cache.get("k", "flops") is None  # other torch/torchvision/model code: start afresh


def test_console_lists_the_zoo(capsys: pytest.CaptureFixture[str]) -> None:
    from qbench.cli import info

    info.show_models()
    text = capsys.readouterr().out
    for name in models.names():
        assert name in text
    assert "61.1M" in text and "25.6M" in text  # alexnet, resnet50
