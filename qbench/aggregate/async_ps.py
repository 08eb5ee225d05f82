"""Registry entry and parameters of the asynchronous parameter server ``async-ps`` (seed 003).

The scheme has no synchronous step, so it is not an Aggregator the training loop calls: the
worker hands the whole run to ``qbench.async_ps`` (rank 0 serves, the others train). This class
exists so that scenarios name and validate it like every other scheme:

``scheme: {name: async-ps, staleness: 4, variant: asylpg, down: {name: qsgd, bits: 8}}``
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from qbench.aggregate.base import Aggregator, down_spec
from qbench.comm import Comm
from qbench.compress import Compressor
from qbench.errors import UserError, choice_error
from qbench.timing import PhaseTimer

VARIANTS = ("asylpg", "sparse", "accelerated")
"""Seed 003's AsyLPG, Sparse-AsyLPG and accelerated AsyLPG (see qbench.async_ps)."""

_KEYS = ("staleness", "variant", "down", "ratio")


@dataclass(frozen=True, kw_only=True)
class AsyncParams:
    staleness: int = 4
    """tau: the most server updates a gradient may miss between its pull and its apply."""
    variant: str = "asylpg"
    down: dict[str, Any] | None = None
    """Model quantizer on the way down (None: the fp32 model)."""
    ratio: float = 0.1
    """variant sparse: fraction of each group's values kept (top-k) before quantizing."""


class AsyncPS(Aggregator):
    name = "async-ps"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, **params: Any
    ) -> None:
        super().__init__(comm, compressor, numel, offset)
        self.params = AsyncParams(**params)

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> dict[str, Any]:
        unknown = [k for k in params if k not in _KEYS]
        if unknown:
            raise UserError(
                f"scheme async-ps: unknown parameter {unknown[0]!r}; valid: {', '.join(_KEYS)} "
                "(e.g. `{name: async-ps, staleness: 4, down: {name: qsgd, bits: 8}}`)"
            )
        variant = params.get("variant", "asylpg")
        if not isinstance(variant, str) or variant not in VARIANTS:
            raise choice_error("async-ps variant", variant, list(VARIANTS))
        if "ratio" in params and variant != "sparse":
            raise UserError(
                f"async-ps: ratio applies to variant sparse only, got variant {variant}; "
                "remove `ratio` or set `variant: sparse`"
            )
        return {
            "staleness": _check_staleness(params.get("staleness", 4)),
            "variant": variant,
            "down": _check_down(params.get("down")),
            "ratio": _check_ratio(params.get("ratio", 0.1)),
        }

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        raise RuntimeError("async-ps has no synchronous step; qbench.worker runs qbench.async_ps")


def _check_staleness(tau: object) -> int:
    if isinstance(tau, bool) or not isinstance(tau, int) or tau < 0:
        raise UserError(
            f"async-ps: staleness must be an integer >= 0 (0 = serial SGD), got {tau!r}; "
            "e.g. `staleness: 4`"
        )
    return tau


def _check_ratio(ratio: object) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise UserError(f"async-ps: ratio must be in (0, 1], got {ratio!r}; e.g. `ratio: 0.1`")
    return float(ratio)


def _check_down(down: object) -> dict[str, Any] | None:
    """The model quantizer: a stateless compressor (error feedback or top-k would carry
    weights over from one model to the next, or drop them)."""
    got = down_spec("async-ps", down, "model", "down")
    if got is None:
        return None
    spec, c = got
    if c.stateful:
        raise UserError(
            f"async-ps: down quantizes the model itself and cannot be {c.name} (it keeps "
            "error-feedback state); use qsgd, fixedpoint, fp16, bf16, adaptive or none"
        )
    return spec
