"""Compressor interface and the Payload that travels on the wire.

A compressor turns a flat float32 gradient into a :class:`Payload` of real buffers and back.
``Payload.nbytes`` is the sum of the sizes of the buffers that are sent: never a formula.

Stochastic rounding draws come from a counter-based hash keyed by
(seed, step, rank, stream, element index), see ``qbench.compress.rng``, so that an encode is
reproducible and independent of how the vector is split into ranges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from qbench import catalog


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


class Compressor:
    """Base class: subclasses implement ``_encode`` and ``_decode``.

    Parameters, label, wire layout and capabilities come from the compressor's catalog entry
    (``qbench.catalog.compressors``), which also validates them: ``QSGD(bits=4)`` fills in the
    other defaults and ``QSGD(bits=12)`` raises the catalog's UserError. Subclasses declare the
    parameters as annotations only, for attribute access (``self.bits``). ``seed`` keys the
    stochastic rounding (the run's seed); ``state`` holds error-feedback residuals by slot.
    """

    name: ClassVar[str] = "base"

    def __init__(self, *, seed: int = 0, **params: Any) -> None:
        self.spec = catalog.compressor({"name": self.name, **params})
        self.seed = seed
        self.state: dict[str, torch.Tensor] = {}
        for key, value in self.spec.params.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.spec.params.items())
        return f"{type(self).__name__}({params}{', ' if params else ''}seed={self.seed})"

    @property
    def fixed_size(self) -> bool:
        """``wire_layout(n)`` fully determines the payload of n elements, so receivers can split
        a wire buffer without a size exchange."""
        return self.spec.entry.wire is not None

    @property
    def stateful(self) -> bool:
        """Keeps error-feedback residuals between steps (by design, whatever its parameters)."""
        return self.spec.entry.stateful

    @property
    def hook_only(self) -> bool:
        """Not a codec but a DDP communication hook (powersgd)."""
        return self.spec.entry.hook_only

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
        wire = self.spec.entry.wire
        if wire is None:
            raise NotImplementedError(
                f"{self.name}: the payload size depends on the data (fixed_size is False); "
                "exchange sizes before receiving and use from_wire, which reads the header"
            )
        return [WireField(b, getattr(torch, dt), n) for b, dt, n in wire(self.spec.params, numel)]

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
        """Short label used in tables, figures and run ids (e.g. ``qsgd-4b-b512``)."""
        return self.spec.label

    @property
    def nominal_bits(self) -> float:
        """Bits per value the algorithm targets, before per-bucket metadata (NaN: unknown)."""
        bits = self.spec.nominal_bits
        return math.nan if bits is None else bits

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
