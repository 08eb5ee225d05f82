"""Asynchronous parameter server with double quantization (seed 003, Yu, Wu and Huang):
AsyLPG, Sparse-AsyLPG and accelerated AsyLPG. Scheme ``async-ps``; its parameters are
validated by the catalog (``qbench.catalog.schemes.ASYNC_PS``) into :class:`AsyncParams`.

Rank 0 is a dedicated server holding the fp32 master model; ranks 1..K-1 are workers over K-1
partitions of the training set. There is no barrier: each worker repeatedly pulls the model
(quantized by ``down``: the model half of double quantization), computes a gradient on its next
batch, encodes it with the run's compressor (the gradient half) and pushes it. The server
applies each gradient when it arrives, one version per update, and holds a worker's next model
back while handing it out could let some update exceed the staleness bound tau
(:func:`qbench.run.async_ps.protocol.may_hand_out`). Variants:

* ``asylpg``: the server steps x <- x - lr (g + wd x) (plain SGD, as AsyLPG; no momentum);
* ``sparse``: the same, with each gradient top-k sparsified then quantized (``ratio``);
* ``accelerated``: Nesterov momentum with beta = the scenario's ``momentum``: workers get the
  look-ahead point y = x + beta v, and the server steps v <- beta v - lr (g + wd x), x <- x + v.

Seed 003 builds the three on SVRG (a snapshot and its full gradient per epoch); qbench's
workers send plain stochastic gradients, as every other scheme here does.

Rows: a worker writes one per push; the server one per update it applied, with the update's
staleness, the version it produced, the pushing worker's batch loss and ``cum_bits``, all bits
through the server so far (up and down, headers included): seed 003's "bits transmitted until
the training loss first falls below a threshold" (:mod:`qbench.run.async_ps.metrics`).

The package reads a rank's set-up through :class:`AsyncParts` only, which
``qbench.run.flat_loop.async_parts`` builds; it never imports the training loops. Modules:
``protocol`` (messages, the staleness rule, the gradient codec), ``server`` (rank 0),
``worker`` (the others), ``metrics`` (pure pandas over the rows). Importing the package or
``metrics`` loads no torch: reports read the metric.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from qbench.errors import UserError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from qbench.comm import Comm
    from qbench.compress import Compressor
    from qbench.run.epochs import EpochData
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
    """What the server and the workers use of a rank's set-up (``qbench.run.flat_loop.async_parts``
    builds it from the shared :class:`~qbench.run.training.Training`). Nothing is copied: the
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


def run(parts: AsyncParts) -> None:
    """Serve (rank 0) or work (the others) until the server has spent its budget of updates."""
    if parts.spec.telemetry:
        raise UserError(
            "async-ps records no per-layer telemetry; remove `telemetry` from the scenario "
            "for async-ps runs"
        )
    if parts.comm.rank == SERVER:
        from qbench.run.async_ps.server import serve  # torch: loaded when a rank runs, not before

        serve(parts)
    else:
        from qbench.run.async_ps.worker import work

        work(parts)
