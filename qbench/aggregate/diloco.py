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

Streaming DiLoCo (Douillard et al., "Streaming DiLoCo with overlapping communication", 2025)
cuts the model into fragments that sync in turn, each every H steps at its own offset, and
merges a fragment's new global value into the local one ``delay`` steps later, as
alpha * local + (1 - alpha) * global. With a delay the exchange runs behind those inner steps,
as the paper's does: on a helper thread and a communicator of its own
(``qbench.comm.background``), given a snapshot of the pseudo-gradient; the merge waits for it,
and only that wait is exposed (``t_comm``; the rest is ``t_comm_total``'s hidden part). The
exchange's bytes count on the step that started it, as when it runs at once (``late``), and
when the run's last step is recorded, the exchanges still in flight are waited for and merged,
outside the timed loop: a measured window of whole rounds then holds one exposed wait per
exchange, as training does in steady state. A backend that cannot run a second thread's
collectives (MPI without MPI_THREAD_MULTIPLE) runs the exchange when it starts, which changes
the timing only: the arithmetic is the same in the same order, so the models are the same bit
for bit.

``within_node: allreduce`` makes each node of G ranks (``LOCAL_WORLD_SIZE``) one data-parallel
worker, as torchft's DiLoCo over replica groups does: every inner step averages the gradient
over the node (an fp32 allreduce on the intra-node communicator), so the node's ranks keep one
model, and only the node leaders (local rank 0) run the outer exchange among themselves; each
leader then hands the mean to its node (an intra-node sum to which the others add zeros).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from qbench.aggregate.allreduce import fp32_mean
from qbench.aggregate.base import Aggregator
from qbench.comm.background import Done, helper
from qbench.comm.base import Comm
from qbench.comm.env import ranks_per_node
from qbench.compress import Compressor
from qbench.errors import UserError
from qbench.timing import PhaseTimer

Exchange = Callable[[Comm, Compressor, int, int, Sequence[int] | None], Aggregator]
"""(comm, compressor, numel, offset, tensors) -> the aggregator of an outer exchange."""


class StreamingDiLoCo(Aggregator):
    """The outer loop on ``fragments`` contiguous runs of the slice's tensors, synced in turn:
    fragment f after the inner steps s with s + 1 = k H + f H // F (k >= 1), its new global
    value merged ``delay`` steps later. DiLoCo is one fragment, no delay, alpha 0."""

    name = "streaming-diloco"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        tensors: Sequence[int] | None = None, H: int, fragments: int, delay: int, alpha: float,
        outer_lr: float, outer_momentum: float, nesterov: bool, exchange: Exchange,
        within_node: str = "none",
    ) -> None:  # fmt: skip
        super().__init__(comm, compressor, numel, offset, tensors=tensors)
        self.H, self.outer_lr = H, outer_lr
        self.outer_momentum, self.nesterov = outer_momentum, nesterov
        self.delay, self.alpha = delay, alpha
        self.bounds = fragment_bounds(self.tensors, fragments)
        per = ranks_per_node(comm.world_size) if within_node == "allreduce" else None
        self.node, outer = _levels(comm, per)  # node: within_node's intra-node communicator
        self.leads = self.node is None or self.node.rank == 0
        self.behind = helper(comm) if delay else None
        """The helper the exchanges run on, behind the inner steps; None: when they start."""
        self._node = self.node  # the exchange's own levels: the helper's, when there is one
        if self.behind is not None:
            self._node, outer = _levels(self.behind.comm, per)
        # each fragment's exchange keeps its own error-feedback slots (``Compressor.twin``)
        codecs = [compressor] + [compressor.twin() for _ in self.bounds[1:]]
        self.inners = [
            exchange(outer, codec, b - a, offset + a, self.pieces(a, b))
            for codec, (a, b) in zip(codecs, self.bounds, strict=True)
        ]
        self.payload_bytes = 0
        self._global: torch.Tensor | None = None
        self._momenta: dict[int, torch.Tensor] = {}
        self._pending: dict[int, list[tuple[int, int, Future[Done[Exchanged]] | Exchanged]]] = {}
        """step -> (fragment, the step it started, its exchange: in flight or done) to merge
        after that step."""
        self._helper_timer: PhaseTimer | None = None

    def begin(self, params: torch.Tensor) -> None:
        self._global = params.detach().clone()

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        """The gradient itself (each rank steps its own model), or its node's mean."""
        return grad if self.node is None else fp32_mean(self.node, grad, timer)

    def syncs(self, step: int, fragment: int = 0) -> bool:
        """Whether ``fragment``'s exchange follows inner step ``step`` (0-based)."""
        shifted = step + 1 - fragment * self.H // len(self.bounds)
        return shifted >= self.H and shifted % self.H == 0

    def after_step(self, params: torch.Tensor, step: int, timer: PhaseTimer) -> None:
        if self._global is None:
            raise RuntimeError(f"{self.name}: begin(params) was not called before the first step")
        self.payload_bytes, self.hidden_s = 0, 0.0  # an inner step sends nothing
        launched = [f for f in range(len(self.bounds)) if self.syncs(step, f)]
        for f in launched:
            self._launch(f, params, step, timer)
        if launched and self.behind is not None:
            timer.mark("step")  # the snapshot; the wait below is the exchange's exposed time
        # due at this step, or earlier on a step the non-finite check skipped
        due = sorted(s for s in self._pending if s <= step)
        for s in due:
            for f, began, item in self._pending.pop(s):
                self._merge(params, f, self._wait(began, item, timer))
        if launched or due:
            timer.mark("step")

    def finish(self, params: torch.Tensor) -> None:
        """Wait for the exchanges still in flight and merge them, as a job does before it keeps
        its model (untimed: the loop has ended)."""
        untimed = PhaseTimer(params.device)
        for s in sorted(self._pending):
            for f, began, item in self._pending.pop(s):
                self._merge(params, f, self._wait(began, item, untimed))

    def close(self) -> None:
        self._pending.clear()
        if self.behind is not None:
            self.behind.close()

    def _launch(self, f: int, params: torch.Tensor, step: int, timer: PhaseTimer) -> None:
        """Fragment f's pseudo-gradient, taken now, into its exchange: behind the next inner
        steps on the helper, or at once."""
        assert self._global is not None
        a, b = self.bounds[f]
        delta = torch.sub(self._global[a:b], params[a:b])
        item: Future[Done[Exchanged]] | Exchanged
        if self.behind is None:
            item = self._exchange(f, delta, step, timer)
            self.payload_bytes += item.payload_bytes
        else:
            if self._helper_timer is None:
                self._helper_timer = timer.fork()
            clock = self._helper_timer
            item = self.behind.submit(
                lambda: self._exchange(f, delta, step, clock, fresh=True), delta.device
            )
        self._pending.setdefault(step + self.delay, []).append((f, step, item))

    def _wait(
        self, began: int, item: Future[Done[Exchanged]] | Exchanged, timer: PhaseTimer
    ) -> Exchanged:
        """A done exchange; one in flight is waited for (its exposed time, ``comm``), its
        hidden time is this step's and its bytes go to the step ``began`` (``late``)."""
        if not isinstance(item, Future):
            return item
        begun = time.perf_counter()
        done = item.result()
        waited = time.perf_counter() - begun
        timer.mark("comm")
        self.late.append((began, done.bytes_sent, done.value.payload_bytes))
        self.hidden_s += max(0.0, done.seconds - waited)
        return done.value

    def _merge(self, params: torch.Tensor, f: int, got: Exchanged) -> None:
        a, b = self.bounds[f]
        if self.alpha:
            params[a:b].mul_(self.alpha).add_(got.value, alpha=1 - self.alpha)
        else:  # DiLoCo: every rank restarts from the global model, exactly
            params[a:b].copy_(got.value)

    def _exchange(
        self, f: int, delta: torch.Tensor, step: int, timer: PhaseTimer, fresh: bool = False
    ) -> Exchanged:
        """Fragment f's pseudo-gradient through its exchange, then its outer step; ``fresh``:
        ``timer`` is the helper's, started here."""
        assert self._global is not None
        if fresh:
            timer.start()
        a, b = self.bounds[f]
        glob = self._global[a:b]
        if self.leads:  # every rank, or its node's leader among the leaders
            mean = self.inners[f].aggregate(delta, step, timer)
            payload = self.inners[f].payload_bytes
        else:
            mean, payload = torch.zeros_like(glob), 0
        if self._node is not None:  # the leader's mean to its node: the others add zeros
            self._node.allreduce_(mean)
            timer.mark("comm")
        self.outer_step(glob, mean, slot=f)
        return Exchanged(glob.clone(), payload)

    def outer_step(self, glob: torch.Tensor, mean: torch.Tensor, slot: int) -> None:
        """glob -= outer_lr * torch.optim.SGD's direction for the mean pseudo-gradient
        (dampening 0); ``slot``: whose momentum buffer (each fragment has its own)."""
        mu, direction = self.outer_momentum, mean
        if mu:
            buf = self._momenta.get(slot)
            if buf is None:
                buf = self._momenta[slot] = mean.clone()
            else:
                buf.mul_(mu).add_(mean)
            direction = mean.add(buf, alpha=mu) if self.nesterov else buf
        glob.sub_(direction, alpha=self.outer_lr)


@dataclass(frozen=True)
class Exchanged:
    """A fragment's exchange: its new global value and this rank's payload bytes."""

    value: torch.Tensor
    payload_bytes: int


def _levels(comm: Comm, per_node: int | None) -> tuple[Comm | None, Comm]:
    """(the intra-node communicator, the exchange's): with nodes of ``per_node`` ranks the
    node leaders' (``Comm.node_comms``), else (None, ``comm``)."""
    return (None, comm) if per_node is None else comm.node_comms(per_node)


class DiLoCo(StreamingDiLoCo):
    """DiLoCo over one slice of the flat parameters: one fragment, merged at once."""

    name = "diloco"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        tensors: Sequence[int] | None = None, H: int, outer_lr: float, outer_momentum: float,
        nesterov: bool, exchange: Exchange, within_node: str = "none",
    ) -> None:  # fmt: skip
        super().__init__(
            comm, compressor, numel, offset, tensors=tensors, H=H, fragments=1, delay=0,
            alpha=0.0, outer_lr=outer_lr, outer_momentum=outer_momentum, nesterov=nesterov,
            exchange=exchange, within_node=within_node,
        )  # fmt: skip


class LocalSGD(DiLoCo):
    """Parameter averaging every H steps: DiLoCo's outer step with lr 1 and no momentum."""

    name = "local-sgd"

    def __init__(
        self, comm: Comm, compressor: Compressor, numel: int, offset: int = 0, *,
        tensors: Sequence[int] | None = None, H: int, exchange: Exchange,
        within_node: str = "none",
    ) -> None:  # fmt: skip
        super().__init__(
            comm, compressor, numel, offset, tensors=tensors, H=H, outer_lr=1.0,
            outer_momentum=0.0, nesterov=False, exchange=exchange, within_node=within_node,
        )  # fmt: skip


def fragment_bounds(tensors: Sequence[int], fragments: int) -> list[tuple[int, int]]:
    """[start, end) of ``fragments`` runs of consecutive tensors, each of at least one tensor,
    cut where the running size first reaches k / fragments of the whole."""
    if fragments > len(tensors):
        raise UserError(
            f"streaming-diloco: {fragments} fragments, but this part of the model holds "
            f"{len(tensors)} tensor(s) and a fragment is at least one; use fragments <= "
            f"{len(tensors)}"
        )
    total, cuts, pos = sum(tensors), [0], 0
    for i, n in enumerate(tensors[:-1]):
        pos += n
        left = len(tensors) - 1 - i  # tensors after this cut
        want = len(cuts) * total / fragments
        if len(cuts) < fragments and (pos >= want or left == fragments - len(cuts)):
            cuts.append(pos)
    cuts.append(total)
    return list(itertools.pairwise(cuts))
