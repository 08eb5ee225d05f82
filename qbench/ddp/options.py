"""Which runs overlap communication with backward, and their DDP options (no torch import: the
planner reads this).

Two ways into DDP's buckets, one implementation (``qbench.ddp.training``):

* ``scheme: ddp``: PyTorch's DistributedDataParallel with torch's own communication, the
  baseline users run. Compressors ``none`` (DDP's allreduce), ``fp16`` / ``bf16`` (torch's compress
  hooks) and ``powersgd`` (torch's PowerSGD hook). With any other (qbench) compressor, ``ddp``
  runs it through qbench's hook on the reduce-broadcast exchange, and the run is recorded as
  ``reduce-broadcast+backward``: the same configuration, spelled once.
* ``backward: true`` on a flat scheme that can run per bucket (allreduce, reduce-broadcast,
  allgather, integer-allreduce): the same DDP buckets, each through that scheme's exchange
  (``qbench.ddp.scheme_hook``). ``{name: allreduce, backward: true}`` is ``ddp``.

DDP options, for both: ``bucket_cap_mb`` (torch's default 25) and ``gradient_as_bucket_view``
(false, torch's default).
"""

from __future__ import annotations

from typing import Any

from qbench.errors import UserError

DDP = "ddp"
BACKWARD_SCHEMES = ("allreduce", "reduce-broadcast", "allgather", "integer-allreduce")
"""Flat schemes that can also run per bucket during backward (``backward: true``)."""
TORCH_HOOKS = ("none", "fp16", "bf16", "powersgd")
"""Compressors DDP runs with torch's own communication (``scheme: ddp``)."""
BACKWARD = "backward"
DEFAULT_BUCKET_CAP_MB = 25.0  # torch.nn.parallel.DistributedDataParallel's default
OPTIONS = ("bucket_cap_mb", "gradient_as_bucket_view")


def check(scheme: str, params: dict[str, Any]) -> dict[str, Any]:
    """The DDP options among ``params`` (validated); UserError naming a bad one."""
    out: dict[str, Any] = {}
    cap = params.get("bucket_cap_mb", DEFAULT_BUCKET_CAP_MB)
    if isinstance(cap, bool) or not isinstance(cap, int | float) or not 0 < cap <= 1e5:
        raise UserError(
            f"scheme {scheme}: bucket_cap_mb must be a size in MB > 0, got {cap!r}; "
            f"e.g. `bucket_cap_mb: 25` (torch's default)"
        )
    view = params.get("gradient_as_bucket_view", False)
    if not isinstance(view, bool):
        raise UserError(
            f"scheme {scheme}: gradient_as_bucket_view must be true or false, got {view!r}"
        )
    if "bucket_cap_mb" in params:
        out["bucket_cap_mb"] = float(cap)
    if "gradient_as_bucket_view" in params:
        out["gradient_as_bucket_view"] = view
    return out


def check_ddp(params: dict[str, Any]) -> dict[str, Any]:
    """``scheme: ddp``'s parameters: the DDP options only."""
    unknown = sorted((k for k in params if k not in OPTIONS), key=repr)
    if unknown:
        raise UserError(
            f"scheme ddp: unknown parameter {unknown[0]!r}; valid: {', '.join(OPTIONS)}"
        )
    return check(DDP, params)


def split(scheme: str, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A flat scheme's parameters -> (``backward`` and the DDP options, the scheme's own)."""
    mine = {k: v for k, v in params.items() if k == BACKWARD or k in OPTIONS}
    rest = {k: v for k, v in params.items() if k not in mine}
    if not mine:
        return {}, rest
    if scheme not in BACKWARD_SCHEMES:
        key = next(iter(mine))
        raise UserError(
            f"scheme {scheme}: unknown parameter {key!r}; only "
            f"{', '.join(BACKWARD_SCHEMES)} run per bucket during backward"
        )
    backward = mine.get(BACKWARD, False)
    if not isinstance(backward, bool):
        raise UserError(f"scheme {scheme}: backward must be true or false, got {backward!r}")
    if not backward and any(k in OPTIONS for k in mine):
        raise UserError(
            f"scheme {scheme}: bucket_cap_mb and gradient_as_bucket_view need `backward: true`"
        )
    return ({BACKWARD: True, **check(scheme, mine)} if backward else {}), rest


def canonical(scheme: str, params: dict[str, Any], compressor: str) -> tuple[str, dict[str, Any]]:
    """One spelling per configuration: ``ddp`` with a qbench compressor is reduce-broadcast per
    bucket; ``allreduce`` per bucket is ``ddp``. ``params`` must be validated already."""
    if scheme == DDP and compressor not in TORCH_HOOKS:
        return "reduce-broadcast", {BACKWARD: True, **params}
    if scheme == "allreduce" and params.get(BACKWARD):
        return DDP, {k: v for k, v in params.items() if k != BACKWARD}
    return scheme, params


def overlap(scheme: str, params: dict[str, Any]) -> str:
    """``backward`` when buckets are communicated during backward, ``none`` when one flat
    gradient is aggregated after it (recorded as the run's ``overlap`` label)."""
    return BACKWARD if scheme == DDP or params.get(BACKWARD) else "none"


def incompatibility(
    backend: str, scheme: str, params: dict[str, Any], compressor: str
) -> str | None:
    """Why a DDP-path combination cannot run, or None."""
    if overlap(scheme, params) != BACKWARD:
        return None
    if backend == "mpi":
        return (
            "DDP runs on torch.distributed process groups (gloo, nccl); torch's MPI backend is "
            "not built, so mpi has no DDP; use backend gloo (CPU) or nccl (GPU)"
        )
    if scheme == DDP and compressor not in TORCH_HOOKS:  # canonical() maps these away
        return f"ddp runs compressors {', '.join(TORCH_HOOKS)} with torch's hooks"
    return None
