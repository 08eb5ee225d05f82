"""Compressor interface and the Payload that travels on the wire.

A compressor turns a flat float32 gradient into a :class:`Payload` of real buffers and back.
``Payload.nbytes`` is the sum of the sizes of the buffers that are sent: never a formula.

Stochastic rounding draws come from a counter-based hash keyed by
(seed, step, rank, stream, element index), see ``qbench.compress.rng``, so that an encode is
reproducible and independent of how the vector is split into ranges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch


@dataclass(frozen=True)
class WireField:
    """One buffer of a payload as it is laid out on the wire."""

    name: str
    dtype: torch.dtype
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * _itemsize(self.dtype)


@dataclass(frozen=True)
class Payload:
    """An encoded gradient: named buffers (all sent) plus the element count they encode."""

    numel: int
    buffers: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        """Exact bytes of every buffer that goes on the wire."""
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def to_wire(self) -> torch.Tensor:
        """All buffers concatenated as one uint8 tensor, in insertion order."""
        parts = [
            b.reshape(-1).contiguous().view(torch.uint8) for b in self.buffers.values() if b.numel()
        ]
        if not parts:
            return torch.empty(0, dtype=torch.uint8)
        return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass(frozen=True)
class Key:
    """What a stochastic rounding draw depends on besides the element index.

    ``stream`` separates independent encodes of the same step and rank (e.g. the second
    quantization of an aggregated range in reduce-broadcast).
    """

    seed: int = 0
    step: int = 0
    rank: int = 0
    stream: int = 0


@dataclass
class Compressor:
    """Base class: subclasses implement ``_encode``, ``_decode`` and ``wire_layout``.

    Attributes set by subclasses:
      name: registry name.
      fixed_size: True when ``wire_layout(n)`` fully determines the payload of n elements,
        so receivers can split a wire buffer without a size exchange.
      stateful: True when the compressor keeps error-feedback residuals between steps.
      hook_only: True when it is not a codec but a DDP communication hook (powersgd).
    """

    name: ClassVar[str] = "base"
    fixed_size: ClassVar[bool] = True
    stateful: ClassVar[bool] = False
    hook_only: ClassVar[bool] = False
    seed: int = 0
    state: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    # -- public API --------------------------------------------------------------------------
    def encode(
        self,
        grad: torch.Tensor,
        *,
        step: int = 0,
        rank: int = 0,
        stream: int = 0,
        offset: int = 0,
        name: str = "",
    ) -> Payload:
        """Encode a 1-D float32 tensor.

        offset: global index of ``grad[0]`` in the full gradient; it keys the random draws so
          that encoding a range gives the same draws as encoding the whole vector.
        name: error-feedback state slot (one residual per distinct name).
        """
        if grad.dim() != 1 or grad.dtype != torch.float32:
            raise ValueError(
                f"{self.name}: expected a 1-D float32 tensor, got {grad.dtype} {tuple(grad.shape)}"
            )
        key = Key(seed=self.seed, step=step, rank=rank, stream=stream)
        return self._encode(grad, key, offset, name)

    def decode(self, payload: Payload, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode to float32; with ``out`` given, add the decoded values into it and return it."""
        values = self._decode(payload)
        if out is None:
            return values
        return out.add_(values)

    def wire_layout(self, numel: int) -> list[WireField]:
        """Buffers, in wire order, of the payload of ``numel`` elements (fixed-size only)."""
        raise NotImplementedError

    def from_wire(self, wire: torch.Tensor, numel: int) -> Payload:
        """Split a received uint8 buffer back into a Payload (inverse of Payload.to_wire)."""
        buffers: dict[str, torch.Tensor] = {}
        pos = 0
        for f in self.wire_layout(numel):
            chunk = wire[pos : pos + f.nbytes]
            if chunk.storage_offset() % _itemsize(f.dtype):
                chunk = chunk.clone()  # view(dtype) needs an aligned start; packed bits may not be
            buffers[f.name] = chunk.view(f.dtype) if f.nbytes else torch.empty(0, dtype=f.dtype)
            pos += f.nbytes
        if pos != wire.numel():
            raise ValueError(f"{self.name}: wire buffer has {wire.numel()} bytes, expected {pos}")
        return Payload(numel=numel, buffers=buffers)

    def wire_nbytes(self, numel: int) -> int:
        return sum(f.nbytes for f in self.wire_layout(numel))

    @property
    def label(self) -> str:
        """Short human label used in tables and figures (e.g. ``qsgd-4b-b512``)."""
        return self.name

    @property
    def nominal_bits(self) -> float:
        """Bits per value the algorithm targets, before per-bucket metadata."""
        return 32.0

    def reset(self) -> None:
        """Forget error-feedback state."""
        self.state.clear()

    # -- to implement ------------------------------------------------------------------------
    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        raise NotImplementedError

    def _decode(self, payload: Payload) -> torch.Tensor:
        raise NotImplementedError


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()
