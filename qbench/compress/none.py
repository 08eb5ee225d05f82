"""No compression: the fp32 gradient itself is the payload (the full-precision baseline)."""

from __future__ import annotations

from typing import ClassVar

import torch

from qbench.compress.base import Compressor, Key, Payload


class NoCompression(Compressor):
    name: ClassVar[str] = "none"

    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        # No copy: the payload aliases ``grad``, so the baseline pays no encode cost. Callers
        # must not modify ``grad`` while the payload is in flight.
        return Payload(numel=grad.numel(), buffers={"values": grad})

    def _decode(self, payload: Payload) -> torch.Tensor:
        # Also aliases the buffer (the gradient, or the received wire bytes viewed as float32).
        return payload.buffers["values"]
