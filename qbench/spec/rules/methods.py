"""What a method allows: its scheme, its compressors and the backend under them.

Each rule is a function of a :class:`~qbench.spec.rules.candidate.Candidate` returning the
one-line reason the planner shows, or None; ``RULES`` is their order (the first reason found is
the one shown).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from qbench import catalog
from qbench.catalog.schemes import BACKWARD, EXCHANGE, TORCH_HOOKS, torus_rows
from qbench.catalog.schemes.spelling import DDP, FSDP, overlap
from qbench.spec.rules.candidate import Candidate

Rule = Callable[[Candidate], "str | None"]


def _fsdp(c: Candidate) -> str | None:
    """FSDP2 shards on torch.distributed, one codec per block's flat shard, its own mixed
    precision; checked before the DDP rules, whose reasons would name DDP."""
    if c.scheme != FSDP:
        return None
    if c.backend == "mpi":
        return (
            "FSDP runs on torch.distributed process groups (gloo, nccl); torch's MPI backend is "
            "not built; use backend gloo (CPU) or nccl (GPU)"
        )
    if c.overrides:
        return (
            "fsdp encodes each block's flat gradient shard with one codec, so layer overrides "
            "cannot apply; drop `layers:` for fsdp"
        )
    if c.telemetry:
        return "telemetry shadows a flat loop's encode; FSDP's run inside backward: drop it"
    if c.compute != "fp32":
        return (
            f"compute {c.compute} is the flat and DDP loops'; FSDP's mixed precision is its "
            f"param_dtype, e.g. `{{name: fsdp, param_dtype: bf16}}`"
        )
    return None


def _ddp_backend(c: Candidate) -> str | None:
    if overlap(c.scheme, c.params) == BACKWARD.name and c.backend == "mpi":
        return (
            "DDP runs on torch.distributed process groups (gloo, nccl); torch's MPI backend is "
            "not built, so mpi has no DDP; use backend gloo (CPU) or nccl (GPU)"
        )
    return None


def _ddp_hooks(c: Candidate) -> str | None:
    if c.scheme != DDP:
        return None
    if c.overrides:
        return (
            "ddp sends every tensor through one torch hook; layer overrides need qbench's hook: "
            "use e.g. `{name: reduce-broadcast, backward: true}`"
        )
    if c.compressor.name not in TORCH_HOOKS:  # canonical() maps these away
        return f"ddp runs compressors {', '.join(TORCH_HOOKS)} with torch's hooks"
    return None


def _ddp_loop(c: Candidate) -> str | None:
    if overlap(c.scheme, c.params) != BACKWARD.name:
        return None
    if c.telemetry:
        return (
            "telemetry shadows each layer's encode after backward; DDP runs communicate during "
            "backward and record none; drop `telemetry` or the DDP schemes"
        )
    if c.compute == "fp16":
        return (
            "fp16 compute zeroes an overflowing rank's gradient before it is communicated, but "
            "DDP communicates during backward; use compute bf16 with DDP"
        )
    return None


def _hook_only(c: Candidate) -> str | None:
    if c.scheme == DDP:
        return None
    for comp in c.compressors:
        if comp.entry.hook_only:
            return (
                f"{comp.name} is torch's DDP communication hook, not a codec the {c.scheme} "
                f"scheme can call; use `scheme: ddp`"
            )
    return None


def _summable(c: Candidate) -> str | None:
    if c.scheme not in ("allreduce", DDP):
        return None
    for comp in c.compressors:
        if not comp.entry.summable and c.scheme == "allreduce":
            return (
                f"allreduce sums raw buffers and cannot sum packed {comp.name} payloads; "
                "use compressor none, fp16 or bf16, or scheme reduce-broadcast"
            )
        if comp.name == "bf16" and c.backend == "mpi":
            return (
                "MPI cannot sum bf16 buffers (numpy, hence mpi4py, has no bfloat16 datatype); "
                "use backend gloo or nccl, or compressor fp16"
            )
    return None


def _integer_levels(c: Candidate) -> str | None:
    if c.scheme != "integer-allreduce":
        return None
    for comp in c.compressors:
        if comp.name == "none":  # groups the layer policy keeps in fp32: a plain allreduce
            continue
        why = comp.entry.integer_levels(comp.params)
        if why == catalog.compressors.NOT_LEVELS:
            return (
                f"integer-allreduce sums codes on shared scales (qsgd, fp8 with blocks, mx, "
                f"nvfp4) and cannot sum {comp.name}: {why}; e.g. `{{name: qsgd, bits: 8}}`, "
                "or scheme reduce-broadcast"
            )
        if why:
            return f"integer-allreduce: {why}"
        if comp.error_feedback:  # its own kernels quantize: no residual is carried
            return (
                f"integer-allreduce quantizes on the shared scales with kernels of its own and "
                f"carries no residual, so {comp.name}'s error feedback would be ignored; set "
                f"`error_feedback: false`, or use scheme reduce-broadcast"
            )
    return None


def _own_error_feedback(c: Candidate) -> str | None:
    carried = {
        "gossip": "gossip algorithms carry their own error feedback (Choco's x_hat, "
        "DeepSqueeze's delta)",
        "push-sum": "push-sum keeps its own error feedback (Choco's public copies per link)",
    }.get(c.scheme)
    for comp in c.compressors if carried else ():
        if comp.error_feedback:
            return f"{carried}; set `error_feedback: false` on {comp.name}"
    return None


def _topology(c: Candidate) -> str | None:
    if c.scheme != "gossip" or c.world_size is None:
        return None
    if c.params.get("topology") == "torus" and torus_rows(c.world_size) < 2:
        return (
            f"gossip: topology torus needs world_size = r x c with r, c >= 2, got "
            f"{c.world_size}; use a world_size such as 4, 6, 8 or 9, or `topology: ring`"
        )
    return None


def _qgm_momentum(c: Candidate) -> str | None:
    if c.scheme == "push-sum" and c.params.get("qgm") and c.momentum:
        return (
            "push-sum's qgm is the momentum (quasi-global); the optimizer's would compound "
            "with it; set `momentum: 0` in the scenario"
        )
    return None


def _async_ps(c: Candidate) -> str | None:
    if c.scheme != "async-ps":
        return None
    if c.world_size is not None and c.world_size < 2:
        return (
            f"async-ps needs a server (rank 0) and at least one worker: world_size >= 2, "
            f"got {c.world_size}"
        )
    if c.backend == "nccl":
        return (
            "async-ps receives from whichever worker sends first, which nccl cannot; "
            "use backend gloo or mpi"
        )
    if c.telemetry:
        return (
            "async-ps records no per-layer telemetry; remove `telemetry` from the scenario "
            "for async-ps runs"
        )
    if c.optimizer:
        return (
            f"async-ps updates the model on its server by its own rule (SGD; Nesterov for "
            f"variant accelerated), so optimizer {c.optimizer} cannot apply; remove `optimizer:`"
        )
    return None


def _trains(c: Candidate) -> str | None:
    if c.accuracy and not catalog.SCHEMES[c.scheme].reduces:
        return (
            f"{c.scheme} does not reduce the gradients (speed only, seed 002 section 4.4), so "
            "it cannot train; drop it from accuracy (epochs) scenarios"
        )
    return None


def _profiled(c: Candidate) -> str | None:
    if c.profile and catalog.SCHEMES[c.scheme].kind == "asynchronous":
        return (
            "profile traces the lock-step loops (flat and DDP); async-ps runs an event loop of "
            "its own without those phases; drop `profile` for it"
        )
    return None


def _replayed(c: Candidate) -> str | None:
    """Replayed compute hands every iteration the rank's first-batch gradient: true to a real
    run's bytes only where the payload's size does not depend on the values, and only in the
    loops that replay (qbench.run.replay.loops)."""
    if c.compute != "replay":
        return None
    if not catalog.SCHEMES[c.scheme].replays:
        return (
            f"compute replay: {c.scheme} runs a loop of its own that cannot sleep through the "
            f"model's work, so it would compute for real under a replay label; use "
            f"`compute: fp32` for {c.scheme}"
        )
    own = [(f"{k}: ", codec) for k, codec in catalog.codecs(c.params).items()]
    for where, comp in (*(("", comp) for comp in c.compressors), *own):
        if comp.entry.sized_by_data:
            return (
                f"compute replay: {where}{comp.name}'s payload size depends on the gradient, "
                "and replay hands every iteration the first batch's, so its bytes would not be "
                f"a real run's; use `compute: fp32` for {comp.name}"
            )
    return None


NO_MEAN = {  # scheme kind (qbench.catalog.schemes) -> why one collective call cannot time it
    "decentralized": "mixes models with its neighbours after the step and has no mean "
    "gradient to time or check; see `qbench sweep` for it",
    "asynchronous": "has no collective step (workers push and pull without a barrier); "
    "see `qbench sweep` for it",
    "ddp": "is a training loop whose buckets overlap backward, not one collective call; see "
    "`qbench sweep` for it",
    "periodic": "exchanges every H steps after the optimizer step, through the scheme its "
    "`exchange` names: time that scheme, or see `qbench sweep` for it",
}


def _collective(c: Candidate) -> str | None:
    """``bench comm`` times one aggregation call per size: schemes with no such call."""
    why = NO_MEAN.get(catalog.SCHEMES[c.scheme].kind) if c.collective else None
    return f"{c.scheme} {why}" if why else None


def _exchange(c: Candidate) -> str | None:
    """Local SGD and DiLoCo send their outer gradients through a collective scheme: what that
    scheme refuses (a packed codec under allreduce, bf16 on MPI, ...) they refuse too."""
    if catalog.SCHEMES[c.scheme].kind != "periodic":
        return None
    through = c.params.get(EXCHANGE.name, EXCHANGE.default)  # given, or the default
    inner = replace(c, scheme=through, params={})
    why = next((w for rule in RULES if rule is not _exchange and (w := rule(inner))), None)
    return f"{c.scheme} exchanges through {through}, and {why}" if why else None


RULES: tuple[Rule, ...] = (
    _collective, _fsdp, _ddp_backend, _ddp_hooks, _hook_only, _topology, _own_error_feedback,
    _async_ps, _summable, _integer_levels, _ddp_loop, _trains, _qgm_momentum, _profiled, _replayed,
    _exchange,
)  # fmt: skip
