"""qbench's compressors as DDP communication hooks, for any training script.

::

    model = DistributedDataParallel(model)
    state = qbench.ddp.register(model, "qsgd", bits=4, bucket_size=512)

or, calling ``register_comm_hook`` yourself::

    state, hook = qbench.ddp.comm_hook("qsgd", bits=4, bucket_size=512)
    model.register_comm_hook(state, hook)

``none``, ``fp16``, ``bf16`` and ``powersgd`` are torch's own hooks (``qbench.ddp.torch_hooks``);
every other compressor is encoded per bucket and exchanged with a flat scheme's collectives
(``exchange``: reduce-broadcast, allgather or integer-allreduce; ``qbench.ddp.scheme_hook``).
The state's ``payload_bytes`` (this rank's encoded gradient), ``bytes_sent`` (what it put on
the wire) and ``timeline`` (when each bucket was handed over and ready) describe the last step.

Which runs use DDP, and how a scenario spells them, is in ``qbench.catalog`` (docs/ddp.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qbench.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn

    from qbench.comm.base import Comm

__all__ = ["comm_hook", "register"]

EXCHANGES = ("reduce-broadcast", "allgather", "integer-allreduce")


def comm_hook(
    name: str,
    *,
    exchange: str = "reduce-broadcast",
    seed: int = 0,
    comm: Comm | None = None,
    spec_for: Callable[[Any], dict[str, Any]] | None = None,
    **params: Any,
) -> tuple[Any, Callable[..., Any]]:
    """``(state, hook)`` for ``DistributedDataParallel.register_comm_hook``.

    ``name`` and ``params`` are a compressor spec as in a scenario (``qsgd``, ``bits=4``).
    ``comm``: qbench's communicator over the process group (default: the default group, which
    must be initialised). ``spec_for`` gives the compressor spec per parameter (the layer
    policy); default: every tensor uses this one.
    """
    from qbench import compress
    from qbench.catalog.schemes import TORCH_HOOKS
    from qbench.compress.powersgd import PowerSGD
    from qbench.ddp import scheme_hook, torch_hooks

    spec = {"name": name, **params}
    compressor = compress.from_spec(spec)  # UserError naming a bad name or parameter
    comm = comm or _default_comm()
    if name in TORCH_HOOKS:
        hook_params = compressor.hook_params() if isinstance(compressor, PowerSGD) else {}
        state = torch_hooks.make_state(name, comm, hook_params, seed)
        return state, torch_hooks.torch_hook
    if exchange not in _exchanges():
        raise UserError(
            f"exchange {exchange!r} is not a per-bucket exchange; valid: {', '.join(_exchanges())}"
        )
    _check_exchange(exchange, spec, comm.backend)
    hook_state = scheme_hook.SchemeHookState(
        scheme=exchange, comm=comm, seed=seed, spec_for=spec_for or (lambda p: spec)
    )
    return hook_state, scheme_hook.scheme_hook


def register(ddp_model: nn.parallel.DistributedDataParallel, name: str, **kwargs: Any) -> Any:
    """Register the hook of :func:`comm_hook` on ``ddp_model``; returns its state."""
    state, hook = comm_hook(name, **kwargs)
    ddp_model.register_comm_hook(state, hook)
    return state


def _exchanges() -> list[str]:
    """The built-in exchanges and every other scheme that runs per bucket (a plug-in's);
    allreduce per bucket is DDP's own (compressor none)."""
    from qbench import catalog

    own = (*EXCHANGES, "allreduce")
    extra = [n for n, e in catalog.SCHEMES.items() if e.per_bucket and n not in own]
    return [*EXCHANGES, *extra]


def _default_comm() -> Comm:
    from qbench.comm.torchdist import TorchDistComm

    return TorchDistComm.attach()


def _check_exchange(exchange: str, spec: dict[str, Any], backend: str) -> None:
    from qbench.spec.rules import incompatibility  # the flat scheme's own rules

    why = incompatibility(backend, exchange, spec)
    if why:
        raise UserError(f"exchange {exchange}: {why}")
