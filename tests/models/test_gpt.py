"""The GPT-style decoder of the zoo (qbench.models.gpt): nanoGPT's shape, causal, every
position predicting the next token, learnable synthetic batches, and a scenario key like any
other model's."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from qbench import models
from qbench.errors import UserError
from qbench.spec import scenario
from qbench.spec.matrix import expand

TINY = {"width": 32, "layers": 2, "heads": 2, "seq_len": 16, "vocab": 64}


def test_defaults_are_a_baby_gpt() -> None:
    info = models.info("gpt")
    assert (info.input_shape, info.num_classes, info.vocab_size) == ((64,), 256, 256)
    assert info.input_dtype == torch.int64
    # 4 blocks of 12 w^2 + 13 w (w = 128), embeddings (256 + 64) x w, final LayerNorm 2 w
    w = 128
    assert models.parameter_count("gpt") == 4 * (12 * w * w + 13 * w) + 320 * w + 2 * w


def test_the_head_is_tied_and_every_position_predicts() -> None:
    torch.manual_seed(0)
    net = models.build("gpt", TINY)
    x = torch.randint(0, 64, (3, 16))
    out = net(x)
    assert out.shape == (3, 16, 64)
    assert not any(n.startswith("head") for n, _ in net.named_parameters())


def test_attention_is_causal() -> None:
    """Changing the last token changes no earlier position's output."""
    torch.manual_seed(0)
    net = models.build("gpt", TINY).eval()
    x = torch.randint(0, 64, (2, 16))
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 64
    a, b = net(x), net(y)
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6)
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_synthetic_batches_are_next_tokens_of_a_learnable_chain() -> None:
    info = models.info("gpt", TINY)
    assert info.batch is not None
    x, y = info.batch(8, torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (8, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # the target is the input shifted by one
    torch.manual_seed(0)
    net = models.build("gpt", TINY)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(40):
        x, y = info.batch(16, gen)
        out = net(x)
        loss = F.cross_entropy(out.reshape(-1, 64), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > math.log(64) - 0.3  # chance
    assert sum(losses[-5:]) / 5 < math.log(64) - 1.0  # it learned the chain's structure


def test_a_scenario_runs_it_with_its_parameters() -> None:
    sc = scenario.loads("name: t\nmodel: {name: gpt, layers: 2, width: 64, heads: 4}\n")
    run = expand(sc).runs[0]
    assert run.workload.model == "gpt" and run.workload.model_params["layers"] == 2
    with pytest.raises(UserError, match="width 30 is not a multiple of heads 4"):
        expand(scenario.loads("name: t\nmodel: {name: gpt, width: 30}\n"))
