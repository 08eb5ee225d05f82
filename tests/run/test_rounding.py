"""Stochastic rounding of int8 compute and quantized weights draws per rank (qbench.run.rounding).

Ranks are built as the worker builds them (scenario -> RunSpec -> Training with the rank's
communicator), so a rank or seed that does not reach the rounding shows here. Expectations are
definitions: independent draws give uncorrelated rounding errors (|r| within 4 standard errors,
1 / sqrt(n) each), stochastic rounding's error has mean 0 and variance D^2 f (1 - f) per value
(f the fraction, D the grid's spacing).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from qbench.run import precision, rounding
from qbench.run.loops import training
from qbench.spec import matrix, scenario

INT8 = "name: t\nmodel: mlp\nworld_size: 2\ncompute: int8\n"


def _spec(text: str) -> matrix.RunSpec:
    return matrix.expand(scenario.loads(text, "t.yaml")).runs[0]


def _input_gradient(text: str, rank: int) -> torch.Tensor:
    """The gradient rank ``rank``'s int8 model hands its input: the same weights (seeded), the
    same batch and the same upstream gradient on every rank, so only the draws differ."""
    comm: Any = SimpleNamespace(rank=rank, world_size=2)
    model = training.Training(_spec(text), comm).model
    g = torch.Generator().manual_seed(5)
    x = torch.randn(32, 784, generator=g).requires_grad_()
    model(x).backward(torch.randn(32, 10, generator=g))
    assert x.grad is not None
    return x.grad


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten() - a.double().mean(), b.double().flatten() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_two_ranks_round_the_gradient_stream_with_their_own_draws() -> None:
    g0, g1 = _input_gradient(INT8, 0), _input_gradient(INT8, 1)
    assert float((g0 != g1).double().mean()) > 0.3  # ~half the values round the other way
    assert torch.equal(g0, _input_gradient(INT8, 0))  # a rank's draws are reproducible
    other_seed = _input_gradient(INT8 + "seed: 1\n", 0)
    assert other_seed.shape == g0.shape and not torch.equal(other_seed, g0)


def test_shared_rounding_gives_every_rank_the_same_draws() -> None:
    shared = INT8 + "rounding: shared\n"
    assert torch.equal(_input_gradient(shared, 0), _input_gradient(shared, 1))


def test_rounding_errors_of_two_ranks_are_uncorrelated_and_unbiased() -> None:
    """The same values rounded to 8 bits with rank 0's and rank 1's draws: their errors are
    uncorrelated (the issue measured 0.5 with torch's shared generator); over 48 calls the
    mean error of each group of 1/32 of the values is within a z-test's reach of 0."""
    n, calls, groups = 1 << 14, 48, 32
    x = torch.linspace(-1.0, 1.0, n) ** 3  # max |x| = 1: the grid's spacing D is 1 / 127
    d = 1 / 127
    frac = (x / d) - torch.floor(x / d)
    ranks = [rounding.draws(7, r, rounding.LAYER_STREAM, shared=False) for r in (0, 1)]
    errors = [precision.quantize_symmetric(x, 8, r) - x for r in ranks]
    assert abs(_correlation(errors[0], errors[1])) < 4 / math.sqrt(n)
    total = torch.zeros(n, dtype=torch.float64)
    for _ in range(calls):
        total += (precision.quantize_symmetric(x, 8, ranks[0]) - x).double()
    var = (d * d * frac * (1 - frac)).double() * calls  # of the summed error per value
    pairs = zip(total.chunk(groups), var.chunk(groups), strict=True)
    z = [float(t.sum() / v.sum().sqrt()) for t, v in pairs]
    assert math.sqrt(sum(v * v for v in z) / groups) < 1.5, z


def test_each_int8_layer_draws_its_own_stream() -> None:
    """Layers of one model never share draws, and none shares the compressors' streams
    (0 to 3, qbench.aggregate)."""
    model = training.Training(_spec(INT8), SimpleNamespace(rank=1, world_size=2)).model
    layers = [m for m in model.modules() if isinstance(m, precision.FakeQuant)]
    assert len(layers) == 3  # the mlp's three Linear layers
    assert len({m.draws.stream for m in layers}) == 3
    assert min(m.draws.stream for m in layers) > 3 and {m.draws.rank for m in layers} == {1}


@pytest.mark.parametrize(("scheme", "alike"), [("allreduce", True), ("gossip", False)])
def test_weight_rounding_keeps_replicas_alike_and_own_models_apart(
    scheme: str, alike: bool
) -> None:
    """``weights: {bits: N}``: replicas of one model (allreduce) must round identically or they
    drift apart; models of their own (gossip) round with their rank's draws."""
    spec = _spec(f"name: t\nmodel: mlp\nworld_size: 2\nscheme: {scheme}\nweights: {{bits: 4}}\n")
    w = torch.randn(4000, generator=torch.Generator().manual_seed(0))
    rounded = []
    for rank in (0, 1):
        q = w.clone()
        precision.quantize_weights_(q, [3000, 1000], 4, training.weight_draws(spec, rank))
        rounded.append(q)
    assert torch.equal(rounded[0], rounded[1]) == alike
