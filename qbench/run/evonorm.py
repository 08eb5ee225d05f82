"""Range-EvoNorm (seed 001 eq. 5) in place of batch norm (``norm:``), wired and initialised as
seed 001's authors' network (aparna-aketi/Low_Precision_DL).

* ``range-evonorm``: the layer as the authors' released code computes it (:class:`RangeEvoNorm`:
  8 groups, the range estimated as the mean over 16 chunks of max - min, their constant);
* ``range-evonorm-gs2``: the paper's formula read with groups of 2 channels
  (:class:`RangeEvoNormGS2`, what ``range-evonorm`` meant before; docs/precision-and-layers.md
  compares the two).

:func:`use_range_evonorm` swaps every BatchNorm2d for the layer and drops the ReLU that follows
it: an EvoNorm-type layer is its own activation, and in the authors' ResNets
(quantized_training/resnet_quantized.py ``BasicBlockq``; resnet.py ``BasicBlock`` with an
'evo' norm type) no ReLU follows one anywhere, neither in the stem, nor inside a block, nor
after the residual add. On qbench's CIFAR ResNets it then initialises the network as their
``init_modelq`` does (:func:`authors_init_`).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from qbench.models.small import BasicBlock, CifarResNet

NORMS = ("batchnorm", "range-evonorm", "range-evonorm-gs2")


def _hsig_gate(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return F.hardsigmoid(v * x)  # = clamp((v x + 3) / 6, 0, 1)


def banner_constant(n: int) -> float:
    """The authors' ``scale_fix`` for a range over n values: 0.5 * 0.35 * (1 + sqrt(pi ln 4))
    / sqrt(2 ln n) (Banner et al.'s Range BN constant), so that scale * range is about the
    standard deviation of n Gaussian values."""
    return 0.5 * 0.35 * (1 + math.sqrt(math.pi * math.log(4))) / math.sqrt(2 * math.log(n))


class RangeEvoNorm(nn.Module):
    """Range-EvoNorm as seed 001's authors compute it (aparna-aketi/Low_Precision_DL,
    quantized_training/quantize.py ``RangeEN``; evonorm.py ``RangeEN_full`` is the same in fp32):

        y = x * hsig(v x) / (scale_fix(m) * range + eps) * gamma + beta

    per sample and per group of channels, where ``groups`` is the NUMBER of groups (8), the
    range is estimated by cutting each group's C/groups * H * W values into ``chunks`` (16)
    consecutive chunks of m values and taking mean(max of each chunk) - mean(min of each
    chunk), ``scale_fix`` is :func:`banner_constant` of the chunk size m, and hsig(z) =
    clamp((z + 3) / 6, 0, 1). gamma starts uniform in [0, 1), as their ``reset_params``; their
    ResNet then sets it to 1 (:func:`authors_init_`).

    Their 8-bit module also quantizes its input, v, the scale, gamma and beta and the output
    gradient; here the layer runs in fp32 (``compute: int8`` fake-quantizes the Conv/Linear
    layers only). When a group's values do not split into 16 chunks, the chunk count is
    gcd(16, values) (their reshape would fail); ``groups`` must divide the channels.
    """

    def __init__(self, channels: int, groups: int = 8, chunks: int = 16, eps: float = 1e-5) -> None:
        super().__init__()
        if groups < 1 or channels % groups:
            raise ValueError(f"groups {groups} must divide the channels, {channels}")
        self.channels, self.groups, self.chunks, self.eps = channels, groups, chunks, eps
        self.v = nn.Parameter(torch.ones(1, channels, 1, 1))
        self.gamma = nn.Parameter(torch.empty(1, channels, 1, 1).uniform_())
        self.beta = nn.Parameter(torch.zeros(1, channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        per_group = x[0].numel() // self.groups
        chunks = math.gcd(self.chunks, per_group)
        size = per_group // chunks
        if size < 2:
            raise ValueError(
                f"Range-EvoNorm needs chunks of >= 2 values, got {per_group} values per group "
                f"in {chunks} chunks (input {tuple(x.shape)})"
            )
        y = x.reshape(n, self.groups, chunks, size)
        spread = y.amax(-1).mean(-1) - y.amin(-1).mean(-1)  # (n, groups)
        scale = 1.0 / (spread * banner_constant(size) + self.eps)
        gated = (x * _hsig_gate(self.v, x)).reshape(n, self.groups, -1) * scale.unsqueeze(-1)
        return gated.reshape(x.shape) * self.gamma + self.beta


class RangeEvoNormGS2(nn.Module):
    """Range-EvoNorm as seed 001's equation 5 reads with groups of ``group_size`` channels:
    ``x * hsig(v x) / (C * range_g(x)) * gamma + beta``.

    ``range_g`` is max - min per sample over each group of ``group_size`` channels (all their
    spatial positions), ``hsig(z) = clamp((z + 3) / 6, 0, 1)`` the hard sigmoid and
    ``C = 1 / sqrt(2 ln(group_size))``. The paper names the argument of C "c/g = #channels per
    group" with a default "group size" of 2; this reads both as channels per group, which must
    be at least 2 (C is infinite at 1). Its denominator is several standard deviations (a range
    over many values times C < 1), so it shrinks activations that the authors' version keeps
    near unit scale (docs/precision-and-layers.md).
    """

    def __init__(self, channels: int, group_size: int = 2, eps: float = 1e-5) -> None:
        super().__init__()
        if group_size < 2 or channels % group_size:
            raise ValueError(
                f"channels {channels} must be a multiple of group_size {group_size} >= 2"
            )
        self.channels, self.group_size, self.eps = channels, group_size, eps
        self.v = nn.Parameter(torch.ones(1, channels, 1, 1))
        self.gamma = nn.Parameter(torch.ones(1, channels, 1, 1))
        self.beta = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.c = 1.0 / math.sqrt(2.0 * math.log(group_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, ch = x.shape[0], x.shape[1]
        groups = x.reshape(n, ch // self.group_size, -1)
        spread = groups.amax(-1) - groups.amin(-1)  # (n, groups)
        spread = spread.repeat_interleave(self.group_size, dim=1).reshape(n, ch, 1, 1)
        gate = _hsig_gate(self.v, x)
        return x * gate / (self.c * spread + self.eps) * self.gamma + self.beta


_NORM_LAYERS: dict[str, type[RangeEvoNorm | RangeEvoNormGS2]] = {
    "range-evonorm": RangeEvoNorm,
    "range-evonorm-gs2": RangeEvoNormGS2,
}


def use_range_evonorm(model: nn.Module, norm: str = "range-evonorm") -> nn.Module:
    """Replace every BatchNorm2d and the ReLU registered right after it by the ``norm`` variant
    (NORMS), in place; a CIFAR ResNet then starts as the authors' (:func:`authors_init_`)."""
    _swap(model, _NORM_LAYERS[norm])
    if isinstance(model, CifarResNet):
        authors_init_(model)
    return model


def _swap(model: nn.Module, layer: type[nn.Module]) -> None:
    children = list(model.named_children())
    for i, (name, child) in enumerate(children):
        if isinstance(child, nn.BatchNorm2d):
            setattr(model, name, layer(child.num_features))
            if i + 1 < len(children) and isinstance(children[i + 1][1], nn.ReLU):
                setattr(model, children[i + 1][0], nn.Identity())
        else:
            _swap(child, layer)


def authors_init_(model: CifarResNet) -> None:
    """``init_modelq`` of seed 001's authors (quantized_training/resnet_quantized.py), the
    initialisation of the ResNet their 8-bit runs train: every conv normal(0, sqrt(2 / n)) with
    n = k * k * out_channels; every norm layer gamma 1 and beta 0 (v stays 1); the second norm
    of every block gamma 0, so each block starts as its shortcut; the classifier's weight
    normal(0, 0.01) and bias 0. Draws from torch's generator, seeded alike on every rank."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.normal_(0.0, math.sqrt(2.0 / n))
            elif isinstance(m, RangeEvoNorm | RangeEvoNormGS2):
                m.gamma.fill_(1.0)
                m.beta.zero_()
        for m in model.modules():
            if isinstance(m, BasicBlock):
                assert isinstance(m.bn2, RangeEvoNorm | RangeEvoNormGS2)
                m.bn2.gamma.zero_()
        model.fc.weight.normal_(0.0, 0.01)
        nn.init.zeros_(model.fc.bias)
