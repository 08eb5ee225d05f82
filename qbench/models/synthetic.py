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
(tests/models/test_models.py checks a grid); at the defaults (10M, 0.1 GFLOPs) both are within
0.2 %.

An explicit ``width`` keeps w fixed and rounds P to whole layers (then the count can be off by up
to half a layer, w^2 / 2).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from qbench.catalog.synthetic_layout import CLASSES, Layout, min_gflops, plan  # noqa: F401


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
