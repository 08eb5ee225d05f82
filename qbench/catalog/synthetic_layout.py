"""The synthetic model's layout: width, layers and repeats for a target size and compute
(no torch; the model itself is ``qbench.models.synthetic``). See that module's docstring for the
construction and its accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
