"""qbench's compressors as DDP communication hooks, for any training script.

::

    model = DistributedDataParallel(model)
    state = qbench.ddp.register(model, "qsgd", bits=4, bucket_size=512)

or, calling ``register_comm_hook`` yourself::

    state, hook = qbench.ddp.comm_hook("qsgd", bits=4, bucket_size=512)
    model.register_comm_hook(state, hook)

``none``, ``fp16``, ``bf16`` and ``powersgd`` are torch's own hooks (``qbench.ddp.torch_hooks``);
every other compressor is encoded per bucket and exchanged with a flat scheme's collectives
(``exchange``: reduce-broadcast, allgather or integer-allreduce; ``qbench.ddp.scheme_hook``);
``qbench.ddp.hooks`` builds either.
The state's ``payload_bytes`` (this rank's encoded gradient), ``bytes_sent`` (what it put on
the wire) and ``timeline`` (when each bucket was handed over and ready) describe the last step.

Which runs use DDP, and how a scenario spells them, is in ``qbench.catalog`` (docs/ddp.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn

__all__ = ["comm_hook", "register"]


def comm_hook(name: str, **options: Any) -> tuple[Any, Callable[..., Any]]:
    """``(state, hook)`` for ``DistributedDataParallel.register_comm_hook``.

    ``name`` and the compressor's parameters among ``options`` are a compressor spec as in a
    scenario (``qsgd``, ``bits=4``). The other options: ``exchange`` (default
    ``reduce-broadcast``); ``seed`` (0); ``comm``, qbench's communicator over the process
    group (default: the default group, which must be initialised); ``spec_for``, the
    compressor spec per parameter (the layer policy; default: every tensor uses this one).
    """
    # torch: loaded when a hook is built; importing the package loads none (the cost model
    # reads qbench.ddp.timeline)
    from qbench.ddp import hooks

    return hooks.comm_hook(name, **options)


def register(ddp_model: nn.parallel.DistributedDataParallel, name: str, **kwargs: Any) -> Any:
    """Register the hook of :func:`comm_hook` on ``ddp_model``; returns its state."""
    state, hook = comm_hook(name, **kwargs)
    ddp_model.register_comm_hook(state, hook)
    return state
