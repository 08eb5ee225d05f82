"""1bitSGD (Seide et al.) with error feedback, bucketed ("1bitSGD*" of the low-precision study).

Per bucket of ``bucket_size`` consecutive values of grad + residual: avg+ is the mean of the
values >= 0, avg- the mean of the values < 0 (0 when there are none), and each value is
replaced by the mean of its sign. The quantisation error is carried into the next step.

Wire: "signs" (1 bit per value, bit set = negative, packed little-endian with bitpack,
exactly ceil(n/8) bytes) then "means" (float32, 2 per bucket, interleaved:
[avg+_0, avg-_0, avg+_1, avg-_1, ...]). Deterministic: no random draws.

The functions below are the reference; CPU and CUDA tensors go through compiled kernels when
they can be built (``qbench.compress.kernels.native``), with byte-identical payloads and residuals:
bucket sums use the fixed order of ``_buckets.tree_sum``. The compiled paths update a
contiguous residual in place. ``native.set_backend("torch")`` forces the reference.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from qbench.compress.base import Compressor, Key, Payload
from qbench.compress.kernels import bitpack, native
from qbench.compress.kernels.abi import check_payload
from qbench.compress.kernels.buckets import buckets, num_buckets, tree_sum


class OneBit(Compressor):
    name: ClassVar[str] = "onebit"
    # Parameters (documented and validated in qbench.catalog.compressors). ``columns``: CNTK's
    # column is its first, contiguous dimension, which is the LAST dimension of a torch
    # (row-major) tensor; ``qbench.spec.layers.plan`` sets ``bucket_size`` per tensor to that length
    # (3 for a 3x3 conv), reproducing the artefact of tiny columns that barely compress.
    bucket_size: int
    error_feedback: bool
    columns: bool

    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        residual = self._residual(grad, name) if self.error_feedback else None
        kernels = native.kernels_for(grad)
        if kernels is None:
            signs, means, new_residual = self._encode_torch(grad, residual)
        else:
            signs, means, new_residual = kernels.onebit_encode(
                grad, residual, bucket_size=self.bucket_size, ef=self.error_feedback
            )
        if new_residual is not None:
            self.state[name] = new_residual
        return Payload(numel=grad.numel(), buffers={"signs": signs, "means": means})

    def _encode_torch(
        self, grad: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        values = grad
        if self.error_feedback:  # a missing residual is +0.0: -0.0 + 0.0 is +0.0, as in C
            values = grad + residual if residual is not None else grad + 0.0
        negative = values < 0
        means = _sign_means(values, negative, self.bucket_size)
        new_residual = None
        if self.error_feedback:
            new_residual = values - _expand(negative, means, self.bucket_size)
        return bitpack.pack(negative, 1), means.reshape(-1), new_residual

    def _decode_into(
        self, payload: Payload, out: torch.Tensor | None, accumulate: bool = True
    ) -> torch.Tensor:
        signs, means, n = payload.buffers["signs"], payload.buffers["means"], payload.numel
        kernels = native.decode_kernels(means, out, n)
        if kernels is None:
            return super()._decode_into(payload, out, accumulate)
        want = (bitpack.packed_nbytes(n, 1), 2 * num_buckets(n, self.bucket_size))
        check_payload("onebit", n, ("signs", signs), ("means", means), want)
        return kernels.onebit_decode(
            signs, means, n, bucket_size=self.bucket_size, out=out, accumulate=accumulate
        )

    def _decode(self, payload: Payload) -> torch.Tensor:
        negative = bitpack.unpack(payload.buffers["signs"], 1, payload.numel).bool()
        return _expand(negative, payload.buffers["means"].view(-1, 2), self.bucket_size)

    def _residual(self, grad: torch.Tensor, name: str) -> torch.Tensor | None:
        residual = self.state.get(name)
        if residual is None:
            return None
        if residual.shape != grad.shape:
            raise ValueError(
                f"onebit: residual {name!r} has shape {tuple(residual.shape)}, gradient has "
                f"{tuple(grad.shape)}; use a distinct `name` per tensor or call reset()"
            )
        if (residual.dtype, residual.device) != (grad.dtype, grad.device):
            raise ValueError(
                f"onebit: residual {name!r} is {residual.dtype} on {residual.device}, gradient "
                f"{grad.dtype} on {grad.device}; call reset() after moving the model"
            )
        return residual


def _sign_means(values: torch.Tensor, negative: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """(buckets, 2) float32: avg+ and avg- of each bucket."""
    v = buckets(values, bucket_size)
    neg = buckets(negative, bucket_size)
    n_neg = neg.sum(dim=1)
    # Sizes come from the true element count: padding zeros would otherwise count as ">= 0".
    sizes = torch.full_like(n_neg, bucket_size)
    sizes[-1:] -= -values.numel() % bucket_size
    # Fixed summation order (tree_sum), so that the compiled paths round identically.
    sum_neg = tree_sum(torch.where(neg, v, 0.0))
    sum_pos = tree_sum(torch.where(neg, 0.0, v))
    avg_pos = sum_pos / (sizes - n_neg).clamp(min=1)
    avg_neg = sum_neg / n_neg.clamp(min=1)
    return torch.stack([avg_pos, avg_neg], dim=1)


def _expand(negative: torch.Tensor, means: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """Each value's replacement: avg- where negative, else avg+."""
    neg = buckets(negative, bucket_size)
    out = torch.where(neg, means[:, 1:2], means[:, 0:1])
    return out.reshape(-1)[: negative.numel()]
