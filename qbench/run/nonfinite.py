"""Non-finite gradients (scenario key ``nonfinite``): one policy for every compressor and scheme.

Each step, a rank checks its own gradient once, as backward left it, before any scheme, codec
or DDP hook sees it; so no codec ever meets a NaN or inf in a run, and none substitutes one.
(Callers of ``encode`` itself: fixed point, top-k and adaptive refuse one,
``qbench.compress.base.require_finite``; QSGD and 1bitSGD, for which that check would cost 2 %
of an encode, give it back non-finite where it was; docs/failures.md.)

* ``fail`` (the default): the rank raises :class:`NonFiniteGradient`, one line naming the
  iteration, the first tensor (in the model's flat order) holding a NaN or inf, and the rank;
  the worker tags it and ends the job, as for any rank that raises (docs/failures.md).
* ``skip``: the step is skipped on every rank: no exchange, no optimizer step, no model
  mixing, so the parameters (and optimizer state, error-feedback residuals) stay as they were;
  the rows of that iteration say ``skipped`` 1. Every rank must skip the same step, or one
  would wait in a collective the others never enter: the ranks agree through one allreduce
  (max) of a one-value flag per step, before the scheme's first collective. Its time is in
  ``t_comm`` and its bytes in ``bytes_sent``: what the policy costs.

The check is one sum of the flat gradient (``qbench.compress.base.all_finite``); only when it
fails is each tensor looked at, to name the first. In flat loops it sits between backward and
the scheme, and its time is left out of every phase and of the iteration (``PhaseTimer.skip``);
under DDP it runs per bucket inside the communication hook (:mod:`qbench.ddp.finite`), during
backward, where nothing can be left out. docs/failures.md has its measured cost.

fp16 compute keeps its own loss scaler (:func:`unscale`): an overflow it can still absorb by
halving the scale zeroes this rank's gradient for the step, as before, and the policy then
sees a finite gradient. At the smallest scale (1) halving cannot help, so the gradient is
left as it is and the policy decides.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from qbench.comm.base import Comm
from qbench.compress.base import all_finite, nonfinite_kind
from qbench.run.precision import LossScaler
from qbench.spec.scenario import NONFINITE
from qbench.timing import PhaseTimer

__all__ = ["NONFINITE", "Guard", "NonFiniteGradient", "first_nonfinite", "message", "unscale"]


class NonFiniteGradient(RuntimeError):
    """A rank's gradient held a NaN or inf under ``nonfinite: fail``."""


def message(it: int, tensor: str, kind: str, rank: int | None) -> str:
    """The failure's one line, e.g. ``iteration 12: gradient of layers.3.conv1.weight has NaN
    (rank 1); set `nonfinite: skip` to skip such steps``."""
    where = f" (rank {rank})" if rank is not None else ""
    return (
        f"iteration {it}: gradient of {tensor} has {kind}{where}; set `nonfinite: skip` to "
        "skip such steps"
    )


def first_nonfinite(
    flat: torch.Tensor, tensors: Sequence[tuple[str, slice]]
) -> tuple[str, str] | None:
    """The first tensor (name, slice of ``flat``) holding a NaN or inf, and which (``NaN``, or
    ``inf`` when it has no NaN); None when every value is finite."""
    for name, part in tensors:
        values = flat[part]
        if not bool(torch.isfinite(values).all()):
            return name, nonfinite_kind(values)
    return None


class Guard:
    """One rank's side of the policy. ``comm``: the ranks that must agree on a skip (None: this
    rank decides alone, as an async-ps worker does, whose steps no collective ties together);
    ``tensors``: each parameter's name and slice of the flat gradient; ``device``: the ranks'
    (where the flag they agree on lives)."""

    def __init__(
        self, policy: str, comm: Comm | None, rank: int,
        tensors: Sequence[tuple[str, slice]] = (), device: torch.device | None = None,
    ) -> None:  # fmt: skip
        if policy not in NONFINITE:
            raise ValueError(f"nonfinite policy {policy!r} is not one of {', '.join(NONFINITE)}")
        self.policy, self.comm, self.rank, self.tensors = policy, comm, rank, list(tensors)
        self.device = device or torch.device("cpu")
        self.skipped = 0

    def check(self, it: int, flat: torch.Tensor, timer: PhaseTimer) -> bool:
        """After backward, before the scheme: True when the step goes ahead, False when every
        rank skips it; raises :class:`NonFiniteGradient` under ``fail``. The check's own time is
        left out of the iteration."""
        found = None if all_finite(flat) else first_nonfinite(flat, self.tensors)
        timer.skip()
        return self.decide(it, found, timer)

    def decide(self, it: int, found: tuple[str, str] | None, timer: PhaseTimer) -> bool:
        """The policy on what this rank found (tensor, kind), or None; under ``skip`` the ranks
        agree first (an allreduce charged to ``comm``)."""
        if self.policy == "fail":
            if found is not None:
                raise NonFiniteGradient(message(it, *found, self.rank))
            return True
        bad = found is not None
        if self.comm is not None and self.comm.world_size > 1:
            flag = torch.tensor([float(bad)], device=self.device)
            self.comm.allreduce_(flag, op="max")
            timer.mark("comm")
            bad = bool(flag.item())
        self.skipped += bad
        return not bad


def unscale(scaler: LossScaler, grad: torch.Tensor) -> None:
    """fp16's loss scaling after backward (nothing for other formats): divide by the scale; an
    overflow the scale can still absorb zeroes this rank's contribution to the step while the
    scale halves (the scaler's own skip); at the smallest scale the non-finite gradient is left
    for the policy (module docstring)."""
    smallest = scaler.scale <= 1.0
    if not scaler.unscale_(grad) and not smallest:
        grad.zero_()
