"""The scaledsign codec (torch): bit-packed signs and one float32 scale per bucket."""

from __future__ import annotations

from typing import ClassVar

import torch

from qbench.compress import Compressor, Key, Payload

_SHIFTS = torch.arange(8, dtype=torch.uint8)


class ScaledSign(Compressor):
    name: ClassVar[str] = "scaledsign"
    bucket_size: int

    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        n, b = grad.numel(), self.bucket_size
        padded = torch.cat([grad, grad.new_zeros(-n % b)]).reshape(-1, b)
        counts = torch.full((padded.shape[0],), float(b), device=grad.device)
        if n:  # the last bucket may be short: its mean is over the values it holds
            counts[-1] = n - b * (padded.shape[0] - 1)
        scales = padded.abs().sum(1) / counts
        bits = (grad >= 0).to(torch.uint8)
        bits = torch.cat([bits, bits.new_zeros(-n % 8)]).reshape(-1, 8)
        signs = (bits << _SHIFTS.to(grad.device)).sum(1, dtype=torch.uint8)
        return Payload(n, {"signs": signs, "scales": scales.float()})

    def _decode(self, payload: Payload) -> torch.Tensor:
        n, b = payload.numel, self.bucket_size
        packed = payload.buffers["signs"]
        bits = (packed[:, None] >> _SHIFTS.to(packed.device)) & 1
        signs = bits.reshape(-1)[:n].float() * 2 - 1
        scales = payload.buffers["scales"].repeat_interleave(b)[:n]
        return signs * scales
