"""A synthetic model whose size and compute are set independently (seed 002 Figure 16's MB/GFLOPS).

The model is a chain of L square ``Linear(w, w)`` layers and a ``Linear(w, classes)`` head; its
input is a w-vector. Parameters: ``L (w^2 + w) + classes (w + 1)``. The forward pass applies the L
layers A >= L times in turn (layer ``i % L`` at step i, so layers share their weights across
repeats), each as a residual step ``x = x + tanh(layer(x)) / sqrt(A)`` that keeps activations and
gradients bounded however deep the unrolled chain is. Forward FLOPs per sample, counted as matmul
FLOPs (2 per multiply-add, like ``torch.utils.flop_counter``; the elementwise tanh and add are not
counted): ``2 A w^2 + 2 w classes``.

Choosing the layout for a target parameter count P and G GFLOPs per sample:

* the ideal width is ``w0 = min(1024, sqrt(P), sqrt(G 1e9 / 32))`` (so the repeats give at
  least ~16 steps of compute granularity) and L0 = round(P / w0^2); for each L in [L0/2, 2 L0 + 2]
  w is solved from the parameter formula and rounded both ways; the (w, L) nearest w0 among those
  within 0.5 % of P wins (else the most accurate);
* A = round((G 1e9 - 2 w classes) / (2 w^2)), at least L: every weight takes part at least once,
  so G must be at least about 2 P / 1e9 (one multiply-add per weight and sample), and FLOPs are
  within about 1 / (2 A) of G.

For P >= 10,000 (the smallest allowed) the count is within 2 % of P and the FLOPs within 4 % of G
(tests/test_models.py checks a grid); at the defaults (10M, 0.1 GFLOPs) both are within 0.2 %.

An explicit ``width`` keeps w fixed and rounds P to whole layers (then the count can be off by up
to half a layer, w^2 / 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

CLASSES = 10
MAX_AUTO_WIDTH = 1024
MAX_LAYERS = 100_000
"""An explicit width that needs more layers than this is refused: building the model (and its
parameter count) would take minutes, and no seed workload is that deep."""


@dataclass(frozen=True)
class Layout:
    width: int
    layers: int
    steps: int
    """Layer applications per forward pass (A)."""

    @property
    def parameters(self) -> int:
        return self.layers * (self.width**2 + self.width) + CLASSES * (self.width + 1)

    @property
    def flops(self) -> int:
        return 2 * self.steps * self.width**2 + 2 * self.width * CLASSES


def min_gflops(params: int) -> float:
    """The least compute a model of ``params`` parameters can have: one multiply-add per weight."""
    return 2 * params / 1e9


def plan(params: int, gflops: float, width: int | None = None) -> Layout:
    """The layout closest to ``params`` parameters and ``gflops`` forward GFLOPs per sample.

    Raises ValueError (a message for the user) when ``width`` is too large for ``params``.
    """
    if width is None:
        width, layers = _auto_width(params, gflops)
    else:
        rest = params - CLASSES * (width + 1)
        if rest < (width**2 + width) / 2:
            need = width**2 + width + CLASSES * (width + 1)
            raise ValueError(
                f"width {width} needs params of at least about {need:,}, got {params:,}; "
                "lower width or leave it auto"
            )
        layers = max(1, round(rest / (width**2 + width)))
        if layers > MAX_LAYERS:
            least = math.ceil(math.sqrt(rest / MAX_LAYERS))
            raise ValueError(
                f"width {width} needs {layers:,} layers for params {params:,} (at most "
                f"{MAX_LAYERS:,}); use width >= {least} or leave it auto"
            )
    steps = max(layers, round((gflops * 1e9 - 2 * width * CLASSES) / (2 * width**2)))
    return Layout(width, layers, steps)


def _auto_width(params: int, gflops: float) -> tuple[int, int]:
    """(width, layers) with about ``params`` parameters and a width near the ideal w0."""
    w0 = max(1.0, min(MAX_AUTO_WIDTH, math.sqrt(params), math.sqrt(gflops * 1e9 / 32)))
    l0 = max(1, round(params / (w0 * w0 + w0)))
    best: tuple[tuple[bool, float, float], int, int] | None = None
    for layers in range(max(1, l0 // 2), 2 * l0 + 3):
        # L w^2 + (L + c) w + c - P = 0
        b = layers + CLASSES
        w = (-b + math.sqrt(b * b + 4 * layers * (params - CLASSES))) / (2 * layers)
        for width in {max(1, math.floor(w)), max(1, math.ceil(w))}:
            err = abs(Layout(width, layers, layers).parameters - params) / params
            key = (err > 0.005, abs(math.log(width / w0)), err)  # near w0 among the accurate
            if best is None or key < best[0]:
                best = (key, width, layers)
    assert best is not None
    return best[1], best[2]


class SyntheticModel(nn.Module):
    def __init__(self, layout: Layout) -> None:
        super().__init__()
        self.layout = layout
        w = layout.width
        self.layers = nn.ModuleList(nn.Linear(w, w) for _ in range(layout.layers))
        self.head = nn.Linear(w, CLASSES)
        self.scale = 1 / math.sqrt(layout.steps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = len(self.layers)
        for i in range(self.layout.steps):
            x = x + self.scale * torch.tanh(self.layers[i % n](x))
        return self.head(x)
