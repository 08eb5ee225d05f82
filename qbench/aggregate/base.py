"""Aggregation scheme interface: turn each rank's flat gradient into the mean gradient."""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import cached_property
from typing import ClassVar

import torch

from qbench.comm.base import Comm
from qbench.compress import Compressor, Payload
from qbench.timing import PhaseTimer


class Aggregator(ABC):
    """One scheme over one contiguous slice of the flat gradient.

    ``aggregate`` marks the timer's encode / comm / decode phases itself. ``offset`` is where the
    slice starts in the flat gradient: it keys the random draws, so slices never share draws.
    ``tensors``: the sizes of the parameter tensors the slice is made of (the layer plan's
    group), so that per-tensor compressors encode each on its own (:meth:`pieces`); default one
    tensor. After each call ``payload_bytes`` holds the bytes of this rank's own encoded
    gradient. What several schemes share is here as well: ``fixed`` and ``wire_size`` (no size
    exchange needed), ``encode_slice`` and ``mean_of`` (K payloads laid end to end).
    """

    name: ClassVar[str]

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        tensors: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        self.comm = comm
        self.compressor = compressor
        self.numel = numel
        self.offset = offset
        self.tensors = tuple(tensors) if tensors else (numel,)
        if sum(self.tensors) != numel:
            raise ValueError(f"{self.name}: tensors {list(self.tensors)} do not add up to {numel}")
        self.payload_bytes = 4 * numel
        self.overlapped = False
        """True when encode / comm / decode interleave, so only the iteration time is real."""
        self.hidden_s = 0.0
        """Seconds of the exchanges this step finished that ran behind the loop, not waited for
        (Streaming DiLoCo's; the records' ``t_comm_total`` less ``t_comm``)."""
        self.late: list[tuple[int, int, int]] = []
        """(step, bytes sent, payload bytes) of exchanges that ran behind the loop and finished
        since: the loop adds them to the record of the step that started them and clears this."""
        self.fixed = compressor.fixed_size
        """The payload's length alone fixes its bytes, so receivers need no size exchange."""

    @cached_property
    def wire_size(self) -> int:
        """Bytes of the whole slice's payload when ``fixed``, else 0."""
        return self.compressor.wire_nbytes(self.numel, self.pieces()) if self.fixed else 0

    @abstractmethod
    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        """Return the gradient the optimizer applies: for synchronous schemes the mean over ranks
        of (the compressed) ``grad``; may reuse ``grad``'s storage."""
        raise NotImplementedError

    def begin(self, params: torch.Tensor) -> None:
        """Called once with this slice of the flat parameters before the first step; local
        SGD and DiLoCo keep the global model from here. Default: nothing."""
        return None

    def after_step(self, params: torch.Tensor, step: int, timer: PhaseTimer) -> None:
        """Called with this slice of the flat parameters after the optimizer step; decentralized
        schemes (gossip) mix models with their neighbours here. Default: nothing."""
        return None

    def finish(self, params: torch.Tensor) -> None:
        """Called once the run's last step is recorded, outside the timed loop: what is still
        in flight ends here (Streaming DiLoCo waits for its exchanges and merges them).
        Default: nothing."""
        return None

    def close(self) -> None:
        """Release threads the scheme started; called when the run ends, well or not."""
        return None

    def metrics(self) -> dict[str, float]:
        """Extra per-iteration columns (names from records.ITERATION_COLUMNS), measured outside
        the timed region. Default: none."""
        return {}

    def pieces(self, start: int = 0, end: int | None = None) -> list[int]:
        """The range [start, end) of the slice cut at its tensor boundaries: the sizes a
        per-tensor compressor encodes separately (the ``pieces`` of encode and from_wire)."""
        return cut(self.tensors, start, self.numel if end is None else end)

    def split(self, numel: int, parts: int, start: int = 0) -> list[tuple[int, int]]:
        """[start, start + numel) of the slice split into ``parts`` ranges (relative to start)
        on the compressor's bucket grid: consecutive buckets, or buckets restarting at every
        tensor for a per-tensor compressor with buckets (qsgd ``align: tensor``)."""
        align = int(getattr(self.compressor, "bucket_size", 1))
        if self.compressor.granularity != "tensor" or align == 1:
            return split_ranges(numel, parts, align)
        return split_ranges(numel, parts, align, self.pieces(start, start + numel))

    def encode_slice(self, values: torch.Tensor, step: int, name: str, stream: int = 0) -> Payload:
        """This rank's payload of ``values``, the whole slice: keyed by the slice's offset, cut
        at its tensors; ``name`` is the error-feedback slot."""
        return self.compressor.encode(
            values, step=step, rank=self.comm.rank, stream=stream, offset=self.offset, name=name,
            pieces=self.pieces(),
        )  # fmt: skip

    def mean_of(
        self, received: torch.Tensor, sizes: Sequence[int], acc: torch.Tensor,
        pieces: Sequence[int] | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """The mean over the K ranks of the payloads laid end to end in ``received`` (``sizes``
        bytes each), each of ``acc``'s length cut into ``pieces`` (default: the slice's), added
        into ``acc`` (zeroed by the caller) and divided by K."""
        c = self.compressor
        pieces = self.pieces() if pieces is None else pieces
        pos = 0
        for size in sizes:
            c.decode(c.from_wire(received[pos : pos + size], acc.numel(), pieces), out=acc)
            pos += size
        return acc.div_(self.comm.world_size)


def split_ranges(
    numel: int, parts: int, align: int = 1, tensors: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """Split [0, numel) into ``parts`` consecutive ranges whose starts are multiples of ``align``
    (so range-wise buckets coincide with whole-vector buckets); sizes differ by at most
    ``align``. With ``tensors`` (sizes adding up to numel) the buckets restart at every tensor:
    a range starts at a tensor's start or a multiple of ``align`` after it, the last such
    point at or before the even split."""
    if tensors is None:
        units = -(-numel // align)
        bounds = [min(numel, (units * i // parts) * align) for i in range(parts + 1)]
        return [(bounds[i], bounds[i + 1]) for i in range(parts)]
    starts: list[int] = []
    pos = 0
    for n in tensors:
        starts.extend(range(pos, pos + n, align))
        pos += n
    starts.append(numel)
    bounds = [starts[bisect.bisect_right(starts, numel * i // parts) - 1] for i in range(parts)]
    bounds.append(numel)
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]


def cut(tensors: Sequence[int], start: int, end: int) -> list[int]:
    """Sizes of the non-empty intersections of [start, end) with consecutive tensors of sizes
    ``tensors``."""
    out, pos = [], 0
    for n in tensors:
        a, b = max(pos, start), min(pos + n, end)
        if b > a:
            out.append(b - a)
        pos += n
    return out
