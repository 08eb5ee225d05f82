"""Compressor interface and the Payload that travels on the wire.

A compressor turns a flat float32 gradient into a :class:`Payload` of real buffers and back.
``Payload.nbytes`` is the sum of the sizes of the buffers that are sent: never a formula.

Stochastic rounding draws come from a counter-based hash keyed by
(seed, step, rank, stream, element index), see ``qbench.compress.kernels.rng``, so that an encode is
reproducible and independent of how the vector is split into ranges.

Per-tensor compressors (catalog granularity ``tensor``: top-k and adaptive with ``scope:
layer``, fixed point with an auto delta, QSGD with ``align: tensor``) take ``pieces``, the sizes
of the tensors (or tensor parts) that make up the range: each piece is encoded on its own (its
draws still keyed by global element index, its error-feedback slot ``name/i``) and the payload
holds the per-piece payloads in order (``Payload.parts``), sent back to back as one message.
Other compressors ignore ``pieces``. The receiver passes the same pieces to ``from_wire``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
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
    parts: tuple[Payload, ...] = ()
    """A per-tensor compressor's payloads of the pieces, in order (``buffers`` is then empty):
    each with its own header, sent back to back."""

    @property
    def nbytes(self) -> int:
        """Exact bytes of every buffer that goes on the wire."""
        own = sum(b.numel() * b.element_size() for b in self.buffers.values())
        return own + sum(p.nbytes for p in self.parts)

    def to_wire(self) -> torch.Tensor:
        """All buffers concatenated as one uint8 tensor, in insertion order (the parts' buffers
        part after part)."""
        parts = [
            b.reshape(-1).contiguous().view(torch.uint8) for b in self.buffers.values() if b.numel()
        ]
        parts += [w for p in self.parts if (w := p.to_wire()).numel()]
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

    def __init__(
        self, *, seed: int = 0, spec: catalog.CompressorSpec | None = None, **params: Any
    ) -> None:
        if spec is not None and params:
            raise TypeError(f"{self.name}: give a validated spec or parameters, not both")
        # a run's spec was validated when its scenario or record was read: not again
        self.spec = spec or catalog.compressor({"name": self.name, **params})
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
        """Keeps error-feedback residuals between steps (by design, or by its parameters)."""
        return self.spec.entry.stateful or self.spec.error_feedback

    @property
    def hook_only(self) -> bool:
        """Not a codec but a DDP communication hook (powersgd)."""
        return self.spec.entry.hook_only

    @property
    def granularity(self) -> str:
        """What one scale, width or budget covers (``qbench.catalog.GRANULARITIES``)."""
        return self.spec.granularity

    def pieces(self, numel: int, pieces: Sequence[int] | None) -> tuple[int, ...]:
        """The sizes this compressor encodes separately out of a range of ``numel`` values made
        of ``pieces``: the pieces for a per-tensor compressor, else the whole range."""
        if pieces is not None and len(pieces) <= 1:
            pieces = None
        return self.spec.entry.pieces(self.spec.params, numel, pieces)

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
        pieces: Sequence[int] | None = None,
    ) -> Payload:
        """Encode a 1-D float32 tensor.

        offset: global index of ``grad[0]`` in the full gradient; it keys the random draws so
          that encoding a range gives the same draws as encoding the whole vector.
        name: error-feedback state slot (one residual per distinct name; piece i of a
          per-tensor encode uses ``name/i``).
        pieces: sizes of the tensors (or tensor parts) ``grad`` is made of, adding up to its
          length; a per-tensor compressor encodes each on its own, the others ignore them.
        """
        if grad.dim() != 1 or grad.dtype != torch.float32:
            raise ValueError(
                f"{self.name}: expected a 1-D float32 tensor, got {grad.dtype} {tuple(grad.shape)}"
            )
        key = Key(seed=self.seed, step=step, rank=rank, stream=stream)
        sizes = self.pieces(grad.numel(), pieces)
        if len(sizes) == 1:
            return self._encode(grad, key, offset, name)
        parts, pos = [], 0
        for i, n in enumerate(sizes):
            parts.append(self._encode(grad[pos : pos + n], key, offset + pos, f"{name}/{i}"))
            pos += n
        return Payload(numel=grad.numel(), buffers={}, parts=tuple(parts))

    def decode(
        self, payload: Payload, out: torch.Tensor | None = None, *, accumulate: bool = True
    ) -> torch.Tensor:
        """Decode to float32; with ``out`` given, add the decoded values into it and return it
        (``accumulate=False``: write them into it, a preallocated buffer)."""
        if not payload.parts:
            return self._decode_into(payload, out, accumulate)
        if out is None:
            device = next(iter(payload.parts[0].buffers.values())).device
            out = torch.zeros(payload.numel, dtype=torch.float32, device=device)
        pos = 0
        for part in payload.parts:
            self._decode_into(part, out[pos : pos + part.numel], accumulate)
            pos += part.numel
        return out

    def _decode_into(
        self, payload: Payload, out: torch.Tensor | None, accumulate: bool = True
    ) -> torch.Tensor:
        """Decode one (single-piece) payload, added into (or written to) ``out`` when given."""
        values = self._decode(payload)
        if out is None:
            return values
        return out.add_(values) if accumulate else out.copy_(values)

    def wire_layout(self, numel: int) -> list[WireField]:
        """Buffers, in wire order, of the payload of ``numel`` elements (fixed-size only)."""
        wire = self.spec.entry.wire
        if wire is None:
            raise NotImplementedError(
                f"{self.name}: the payload size depends on the data (fixed_size is False); "
                "exchange sizes before receiving and use from_wire, which reads the header"
            )
        return [WireField(b, getattr(torch, dt), n) for b, dt, n in wire(self.spec.params, numel)]

    def from_wire(
        self, wire: torch.Tensor, numel: int, pieces: Sequence[int] | None = None
    ) -> Payload:
        """Split a received uint8 buffer back into a Payload (inverse of Payload.to_wire);
        ``pieces`` as the sender's encode had them."""
        sizes = self.pieces(numel, pieces)
        if len(sizes) == 1:
            return self._from_wire(wire, numel)
        parts, pos = [], 0
        for n in sizes:
            size = self._wire_size_at(wire[pos:], n)
            parts.append(self._from_wire(wire[pos : pos + size], n))
            pos += size
        if pos != wire.numel():
            raise ValueError(f"{self.name}: wire buffer has {wire.numel()} bytes, expected {pos}")
        return Payload(numel=numel, buffers={}, parts=tuple(parts))

    def _wire_size_at(self, wire: torch.Tensor, numel: int) -> int:
        """Bytes of the payload of ``numel`` values at the start of ``wire`` (one piece of a
        per-tensor payload); data-dependent payloads read it from their header."""
        return self.wire_nbytes(numel)

    def _from_wire(self, wire: torch.Tensor, numel: int) -> Payload:
        """``from_wire`` of one piece (the whole buffer)."""
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

    def wire_nbytes(self, numel: int, pieces: Sequence[int] | None = None) -> int:
        """Payload bytes of ``numel`` values (fixed-size only), per piece for a per-tensor
        compressor."""
        return sum(f.nbytes for n in self.pieces(numel, pieces) for f in self.wire_layout(n))

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

    def twin(self) -> Compressor:
        """This compressor with error-feedback state of its own, for a second exchange whose
        slot names would meet this one's (Streaming DiLoCo's fragments: each exchange names its
        slots from its own slice, so two fragments through one compressor would trade
        residuals). Everything else, kernels and buffers included, is shared."""
        twin = copy.copy(self)
        twin.state = {}
        return twin

    # -- to implement ------------------------------------------------------------------------
    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        raise NotImplementedError

    def _decode(self, payload: Payload) -> torch.Tensor:
        raise NotImplementedError


def all_finite(values: torch.Tensor) -> bool:
    """Whether every value is finite (no NaN, no inf). One sum decides it in the usual case: a
    NaN or inf survives every addition, so a finite sum means finite values, and a reduction
    costs far less than ``isfinite(values).all()``, which writes a mask first (docs/failures.md
    measures both). Only a sum that overflowed on finite values takes the full check."""
    return math.isfinite(float(values.sum())) or bool(torch.isfinite(values).all())


def nonfinite_kind(values: torch.Tensor) -> str:
    """``NaN`` when ``values`` holds one, else ``inf`` (for values known to be non-finite)."""
    return "NaN" if bool(torch.isnan(values).any()) else "inf"


def require_finite(
    codec: str, values: torch.Tensor, probe: torch.Tensor | float | None = None, offset: int = 0
) -> None:
    """Raise ValueError, naming the first NaN or inf of ``values``, when there is one, where a
    codec would otherwise put a finite value in its place (fixed point), keep it for good (an
    error-feedback residual) or fail obscurely (adaptive, in numpy). ``probe``: what the codec
    computed from ``values`` anyway that is NaN or inf whenever one of them is (a max |x|), so
    that the usual case costs nothing more; None: the sum of ``values``. ``offset``: the index
    of ``values[0]`` (encode's ``offset``, plus a piece's position), so that the message counts
    as the caller does. qbench's run loops check every gradient before a codec sees it
    (qbench.run.nonfinite); this is for callers of ``encode`` itself."""
    if isinstance(probe, float):
        if math.isfinite(probe):
            return
    elif math.isfinite(float((values if probe is None else probe).sum())):
        return
    bad = ~torch.isfinite(values)
    if not bool(bad.any()):  # only the sum overflowed (e.g. a norm of values near 1e19)
        return
    i = int(bad.nonzero()[0, 0])
    raise ValueError(
        f"{codec}: value {offset + i} is {float(values[i])}; the codecs take finite "
        "values only (qbench's run loop fails or skips such a step: scenario key `nonfinite`)"
    )


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()
