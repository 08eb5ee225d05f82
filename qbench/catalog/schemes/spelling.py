"""One spelling per DDP configuration, and which runs communicate during backward.

``scheme: auto`` resolves here too. Which combinations can run at all is
:mod:`qbench.spec.rules`; see docs/ddp.md for the DDP spellings.
"""

from __future__ import annotations

from typing import Any

from qbench import catalog
from qbench.catalog.schemes import BACKWARD, TORCH_HOOKS

DDP = "ddp"
FSDP = "fsdp"


def overlap(scheme: str, params: dict[str, Any]) -> str:
    """``backward`` when gradients are communicated during backward (DDP's buckets, FSDP's
    reduce-scatters), ``none`` when one flat gradient is aggregated after it (the run's
    ``overlap`` label)."""
    return BACKWARD.name if scheme in (DDP, FSDP) or params.get(BACKWARD.name) else "none"


def canonical(scheme: str, params: dict[str, Any], compressor: str) -> tuple[str, dict[str, Any]]:
    """One spelling per configuration: ``ddp`` with a qbench compressor is reduce-broadcast per
    bucket; ``allreduce`` per bucket is ``ddp``; ``backward: false`` is the flat scheme."""
    if scheme == DDP and compressor not in TORCH_HOOKS:
        return "reduce-broadcast", {BACKWARD.name: True, **params}
    if params.get(BACKWARD.name) is False:
        params = {k: v for k, v in params.items() if k != BACKWARD.name}
    if scheme == "allreduce" and params.get(BACKWARD.name):
        return DDP, {k: v for k, v in params.items() if k != BACKWARD.name}
    return scheme, params


def resolve_auto(compressor: catalog.CompressorSpec) -> str:
    """``scheme: auto``: allreduce for fp32, ddp for torch-only hooks, else reduce-broadcast."""
    if compressor.name == "none":
        return "allreduce"
    return DDP if compressor.entry.hook_only else "reduce-broadcast"
