"""Per-layer compression telemetry, on request (scenario ``telemetry: true``).

A separate pass, outside the timed region: every layer is shadowed by its own encoder (same
compressor and key as the run, its own error-feedback state) fed with that layer's gradient each
iteration. It records what per-layer compression does to this gradient: the relative error
||Q(g) - g|| / ||g||, the error-feedback residual norm (NaN for stateless compressors) and the
bits per value actually on the wire (Payload.nbytes * 8 / numel). Every tensor is encoded on
its own, so for a compressor with ``scope: global`` (one choice per group or owner range) the
rows show what a per-tensor encode would do, not what the scheme's one call did.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch

from qbench.compress import Compressor

TELEMETRY_COLUMNS: dict[str, str] = {
    "run_id": "string",
    "rank": "int32",
    "iteration": "int32",
    "layer": "string",
    "compressor": "string",
    "numel": "int64",
    "rel_error": "float64",
    "residual_norm": "float64",
    "bits_per_value": "float64",
}


class Telemetry:
    def __init__(
        self,
        layers: list[tuple[str, slice, dict[str, Any]]],
        make: Callable[[dict[str, Any]], Compressor],
        run_id: str,
        rank: int,
    ) -> None:
        """layers: (name, slice of the flat gradient, compressor spec) per parameter tensor."""
        self.layers = [(name, part, make(spec)) for name, part, spec in layers]
        self.run_id, self.rank = run_id, rank
        self.rows: list[dict[str, Any]] = []

    def observe(self, iteration: int, flat_grad: torch.Tensor) -> None:
        for name, part, enc in self.layers:
            g = flat_grad[part]
            old = enc.state.get(name)
            target = g if old is None else g + old  # what error feedback makes the encoder send
            payload = enc.encode(g, step=iteration, rank=self.rank, offset=part.start, name=name)
            approx = enc.decode(payload)
            self.rows.append(self._row(iteration, name, enc, g, approx, target, payload.nbytes))

    def _row(
        self, it: int, name: str, enc: Compressor, g: torch.Tensor, approx: torch.Tensor,
        target: torch.Tensor, nbytes: int,
    ) -> dict[str, Any]:  # fmt: skip
        norm = float(g.norm())
        residual = enc.state.get(name)
        return {
            "run_id": self.run_id,
            "rank": self.rank,
            "iteration": it,
            "layer": name,
            "compressor": enc.label,
            "numel": g.numel(),
            "rel_error": float((approx - g).norm()) / norm if norm > 0 else math.nan,
            "residual_norm": float(residual.norm()) if residual is not None else math.nan,
            "bits_per_value": nbytes * 8 / max(1, g.numel()),
        }

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(TELEMETRY_COLUMNS)).astype(TELEMETRY_COLUMNS)
