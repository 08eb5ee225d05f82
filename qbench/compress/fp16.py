"""Half-precision casts on the wire: IEEE fp16 ("fp16") and bfloat16 ("bf16").

The 16-bit baselines of the low-precision study (seed 000, Tables 1-2, 16 bits). Each value is
rounded to nearest (no stochastic rounding) and sent as 2 bytes. fp16 keeps 10 mantissa bits but
only the range |x| <= 65504 (larger values become inf, values below ~6e-8 become 0); bf16 keeps
float32's range with 7 mantissa bits. No scaling: that is what loss scaling would add.

Wire: "values" (float16 or bfloat16, one per value, 2n bytes). Deterministic.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from qbench.compress.base import Compressor, Key, Payload


class _Cast(Compressor):
    wire_dtype: ClassVar[torch.dtype]

    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        return Payload(numel=grad.numel(), buffers={"values": grad.to(self.wire_dtype)})

    def _decode(self, payload: Payload) -> torch.Tensor:
        return payload.buffers["values"].to(torch.float32)


class Half(_Cast):
    name: ClassVar[str] = "fp16"
    wire_dtype: ClassVar[torch.dtype] = torch.float16


class BFloat16(_Cast):
    name: ClassVar[str] = "bf16"
    wire_dtype: ClassVar[torch.dtype] = torch.bfloat16
