"""The user's own workload: model and dataset factories by import path, optimizers, losses.

The planner checks spellings without importing anything; the driver's pre-run check imports and
calls each factory once and says in one line what is wrong; the ranks build the same things.
Expected values are written from definitions: parameter counts of nn.Linear (in x out + out),
FLOPs 2 per multiply-add, cross entropy and MSE by hand, partitions from their sizes.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from qbench.data import factory
from qbench.errors import UserError
from qbench.run import workload
from qbench.run.loops import epochs
from qbench.spec import matrix, scenario
from tests import invoke
from tests.invoke import qbench

_COUNTER = itertools.count()


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Write a module into the current directory (a fresh name each time); returns its name."""
    monkeypatch.chdir(tmp_path)

    def write(source: str) -> str:
        name = f"userwl_{next(_COUNTER)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


NETS = """
    import torch
    from torch import nn
    from qbench.models import Workload

    def linear(inputs=6, classes=3):
        return nn.Linear(inputs, classes)

    def described():
        return Workload(nn.Linear(4, 2), input_shape=[4], num_classes=2)

    def tokens(vocab=11, seq=5):
        class Tiny(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(vocab, 8)
                self.out = nn.Linear(8, vocab)
            def forward(self, x):
                return self.out(self.emb(x))  # (N, T, V): a next-token model
        def batch(n, gen):
            x = torch.randint(0, vocab, (n, seq), generator=gen)
            return x, torch.roll(x, -1, dims=1)
        return Workload(Tiny(), batch=batch)

    def broken(width=1):
        raise RuntimeError("no GPU here")

    def not_a_model():
        return {"model": 1}

    def splits(n=40, test=True):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, 6, generator=g)
        y = torch.arange(n) % 3
        train = torch.utils.data.TensorDataset(x, y)
        return (train, torch.utils.data.TensorDataset(x[:10], y[:10])) if test else train

    def not_data():
        return 5
"""


def _runs(text: str) -> list[matrix.RunSpec]:
    return matrix.expand(scenario.loads("name: w\nworld_size: 2\n" + text)).runs


# -- the planner: spellings, run ids ------------------------------------------------------------
def test_a_factory_model_is_labelled_by_its_function_and_keeps_its_spec() -> None:
    (run,) = _runs(
        "model: {factory: 'torchvision.models:mobilenet_v3_small', params: {weights: null},"
        " input_shape: [3, 64, 64], num_classes: 10}\n"
    )
    assert run.workload.model == "mobilenet_v3_small"
    assert run.workload.factory == {
        "factory": "torchvision.models:mobilenet_v3_small", "params": {"weights": None},
        "input_shape": [3, 64, 64], "num_classes": 10, "vocab_size": None,
        "input_dtype": "float32",
    }  # fmt: skip
    assert run.run_id.startswith("mobilenet_v3_small-gloo-allreduce-fp32-w2-")
    (named,) = _runs("model: {factory: 'a.b:c', name: mine, input_shape: [3], num_classes: 2}\n")
    assert named.workload.model == "mine"


def test_existing_scenarios_keep_their_run_ids() -> None:
    # ids written before model/dataset factories, optimizer: and loss: existed
    base = "model: mlp\niterations: 3\nwarmup: 1\n"
    ids = {r.run_id for r in _runs(base + "compressor: [none, {name: qsgd, bits: 4}]\n")}
    assert ids == {"mlp-gloo-allreduce-fp32-w2-2d67a70b06",
                   "mlp-gloo-reduce-broadcast-qsgd-4b-b512-w2-9f091a3ad2"}  # fmt: skip
    # spelling out the default optimizer and loss changes nothing
    (same,) = _runs(base + "optimizer: momentum\nloss: cross-entropy\n")
    assert same.run_id == "mlp-gloo-allreduce-fp32-w2-2d67a70b06"
    (sgd,) = _runs(base + "optimizer: sgd\n")
    assert sgd.run_id == "mlp-gloo-allreduce-fp32-w2-80111df118"  # as `momentum: 0` was
    assert sgd.workload.momentum == 0.0


def test_optimizers_take_the_scenario_keys_unless_they_set_their_own() -> None:
    (adam,) = _runs("model: mlp\nlr: 0.01\noptimizer: adam\n")
    assert (adam.workload.lr, adam.workload.weight_decay, adam.workload.momentum) == (
        0.01,
        0.0,
        0.0,
    )
    assert adam.workload.optimizer == {"name": "adam", "betas": [0.9, 0.999], "eps": 1e-8,
                              "amsgrad": False}  # fmt: skip
    (own,) = _runs("model: mlp\nlr: 0.01\noptimizer: {name: adamw, lr: 0.002}\n")
    assert (own.workload.lr, own.workload.weight_decay) == (
        0.002,
        0.01,
    )  # adamw's own default decay
    (nest,) = _runs("model: mlp\nmomentum: 0.5\noptimizer: nesterov\n")
    assert (nest.workload.momentum, nest.workload.optimizer) == (0.5, {"name": "nesterov"})
    assert nest.labels()["optimizer"] == "nesterov"


@pytest.mark.parametrize(
    ("text", "message"),
    [("model: {factory: mypkg.nets}", "model factory 'mypkg.nets' is not an import path; write "
      "`module.name:attribute`, e.g. `mypkg.nets:build`"),
     ("model: {factory: 'a:b', input_shape: [3, 0]}", "model factory 'a:b': input_shape must be "
      "a list of positive sizes without the batch, got [3, 0]; e.g. `input_shape: [3, 32, 32]`"),
     ("model: {factory: 'a:b', imput_shape: [3]}", "model factory: unknown key 'imput_shape' "
      "(did you mean 'input_shape'?)"),
     ("model: {factory: 'a:b', params: [1]}", "model factory 'a:b': params must be a mapping"),
     ("model: mlp\ndataset: {factory: 'a:b', split: test}", "dataset factory: unknown key "
      "'split'"),
     ("model: mlp\ndataset: {name: digits}", "dataset must be str, got {'name': 'digits'}"),
     ("model: mlp\noptimizer: adamm",
      "unknown optimizer 'adamm' (did you mean 'adam'?); valid: adam"),
     ("model: mlp\nmomentum: 0.5\noptimizer: adam", "optimizer adam has no momentum (it takes "
      "amsgrad, betas, eps, lr, weight_decay); remove the scenario's `momentum:`"),
     ("model: mlp\noptimizer: {name: adam, betas: [0.9]}", "optimizer adam: betas must be two "
      "numbers in [0, 1)"),
     ("model: mlp\noptimizer: {name: nesterov, momentum: 0}", "optimizer nesterov needs "
      "momentum > 0"),
     ("model: mlp\nloss: hinge", "unknown loss 'hinge'; valid: bce-logits, cross-entropy, l1"),
     ("model: mlp\nloss: {name: cross-entropy, label_smoothing: 1}", "loss cross-entropy: "
      "label_smoothing must be a number in [0, 1), got 1")],
)  # fmt: skip
def test_planner_errors_are_one_line_naming_the_value(text: str, message: str) -> None:
    with pytest.raises(UserError) as e:
        _runs(text + "\n")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_async_ps_is_excluded_with_another_optimizer() -> None:
    m = matrix.expand(scenario.loads(
        "name: w\nmodel: mlp\nworld_size: 2\nscheme: [async-ps, allreduce]\noptimizer: adam\n"
    ))  # fmt: skip
    assert [r.method.scheme.name for r in m.runs] == ["allreduce"]
    assert "optimizer adam cannot apply" in m.excluded[0].reason


# -- the pre-run check: one line naming the factory -----------------------------------------------
def _preflight(text: str) -> None:
    workload.preflight(_runs(text))


def test_good_factories_pass_the_check(module: Any) -> None:
    m = module(NETS)
    _preflight(f"model: {{factory: '{m}:linear', input_shape: [6], num_classes: 3}}\n")
    _preflight(f"model: {{factory: '{m}:described'}}\n")
    _preflight(f"model: {{factory: '{m}:tokens'}}\n")
    _preflight(f"model: {{factory: '{m}:linear'}}\ndataset: {{factory: '{m}:splits'}}\n")
    _preflight("model: mlp\nloss: {factory: 'torch.nn:CrossEntropyLoss'}\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [("model: {factory: 'M:broken', input_shape: [6], num_classes: 3}",
      "model factory 'M:broken' raised RuntimeError: no GPU here; check its params"),
     ("model: {factory: 'M:not_a_model'}", "model factory 'M:not_a_model' returned dict; expected "
      "a torch.nn.Module or qbench.models.Workload(model, input_shape=..., num_classes=...)"),
     ("model: {factory: 'M:linear'}", "model factory 'M:linear' describes no input: give "
      "input_shape and num_classes in the scenario"),
     ("model: {factory: 'M:nothere', input_shape: [6], num_classes: 3}",
      "model factory 'M:nothere': module M has no attribute 'nothere'"),
     ("model: {factory: 'nopkg_zz.nets:build', input_shape: [6], num_classes: 3}",
      "model factory 'nopkg_zz.nets:build' cannot be imported (ModuleNotFoundError: No module "
      "named 'nopkg_zz'); install its package or run from the directory that holds nopkg_zz"),
     ("model: {factory: 'M:linear', input_shape: [5], num_classes: 3}",
      "model factory 'M:linear': one forward pass and the loss on 2 samples of shape (5,) failed "
      "(RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
     ("model: {factory: 'M:linear', input_shape: [6], num_classes: 3}\nloss: mse",
      "failed (ValueError: targets of shape (2,) do not match outputs of shape (2, 3))"),
     ("model: {factory: 'M:linear'}\ndataset: {factory: 'M:not_data'}",
      "dataset factory 'M:not_data' returned int; expected a torch Dataset of (input, target) "
      "pairs, a (train, test) pair of them, or {'train': ..., 'test': ...}"),
     ("model: {factory: 'M:linear'}\ndataset: {factory: 'M:splits', params: {test: false}}\n"
      "epochs: 1", "dataset factory 'M:splits': accuracy mode (epochs) evaluates on a test split"),
     ("model: mlp\nloss: {factory: 'M:not_data'}", "loss factory 'M:not_data' returned int; "
      "expected a function (output, target) -> loss"),
     ],
)  # fmt: skip
def test_bad_factories_are_one_line_naming_them(module: Any, text: str, message: str) -> None:
    m = module(NETS)
    with pytest.raises(UserError) as e:
        _preflight(text.replace("M:", f"{m}:").replace("module M ", f"module {m} ") + "\n")
    got = str(e.value)
    assert message.replace("M:", f"{m}:").replace("module M ", f"module {m} ") in got
    assert "\n" not in got


def test_the_cli_stops_before_any_run_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "nets_cli.py").write_text("def build():\n    return 42\n")
    (tmp_path / "s.yaml").write_text(
        "name: bad\nmodel: {factory: 'nets_cli:build', input_shape: [4], num_classes: 2}\n"
        "world_size: 1\n"
    )
    proc = qbench("sweep", "s.yaml", "--out", "res", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (
        "qbench: error: model factory 'nets_cli:build' returned int; expected a torch.nn.Module "
        "or qbench.models.Workload(model, input_shape=..., num_classes=...)\n"
    )
    assert not (tmp_path / "res").exists()
    dry = qbench("sweep", "s.yaml", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and "does not import model, dataset or loss factories" in dry.stderr


# -- what the ranks build ------------------------------------------------------------------------
def test_zoo_models_and_factories_come_out_the_same_way(module: Any) -> None:
    m = module(NETS)
    (zoo_run,) = _runs("model: logreg\n")
    info, net = workload.model(zoo_run)
    assert (info.input_shape, info.num_classes, type(net)) == ((784,), 10, nn.Linear)
    (run,) = _runs(f"model: {{factory: '{m}:linear', params: {{inputs: 5}}, input_shape: [5],"
                   " num_classes: 3}\n")  # fmt: skip
    info, net = workload.model(run)
    assert (info.name, info.input_shape, info.num_classes) == ("linear", (5,), 3)
    assert isinstance(net, nn.Linear) and net.in_features == 5
    assert isinstance(info.build(), nn.Linear)  # a fresh one


def test_model_stats_count_parameters_and_flops_of_a_factory(module: Any) -> None:
    m = module(NETS)
    (run,) = _runs(f"model: {{factory: '{m}:linear', input_shape: [6], num_classes: 3}}\n")
    stats = workload.model_stats(run)
    assert stats["numel"] == 6 * 3 + 3
    assert stats["gflops_per_sample"] == pytest.approx(2 * 6 * 3 / 1e9, rel=1e-9)
    (tokens,) = _runs(f"model: {{factory: '{m}:tokens'}}\n")
    stats = workload.model_stats(tokens)
    assert stats["numel"] == 11 * 8 + 8 * 11 + 11
    assert stats["gflops_per_sample"] == pytest.approx(2 * 5 * 8 * 11 / 1e9, rel=1e-9)


def test_a_batch_function_makes_each_ranks_synthetic_data(module: Any) -> None:
    from qbench import data

    m = module(NETS)
    (run,) = _runs(f"model: {{factory: '{m}:tokens'}}\n")
    info, _ = workload.model(run)
    cpu = torch.device("cpu")
    r0 = data.make("synthetic", info, 4, seed=0, rank=0, device=cpu).batch(0)
    r1 = data.make("synthetic", info, 4, seed=0, rank=1, device=cpu).batch(0)
    assert r0[0].shape == (4, 5) and r0[0].dtype == torch.int64
    assert torch.equal(r0[1], torch.roll(r0[0], -1, dims=1))
    assert not torch.equal(r0[0], r1[0])


def test_losses_follow_their_definitions() -> None:
    out = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    y = torch.tensor([0, 2])
    (run,) = _runs("model: mlp\n")
    ce = -(math.log(math.exp(2) / (math.exp(2) + 2)) + math.log(1 / (math.e + 2))) / 2
    assert float(workload.loss(run)(out, y)) == pytest.approx(ce, rel=1e-6)
    seq = workload.loss(run)(out.reshape(1, 2, 3), y.reshape(1, 2))  # (N, T, C), (N, T)
    assert float(seq) == pytest.approx(ce, rel=1e-6)
    (mse,) = _runs("model: mlp\nloss: mse\n")
    got = workload.loss(mse)(torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0]))
    assert float(got) == pytest.approx((1 + 4) / 2)
    (smooth,) = _runs("model: mlp\nloss: {name: cross-entropy, label_smoothing: 0.5}\n")
    flat = torch.zeros(1, 2)  # uniform scores: smoothing changes nothing, log 2 either way
    assert float(workload.loss(smooth)(flat, torch.tensor([1]))) == pytest.approx(math.log(2))


def test_optimizers_are_built_as_named() -> None:
    net = nn.Linear(2, 1)
    (adamw,) = _runs("model: mlp\noptimizer: {name: adamw, betas: [0.8, 0.9], eps: 0.001}\n")
    opt = workload.optimizer(net.parameters(), adamw)
    group = opt.param_groups[0]
    assert isinstance(opt, torch.optim.AdamW)
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (
        0.001, (0.8, 0.9), 0.001, 0.01)  # fmt: skip
    (nest,) = _runs("model: mlp\noptimizer: nesterov\n")
    sgd = workload.optimizer(net.parameters(), nest)
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["nesterov"] is True


def test_dataset_factories_are_partitioned_like_built_in_data(module: Any) -> None:
    m = module(NETS)
    (run,) = _runs(f"model: {{factory: '{m}:linear', input_shape: [6], num_classes: 3}}\n"
                   f"dataset: {{factory: '{m}:splits'}}\n")  # fmt: skip
    info, _ = workload.model(run)
    cpu = torch.device("cpu")
    parts = [workload.epoch_data(run, info, world_size=2, rank=r, device=cpu) for r in (0, 1)]
    assert [len(p.train_y) for p in parts] == [20, 20]  # 40 samples, equal halves
    seen = torch.cat([p.train_x for p in parts])
    assert len({tuple(row.tolist()) for row in seen}) == 40  # disjoint, together all of them
    assert [len(p.test_y) for p in parts] == [5, 5]  # a strided share of the 10 test samples
    assert parts[0].num_classes == 3


def test_dataset_factory_labels_come_from_targets_when_there(module: Any) -> None:
    class Targets(torch.utils.data.Dataset[Any]):
        targets: ClassVar[list[int]] = [1, 0, 1]

        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> Any:
            raise AssertionError("labels must not read samples when targets exist")

    assert factory.labels(Targets()).tolist() == [1, 0, 1]


def test_evaluation_with_a_regression_loss_has_no_top1() -> None:
    class Local:
        world_size, rank, bytes_sent = 1, 0, 0

        def allreduce_(self, t: torch.Tensor, op: str = "sum") -> None:
            return None

    data = epochs.EpochData(
        train_x=torch.zeros(0, 1), train_y=torch.zeros(0), test_x=torch.tensor([[1.0], [2.0]]),
        test_y=torch.tensor([1.0, 0.0]), num_classes=0,
    )  # fmt: skip
    net = nn.Linear(1, 1, bias=False)
    nn.init.ones_(net.weight)  # predicts x: errors 0 and 2
    mse = lambda o, t: torch.nn.functional.mse_loss(o, t.view_as(o))  # noqa: E731
    out = epochs.evaluate(net, data, Local(), mse)  # type: ignore[arg-type]
    assert out["test_loss"] == pytest.approx((0 + 4) / 2)
    assert math.isnan(out["top1"]) and math.isnan(out["top5"])


@pytest.mark.slow
def test_a_sweep_trains_a_factory_model_on_factory_data_with_adamw(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(textwrap.dedent(NETS))
    (tmp_path / "s.yaml").write_text(textwrap.dedent("""\
        name: own
        model:
          - {factory: "mine:linear", name: lin}
          - {factory: "mine:tokens"}
        dataset: [{factory: "mine:splits", params: {n: 200}}, synthetic]
        exclude: [{model: lin, dataset: synthetic}, {model: tokens, dataset: splits}]
        world_size: 2
        optimizer: {name: adamw, lr: 0.01}
        loss: {name: cross-entropy, label_smoothing: 0.1}
        compressor: [none, {name: qsgd, bits: 4, bucket_size: 64}]
        batch_size: 10
        warmup: 1
        iterations: 4
        """))  # fmt: skip
    proc = invoke.run(
        [sys.executable, "-m", "qbench.cli", "sweep", "s.yaml", "--out", "res"],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(p.read_text()) for p in sorted((tmp_path / "res").glob("*/run.json"))]
    got = sorted((r["labels"]["model"], r["labels"]["dataset"], r["labels"]["compressor"],
                  r["status"]) for r in runs)  # fmt: skip
    assert got == [("lin", "splits", "fp32", "ok"), ("lin", "splits", "qsgd-4b-b64", "ok"),
                   ("tokens", "synthetic", "fp32", "ok"),
                   ("tokens", "synthetic", "qsgd-4b-b64", "ok")]  # fmt: skip
    for r in runs:
        assert r["labels"]["optimizer"] == "adamw"
        want = 6 * 3 + 3 if r["labels"]["model"] == "lin" else 11 * 8 + 8 * 11 + 11
        assert r["labels"]["numel"] == want


@pytest.mark.slow
def test_accuracy_mode_evaluates_a_factory_datasets_test_split(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(textwrap.dedent(NETS))
    (tmp_path / "s.yaml").write_text(textwrap.dedent("""\
        name: acc
        model: {factory: "mine:linear", name: lin}
        dataset: {factory: "mine:splits", params: {n: 120}}
        world_size: 2
        skew: 0.5
        epochs: 2
        batch_size: 10
        compressor: {name: qsgd, bits: 4, bucket_size: 64}
        """))  # fmt: skip
    proc = invoke.run(
        [sys.executable, "-m", "qbench.cli", "sweep", "s.yaml", "--out", "res"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    import pandas as pd

    (path,) = (tmp_path / "res").glob("*/epochs.parquet")
    frame = pd.read_parquet(path)
    assert frame["epoch"].tolist() == [1, 2]
    assert frame["iteration"].tolist() == [6, 12]  # 60 samples per rank, batches of 10
    assert frame["top1"].between(0, 1).all() and frame["test_loss"].notna().all()
