"""Keyed uniforms for the stochastic rounding of low-precision compute and weights
(qbench.run.precision: ``compute: int8 / int8-asym`` and ``weights: {bits: N}``).

Every draw is the compressors' counter-based hash (:mod:`qbench.compress.kernels.rng`) of (seed,
step, rank, stream, element index): no generator state, so a run is reproducible and each rank's
draws are its own. Until issue 31 this rounding drew from torch's global generator, which every rank
seeds with the run's seed, so all ranks drew the same numbers and their rounding errors were
correlated. Where a rank's draws come from (``rounding:``, a scenario key):

* ``per-rank`` (the default): keyed by the rank, independent between ranks, as separate
  devices with their own generators would round;
* ``shared``: keyed as rank 0 on every rank, so every rank draws the same numbers for the same
  element and call: what seed 001's authors' code does (each rank seeds torch's generator
  with the same seed), kept to reproduce it.

Streams keep these draws apart from the compressors' (streams 0 to 3 in qbench.aggregate) and
from each other: one per fake-quantized layer, one for the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qbench.compress.base import Key
from qbench.compress.kernels.draws import uniform

SHARED_RANK = 0
"""The rank every rank keys its draws with under ``rounding: shared``."""
LAYER_STREAM = 1 << 20
"""+ the layer's index: the input-gradient rounding of the i-th fake-quantized layer."""
WEIGHT_STREAM = 1 << 21
"""The rounding of the parameters after each step (``weights: {bits: N}``)."""


@dataclass
class Draws:
    """One stream of draws of one rank: call k draws with step k of the key, so the same
    (seed, rank, stream) gives the same sequence in every run."""

    seed: int
    rank: int
    stream: int
    calls: int = 0
    """Tensors drawn for so far: the step of the next key."""

    def uniform_like(self, y: torch.Tensor) -> torch.Tensor:
        """Uniforms in [0, 1) of y's shape, dtype and device, one per element in row-major
        order; each call draws with the next step's key."""
        key = Key(seed=self.seed, step=self.calls, rank=self.rank, stream=self.stream)
        self.calls += 1
        return uniform(key, 0, y.numel(), y.device).reshape(y.shape).to(y.dtype)


def draws(seed: int, rank: int, stream: int, shared: bool) -> Draws:
    """A rank's draws of ``stream``; ``shared``: every rank's are rank 0's."""
    return Draws(seed, SHARED_RANK if shared else rank, stream)
