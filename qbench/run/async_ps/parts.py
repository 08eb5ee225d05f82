"""What the async parameter server's ranks read of a rank's set-up (:class:`AsyncParts`, built
by ``qbench.run.loops.flat.async_parts``), the scheme's parameters and which rank serves. Apart
from the package's ``__init__`` so that the server, the client and the protocol import it without
importing the package that starts them. Loads no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from qbench.comm.base import Comm
    from qbench.compress import Compressor
    from qbench.run.loops.epochs import EpochData
    from qbench.run.nonfinite import Guard
    from qbench.run.precision import LossScaler
    from qbench.spec.matrix import RunSpec

SERVER = 0
"""The rank that serves; every other rank is a worker."""


@dataclass(frozen=True, kw_only=True)
class AsyncParams:
    """The scheme's parameters as the catalog validated them (qbench.catalog.schemes.ASYNC_PS,
    where each is documented)."""

    staleness: int
    variant: str
    down: dict[str, Any] | None
    ratio: float


class Batches(Protocol):
    def batch(self, i: int, /) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True, kw_only=True)
class AsyncParts:
    """What the server and the workers use of a rank's set-up (``qbench.run.loops.flat.async_parts``
    builds it from the shared :class:`~qbench.run.loops.training.Training`). Nothing is copied: the
    package trains the model in place and appends to the caller's row lists."""

    spec: RunSpec
    comm: Comm
    device: torch.device
    model: nn.Module
    params: torch.Tensor
    """The flat parameters; the model's parameters are views into it (the server steps it)."""
    grads: torch.Tensor
    """The flat gradients; the model's ``.grad`` are views into it."""
    sizes: list[int]
    """Elements of each parameter tensor, in flat order (per-tensor weight quantization)."""
    groups: list[tuple[slice, Compressor, tuple[int, ...]]]
    """Each layer group's slice of the flat buffers, its compressor and the sizes of its tensors
    (the gradient codec; per-tensor compressors encode each tensor on its own)."""
    scheme: AsyncParams
    data: Batches
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    scaler: LossScaler
    epoch_data: EpochData | None
    """Accuracy mode: the server evaluates its model on it after each epoch's updates."""
    rows: list[dict[str, Any]]
    """Per-iteration rows (records.ITERATION_COLUMNS): one per push or applied update."""
    epoch_rows: list[dict[str, Any]]
    """Per-epoch rows (records.EPOCH_COLUMNS), written by the server in accuracy mode."""
    guard: Guard
    """A worker's non-finite policy (``nonfinite``), its own: under ``skip`` the worker pushes
    no gradient that holds a NaN or inf (the server applies no update for it and hands the
    worker a new model), with no collective to agree on."""


def shard(rank: int, world_size: int) -> tuple[int, int]:
    """The (index, count) of the training partition a rank owns: the workers split the training
    set; the server holds all of it, and the test split, to evaluate its model."""
    return (0, 1) if rank == SERVER else (rank - 1, world_size - 1)
