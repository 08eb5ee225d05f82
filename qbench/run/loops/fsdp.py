"""The training loop of FSDP runs: PyTorch's FSDP2 (``fully_shard`` per block, then the root),
each block's parameters all-gathered before its forward (and backward, when resharded) and its
gradients reduce-scattered during backward, through ``qbench.fsdp``'s collectives.

Blocks are the model's ``blocks`` (a transformer's layers) when it has them, else its direct
children that hold parameters; the root takes what is left (embeddings, the head). The
compressor axis is what the reduce-scatter sends: ``none`` / ``fp16`` / ``bf16`` are torch's
own reduce-scatter in that dtype (FSDP's ``reduce_dtype``: the 16-bit baselines), any other
codec qbench's compressed reduce-scatter; the scheme's ``all_gather`` compresses the parameter
all-gather. ``param_dtype`` is FSDP's mixed precision (gathered parameters, forward and
backward); the optimizer steps the fp32 shards.

Per iteration it records, as DDP runs do: the forward pass (its all-gathers included),
``t_comm`` the communication the training thread waited for (exposed), ``t_compute`` the rest
of forward and backward, ``t_comm_total`` the seconds with a collective in flight, hidden or
not, ``overlap_fraction``, ``t_codec_total`` and, FSDP's own, the all-gathers' and the
reduce-scatters' totals and bytes apart (``t_allgather_total``, ``bytes_allgather``, ...).
A NaN or inf in a block's gradient is zeroed before it is sent and the run's ``nonfinite``
policy fails or skips the step, as in DDP runs.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from qbench import comm, fsdp
from qbench.catalog.schemes import FSDP_TORCH
from qbench.ddp.timeline import overlap_fraction
from qbench.run import nonfinite, profile, workload
from qbench.run.loops.training import Training
from qbench.spec.runspec import RunSpec
from qbench.timing import PhaseTimer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def blocks(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP shards one by one: a transformer's ``blocks``, else the children
    holding parameters."""
    own = getattr(model, "blocks", None)
    if isinstance(own, nn.ModuleList):
        return list(own)
    return [m for m in model.children() if any(True for _ in m.parameters())]


def shard(model: nn.Module, params: dict[str, Any], reduce_dtype: torch.dtype) -> None:
    """``fully_shard`` every block, then the root, with the scheme's parameters."""
    policy = MixedPrecisionPolicy(
        param_dtype=DTYPES[params["param_dtype"]], reduce_dtype=reduce_dtype
    )
    parts = blocks(model)
    for block in parts:
        fully_shard(block, reshard_after_forward=params["reshard_after_forward"],
                    mp_policy=policy)  # fmt: skip
    fully_shard(model, reshard_after_forward=params["reshard_after_forward"], mp_policy=policy)
    ahead = params["prefetch"]
    if ahead > 1:  # torch prefetches the next block itself; more are asked for explicitly
        sharded: list[Any] = [b for b in parts if isinstance(b, FSDPModule)]
        for i, block in enumerate(sharded):
            block.set_modules_to_forward_prefetch(sharded[i + 1 : i + 1 + ahead])
            block.set_modules_to_backward_prefetch(sharded[max(0, i - ahead) : i][::-1])


class FSDPRun(Training):
    def __init__(self, spec: RunSpec, cm: comm.Comm) -> None:
        super().__init__(spec, cm)
        self.options = spec.method.scheme.params
        name = spec.method.compressor.name
        torch_own = name in FSDP_TORCH
        # evaluation reads the whole model: a plain replica, filled from the shards
        self.replica = copy.deepcopy(self.model) if spec.measurement.epochs else None
        self.grad_bytes = 4 * sum(p.numel() for p in self.named.values())
        # torch's own reduce-scatter in the 16-bit dtype named; fp32 for none and for codecs
        shard(self.model, self.options, DTYPES.get(name, torch.float32))
        codec = {"name": "none"} if torch_own else spec.method.compressor.given
        self.coded = not torch_own or self.options["all_gather"] is not None
        self.log = fsdp.register(
            self.model,
            **codec,
            all_gather=self.options["all_gather"],
            comm=cm,
            seed=spec.measurement.seed,
        )
        # fully_shard replaced the parameters by sharded ones: the optimizer steps those
        self.named = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        self.opt = workload.optimizer(self.model.parameters(), spec)
        self.guard = nonfinite.Guard(spec.measurement.nonfinite, cm, cm.rank, device=self.device)

    def iteration(self, it: int, timer: PhaseTimer) -> None:
        x, y = self.data.batch(it)
        self.log.begin(it)
        timer.start()
        profile.phase("forward")
        self.opt.zero_grad()
        loss = self.loss_fn(self.model(x), y)  # all-gathers block by block
        timer.mark("compute")
        profile.phase("backward")
        loss.backward()  # reduce-scatters block by block (and all-gathers again if resharded)
        timer.mark("comm")
        backward_end = timer.last_mark
        until_backward = timer.totals["compute"] + timer.totals["comm"]
        stepped = self.guard.decide(it, self.log.found, timer)  # fail, or all skip
        agree = timer.last_mark - backward_end
        profile.phase("step")
        if stepped:
            self.opt.step()
        timer.mark("step")
        profile.phase(None)
        self._losses.append(loss.detach())
        self._record(it, timer, until_backward, agree, skipped=not stepped)

    def _record(
        self, it: int, timer: PhaseTimer, until_backward: float, agree: float, skipped: bool
    ) -> None:
        """``until_backward``: forward and backward's seconds, collectives included."""
        log = self.log
        exposed = log.held + agree
        total = log.total() + agree
        self.rows.append({
            "run_id": self.spec.run_id, "rank": self.comm.rank, "iteration": it,
            "warmup": it < self.spec.measurement.warmup,
            "t_forward": timer.totals["compute"],
            "t_compute": until_backward - log.held,
            "t_encode": math.nan, "t_comm": exposed, "t_decode": math.nan,
            "t_step": timer.totals["step"], "t_iteration": timer.elapsed(),
            "bytes_sent": log.bytes_sent(), "payload_bytes": log.payload_bytes,
            "grad_bytes": self.grad_bytes, "loss": math.nan,
            "t_comm_total": total, "overlap_fraction": overlap_fraction(exposed, total),
            "t_codec_total": log.codec if self.coded else math.nan,
            "skipped": float(skipped),
            "t_allgather_total": log.total("all_gather"),
            "t_reduce_scatter_total": log.total("reduce_scatter"),
            "bytes_allgather": float(log.bytes_sent("all_gather")),
            "bytes_reduce_scatter": float(log.bytes_sent("reduce_scatter")),
        })  # fmt: skip

    def eval_model(self) -> nn.Module:
        """The whole model for evaluation: every shard gathered (torch's all-gather, not
        counted) into the plain replica; every rank calls it at the same epochs."""
        assert self.replica is not None
        full = dict(self.replica.named_parameters())
        buffers = dict(self.replica.named_buffers())
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                full[n].copy_(p.full_tensor() if hasattr(p, "full_tensor") else p)
            for n, b in self.model.named_buffers():  # not sharded: the same on every rank
                buffers[n].copy_(b)
        return self.replica
