"""Accuracy (epoch) mode: scenario keys, learning-rate schedule, batches, averaged evaluation,
and a short run on the bundled digits set that must learn."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from qbench.errors import UserError
from qbench.run.loops import epochs
from qbench.spec import scenario
from qbench.spec.matrix import expand
from qbench.spec.parts import LrSchedule
from tests import invoke
from tests.distributed import here, launch

BASE = "name: acc\nmodel: logreg\ndataset: digits\nworld_size: 2\n"


def test_epoch_keys_reach_the_run_spec() -> None:
    text = BASE + "epochs: 3\nlr_schedule: {every: 2, gamma: 0.5}\nweight_decay: 0.001\n"
    text += "skew: [0, 0.8]\ntarget_accuracy: 0.9\n"
    runs = expand(scenario.loads(text)).runs
    assert [r.workload.skew for r in runs] == [0.0, 0.8]
    assert {r.measurement.epochs for r in runs} == {3}
    assert runs[0].workload.lr_schedule == LrSchedule(every=2, gamma=0.5)
    assert runs[0].run_id != runs[1].run_id  # skew is part of the identity


def test_defaults_keep_earlier_run_ids() -> None:
    plain = expand(scenario.loads("name: s\nmodel: mlp\nworld_size: 2\n")).runs[0]
    same = expand(scenario.loads("name: s\nmodel: mlp\nworld_size: 2\nskew: 0\n")).runs[0]
    assert plain.run_id == same.run_id
    target = expand(scenario.loads(BASE + "epochs: 2\ntarget_accuracy: 0.5\n")).runs[0]
    other = expand(scenario.loads(BASE + "epochs: 2\ntarget_accuracy: 0.7\n")).runs[0]
    assert target.run_id == other.run_id  # a report setting, not a different run


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("epochs: 2\ndataset: synthetic\n", ["epochs", "synthetic", "digits"]),
        ("epochs: 0\n", ["epochs", "0"]),
        ("skew: 1.5\n", ["skew", "1.5"]),
        ("lr_schedule: {milestone: [2]}\n", ["milestone", "milestones"]),
        ("lr_schedule: {milestones: [2], every: 3}\n", ["not both"]),
        ("lr_schedule: {gamma: 2}\n", ["gamma", "2"]),
        ("lr_schedule: {milestones: 3}\n", ["milestones", "3"]),
        ("lr_schedule: [1, 2]\n", ["lr_schedule", "mapping", "milestones"]),
        ("target_accuracy: 90\n", ["target_accuracy", "90"]),
        ("dataset: cifar100\n", ["dataset", "cifar100", "digits"]),
    ],
)
def test_bad_accuracy_keys_are_one_line_errors(extra: str, words: list[str]) -> None:
    text = BASE.replace("dataset: digits\n", "") + extra
    if "dataset" not in extra:
        text += "dataset: digits\n"
    with pytest.raises(UserError) as e:
        expand(scenario.loads(text))
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_simulated_lowprec_is_refused_in_accuracy_runs() -> None:
    text = BASE + "epochs: 2\ncompressor: [none, {name: qsgd, bits: 4}]\n"
    text += "scheme: [allreduce, simulated-lowprec]\n"
    m = expand(scenario.loads(text))
    assert all(r.method.scheme.name != "simulated-lowprec" for r in m.runs)
    assert any("cannot train" in e.reason for e in m.excluded)


def test_lr_schedules() -> None:
    assert LrSchedule().lr(0.1, 99) == 0.1
    steps = LrSchedule.of({"milestones": [2, 4], "gamma": 0.1})
    got = [steps.lr(1.0, e) for e in range(6)]
    assert got == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])
    every = [LrSchedule.of({"every": 2, "gamma": 0.5}).lr(1.0, e) for e in range(5)]
    assert every == pytest.approx([1, 1, 0.5, 0.5, 0.25])
    assert [LrSchedule.of({"milestones": [1]}).lr(1.0, e) for e in range(2)] == [1.0, 0.1]


def test_lr_schedule_gives_back_what_was_written() -> None:
    for written in ({}, {"every": 30, "gamma": 1}, {"milestones": [30, 45]}):
        assert LrSchedule.of(written).written() == written


def _data(n: int) -> epochs.EpochData:
    return epochs.EpochData(
        train_x=torch.arange(n, dtype=torch.float32)[:, None], train_y=torch.arange(n),
        test_x=torch.zeros(1, 1), test_y=torch.zeros(1, dtype=torch.long), num_classes=10,
    )  # fmt: skip


def test_epoch_batches_visit_each_sample_once_per_epoch_reproducibly() -> None:
    b = epochs.EpochBatches(_data(10), batch_size=3, seed=1, rank=0)
    assert b.steps == 3  # the last, partial batch is dropped, as every rank has equal counts
    first = torch.cat([b.batch(i)[1] for i in range(3)])
    second = torch.cat([b.batch(i)[1] for i in range(3, 6)])
    assert len(set(first.tolist())) == 9 and len(set(second.tolist())) == 9
    assert not torch.equal(first, second)  # a new order each epoch
    again = epochs.EpochBatches(_data(10), batch_size=3, seed=1, rank=0)
    assert torch.equal(torch.cat([again.batch(i)[1] for i in range(3)]), first)


def test_batch_larger_than_the_partition_says_so() -> None:
    with pytest.raises(ValueError, match="batch_size 64 is larger"):
        epochs.EpochBatches(_data(10), batch_size=64, seed=0, rank=0)


class _Solo:
    """One rank: the sums are already complete."""

    rank, world_size, bytes_sent = 0, 1, 0

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        return None


class _Twins(_Solo):
    """Two ranks holding the same partition: the allreduce doubles every sum, count included."""

    world_size = 2

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        tensor.mul_(2)


def _logreg(weight: list[float], bias: list[float]) -> torch.nn.Linear:
    model = torch.nn.Linear(1, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(weight)[:, None])
        model.bias.copy_(torch.tensor(bias))
    return model


def _two_class_data(x: list[float], y: list[int]) -> epochs.EpochData:
    return epochs.EpochData(
        train_x=torch.tensor(x)[:, None], train_y=torch.tensor(y), test_x=torch.zeros(1, 1),
        test_y=torch.zeros(1, dtype=torch.long), num_classes=2,
    )  # fmt: skip


def test_gradient_norm_is_exactly_zero_at_a_stationary_point() -> None:
    """Two samples at the same x with labels 0 and 1, logits 0: softmax (1/2, 1/2), so the
    per-sample gradients (p - onehot) x are (-1/2, 1/2) x and (1/2, -1/2) x and cancel."""
    data = _two_class_data([3.0, 3.0], [0, 1])
    model = _logreg([0.0, 0.0], [0.0, 0.0])
    norm = epochs.gradient_norm(model, data, _Solo(), weight_decay=0.1)  # type: ignore[arg-type]
    assert norm == 0.0  # weight decay of zero weights adds nothing


def test_gradient_norm_matches_the_hand_derived_gradient() -> None:
    """Logits 0 (zero weights, zero bias) and every label 0: each sample's gradient is
    p - onehot(0) = (-1/2, 1/2) for the bias and (-1/2, 1/2) x for the weights. Over x = 1, 2,
    3, 6 (mean 3): bias (-1/2, 1/2), weights (-3/2, 3/2); norm sqrt(1/4 + 1/4 + 9/4 + 9/4)."""
    data = _two_class_data([1.0, 2.0, 3.0, 6.0], [0, 0, 0, 0])
    model = _logreg([0.0, 0.0], [0.0, 0.0])
    want = math.sqrt(5.0)
    got = epochs.gradient_norm(model, data, _Solo(), weight_decay=0.0)  # type: ignore[arg-type]
    assert got == pytest.approx(want, rel=1e-12)
    # the mean over all samples: twins' doubled sums over a doubled count change nothing
    twins = epochs.gradient_norm(model, data, _Twins(), weight_decay=0.0)  # type: ignore[arg-type]
    assert twins == pytest.approx(want, rel=1e-12)


def test_gradient_norm_adds_weight_decay_times_the_parameters() -> None:
    """x = 0: the logits are the bias (0, 0) whatever the weights, so the loss gradient is
    (-1/2, 1/2) for the bias and 0 for the weights (3, -4); weight decay 0.1 adds 0.1 times
    every parameter: weights (0.3, -0.4), bias unchanged (zero). Norm sqrt(1/2 + 0.25)."""
    data = _two_class_data([0.0, 0.0], [0, 0])
    model = _logreg([3.0, -4.0], [0.0, 0.0])
    got = epochs.gradient_norm(model, data, _Solo(), weight_decay=0.1)  # type: ignore[arg-type]
    assert got == pytest.approx(math.sqrt(0.5 + 0.25), rel=1e-6)  # float32 parameters


def test_gradient_norm_is_tiny_near_the_minimum_of_a_constant_label() -> None:
    """Every label 0: a bias margin of 60 leaves p(1) = 1 / (1 + e^60) per sample, so the
    bias gradient is (-p1, p1) and the weight gradient (-p1, p1) * mean(x) = (-p1, p1) * 1.5
    over x = 0..3: norm p1 * sqrt(2 * (1 + 1.5^2))."""
    data = _data(4)
    data.train_y = torch.zeros(4, dtype=torch.long)
    model = _logreg([0.0, 0.0], [30.0, -30.0])
    p1 = 1 / (1 + math.exp(60.0))
    want = p1 * math.sqrt(2 * (1 + 1.5**2))
    got = epochs.gradient_norm(model, data, _Solo(), weight_decay=0.0)  # type: ignore[arg-type]
    assert 0 < got == pytest.approx(want, rel=1e-5)


@pytest.mark.slow
def test_evaluation_uses_the_model_averaged_over_ranks() -> None:
    launch("gloo", 2, [here("dist_epochs_prog.py")])


@pytest.mark.slow
def test_short_epoch_run_learns_digits(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(
        BASE + "backend: [gloo]\nscheme: [auto, gossip]\n"
        "compressor: [none]\nepochs: 3\nlr: 0.1\nbatch_size: 32\n"
    )
    out = tmp_path / "out"
    proc = invoke.run(
        [sys.executable, "-m", "qbench.cli", "sweep", str(sc), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = sorted(p.parent for p in out.glob("*/run.json"))
    assert len(runs) == 2
    for run in runs:
        ep = pd.read_parquet(run / "epochs.parquet")
        assert list(ep["epoch"]) == [1, 2, 3]
        assert ep["top1"].iloc[-1] > 0.8, ep  # chance is 0.1
        assert ep["train_loss"].iloc[-1] < ep["train_loss"].iloc[0]
        assert (ep["grad_norm"] > 0).all()  # logreg is convex: the norm is recorded
        assert ep["train_time_s"].is_monotonic_increasing
        labels = json.loads((run / "run.json").read_text())["labels"]
        if labels["scheme"] == "gossip":
            assert not math.isnan(ep["consensus_distance"].iloc[-1])
