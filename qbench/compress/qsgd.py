"""QSGD (Alistarh et al.), bucketed, as in section 3.2.2 of the low-precision study.

Each bucket of ``bucket_size`` consecutive values is scaled by its own s (max |x| or the l2
norm) and every value is stochastically rounded to one of the levels, so E[decode] = x.
Two level layouts:

- ``intervals``: [-s, s] cut into 2^bits - 1 equal intervals, levels are their endpoints;
  code k means -s + k * 2s / (2^bits - 1).
- ``sign``: the top bit of a code is the sign (1 = negative), the other bits a magnitude level
  0..S of |x|/s with S = 2^(bits-1) - 1; code means sign * level * s / S.

Buckets run over consecutive values (``align: contiguous``, the default), so with several
tensors in one layer group a bucket can take the tail of one tensor and the head of the next
under one scale; ``align: tensor`` restarts them at every tensor, as the seed artefact's buckets
live inside one matrix: each tensor is encoded on its own (qbench.compress.base: pieces), a
tensor's last bucket may be partial, and its payload is the tensors' payloads back to back.

Wire: "levels" (codes bit-packed, exactly ceil(n*bits/8) bytes; 16-bit codes as 2n
little-endian bytes) then "scales" (float32, one per bucket). The last bucket is padded in
memory only; padding is never sent.

The functions below are the reference. CPU and CUDA tensors go through compiled kernels when
they can be built (``qbench.compress.kernels.native``: C loops, CuPy), with byte-identical payloads;
the reference is written so that this is possible: true divisions, and the l2 norm summed in the
fixed order of ``_buckets.tree_sum``. ``native.set_backend("torch")`` forces the reference.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

from qbench.compress.base import Compressor, Key, Payload
from qbench.compress.kernels import bitpack, native
from qbench.compress.kernels.abi import QsgdFormat, check_payload
from qbench.compress.kernels.buckets import buckets as _buckets
from qbench.compress.kernels.buckets import tree_sum
from qbench.compress.kernels.draws import uniform
from qbench.compress.kernels.rng import key_hash


class QSGD(Compressor):
    name: ClassVar[str] = "qsgd"
    # Parameters (documented and validated in qbench.catalog.compressors):
    bits: int
    bucket_size: int
    norm: Literal["max", "l2"]
    layout: Literal["intervals", "sign"]
    align: Literal["contiguous", "tensor"]
    error_feedback: bool

    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        """With error feedback the values encoded are grad + last step's residual of the slot
        ``name``, and the new residual is what they lose, values - decode(payload): the
        payload's own decode, byte-identical on every path, so the residual is too."""
        residual = self.state.get(name) if self.error_feedback else None
        values = grad if residual is None else grad + residual
        kernels = native.kernels_for(values)
        if kernels is None:
            levels, scales = self._encode_torch(values, key, offset)
        else:
            levels, scales = kernels.qsgd_encode(
                values, self.kernel_format, key_hash=key_hash(key), offset=offset
            )
        payload = Payload(numel=grad.numel(), buffers={"levels": levels, "scales": scales})
        if self.error_feedback:
            decoded = self._decode_into(payload, None, accumulate=False).view(grad.shape)
            self.state[name] = values - decoded
        return payload

    def _decode_into(
        self, payload: Payload, out: torch.Tensor | None, accumulate: bool = True
    ) -> torch.Tensor:
        levels, scales, n = payload.buffers["levels"], payload.buffers["scales"], payload.numel
        kernels = native.decode_kernels(scales, out, n)
        if kernels is None:
            return super()._decode_into(payload, out, accumulate)
        # The compiled paths read exactly these sizes: check them as unpack does for torch.
        nbytes, nscales = (f.numel for f in self.wire_layout(n))
        check_payload("qsgd", n, ("levels", levels), ("scales", scales), (nbytes, nscales))
        return kernels.qsgd_decode(
            levels, scales, n, self.kernel_format, out=out, accumulate=accumulate
        )

    @property
    def kernel_format(self) -> QsgdFormat:
        """The wire format as the compiled paths take it."""
        return QsgdFormat(self.bits, self.bucket_size, self.layout, self.norm)

    def _encode_torch(
        self, grad: torch.Tensor, key: Key, offset: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        buckets = _buckets(grad, self.bucket_size)
        scales = _scales(buckets, self.norm)
        # Draws are keyed by global element index, so a bucket-aligned range of the vector
        # encodes exactly as the same range of the whole vector does.
        u = _buckets(uniform(key, offset, grad.numel(), grad.device), self.bucket_size)
        codes = _quantize(buckets, scales, u, self.bits, self.layout)
        return _pack_codes(codes.reshape(-1)[: grad.numel()], self.bits), scales

    def _decode(self, payload: Payload) -> torch.Tensor:
        n = payload.numel
        codes = _unpack_codes(payload.buffers["levels"], self.bits, n)
        scales = payload.buffers["scales"]
        values = _dequantize(_buckets(codes, self.bucket_size), scales, self.bits, self.layout)
        return values.reshape(-1)[:n]


def _scales(buckets: torch.Tensor, norm: str) -> torch.Tensor:
    if norm == "max":
        return buckets.abs().amax(dim=1)
    # Fixed summation order (_buckets.tree_sum). torch's float32 sqrt on CPU may be off by an
    # ulp (vectorised math library); the float64 root rounded to float32 is the correctly
    # rounded one (float64 has more than 2 * 24 + 2 bits), as sqrtf in the kernels.
    return torch.sqrt(tree_sum(buckets * buckets).double()).float()


def _quantize(
    buckets: torch.Tensor, scales: torch.Tensor, u: torch.Tensor, bits: int, layout: str
) -> torch.Tensor:
    """Integer codes (int32): the position t in level units, rounded up with probability its
    fraction (``_round_level``)."""
    # An all-zero bucket has s = 0: divide by 1 instead so it encodes to level 0 / magnitude 0
    # (which decode to 0 either way, since the scale sent is 0).
    ratio = buckets / torch.where(scales > 0, scales, 1.0).unsqueeze(1)
    if layout == "intervals":
        top = (1 << bits) - 1
        t = (ratio + 1.0) * (top / 2.0)
        level = _round_level(t, u, top)
        return torch.where(scales.unsqueeze(1) > 0, level, 0)
    # |ratio| <= 1 for both norms; the clamp only guards against rounding just above top.
    top = (1 << (bits - 1)) - 1
    level = _round_level(ratio.abs() * top, u, top)
    return level | ((ratio < 0).to(torch.int32) << (bits - 1))


def _round_level(t: torch.Tensor, u: torch.Tensor, top: int) -> torch.Tensor:
    """floor(v) + [u < v - floor(v)] with v = t clamped to [0, top] (NaN to 0), as int32.

    Exact at every width: v - floor(v) is computed without rounding, so the level goes up with
    probability the fraction itself. floor(t + u) would first round t + u to float32, which
    drops the low bits of u once t is large (16 bits: t up to 65535, float32 spacing 2^-8
    there) and biases the rounding (kernels/qsgd_math.h: qb_round_level, the same steps)."""
    v = torch.where(t >= 0, t, 0.0)  # NaN compares false: 0, as in the kernels
    v = torch.where(v <= top, v, float(top))
    low = torch.floor(v)
    return (low + (u < v - low).to(v.dtype)).to(torch.int32)


def _dequantize(codes: torch.Tensor, scales: torch.Tensor, bits: int, layout: str) -> torch.Tensor:
    codes = codes.to(torch.int32)
    top = (1 << bits) - 1 if layout == "intervals" else (1 << (bits - 1)) - 1
    # A tensor divisor: CUDA torch multiplies by the reciprocal of a Python-number divisor,
    # which can differ from s / top in the last bit.
    step = (scales / torch.full_like(scales, float(top))).unsqueeze(1)
    if layout == "intervals":
        # (2k - top) is an exact integer, so codes k and top - k decode to exact negatives.
        return (2 * codes - top).to(torch.float32) * step
    magnitude = (codes & top).to(torch.float32) * step
    return torch.where((codes >> (bits - 1)) > 0, -magnitude, magnitude)


def _pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    if bits != 16:
        return bitpack.pack(codes, bits)
    # Low byte first (little-endian), built by hand: uint16 tensors support few torch ops.
    return torch.stack([codes & 0xFF, codes >> 8], dim=1).to(torch.uint8).reshape(-1)


def _unpack_codes(levels: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    if bits != 16:
        return bitpack.unpack(levels, bits, numel)
    if levels.numel() != 2 * numel:
        raise ValueError(f"qsgd: expected {2 * numel} bytes of 16-bit levels, got {levels.numel()}")
    pairs = levels.reshape(-1, 2).to(torch.int32)
    return pairs[:, 0] | (pairs[:, 1] << 8)
