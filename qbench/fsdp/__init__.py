"""qbench's codecs inside PyTorch FSDP2, for any training script.

::

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    log = qbench.fsdp.register(model, "qsgd", bits=4, bucket_size=512)
    ...
    log.begin(step)            # before each step: the step keys the codecs' random draws
    loss.backward()
    log.bytes_sent(), log.total("reduce_scatter"), log.held   # that step's account

Every FSDP block's reduce-scatter becomes qbench's compressed reduce-scatter (each rank encodes
the shards it owes, one all-to-all, decode and sum in fp32; error feedback per shard), and with
``all_gather=`` a codec spec its parameter all-gather is compressed too (each rank encodes its
shard, every rank decodes all). ``"none"`` keeps torch's collectives in FSDP's own dtypes (the
16-bit baselines are FSDP's ``MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)``), timed the
same way. How it works and what it measures: ``qbench.fsdp.collectives``, docs/fsdp.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.distributed.fsdp import FSDPModule

from qbench import catalog, compress
from qbench.catalog.schemes import FSDP_TORCH
from qbench.comm.torchdist import TorchDistComm
from qbench.errors import UserError
from qbench.fsdp import collectives as c

if TYPE_CHECKING:
    from torch import nn

    from qbench.comm.base import Comm

__all__ = ["register"]


def register(
    model: nn.Module,
    name: str = "none",
    *,
    all_gather: Any = None,
    comm: Comm | None = None,
    seed: int = 0,
    **params: Any,
) -> c.CommLog:
    """Route the collectives of every FSDP block of ``model`` (``fully_shard`` applied)
    through qbench; the :class:`~qbench.fsdp.collectives.CommLog` that accounts for them.

    ``name`` and ``params``: the reduce-scatter's compressor spec as in a scenario;
    ``all_gather``: the parameter all-gather's (None: torch's). ``comm``: qbench's
    communicator over the default group (default: attached to it); ``seed``: the draws'.
    """
    spec = catalog.compressor({"name": name, **params})
    if (spec.name in FSDP_TORCH and spec.name != "none") or spec.entry.hook_only:
        raise UserError(
            f"{spec.name} is not a codec for FSDP's reduce-scatter; a 16-bit reduce-scatter is "
            "FSDP's own: fully_shard(..., mp_policy=MixedPrecisionPolicy(reduce_dtype=...)) "
            "and register(model, 'none')"
        )
    catalog.scheme({"name": "fsdp", "all_gather": all_gather})  # a stateless codec, or None
    comm = comm or TorchDistComm.attach()
    codec = None if spec.name == "none" else compress.from_spec(spec, seed=seed)
    gather = None if all_gather is None else compress.from_spec(all_gather, seed=seed)
    log = c.CommLog()
    blocks = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not blocks:
        raise UserError("register: the model has no FSDP module; apply fully_shard first")
    for b, block in enumerate(blocks):
        rs: Any = (c.TimedReduceScatter(log, f"block {b}") if codec is None
                   else c.CompressedReduceScatter(log, comm, codec, b))  # fmt: skip
        ag: Any = c.TimedAllGather(log) if gather is None else c.CompressedAllGather(
            log, comm, gather, b)  # fmt: skip
        block.set_custom_reduce_scatter(rs)
        block.set_custom_all_gather(ag)
    return log
