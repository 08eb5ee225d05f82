"""PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019) as PyTorch ships it: a DDP hook.

The compressor practitioners reach for first, so it is the peer to compare QSGD and 1-bit
against. Per gradient matrix M (n x m, a conv kernel flattened to n x the rest) and rank r, one
step of power iteration: P = M Q (allreduce P, orthogonalize), Q = M^T P (allreduce Q), and the
mean is approximated by P Q^T; (n + m) r values go on the wire instead of n m. 1-D tensors and
matrices that would not shrink ``min_compression_rate`` times are allreduced as they are.

It is not an encode / decode codec: its two allreduces are part of the algorithm. So it runs
only as torch's ``powerSGD_hook`` under ``scheme: ddp`` (``qbench.ddp.torch_hooks``), and the
planner excludes it from every other scheme with that reason. This class holds and validates its
parameters and names it in tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from qbench.compress.base import Compressor, Key, Payload
from qbench.errors import UserError


@dataclass(kw_only=True)
class PowerSGD(Compressor):
    name: ClassVar[str] = "powersgd"
    fixed_size: ClassVar[bool] = False
    stateful: ClassVar[bool] = True
    hook_only: ClassVar[bool] = True
    """Runs only as a DDP communication hook (scheme ddp)."""

    rank: int = 1
    """Rank r of the low-rank approximation (torch's matrix_approximation_rank)."""
    start_iter: int = 2
    """Iterations allreduced uncompressed first (torch's start_powerSGD_iter). torch defaults to
    1000 for training from scratch; qbench takes the smallest value torch allows with error
    feedback or warm start (2), so the measured iterations after warm-up are compressed. Raise
    it for accuracy runs as the PowerSGD paper advises."""
    warm_start: bool = True
    """Reuse last step's Q as the starting point of the power iteration (torch's default)."""
    error_feedback: bool = True
    """Add the compression error of the last step before compressing (torch's default)."""
    min_compression_rate: float = 2.0
    """Compress a matrix only when (n m) / ((n + m) r) exceeds this (torch's default 2)."""

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise UserError(
                f"powersgd: rank must be an integer >= 1, got {self.rank!r}; e.g. `rank: 2`"
            )
        low = 2 if (self.error_feedback or self.warm_start) else 0
        if (
            isinstance(self.start_iter, bool)
            or not isinstance(self.start_iter, int)
            or (self.start_iter < low)
        ):
            raise UserError(
                f"powersgd: start_iter must be an integer >= {low} (torch needs two plain "
                f"iterations before warm start or error feedback), got {self.start_iter!r}; "
                "e.g. `start_iter: 2`"
            )
        for flag in ("warm_start", "error_feedback"):
            if not isinstance(getattr(self, flag), bool):
                raise UserError(
                    f"powersgd: {flag} must be true or false, got {getattr(self, flag)!r}"
                )
        rate = self.min_compression_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or rate < 1:
            raise UserError(
                f"powersgd: min_compression_rate must be a number >= 1, got {rate!r}; "
                "e.g. `min_compression_rate: 2`"
            )

    @property
    def label(self) -> str:
        extra = ("" if self.warm_start else "-cold") + ("" if self.error_feedback else "-noef")
        return f"powersgd-r{self.rank}{extra}"

    @property
    def nominal_bits(self) -> float:
        """Depends on the shapes of the model's matrices: none to state in advance."""
        return math.nan

    def hook_params(self) -> dict[str, Any]:
        """Keyword arguments of ``qbench.ddp.torch_hooks.powersgd_state``."""
        return {
            "rank": self.rank, "start_iter": self.start_iter, "warm_start": self.warm_start,
            "error_feedback": self.error_feedback,
            "min_compression_rate": float(self.min_compression_rate),
        }  # fmt: skip

    def _encode(self, grad: Any, key: Key, offset: int, name: str) -> Payload:
        raise NotImplementedError("powersgd runs only as torch's DDP hook (scheme ddp)")

    def _decode(self, payload: Payload) -> Any:
        raise NotImplementedError("powersgd runs only as torch's DDP hook (scheme ddp)")
