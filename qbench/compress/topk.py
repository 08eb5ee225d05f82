"""Top-k sparsification with error feedback (seed 001 section 1 and Table 3; seed 003).

Seed 001 (Aketi et al.) communicates, per layer, only the top K% (by magnitude) of the
error-compensated values, and reports 99% compression (ratio 0.01, the default here); seed 003
(Sparse-AsyLPG) bounds the convergence rate by the sparsity budget. Per encode: the
k = max(1, ceil(ratio * n)) entries of largest |grad + residual| are sent; with error feedback
the entries not sent become the next residual (one per ``name``), so
sent + new residual == grad + old residual, exactly.

Scope. ``layer`` (the default, seed 001's "layer-wise top-k": "only top K% of the weights /
gradients of each layer are communicated"): the schemes hand the codec the tensor boundaries of
every range they encode and each tensor keeps its own ceil(ratio * n_i), so a small layer is
never starved by a large one (qbench.compress.base: pieces). ``global``: one top-k over all an
encode call gets, a whole layer group or an owner range (label without ``-layer``; what qbench
did before the scope existed). The seed's code (aparna-aketi/Low_Precision_DL,
gossip_choco/utils/helpers.py ``sparsify_layerwise``) keeps max(1, int(n (1 - 0.99))) per
parameter tensor, i.e. floor; qbench keeps the ceiling, so a 1% budget of a 150-value bias is 2.

Wire: "values" (float32[k]) then "indices" (int32[k], ascending, relative to the encoded
range, or to the piece per tensor). k depends only on n, so the size is fixed; decode scatters
into zeros.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

from qbench.catalog.wire import topk_k
from qbench.compress.base import Compressor, Key, Payload, require_finite


class TopK(Compressor):
    name: ClassVar[str] = "topk"
    # Parameters (documented and validated in qbench.catalog.compressors):
    ratio: float
    error_feedback: bool
    scope: Literal["layer", "global"]

    def k(self, numel: int) -> int:
        """Entries kept out of ``numel``."""
        return topk_k(self.ratio, numel)

    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        values = (grad + self._residual(grad, name)) if self.error_feedback else grad
        require_finite(self.name, values, offset=offset)  # before the residual keeps it for good
        indices = _top_indices(values, self.k(grad.numel()))
        sent = values[indices]
        if self.error_feedback:
            residual = values.clone()
            residual[indices] = 0.0
            self.state[name] = residual
        buffers = {"values": sent, "indices": indices.to(torch.int32)}
        return Payload(numel=grad.numel(), buffers=buffers)

    def _decode(self, payload: Payload) -> torch.Tensor:
        values = payload.buffers["values"]
        out = values.new_zeros(payload.numel)
        out[payload.buffers["indices"].long()] = values
        return out

    def _residual(self, grad: torch.Tensor, name: str) -> torch.Tensor:
        residual = self.state.get(name)
        if residual is None:
            return torch.zeros_like(grad)
        if residual.shape != grad.shape:
            raise ValueError(
                f"topk: residual {name!r} has shape {tuple(residual.shape)}, gradient has "
                f"{tuple(grad.shape)}; use a distinct `name` per tensor or call reset()"
            )
        return residual


def _top_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (int64, ascending) of the k entries of largest magnitude."""
    if k == 0:
        return torch.zeros(0, dtype=torch.int64, device=values.device)
    return torch.topk(values.abs(), k, sorted=False).indices.sort().values
