"""Compute precision (seed 001 8-bit training, autocast) and quantized weights (seed 000)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from qbench.run import evonorm, precision, rounding


def _train(compute: str, steps: int = 60) -> tuple[float, float]:
    """First and last loss of a small MLP fitting a fixed linear teacher, with the worker's
    recipe: autocast forward, scaled backward, unscale, SGD step."""
    torch.manual_seed(0)
    x = torch.randn(256, 20)
    y = (x @ torch.randn(20, 4)).argmax(1)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))
    if compute in precision.INT8:
        precision.fake_quantize(model, scheme=precision.INT8[compute], seed=0, rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    scaler = precision.LossScaler(enabled=compute == "fp16")
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with precision.autocast(compute, torch.device("cpu")):
            loss = nn.functional.cross_entropy(model(x), y)
        (loss * scaler.scale).backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        ok = scaler.unscale_(grads)
        for p, g in zip(
            model.parameters(),
            torch.split(grads, [p.numel() for p in model.parameters()]),
            strict=True,
        ):
            p.grad.copy_(g.view_as(p))
        if ok:
            opt.step()
        losses.append(float(loss.detach()))
    return losses[0], losses[-1]


def test_the_planner_accepts_exactly_the_precisions_and_norms_the_worker_runs() -> None:
    from qbench.spec import scenario  # the planner keeps its own copy: it imports no torch

    assert (*precision.COMPUTE, scenario.REPLAY) == scenario.COMPUTE  # replay: fp32, stood in for
    assert scenario.NORMS == evonorm.NORMS
    assert tuple(precision.INT8) == scenario.ROUNDED_COMPUTE


@pytest.mark.parametrize("compute", precision.COMPUTE)
def test_every_compute_precision_trains(compute: str) -> None:
    first, last = _train(compute)
    assert last < 0.5 * first, (compute, first, last)


def test_range_evonorm_gs2_matches_its_formula_on_a_hand_computed_example() -> None:
    layer = evonorm.RangeEvoNormGS2(channels=2, group_size=2, eps=0.0)
    x = torch.tensor([[[[1.0, -2.0]], [[0.5, 3.0]]]])  # (1 sample, 2 channels, 1 x 2)
    # one group of both channels: range = 3 - (-2) = 5; C = 1 / sqrt(2 ln 2)
    c = 1 / math.sqrt(2 * math.log(2))
    hsig = lambda z: min(1.0, max(0.0, (z + 3) / 6))  # noqa: E731
    want = torch.tensor(
        [[[[v * hsig(v) / (c * 5) for v in row] for row in ch] for ch in x[0].tolist()]]
    )
    torch.testing.assert_close(layer(x), want)
    with torch.no_grad():
        layer.gamma.fill_(2.0)
        layer.beta.fill_(0.5)
    torch.testing.assert_close(layer(x), want * 2 + 0.5)


@pytest.mark.parametrize(
    ("norm", "layer"),
    [("range-evonorm", evonorm.RangeEvoNorm), ("range-evonorm-gs2", evonorm.RangeEvoNormGS2)],
)
def test_range_evonorm_replaces_batch_norms(norm: str, layer: type[nn.Module]) -> None:
    from qbench import models

    model = evonorm.use_range_evonorm(models.build("resnet20"), norm)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert any(isinstance(m, layer) for m in model.modules())
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_range_evonorm_rejects_bad_groups() -> None:
    with pytest.raises(ValueError, match="group_size"):
        evonorm.RangeEvoNormGS2(channels=4, group_size=1)
    with pytest.raises(ValueError, match="groups 8 must divide the channels, 12"):
        evonorm.RangeEvoNorm(channels=12)
    with pytest.raises(ValueError, match="chunks of >= 2 values"):
        evonorm.RangeEvoNorm(channels=8)(torch.randn(2, 8, 1, 1))  # one value per group


def test_asymmetric_int8_uses_min_max_and_a_zero_point() -> None:
    x = torch.tensor([-1.0, 0.0, 2.0, 3.0])  # range 4 over 255 steps, zero point at -1
    q = precision.quantize_minmax(x, 8, None)
    step = 4.0 / 255
    want = [-1.0, -1.0 + round(1 / step) * step, -1.0 + round(3 / step) * step, 3.0]
    torch.testing.assert_close(q, torch.tensor(want))
    layer = precision.FakeQuant(nn.Linear(4, 2), scheme="asymmetric")
    batch = torch.tensor([[0.0, 1.0, 2.0, 4.0], [-2.0, 0.0, 1.0, 2.0]])
    # activations: the mean of the samples' min (0, -2) and max (4, 2): [-1, 3], clipped
    xq = precision.quantize_minmax(batch, 8, None, torch.tensor(-1.0), torch.tensor(3.0))
    assert float(xq.min()) == -1.0 and float(xq.max()) == 3.0
    wq = precision.quantize_minmax(layer.layer.weight.detach(), 8, None)
    torch.testing.assert_close(layer(batch), nn.functional.linear(xq, wq, layer.layer.bias))
    with pytest.raises(ValueError, match="scheme must be one of"):
        precision.FakeQuant(nn.Linear(4, 2), scheme="minmax")


def test_fake_quant_quantizes_forward_and_input_gradient_but_not_weight_gradient() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    q = precision.FakeQuant(nn.Linear(64, 32))
    q.layer.load_state_dict(layer.state_dict())
    x = torch.randn(16, 64, requires_grad=True)
    out = q(x)
    xq = precision.quantize_symmetric(x.detach(), 8, None)
    wq = precision.quantize_symmetric(layer.weight.detach(), 8, None)
    torch.testing.assert_close(out, nn.functional.linear(xq, wq, layer.bias))
    out.pow(2).sum().backward()
    assert x.grad is not None and q.layer.weight.grad is not None
    levels = (x.grad / (x.grad.abs().max() / 127)).round()
    torch.testing.assert_close(x.grad, levels * (x.grad.abs().max() / 127))  # on the 8-bit grid
    w_grad = q.layer.weight.grad
    assert len(torch.unique(w_grad)) > 255  # kept in full precision (gradient bifurcation)


def test_loss_scaler_skips_overflow_and_recovers() -> None:
    s = precision.LossScaler(enabled=True)
    start = s.scale
    assert not s.unscale_(torch.tensor([1.0, math.inf]))
    assert s.scale == start / 2 and s.skipped == 1
    g = torch.tensor([start / 2, 0.0])
    assert s.unscale_(g) and g[0] == 1.0
    off = precision.LossScaler(enabled=False)
    assert off.scale == 1.0 and off.unscale_(torch.tensor([math.inf]))


def test_weights_are_quantized_per_tensor_and_unbiased() -> None:
    torch.manual_seed(0)
    w = torch.randn(1000) * 0.1
    sizes = [600, 400]
    means = torch.zeros_like(w)
    draws = rounding.Draws(seed=0, rank=0, stream=rounding.WEIGHT_STREAM)
    for _ in range(400):
        q = w.clone()
        precision.quantize_weights_(q, sizes, 4, draws)
        for piece in torch.split(q, sizes):
            assert len(torch.unique(piece)) <= 15  # 2^(4-1) - 1 levels per side and zero
        means += q / 400
    assert (means - w).abs().max() < 0.01  # stochastic rounding is unbiased
