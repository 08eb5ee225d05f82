"""Aggregation scheme interface: turn each rank's flat gradient into the mean gradient."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from qbench.comm import Comm
from qbench.compress import Compressor, from_spec
from qbench.errors import UserError
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

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> dict[str, Any]:
        """Validate scheme parameters from the scenario; returns the keyword arguments for
        ``__init__``. Default: the scheme takes none."""
        if params:
            got = ", ".join(map(repr, params))  # YAML keys: any type, any characters
            raise UserError(f"scheme {cls.name} takes no parameters, got {got}")
        return {}

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


# -- parameter checks shared by the decentralized schemes (gossip, push-sum) ----------------


def check_known(scheme: str, params: dict[str, Any], valid: dict[str, Any]) -> None:
    unknown = sorted(set(params) - set(valid), key=repr)  # YAML keys: any type
    if unknown:
        raise UserError(
            f"scheme {scheme}: unknown parameter {unknown[0]!r}; valid: {', '.join(valid)}"
        )


def check_choice(
    scheme: str, param: str, value: object, valid: tuple[str, ...], default: object
) -> None:
    if not isinstance(value, str) or value not in valid:
        raise UserError(
            f"{scheme}: {param} must be one of {', '.join(valid)}, got {value!r}; "
            f"e.g. `{param}: {default}`"
        )


def check_gamma(scheme: str, g: object) -> float:
    """A consensus step size in (0, 1]."""
    if isinstance(g, bool) or not isinstance(g, int | float) or not 0 < g <= 1:
        raise UserError(f"{scheme}: gamma must be a number in (0, 1], got {g!r}; e.g. `gamma: 0.5`")
    return float(g)


def down_spec(
    scheme: str, down: object, fp32: str, seed_fix: str
) -> tuple[dict[str, Any], Compressor] | None:
    """A ``down`` compressor spec of a parameter-server scheme (what the server sends back),
    validated by building it; None when absent (fp32 goes down). ``fp32`` names what is sent
    without one and ``seed_fix`` where the seed must be removed from, for the messages."""
    if down is None:
        return None
    spec = {"name": down} if isinstance(down, str) else down
    if not isinstance(spec, dict) or "name" not in spec:
        raise UserError(
            f"{scheme}: down must be a compressor spec with a name, got {down!r}; "
            f"e.g. `down: {{name: qsgd, bits: 8}}`, or leave it out to send the fp32 {fp32}"
        )
    if "seed" in spec:
        raise UserError(f"{scheme}: down takes the run's seed; remove `seed` from {seed_fix}")
    return dict(spec), from_spec(spec)  # from_spec raises UserError naming a bad value
