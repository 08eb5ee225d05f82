"""Low-precision computation next to low-precision communication (``compute:``, ``weights:``).

* ``fp32``: as before.
* ``bf16`` / ``fp16``: ``torch.autocast`` around forward and loss, fp32 master weights; fp16 adds
  dynamic loss scaling (scale the loss, unscale the gradient, skip the step and halve the scale
  when it overflowed, double it after ``GROWTH_INTERVAL`` clean steps), as torch's GradScaler.
* ``int8``: fake-quantized training in the manner of seed 001 (after Banner et al. 2018): every
  Conv/Linear quantizes its weight and its input activation to 8 bits in the forward pass and
  the gradient flowing to its input to 8 bits in the backward pass (stochastic rounding), all
  with a straight-through estimator; the weight gradients stay fp32 ("gradient bifurcation"),
  so what the schemes communicate is unchanged. Batch norms can be swapped for
  :class:`RangeEvoNorm` (seed 001 eq. 5) with ``norm: range-evonorm``.
* ``weights: {bits: N}`` (seed 000 section 5.4): after every optimizer step, all parameters are
  rounded stochastically to N-bit fixed point with a per-tensor scale (max |w|).

Quantization here is simulated in fp32 ("fake quant"): it measures the accuracy effect of the
number format, not integer-kernel speed; reports label it so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

COMPUTE = ("fp32", "bf16", "fp16", "int8")
GROWTH_INTERVAL = 200
"""fp16 loss scale: clean steps before the scale doubles (torch.amp.GradScaler's default is 2000;
short runs here need a faster recovery after an overflow)."""
INIT_SCALE = 2.0**12


def autocast(compute: str, device: torch.device) -> AbstractContextManager[Any]:
    """The forward pass's context: autocast for bf16 / fp16, nothing otherwise."""
    if compute in ("bf16", "fp16"):
        dtype = torch.bfloat16 if compute == "bf16" else torch.float16
        return torch.autocast(device.type, dtype=dtype)
    return nullcontext()


class LossScaler:
    """Dynamic loss scaling for fp16 (a scale of 1 that never changes for other formats)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.scale = INIT_SCALE if enabled else 1.0
        self._clean = 0
        self.skipped = 0

    def unscale_(self, grad: torch.Tensor) -> bool:
        """Divide ``grad`` by the scale; False (and a smaller scale) when it overflowed, in
        which case the caller skips the optimizer step."""
        if not self.enabled:
            return True
        grad.mul_(1.0 / self.scale)
        if bool(torch.isfinite(grad).all()):
            self._clean += 1
            if self._clean >= GROWTH_INTERVAL:
                self.scale, self._clean = self.scale * 2.0, 0
            return True
        self.scale, self._clean = max(self.scale / 2.0, 1.0), 0
        self.skipped += 1
        return False


# -- int8 fake quantization ------------------------------------------------------------------


def quantize_symmetric(x: torch.Tensor, bits: int, stochastic: bool) -> torch.Tensor:
    """x on a symmetric grid of 2^(bits-1) - 1 levels per side, scaled by max |x| of the tensor;
    nearest or unbiased stochastic rounding."""
    levels = 2 ** (bits - 1) - 1
    scale = x.detach().abs().max().clamp_min(1e-12) / levels
    y = x / scale
    if stochastic:  # up with probability the fraction; floor(y + u) would round y + u first
        low = torch.floor(y)
        y = low + (torch.rand_like(y) < y - low).to(y.dtype)
    else:
        y = torch.round(y)
    return y.clamp_(-levels, levels) * scale


class _QuantizeForward(torch.autograd.Function):
    """Forward: 8-bit nearest rounding; backward: the gradient passes unchanged (STE)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bits: int) -> torch.Tensor:
        return quantize_symmetric(x, bits, stochastic=False)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _QuantizeBackward(torch.autograd.Function):
    """Forward: identity; backward: the gradient w.r.t. the input is rounded stochastically to
    ``bits`` bits (the layer-gradient stream of 8-bit training)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bits: int) -> torch.Tensor:
        ctx.bits = bits
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return quantize_symmetric(grad, ctx.bits, stochastic=True), None


class FakeQuant(nn.Module):
    """Wraps a Conv/Linear: quantized weight and input in the forward pass, quantized input
    gradient in the backward pass, fp32 weight gradient."""

    def __init__(self, layer: nn.Conv2d | nn.Linear, bits: int = 8) -> None:
        super().__init__()
        self.layer, self.bits = layer, bits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _QuantizeBackward.apply(x, self.bits)
        xq = _QuantizeForward.apply(x, self.bits)
        wq = _QuantizeForward.apply(self.layer.weight, self.bits)
        if isinstance(self.layer, nn.Linear):
            return F.linear(xq, wq, self.layer.bias)
        return self.layer._conv_forward(xq, wq, self.layer.bias)


def fake_quantize(model: nn.Module, bits: int = 8) -> nn.Module:
    """Replace every Conv2d / Linear of ``model`` in place by a FakeQuant wrapper. Parameter
    names gain a ``.layer`` (the layer policy matches them by pattern either way)."""
    for name, child in model.named_children():
        if isinstance(child, nn.Conv2d | nn.Linear):
            setattr(model, name, FakeQuant(child, bits))
        else:
            fake_quantize(child, bits)
    return model


# -- Range-EvoNorm (seed 001 eq. 5) ----------------------------------------------------------


class RangeEvoNorm(nn.Module):
    """Range-EvoNorm: ``x * hsig(v x) / (C * range_g(x)) * gamma + beta``.

    ``range_g`` is max - min per sample over each group of ``group_size`` channels (all their
    spatial positions), ``hsig(z) = clamp((z + 3) / 6, 0, 1)`` the hard sigmoid and
    ``C = 1 / sqrt(2 ln(group_size))``, the constant that makes a range of m Gaussian samples
    estimate their standard deviation. The paper names the argument of C "c/g = #channels per
    group" with a default "group size" of 2; we read both as channels per group, which must be
    at least 2 (C is infinite at 1).
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
        gate = F.hardsigmoid(self.v * x)  # = clamp((v x + 3) / 6, 0, 1)
        return x * gate / (self.c * spread + self.eps) * self.gamma + self.beta


def use_range_evonorm(model: nn.Module, group_size: int = 2) -> nn.Module:
    """Replace every BatchNorm2d (and a ReLU right after it, which Range-EvoNorm's gate
    subsumes) by RangeEvoNorm, in place."""
    children = list(model.named_children())
    for i, (name, child) in enumerate(children):
        if isinstance(child, nn.BatchNorm2d):
            setattr(model, name, RangeEvoNorm(child.num_features, group_size))
            if i + 1 < len(children) and isinstance(children[i + 1][1], nn.ReLU):
                setattr(model, children[i + 1][0], nn.Identity())
        else:
            use_range_evonorm(child, group_size)
    return model


# -- quantized model (seed 000 section 5.4) ---------------------------------------------------


def quantize_weights_(params: torch.Tensor, sizes: list[int], bits: int) -> None:
    """Round every parameter tensor (consecutive slices of the flat ``params``) stochastically
    to ``bits``-bit fixed point with its own max-abs scale, in place."""
    quantize_tensors_(torch.split(params, sizes), bits)


def quantize_tensors_(tensors: Iterable[torch.Tensor], bits: int) -> None:
    """:func:`quantize_weights_` for separate tensors (a model whose parameters are not views of
    one flat buffer, as under DDP)."""
    with torch.no_grad():
        for piece in tensors:
            piece.copy_(quantize_symmetric(piece, bits, stochastic=True))
