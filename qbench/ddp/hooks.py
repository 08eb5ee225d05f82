"""The hook for a compressor (torch's own or a flat scheme's per bucket), built for
:func:`qbench.ddp.comm_hook`, which the package keeps free of torch (the cost model reads
``qbench.ddp.timeline``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qbench import catalog, compress
from qbench.catalog.schemes import TORCH_HOOKS
from qbench.comm.base import Comm
from qbench.comm.torchdist import TorchDistComm
from qbench.compress.powersgd import PowerSGD
from qbench.ddp import scheme_hook, torch_hooks
from qbench.errors import UserError
from qbench.spec.rules import incompatibility

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
    """``(state, hook)``: :func:`qbench.ddp.comm_hook`, which says what the arguments are."""
    spec = {"name": name, **params}
    compressor = compress.from_spec(spec)  # UserError naming a bad name or parameter
    comm = comm or TorchDistComm.attach()
    if name in TORCH_HOOKS:
        hook_params = compressor.hook_params() if isinstance(compressor, PowerSGD) else {}
        state = torch_hooks.make_state(name, comm, hook_params, seed)
        return state, torch_hooks.torch_hook
    if exchange not in exchanges():
        raise UserError(
            f"exchange {exchange!r} is not a per-bucket exchange; valid: {', '.join(exchanges())}"
        )
    why = incompatibility(comm.backend, exchange, compressor.spec)  # the flat scheme's own rules
    if why:
        raise UserError(f"exchange {exchange}: {why}")
    hook_state = scheme_hook.SchemeHookState(
        scheme=exchange, comm=comm, seed=seed, spec_for=spec_for or (lambda p: spec)
    )
    return hook_state, scheme_hook.scheme_hook


def exchanges() -> list[str]:
    """The built-in exchanges and every other scheme that runs per bucket (a plug-in's);
    allreduce per bucket is DDP's own (compressor none)."""
    own = (*EXCHANGES, "allreduce")
    extra = [n for n, e in catalog.SCHEMES.items() if e.per_bucket and n not in own]
    return [*EXCHANGES, *extra]
