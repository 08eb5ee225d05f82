"""Low-precision computation next to low-precision communication (``compute:``, ``weights:``).

* ``fp32``: as before.
* ``bf16`` / ``fp16``: ``torch.autocast`` around forward and loss, fp32 master weights; fp16 adds
  dynamic loss scaling (scale the loss, unscale the gradient, skip the step and halve the scale
  when it overflowed, double it after ``GROWTH_INTERVAL`` clean steps), as torch's GradScaler.
* ``int8``: fake-quantized training in the manner of seed 001 (after Banner et al. 2018): every
  Conv/Linear quantizes its weight and its input activation to 8 bits in the forward pass and
  the gradient flowing to its input to 8 bits in the backward pass (stochastic rounding with
  each layer's own stream of this rank's draws, :mod:`qbench.run.rounding`), all with a
  straight-through estimator; the weight gradients stay fp32 ("gradient bifurcation"),
  so what the schemes communicate is unchanged. Two quantizers (INT8):

  - ``int8``: symmetric, per tensor: 2^7 - 1 levels per side of zero, scale max |x| / 127
    (:func:`quantize_symmetric`);
  - ``int8-asym``: asymmetric min/max, the quantizer of Banner et al.'s code that seed 001's
    authors train with (aparna-aketi/Low_Precision_DL, quantized_training/quantize.py:
    UniformQuantize, QuantMeasure, QConv2d): 2^8 - 1 steps over [min, max], the zero point at
    min (:func:`quantize_minmax`); weights and input gradients by their own min and max,
    activations by the batch mean of each sample's min and max (values outside are clipped,
    as there).

* ``norm:`` Range-EvoNorm in place of batch norm: :mod:`qbench.run.evonorm`.
* ``weights: {bits: N}`` (seed 000 section 5.4): after every optimizer step, all parameters are
  rounded stochastically to N-bit fixed point with a per-tensor scale (max |w|), with the
  draws of :func:`weight_draws`.

Quantization here is simulated in fp32 ("fake quant"): it measures the accuracy effect of the
number format, not integer-kernel speed; reports label it so.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from qbench.run import rounding
from qbench.run.rounding import Draws
from qbench.spec import parts

COMPUTE = parts.PRECISIONS
INT8 = {"int8": "symmetric", "int8-asym": "asymmetric"}
"""The fake-quantized compute precisions and the quantizer each uses (module docstring)."""
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


def quantize_symmetric(x: torch.Tensor, bits: int, draws: Draws | None) -> torch.Tensor:
    """x on a symmetric grid of 2^(bits-1) - 1 levels per side, scaled by max |x| of the tensor;
    nearest rounding (``draws`` None) or unbiased stochastic rounding with these draws."""
    levels = 2 ** (bits - 1) - 1
    scale = x.detach().abs().max().clamp_min(1e-12) / levels
    y = _round(x / scale, draws)
    return y.clamp_(-levels, levels) * scale


def quantize_minmax(
    x: torch.Tensor, bits: int, draws: Draws | None,
    low: torch.Tensor | None = None, high: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """x on 2^bits - 1 equal steps over [low, high] (default: the tensor's min and max), the
    zero point at low: Banner et al.'s asymmetric quantizer (UniformQuantize in the seed
    authors' code: scale (max - min) / (2^bits - 1), at least 1e-8). Values outside are clipped.
    Nearest rounding (``draws`` None) or stochastic with these draws."""
    d = x.detach()
    lo = d.min() if low is None else low
    hi = d.max() if high is None else high
    top = 2**bits - 1
    scale = ((hi - lo) / top).clamp_min(1e-8)
    y = _round((x - lo) / scale, draws)
    return y.clamp_(0, top) * scale + lo


def _round(y: torch.Tensor, draws: Draws | None) -> torch.Tensor:
    if draws is None:
        return torch.round(y)
    low = torch.floor(y)  # up with probability the fraction; floor(y + u) would round y + u
    return low + (draws.uniform_like(y) < y - low).to(y.dtype)


def _quantize(
    x: torch.Tensor, bits: int, scheme: str, draws: Draws | None, batch: bool
) -> torch.Tensor:
    """``scheme`` symmetric or asymmetric (INT8); ``batch``: x is a batch of activations, whose
    asymmetric range is the mean over samples of each sample's min and max (QuantMeasure)."""
    if scheme == "symmetric":
        return quantize_symmetric(x, bits, draws)
    if batch and x.dim() > 1:
        flat = x.detach().flatten(1)
        return quantize_minmax(x, bits, draws, flat.amin(1).mean(), flat.amax(1).mean())
    return quantize_minmax(x, bits, draws)


class _QuantizeForward(torch.autograd.Function):
    """Forward: 8-bit nearest rounding; backward: the gradient passes unchanged (STE)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, bits: int, scheme: str = "symmetric", batch: bool = False
    ) -> torch.Tensor:
        return _quantize(x, bits, scheme, None, batch=batch)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return grad, None, None, None


class _QuantizeBackward(torch.autograd.Function):
    """Forward: identity; backward: the gradient w.r.t. the input is rounded stochastically to
    ``bits`` bits with ``draws`` (the layer-gradient stream of 8-bit training)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bits: int, scheme: str, draws: Draws) -> torch.Tensor:
        ctx.bits, ctx.scheme, ctx.draws = bits, scheme, draws
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        rounded = _quantize(grad, ctx.bits, ctx.scheme, ctx.draws, batch=False)
        return rounded, None, None, None


class FakeQuant(nn.Module):
    """Wraps a Conv/Linear: quantized weight and input in the forward pass, quantized input
    gradient in the backward pass, fp32 weight gradient; ``scheme`` symmetric or asymmetric
    (INT8). ``draws``: the input gradient's rounding (default: seed 0, rank 0, the first
    layer's stream, for a layer used on its own; :func:`fake_quantize` keys each layer)."""

    def __init__(
        self, layer: nn.Conv2d | nn.Linear, bits: int = 8, scheme: str = "symmetric",
        draws: Draws | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        if scheme not in INT8.values():
            raise ValueError(f"scheme must be one of {sorted(INT8.values())}, got {scheme!r}")
        self.layer, self.bits, self.scheme = layer, bits, scheme
        self.draws = draws or Draws(seed=0, rank=0, stream=rounding.LAYER_STREAM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _QuantizeBackward.apply(x, self.bits, self.scheme, self.draws)
        xq = _QuantizeForward.apply(x, self.bits, self.scheme, True)
        wq = _QuantizeForward.apply(self.layer.weight, self.bits, self.scheme)
        if isinstance(self.layer, nn.Linear):
            return F.linear(xq, wq, self.layer.bias)
        return self.layer._conv_forward(xq, wq, self.layer.bias)


def fake_quantize(
    model: nn.Module, bits: int = 8, scheme: str = "symmetric", *,
    seed: int, rank: int, shared: bool = False,
) -> nn.Module:  # fmt: skip
    """Replace every Conv2d / Linear of ``model`` in place by a FakeQuant wrapper. Parameter
    names gain a ``.layer`` (the layer policy matches them by pattern either way). The i-th
    layer in module order rounds its input gradient with stream LAYER_STREAM + i of this rank's
    draws (qbench.run.rounding; ``shared``: rank 0's on every rank)."""
    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Conv2d | nn.Linear)
    ]
    for i, (parent, name, child) in enumerate(found):
        draws = rounding.draws(seed, rank, rounding.LAYER_STREAM + i, shared)
        setattr(parent, name, FakeQuant(child, bits, scheme, draws))
    return model


# -- quantized model (seed 000 section 5.4) ---------------------------------------------------


def quantize_weights_(params: torch.Tensor, sizes: list[int], bits: int, draws: Draws) -> None:
    """Round every parameter tensor (consecutive slices of the flat ``params``) stochastically
    to ``bits``-bit fixed point with its own max-abs scale, in place."""
    quantize_tensors_(torch.split(params, sizes), bits, draws)


def quantize_tensors_(tensors: Iterable[torch.Tensor], bits: int, draws: Draws) -> None:
    """:func:`quantize_weights_` for separate tensors (a model whose parameters are not views of
    one flat buffer, as under DDP). Each tensor takes the next call of ``draws``
    (:func:`weight_draws`)."""
    with torch.no_grad():
        for piece in tensors:
            piece.copy_(quantize_symmetric(piece, bits, draws))


def weight_draws(seed: int, rank: int, own_model: bool, shared: bool) -> Draws:
    """The draws that round a rank's parameters after each step. Where every rank holds a
    replica of one model (collective schemes, DDP, the asynchronous server), the replicas must
    round alike or they drift apart, so every rank keys them as rank 0, as the one model would
    be rounded once; where each rank trains its own model (``own_model``: the decentralized
    schemes) they are the rank's own, unless ``shared``."""
    return rounding.draws(seed, rank if own_model else 0, rounding.WEIGHT_STREAM, shared)
