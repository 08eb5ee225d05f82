"""PyTorch's own DDP communication: its allreduce, its fp16 / bf16 compress hooks and PowerSGD.

These are what practitioners run, so they are the baselines and peers qbench compares its
compressors against. Each is torch's hook, unchanged, wrapped only to record when a bucket was
handed over and when its mean was ready (:mod:`qbench.ddp.timeline`) and how many bytes it put
on the wire (the nccl-tests bus convention of :mod:`qbench.comm.base`):

* ``none``: ``default_hooks.allreduce_hook``, which torch documents as equivalent to DDP
  without a hook (divide by K, allreduce of the bucket, 4 bytes per value);
* ``fp16`` / ``bf16``: ``fp16_compress_hook`` / ``bf16_compress_hook`` (cast, allreduce in 16
  bits, cast back: 2 bytes per value);
* ``powersgd``: ``powerSGD_hook`` with ``PowerSGDState`` (Vogels et al. 2019): per matrix, P and
  Q of rank r are allreduced instead of the gradient; 1-D tensors and matrices that would not
  shrink ``min_compression_rate`` times go uncompressed. Its state counts the values it sends,
  which give the bytes; before ``start_iter`` it allreduces the bucket as it is.

One change to PowerSGD's timing, not to its arithmetic: torch's hook issues a bucket's first
allreduce at once but its P and Q allreduces from future callbacks, so with several buckets in
flight the ranks can issue collectives in different orders. Gloo then hangs or aborts ("Received
data size doesn't match expected size"); here 12 small buckets hung from the first compressed
step, and vgg16-cifar's 3 buckets failed 2 runs in 4. So each bucket's hook starts when the
previous bucket's exchange has finished: one communication stream, in hand-over order, as
qbench's own hooks run (``qbench.ddp.scheme_hook``) and as the cost model assumes. Backward is
not held up: the hook returns a future at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from qbench.comm import allreduce_bus_bytes
from qbench.comm.base import Comm
from qbench.ddp.timeline import BucketTimeline

TorchHook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]
WIRE_BYTES_PER_VALUE = {"none": 4, "fp16": 2, "bf16": 2}
HOOKS: dict[str, TorchHook] = {
    "none": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


@dataclass
class TorchHookState:
    """State handed to DDP with :func:`torch_hook`: torch's own hook and its state, plus the
    measurements of the current iteration (read and reset by the caller)."""

    name: str
    hook: TorchHook
    inner: Any  # the process group (None: the default group), or a PowerSGDState
    comm: Comm  # bytes_sent accumulates here
    timeline: BucketTimeline
    payload_bytes: int = 0
    grad_bytes: int = 0
    step: int = 0
    _sent_at_reset: int = 0
    _last: torch.futures.Future[torch.Tensor] | None = None  # PowerSGD: the last bucket's exchange

    def reset(self) -> None:
        """Start a new iteration's measurements (also done when bucket 0 of a step arrives)."""
        self.timeline.reset()
        self.payload_bytes = self.grad_bytes = 0
        self._sent_at_reset = self.comm.bytes_sent

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank put on the wire since the step began (qbench.comm.base)."""
        return self.comm.bytes_sent - self._sent_at_reset


def powersgd_state(
    *, rank: int, start_iter: int, warm_start: bool, error_feedback: bool,
    min_compression_rate: float, seed: int, group: Any = None,
) -> powerSGD_hook.PowerSGDState:  # fmt: skip
    """torch's PowerSGD state from qbench's parameter names (see qbench.compress.powersgd)."""
    return powerSGD_hook.PowerSGDState(
        process_group=group, matrix_approximation_rank=rank, start_powerSGD_iter=start_iter,
        min_compression_rate=min_compression_rate, use_error_feedback=error_feedback,
        warm_start=warm_start, random_seed=seed,
    )  # fmt: skip


def make_state(
    name: str, comm: Comm, params: dict[str, Any], seed: int, group: Any = None
) -> TorchHookState:
    if name == "powersgd":
        inner = powersgd_state(**params, seed=seed, group=group)
        return TorchHookState(name, powerSGD_hook.powerSGD_hook, inner, comm, BucketTimeline())
    return TorchHookState(name, HOOKS[name], group, comm, BucketTimeline())


def torch_hook(
    state: TorchHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: torch's hook for ``state.name``, timed and byte-counted."""
    index, numel = bucket.index(), bucket.buffer().numel()
    if index == 0:  # a new step: the counters hold the last step's until now
        state.reset()
    state.timeline.hand_over(index, numel)
    state.grad_bytes += 4 * numel
    if bucket.is_last():
        state.step += 1
    if state.name == "powersgd":  # after the previous bucket's exchange (module docstring)
        fut = _after(state._last, lambda: _issue(state, bucket, numel))
        state._last = fut
    else:
        fut = _issue(state, bucket, numel)

    def ready(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        state.timeline.done(index)
        return f.value()

    return fut.then(ready)


def _issue(
    state: TorchHookState, bucket: dist.GradBucket, numel: int
) -> torch.futures.Future[torch.Tensor]:
    """Call torch's hook on the bucket and count what it puts on the wire."""
    sent_values = _values_before(state, bucket)
    fut = state.hook(state.inner, bucket)
    wire = _wire(state.name, _values_after(state, sent_values, numel))
    state.timeline.add_payload(bucket.index(), wire)
    state.payload_bytes += wire
    state.comm.bytes_sent += allreduce_bus_bytes(wire, state.comm.world_size)
    return fut


def _after(
    previous: torch.futures.Future[torch.Tensor] | None,
    start: Callable[[], torch.futures.Future[torch.Tensor]],
) -> torch.futures.Future[torch.Tensor]:
    """``start()``'s future, started once ``previous`` is done (at once if it is)."""
    if previous is None or previous.done():
        return start()
    out: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def settle(f: torch.futures.Future[torch.Tensor]) -> None:
        try:
            out.set_result(f.value())
        except BaseException as e:  # DDP re-raises it from its wait
            out.set_exception(e)  # type: ignore[arg-type]  # torch's stub

    def go(_: torch.futures.Future[torch.Tensor]) -> None:
        try:
            start().add_done_callback(settle)
        except BaseException as e:
            out.set_exception(e)  # type: ignore[arg-type]

    previous.add_done_callback(go)
    return out


def _wire(name: str, values: int) -> int:
    return WIRE_BYTES_PER_VALUE.get(name, 4) * values


def _values_before(state: TorchHookState, bucket: dist.GradBucket) -> int | None:
    """PowerSGD's running count of values sent before this bucket, when it will compress it;
    None when the bucket goes out whole."""
    inner = state.inner
    if state.name != "powersgd" or inner.iter < inner.start_powerSGD_iter:
        return None
    return int(inner.total_numel_after_compression)


def _values_after(state: TorchHookState, before: int | None, numel: int) -> int:
    if before is None:
        return numel
    return int(state.inner.total_numel_after_compression) - before


# DDP checks a hook's annotations as objects; `from __future__ import annotations` made them
# strings, so give DDP the real ones.
torch_hook.__annotations__.update(
    {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
)
