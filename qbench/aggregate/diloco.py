"""Exchange rarely, then compress what is exchanged: local SGD and DiLoCo (beyond the seeds).

Every rank steps its own model with its own gradient (``aggregate`` passes it through) for H
inner steps. At every H-th step each rank sends its pseudo-gradient delta = theta_global -
theta_local through an *exchange*, one of the collective schemes (allreduce of casts,
reduce-broadcast, integer-allreduce, hierarchical) with the scheme's compressor, which gets
the mean delta back; the outer optimizer then steps theta_global on it and every rank starts
the next round from theta_global. DiLoCo (Douillard et al., "DiLoCo: Distributed Low-
Communication Training of Language Models", 2023) uses SGD with Nesterov momentum as the outer
optimizer (lr 0.7, momentum 0.9); local SGD (parameter averaging every H steps) is the outer
step with lr 1 and no momentum, theta_global - mean(delta) = mean(theta_local).

The outer step is torch.optim.SGD's (dampening 0): buf = mu * buf + delta, update = delta +
mu * buf with Nesterov else buf, theta_global -= lr * update. The ranks agree on theta_global
because every exchange hands every rank the same decoded mean. Error feedback on the outer
gradients is the compressor's own, keyed by the exchange's slot, so the residual of one round
is carried into the next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from qbench.aggregate.base import Aggregator
from qbench.comm.base import Comm
from qbench.compress import Compressor
from qbench.timing import PhaseTimer

Exchange = Callable[[Comm, Compressor, int, int, Sequence[int] | None], Aggregator]
"""(comm, compressor, numel, offset, tensors) -> the aggregator of the outer exchange."""


class DiLoCo(Aggregator):
    """DiLoCo over one slice of the flat parameters; ``exchange`` builds the collective."""

    name = "diloco"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        tensors: Sequence[int] | None = None, H: int, outer_lr: float,
        outer_momentum: float, nesterov: bool, exchange: Exchange,
    ) -> None:  # fmt: skip
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        self.H, self.outer_lr = H, outer_lr
        self.outer_momentum, self.nesterov = outer_momentum, nesterov
        self.inner = exchange(comm, compressor, numel, offset, tensors)
        self.payload_bytes = 0
        self._global: torch.Tensor | None = None
        self._momentum: torch.Tensor | None = None

    def begin(self, params: torch.Tensor) -> None:
        self._global = params.detach().clone()

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        self.payload_bytes = 0  # an inner step sends nothing
        return grad

    def syncs(self, step: int) -> bool:
        """Whether the outer exchange follows inner step ``step`` (0-based): every H-th."""
        return (step + 1) % self.H == 0

    def after_step(self, params: torch.Tensor, step: int, timer: PhaseTimer) -> None:
        if not self.syncs(step):
            return
        if self._global is None:
            raise RuntimeError(f"{self.name}: begin(params) was not called before the first step")
        delta = torch.sub(self._global, params)  # the pseudo-gradient, this rank's
        mean = self.inner.aggregate(delta, step, timer)
        self.payload_bytes = self.inner.payload_bytes
        self._global.sub_(self.outer_update(mean), alpha=self.outer_lr)
        params.copy_(self._global)
        timer.mark("step")

    def outer_update(self, mean: torch.Tensor) -> torch.Tensor:
        """torch.optim.SGD's direction for the mean pseudo-gradient (dampening 0)."""
        mu = self.outer_momentum
        if mu == 0:
            return mean
        if self._momentum is None:
            self._momentum = mean.clone()
        else:
            self._momentum.mul_(mu).add_(mean)
        return mean.add(self._momentum, alpha=mu) if self.nesterov else self._momentum


class LocalSGD(DiLoCo):
    """Parameter averaging every H steps: DiLoCo's outer step with lr 1 and no momentum."""

    name = "local-sgd"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        tensors: Sequence[int] | None = None, H: int, exchange: Exchange,
    ) -> None:  # fmt: skip
        super().__init__(
            comm, compressor, numel, offset, tensors=tensors, H=H, outer_lr=1.0,
            outer_momentum=0.0, nesterov=False, exchange=exchange,
        )  # fmt: skip
