"""Registry entry and parameters of the asynchronous parameter server ``async-ps`` (seed 003).

The scheme has no synchronous step, so it is not an Aggregator the training loop calls: the
worker hands the whole run to ``qbench.async_ps`` (rank 0 serves, the others train). This class
exists so that scenarios name and validate it like every other scheme:

``scheme: {name: async-ps, staleness: 4, variant: asylpg, down: {name: qsgd, bits: 8}}``
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from qbench.aggregate.base import Aggregator
from qbench.comm import Comm
from qbench.compress import Compressor
from qbench.timing import PhaseTimer


@dataclass(frozen=True, kw_only=True)
class AsyncParams:
    """The scheme's parameters as the catalog validated them (qbench.catalog.schemes.ASYNC_PS,
    where each is documented)."""

    staleness: int
    variant: str
    down: dict[str, Any] | None
    ratio: float


class AsyncPS(Aggregator):
    name = "async-ps"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        tensors: Sequence[int] | None = None, **params: Any,
    ) -> None:  # fmt: skip
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        self.params = AsyncParams(**params)

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        raise RuntimeError("async-ps has no synchronous step; qbench.worker runs qbench.async_ps")
