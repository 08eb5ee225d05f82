"""Aggregation scheme interface: turn each rank's flat gradient into the mean gradient."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from qbench.comm import Comm
from qbench.compress import Compressor
from qbench.timing import PhaseTimer


class Aggregator(ABC):
    """One scheme over one contiguous slice of the flat gradient.

    ``aggregate`` marks the timer's encode / comm / decode phases itself. ``offset`` is where the
    slice starts in the flat gradient: it keys the random draws, so slices never share draws.
    After each call ``payload_bytes`` holds the bytes of this rank's own encoded gradient.
    """

    name: ClassVar[str]

    def __init__(self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0) -> None:
        self.comm = comm
        self.compressor = compressor
        self.numel = numel
        self.offset = offset
        self.payload_bytes = 4 * numel
        self.overlapped = False
        """True when encode / comm / decode interleave, so only the iteration time is real."""

    @abstractmethod
    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        """Return the gradient the optimizer applies: for synchronous schemes the mean over ranks
        of (the compressed) ``grad``; may reuse ``grad``'s storage."""
        raise NotImplementedError

    def after_step(self, params: torch.Tensor, step: int, timer: PhaseTimer) -> None:
        """Called with this slice of the flat parameters after the optimizer step; decentralized
        schemes (gossip) mix models with their neighbours here. Default: nothing."""
        return None

    def metrics(self) -> dict[str, float]:
        """Extra per-iteration columns (names from records.ITERATION_COLUMNS), measured outside
        the timed region. Default: none."""
        return {}


def split_ranges(numel: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """Split [0, numel) into ``parts`` consecutive ranges whose starts are multiples of ``align``
    (so range-wise buckets coincide with whole-vector buckets); sizes differ by at most
    ``align``."""
    units = -(-numel // align)
    bounds = [min(numel, (units * i // parts) * align) for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]
