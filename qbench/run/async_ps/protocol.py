"""Messages and pure rules of the asynchronous parameter server (:mod:`qbench.run.async_ps`).

Every message is a fixed-size float64 header (tag HEADER) followed, when its size is not zero,
by one uint8 payload (tag PAYLOAD) whose size the header gives, so payloads of any size travel
(adaptive compressors, top-k with quantized values). float64 holds every integer up to 2^53
exactly, so versions, sizes and the loss share one header.

* push, worker -> server: [worker, version the gradient was computed on, batch loss, skipped,
  size of each layer group's wire...]; the payload is the groups' wires, concatenated.
  ``skipped`` 1: the gradient held a NaN or inf (``nonfinite: skip``) and is not sent: no
  payload, and the server applies no update for it.
* reply, server -> worker: [model version, staleness of this worker's last update, version that
  update produced, stop flag, payload size]; the payload is the model, quantized by ``down``
  cut at every tensor of the model (:func:`encode_model`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from qbench.comm.base import Comm
from qbench.compress import Compressor, WireField, from_spec
from qbench.compress.topk import TopK
from qbench.run.async_ps.parts import AsyncParts

HEADER, PAYLOAD = 1, 2
"""Message tags: a header and its payload never match each other's receive."""


def send_message(cm: Comm, header: torch.Tensor, payload: torch.Tensor, dst: int) -> None:
    """A header, then its payload unless empty (the receiver knows from the header)."""
    cm.send(header, dst, tag=HEADER)
    if payload.numel():
        cm.send(payload.cpu(), dst, tag=PAYLOAD)


def may_hand_out(version: int, pulled: Collection[int], tau: int) -> bool:
    """Whether the server may give a waiting worker the current model (version ``version``)
    now, given the versions ``pulled`` that the workers still computing received.

    Staleness of an update = server version when applied - version its gradient was computed
    on: the updates applied in between. The server cannot choose the order gradients arrive
    in, so it keeps, for every gradient j in flight, the worst case bounded:
    ``(version - pulled_j) + (other gradients in flight) <= tau``, since j's staleness grows
    only when another gradient in flight lands first. Applying another update leaves that sum
    unchanged (version + 1, one fewer in flight); handing out a model raises every sum by one
    and adds a gradient whose sum is len(pulled). So a model goes out only while
    ``version - min(pulled) + len(pulled) <= tau`` (nothing in flight: always), and no update
    is ever applied with staleness > tau, whatever the arrival order. tau = 0 is serial SGD;
    W equally fast workers run without waiting from about tau >= 2 (W - 1).
    """
    oldest = min(pulled, default=version)
    return version - oldest + len(pulled) <= tau


def update_budget(workers: int, per_worker: int) -> int:
    """Updates the server applies in all: ``per_worker`` pushes per worker on average (fast
    workers push more, slow ones less; the server stops everyone when the budget is spent)."""
    return workers * per_worker


@dataclass(frozen=True)
class Push:
    worker: int
    version: int
    loss: float
    sizes: tuple[int, ...]
    skipped: bool = False

    def to_tensor(self) -> torch.Tensor:
        values = [self.worker, self.version, self.loss, float(self.skipped), *self.sizes]
        return torch.tensor(values, dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Push:
        v = t.tolist()
        return cls(int(v[0]), int(v[1]), v[2], tuple(int(s) for s in v[4:]), bool(v[3]))

    @staticmethod
    def header_len(groups: int) -> int:
        return 4 + groups


@dataclass(frozen=True)
class Reply:
    version: int
    staleness: float = math.nan
    applied_as: float = math.nan
    stop: bool = False
    size: int = 0

    LEN = 5

    def to_tensor(self) -> torch.Tensor:
        values = [self.version, self.staleness, self.applied_as, float(self.stop), self.size]
        return torch.tensor(values, dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Reply:
        v = t.tolist()
        return cls(int(v[0]), v[1], v[2], bool(v[3]), int(v[4]))


class GradientCodec:
    """A flat gradient <-> one wire per layer group (the run's per-group compressors, each with
    the sizes of the group's tensors, which per-tensor compressors encode separately).

    ``ratio`` None: each group is encoded with its compressor (AsyLPG: quantized). ``ratio`` r:
    Sparse-AsyLPG; each tensor of a group keeps its top ceil(r n) values (top-k's default
    ``scope: layer``, so a small tensor is never starved by a large one; error feedback: the
    rest is added to the next gradient, per tensor, on the worker). The kept values are then
    encoded with the compressor, with each tensor's kept values as one piece: a per-tensor
    compressor (granularity ``tensor``, e.g. QSGD ``align: tensor``) quantizes each tensor's
    kept values with their own scale and header, so values ~1e-3 are not rounded on the grid
    of a neighbour's ~1; the others treat the group's kept values as one vector (contiguous
    buckets, one ``scope: global`` call), as their granularity says. The wire is the int32
    indices (in the group; each tensor's as the catalog's top-k wire counts them), then the
    encoded values.
    """

    def __init__(
        self, groups: Sequence[tuple[slice, Compressor, Sequence[int]]], ratio: float | None
    ) -> None:
        self.groups = list(groups)
        self.topk = TopK(ratio=ratio, error_feedback=True) if ratio is not None else None

    def encode(self, grad: torch.Tensor, step: int, rank: int) -> list[torch.Tensor]:
        wires = []
        for i, (part, c, tensors) in enumerate(self.groups):
            g, slot = grad[part], f"g{i}"
            if self.topk is None:
                payload = c.encode(
                    g, step=step, rank=rank, offset=part.start, name=slot, pieces=tensors
                )
                wires.append(payload.to_wire())
                continue
            indices, kept = self._sparsify(g, tensors, slot)
            counts = [f.numel for f in self._index_fields(tensors, g.numel())]
            values = c.encode(
                kept, step=step, rank=rank, offset=part.start, name=slot, pieces=counts
            )
            wires.append(torch.cat([indices.view(torch.uint8), values.to_wire()]))
        return wires

    def _sparsify(
        self, g: torch.Tensor, tensors: Sequence[int], slot: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(int32 indices in the group, values) of each tensor's top-k, tensor by tensor."""
        assert self.topk is not None
        indices, values, start = [], [], 0
        for j, n in enumerate(_pieces(tensors, g.numel())):
            kept = self.topk.encode(g[start : start + n], name=f"{slot}.{j}").buffers
            indices.append(kept["indices"] + start)
            values.append(kept["values"])
            start += n
        return torch.cat(indices).to(torch.int32), torch.cat(values)

    def _index_fields(self, tensors: Sequence[int], numel: int) -> list[WireField]:
        """Each tensor's kept-index buffer as the catalog's top-k wire lays it out (int32 k_i):
        the counts are the pieces of the kept values, the bytes where the values start."""
        assert self.topk is not None
        layouts = (self.topk.wire_layout(n) for n in _pieces(tensors, numel))
        return [f for layout in layouts for f in layout if f.name == "indices"]

    def decode(self, wire: torch.Tensor, sizes: Sequence[int], out: torch.Tensor) -> None:
        """Decode the concatenated group wires into ``out`` (overwritten)."""
        out.zero_()
        pos = 0
        for (part, c, tensors), size in zip(self.groups, sizes, strict=True):
            chunk, view = _aligned(wire[pos : pos + size]), out[part]
            pos += size
            if self.topk is None:
                c.decode(c.from_wire(chunk, view.numel(), tensors), out=view)
                continue
            fields = self._index_fields(tensors, view.numel())
            counts, at = [f.numel for f in fields], sum(f.nbytes for f in fields)
            indices = chunk[:at].view(torch.int32).long()
            values = c.decode(c.from_wire(_aligned(chunk[at:]), sum(counts), counts))
            view.index_add_(0, indices, values)


def encode_model(
    down: Compressor, model: torch.Tensor, sizes: Sequence[int], version: int, worker: int
) -> torch.Tensor:
    """The wire of the model the server sends ``worker`` (the model half of double
    quantization). ``sizes`` are the model's tensors: a per-tensor ``down`` gives each its own
    scale and header, as the gradient codec does. Encoded per reply, keyed by the worker, so
    each worker gets its own stochastic rounding; stream 1 keeps its draws apart from the
    gradients'."""
    enc = down.encode(model, step=version, rank=worker, stream=1, name="down", pieces=sizes)
    return enc.to_wire()


def decode_model(
    down: Compressor, wire: torch.Tensor, sizes: Sequence[int], out: torch.Tensor
) -> None:
    """The worker's side of :func:`encode_model`: the model into ``out`` (overwritten)."""
    out.copy_(down.decode(down.from_wire(wire, out.numel(), sizes)))


def _pieces(tensors: Sequence[int], numel: int) -> Sequence[int]:
    """The tensor sizes a group's top-k runs over: each tensor (scope layer), else the group."""
    return tensors if tensors else (numel,)


def _aligned(chunk: torch.Tensor) -> torch.Tensor:
    """A slice of a received byte buffer that any dtype view can read (8-byte aligned)."""
    return chunk.clone() if chunk.storage_offset() % 8 else chunk


def codecs(parts: AsyncParts) -> tuple[GradientCodec, Compressor]:
    """The run's gradient codec (per layer group) and model quantizer (``down``)."""
    scheme = parts.scheme
    codec = GradientCodec(parts.groups, scheme.ratio if scheme.variant == "sparse" else None)
    down = from_spec(scheme.down or "none", seed=parts.spec.measurement.seed)
    return codec, down
