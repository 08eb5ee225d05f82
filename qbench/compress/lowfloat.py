"""The low-precision float wire formats hardware ships now: FP8 (E4M3, E5M2) with fp32 scales,
the OCP Microscaling formats MXFP8 / MXFP6 / MXFP4, and NVFP4 (beyond the seeds).

The arithmetic is ``qbench.compress.blockscale`` on the element formats of
``qbench.compress.minifloat``; this module makes them codecs: error feedback (optional, off by
default: the formats are usually sent as they are), stochastic rounding drawn from
``qbench.compress.kernels.rng`` keyed like every other codec (element index, so a range encodes as
the whole does), and the wire: the element codes bit-packed (8, 6 or 4 bits, ``bitpack``), then
the block scales (float32 for FP8, one E8M0 or E4M3 byte per block for MX and NVFP4), then
NVFP4's float32 tensor scale. Wire layouts: ``qbench.catalog.compressors`` (``_fp8_wire``...).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

from qbench.compress import blockscale as bs
from qbench.compress import minifloat as mf
from qbench.compress.base import Compressor, Key, Payload, require_finite
from qbench.compress.kernels import bitpack, native
from qbench.compress.kernels.abi import LowFloatFormat
from qbench.compress.kernels.draws import uniform
from qbench.compress.kernels.rng import key_hash


class ScaledFloat(Compressor):
    """The pipeline the three formats share; subclasses say how they scale (``scaling``).

    ``_encode_torch`` and ``_decode`` are the reference. CPU and CUDA tensors go through
    compiled kernels when they can be built (``qbench.compress.kernels.native``:
    kernels/cpu/qbench_cpu.c, kernels/lowfloat.cu, both on kernels/lowfloat_math.h), with
    byte-identical codes, scales, residuals (updated in place when contiguous) and decoded values;
    ``native.set_backend("torch")`` forces the reference."""

    rounding: Literal["nearest", "stochastic"]
    error_feedback: bool

    @property
    def scaling(self) -> bs.Scaling:
        raise NotImplementedError

    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        residual = self.state.get(name) if self.error_feedback else None
        kernels = native.kernels_for(grad)
        plain = residual is None or (
            residual.shape == grad.shape
            and (residual.dtype, residual.device) == (grad.dtype, grad.device)
        )  # else the reference, which broadcasts or fails as torch does
        if kernels is None or not plain:
            return self._encode_torch(grad, key, offset, name)
        fmt, ef = self.kernel_format(grad.numel()), self.error_feedback
        enc = kernels.lowfloat_encode(
            grad, residual, fmt, ef=ef, key_hash=key_hash(key), offset=offset
        )
        if enc is None:  # a NaN or inf in grad: the reference's error, the residual untouched
            require_finite(self.name, grad, None, offset)
            raise AssertionError(f"{self.name}: the kernel saw a NaN or inf that grad lacks")
        buffers = {"codes": enc.codes, "scales": enc.scales}
        if enc.tensor_scale is not None:
            buffers["tensor_scale"] = enc.tensor_scale
        if enc.residual is not None:
            self.state[name] = enc.residual
        return Payload(numel=grad.numel(), buffers=buffers)

    def _encode_torch(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        """The reference: blockscale's arithmetic, then bitpack."""
        values = grad
        if self.error_feedback:
            residual = self.state.get(name)
            values = grad + residual if residual is not None else grad
        enc = self.encode_blocks(values, key, offset)
        require_finite(self.name, grad, None, offset)
        codes = enc.codes.reshape(-1)[: grad.numel()]  # the padding of the last block stays home
        buffers = {"codes": bitpack.pack(codes, self.scaling.element.bits), "scales": enc.scales}
        if enc.tensor_scale is not None:
            buffers["tensor_scale"] = enc.tensor_scale
        payload = Payload(numel=grad.numel(), buffers=buffers)
        if self.error_feedback:
            self.state[name] = values - self._decode(payload)
        return payload

    def encode_blocks(
        self, values: torch.Tensor, key: Key, offset: int, amax: torch.Tensor | None = None
    ) -> bs.Blocks:
        """The unpacked codes and scales of ``values`` (``amax``: shared block maxima)."""
        return bs.encode(values, self.scaling, self.draws(values, key, offset), amax)

    def draws(self, values: torch.Tensor, key: Key, offset: int) -> torch.Tensor | None:
        """Stochastic rounding's draws for ``values``, zero-padded to whole blocks (padding is 0
        and rounds to 0 anyway); None when rounding to nearest."""
        if self.rounding != "stochastic":
            return None
        u = uniform(key, offset, values.numel(), values.device)
        return torch.cat([u, u.new_zeros(-values.numel() % self.scaling.block_of(values.numel()))])

    def _decode_into(
        self, payload: Payload, out: torch.Tensor | None, accumulate: bool = True
    ) -> torch.Tensor:
        n, scales = payload.numel, payload.buffers["scales"]
        kernels = native.decode_kernels(scales, out, n)
        if kernels is None:
            return super()._decode_into(payload, out, accumulate)
        self._check_payload(payload)
        codes, tensor_scale = payload.buffers["codes"], payload.buffers.get("tensor_scale")
        return kernels.lowfloat_decode(
            codes, scales, tensor_scale, n, self.kernel_format(n), out=out, accumulate=accumulate
        )

    def kernel_format(self, numel: int) -> LowFloatFormat:
        """The wire format of ``numel`` values as the compiled paths take it."""
        scaling, stochastic = self.scaling, self.rounding == "stochastic"
        return LowFloatFormat(
            scaling.kind, scaling.element.name, scaling.block_of(numel), stochastic
        )

    def _check_payload(self, payload: Payload) -> None:
        # The compiled paths read exactly these buffers: check them as unpack does for torch.
        want = [(f.name, f.dtype, f.numel) for f in self.wire_layout(payload.numel)]
        got = [(k, b.dtype, b.numel()) for k, b in payload.buffers.items()]
        if got != want:
            raise ValueError(
                f"{self.name}: payload of {payload.numel} values needs buffers {want}, got {got}"
            )
        devices = {b.device for b in payload.buffers.values()}
        if len(devices) > 1:
            raise ValueError(f"{self.name}: payload buffers on several devices: {devices}")

    def _decode(self, payload: Payload) -> torch.Tensor:
        """The reference: bitpack.unpack, then blockscale's arithmetic."""
        n = payload.numel
        block = self.scaling.block_of(n)
        codes = bitpack.unpack(payload.buffers["codes"], self.scaling.element.bits, n)
        padded = torch.cat([codes, codes.new_zeros(-n % block)])
        enc = bs.Blocks(padded, payload.buffers["scales"], payload.buffers.get("tensor_scale"))
        return bs.decode(enc, self.scaling, n)


class FP8(ScaledFloat):
    name: ClassVar[str] = "fp8"
    format: Literal["e4m3", "e5m2"]
    block_size: int

    @property
    def scaling(self) -> bs.Scaling:
        return bs.fp8(mf.FORMATS[self.format], self.block_size)


class MX(ScaledFloat):
    name: ClassVar[str] = "mx"
    element: Literal["e4m3", "e5m2", "e3m2", "e2m3", "e2m1"]

    @property
    def scaling(self) -> bs.Scaling:
        return bs.mx(mf.FORMATS[self.element])


class NVFP4(ScaledFloat):
    name: ClassVar[str] = "nvfp4"
    scope: Literal["layer", "global"]

    @property
    def scaling(self) -> bs.Scaling:
        return bs.NVFP4
