"""Scenario -> run matrix: a list of RunSpec (stable ids) plus the excluded combinations.

Pure: no processes, no files. Combinations that cannot work are never dropped silently; they are
returned as :class:`Excluded` with the reason.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from qbench import aggregate, compress, data, models, network
from qbench.ddp import options as ddp_options
from qbench.errors import UserError
from qbench.scenario import Scenario

# Fields added after results existed: left out of the hash while they hold their default.
_OPTIONAL_ID_FIELDS: dict[str, Any] = {
    "model_params": {}, "repeat": 0, "nodes": 1, "device": "", "epochs": 0, "lr_schedule": {},
    "weight_decay": 0.0, "skew": 0.0, "compute": "fp32", "norm": "batchnorm", "weight_bits": 0,
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Everything a worker needs to run one configuration. Its hash is the run id."""

    scenario: str
    model: str
    dataset: str
    world_size: int
    backend: str
    scheme: str
    """Aggregation scheme name (``auto`` already resolved)."""
    compressor: dict[str, Any]
    batch_size: int
    warmup: int
    iterations: int
    lr: float
    momentum: float
    seed: int
    timeout: float
    telemetry: bool = False
    layers: dict[str, Any] = field(default_factory=dict)
    """Resolved LayerPolicy (empty for fp32 runs without overrides: nothing to decide)."""
    scheme_params: dict[str, Any] = field(default_factory=dict)
    network: dict[str, Any] = field(default_factory=dict)
    """Emulated link settings; empty = unshaped."""
    model_params: dict[str, Any] = field(default_factory=dict)
    """Model parameters from the scenario (e.g. the synthetic model's size); empty = defaults."""
    repeat: int = 0
    """Repetition index of an otherwise identical run (scenario ``repeats``)."""
    nodes: int = 1
    """Hosts the ranks are spread over."""
    device: str = ""
    """cpu or cuda; empty = the backend's own (cuda for nccl, cpu otherwise)."""
    price_per_hour: float | None = None
    """Machine-hour price for cost columns (not part of the run id)."""
    epochs: int = 0
    """Accuracy mode: passes over the training split (0 = iteration mode, ``iterations``)."""
    lr_schedule: dict[str, Any] = field(default_factory=dict)
    weight_decay: float = 0.0
    skew: float = 0.0
    """Label skew of the training partitions (0 = IID)."""
    target_accuracy: float | None = None
    """Top-1 accuracy for time-to-accuracy in reports (not part of the run id)."""
    compute: str = "fp32"
    """Compute precision (qbench.precision): fp32, bf16, fp16 or int8 (fake-quantized)."""
    norm: str = "batchnorm"
    weight_bits: int = 0
    """Quantize all parameters to this many bits after each step (0: no)."""

    @property
    def run_id(self) -> str:
        """Readable slug + hash of the resolved config (timeout and price excluded: they change
        nothing measured)."""
        d = asdict(self)
        d.pop("timeout")
        d.pop("scenario")
        d.pop("price_per_hour")
        d.pop("target_accuracy")
        for key, default in _OPTIONAL_ID_FIELDS.items():  # ids of earlier results stay valid
            if d[key] == default:
                d.pop(key)
        digest = hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
        parts = (self.model, self.backend, self.scheme_label, self.compressor_label)
        nodes = f"n{self.nodes}" if self.nodes > 1 else ""
        rep = f"-r{self.repeat}" if self.repeat else ""
        return f"{'-'.join(parts)}-w{self.world_size}{nodes}{rep}-{digest}"

    @property
    def scheme_label(self) -> str:
        """The scheme plus its parameters, e.g. ``reduce-broadcast+overlap4``."""
        return scheme_label(self.scheme, self.scheme_params)

    @property
    def compressor_label(self) -> str:
        return build_compressor(self.compressor).label

    @property
    def device_kind(self) -> str:
        """Where the ranks compute: cuda or cpu."""
        return self.device or natural_device(self.backend)

    def labels(self) -> dict[str, Any]:
        """Flat columns reports group by (stored in run.json)."""
        c = build_compressor(self.compressor)
        return {
            "model": self.model,
            "dataset": self.dataset,
            "backend": self.backend,
            "device": self.device_kind,
            "scheme": self.scheme_label,
            "mode": "overlap" if self.scheme_params.get("overlap", 1) > 1 else "breakdown",
            # communication during backward (DDP buckets) or after it (one flat gradient)
            "overlap": ddp_options.overlap(self.scheme, self.scheme_params),
            "compressor": c.label,
            "compressor_name": c.name,
            "bits": None if math.isnan(c.nominal_bits) else c.nominal_bits,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "global_batch": self.batch_size * self.world_size,
            # seed 002 section 4.4: NCCL "simulated" low precision sends the bytes but does not
            # reduce the gradients; every table and figure must say so.
            "simulated": self.scheme == "simulated-lowprec",
            "network": network.label(self.network),
            "numel": models.parameter_count(self.model, self.model_params),
            # forward FLOPs of one sample (cached): the computation side of seed 002's
            # communication / computation ratio (MB / GFLOPS), for reports that cannot import
            # the models
            "gflops_per_sample": models.flops_per_sample(self.model, self.model_params) / 1e9,
            "model_params": dict(self.model_params),
            "seed": self.seed,
            "repeat": self.repeat,
            "nodes": self.nodes,
            "price_per_hour": self.price_per_hour,
            "epochs": self.epochs,
            "skew": self.skew,
            "target_accuracy": self.target_accuracy,
            "compute": self.compute,
            "norm": self.norm,
            "weight_bits": self.weight_bits,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        return cls(**d)


@dataclass(frozen=True)
class Excluded:
    description: str
    reason: str


@dataclass(frozen=True)
class Matrix:
    runs: list[RunSpec]
    excluded: list[Excluded]


def build_compressor(params: dict[str, Any]) -> compress.Compressor:
    return compress.from_spec(params)


def expand(sc: Scenario) -> Matrix:
    """Cross-product of the scenario's axes; validates names and parameters first."""
    model_entries = [(m["name"], models.check_params(m["name"], _params(m))) for m in sc.model]
    for d in sc.dataset:
        if d not in data.DATASETS:
            from qbench.errors import choice_error

            raise choice_error("dataset", d, list(data.DATASETS))
    for c in (*sc.compressor, *sc.layers.overrides.values()):
        build_compressor(c)  # raises UserError naming the bad parameter
    for s in sc.scheme:
        if s["name"] != "auto":
            aggregate.check_params(s["name"], _params(s))
            continue
        for comp in sc.compressor:  # auto: the parameters must suit what it resolves to
            resolved = resolve_scheme("auto", comp)
            try:
                aggregate.check_params(resolved, _params(s))
            except UserError as e:
                raise UserError(
                    f"scheme auto is {resolved} for compressor {comp['name']}, and {e}; "
                    f"name the scheme, e.g. `scheme: [{{name: reduce-broadcast, overlap: 4}}]`"
                ) from None
    runs: list[RunSpec] = []
    excluded: list[Excluded] = []
    seen: set[str] = set()
    # Nested products (same order as one flat product): typed, where an 11-way one is not.
    places = list(itertools.product(sc.world_size, sc.nodes, sc.backend, sc.device))
    variants = list(itertools.product(sc.compressor, sc.scheme))
    draws = list(itertools.product(sc.seed, range(sc.repeats), sc.skew, sc.compute, sc.weights))
    axes = itertools.product(model_entries, sc.dataset, sc.network, places, variants, draws)
    for (model, mparams), dataset, net, (ws, nodes, backend, dev), (comp, scheme_spec), (
        seed,
        rep,
        skew,
        compute,
        weights,
    ) in axes:
        weight_bits = int(weights.get("bits", 0))
        resolved, scheme_params = ddp_options.canonical(
            resolve_scheme(scheme_spec["name"], comp), _params(scheme_spec), comp["name"]
        )
        device, device_problem = _device_for(backend, dev)
        why = next(
            (
                w
                for c in (comp, *sc.layers.overrides.values())
                if (w := incompatibility(backend, resolved, c, world_size=ws, params=scheme_params))
            ),
            None,
        )
        if not why and sc.epochs and resolved == "simulated-lowprec":
            why = (
                "simulated-lowprec does not reduce the gradients (speed only, seed 002 "
                "section 4.4), so it cannot train; drop it from accuracy (epochs) scenarios"
            )
        if not why:
            why = _overlap_problem(resolved, scheme_params, sc, compute)
        if not why and resolved == "push-sum" and scheme_spec.get("qgm") and sc.momentum:
            why = (
                "push-sum's qgm is the momentum (quasi-global); the optimizer's would compound "
                "with it; set `momentum: 0` in the scenario"
            )
        if not why and net and backend == "nccl":
            why = (
                "network.bandwidth emulates links between CPU processes (gloo, mpi); nccl would "
                "talk GPU to GPU inside one host and bypass them; use gloo or remove `network:`"
            )
        if not why:
            why = device_problem or _placement_problem(
                ws, nodes, device or natural_device(backend), sc.gpus_per_node
            )
        label = build_compressor(comp).label
        desc = (
            f"{model} {backend} {scheme_label(resolved, scheme_params)} {label} "
            f"w{ws}{f' n{nodes}' if nodes > 1 else ''} "
            f"{network.label(net)} seed{seed}{f' repeat{rep}' if rep else ''}"
            f"{f' skew{skew:g}' if skew else ''}{f' {compute}' if compute != 'fp32' else ''}"
            f"{f' w{weight_bits}bits' if weight_bits else ''}"
        )
        if not why:
            values = {
                "model": (model, {"name": model, **mparams}), "dataset": (dataset,),
                "world_size": (ws,), "nodes": (nodes,), "backend": (backend,),
                "device": (dev, device or natural_device(backend)),
                "scheme": (resolved, scheme_spec["name"], dict(scheme_spec),
                           {"name": resolved, **scheme_params}),
                "compressor": (comp["name"], label, dict(comp)),
                "network": (network.label(net), dict(net)), "seed": (seed,), "repeat": (rep,),
                "skew": (skew,), "compute": (compute,),
            }  # fmt: skip
            why = _filtered(values, sc.include, sc.exclude)
        if why:
            excluded.append(Excluded(desc, why))
            continue
        spec = RunSpec(
            scenario=sc.name, model=model, dataset=dataset, world_size=ws, backend=backend,
            scheme=resolved, compressor=dict(comp), batch_size=sc.batch_for(ws),
            warmup=sc.warmup, iterations=sc.iterations, lr=sc.lr, momentum=sc.momentum,
            seed=seed, timeout=sc.timeout, telemetry=sc.telemetry, layers=_layers_for(comp, sc),
            scheme_params=scheme_params, network=dict(net), model_params=mparams,
            repeat=rep, nodes=nodes, price_per_hour=sc.price_per_hour, device=device,
            epochs=sc.epochs or 0, lr_schedule=dict(sc.lr_schedule),
            weight_decay=sc.weight_decay, skew=skew, target_accuracy=sc.target_accuracy,
            compute=compute, norm=sc.norm, weight_bits=weight_bits,
        )  # fmt: skip
        if spec.run_id not in seen:  # "auto" may resolve to a scheme also listed explicitly
            seen.add(spec.run_id)
            runs.append(spec)
    if not runs:
        raise UserError(f"scenario {sc.name!r} expands to no runnable combination; see --dry-run")
    # Repeats interleaved: every configuration's first repeat, then every second one, ...; a
    # slow spell of a shared machine then hits one repeat of many configurations, not all the
    # repeats of one (their median is what reports and the cost model compare).
    runs.sort(key=lambda r: r.repeat)  # stable: matrix order within a repeat
    return Matrix(runs, excluded)


def natural_device(backend: str) -> str:
    return "cuda" if backend == "nccl" else "cpu"


def _device_for(backend: str, device: str) -> tuple[str, str | None]:
    """RunSpec.device ('' when it is the backend's own) and why the pair cannot run."""
    kind = natural_device(backend) if device == "auto" else device
    if backend == "nccl" and kind == "cpu":
        return "", "nccl reduces GPU tensors only; use device cuda (or auto) or backend gloo"
    if backend == "gloo" and kind == "cuda":
        return "", (
            "gloo has no CUDA all-to-all for the compressed schemes; use nccl or mpi for "
            "device cuda"
        )
    return ("" if kind == natural_device(backend) else kind), None


def _placement_problem(ws: int, nodes: int, device: str, gpus_per_node: int | None) -> str | None:
    if ws % nodes:
        return f"world_size {ws} does not split evenly over nodes {nodes}"
    if device == "cuda" and gpus_per_node is not None and ws // nodes > gpus_per_node:
        return (
            f"{ws // nodes} ranks per node but gpus_per_node is {gpus_per_node}; each CUDA rank "
            "needs its own GPU"
        )
    return None


def _filtered(
    values: dict[str, tuple[Any, ...]],
    include: tuple[dict[str, Any], ...],
    exclude: tuple[dict[str, Any], ...],
) -> str | None:
    """Why include / exclude drop a run (None: it stays). An entry matches when every axis it
    names has one of its values; a value may be a name, a label or the full mapping."""

    def matches(entry: dict[str, Any]) -> bool:
        for key, want in entry.items():
            options = want if isinstance(want, list) else [want]
            if not any(o == v for o in options for v in values[key]):
                return False
        return True

    for i, entry in enumerate(exclude):
        if matches(entry):
            return f"dropped by exclude entry {i + 1} {entry}"
    if include and not any(matches(e) for e in include):
        return "matches no include entry"
    return None


def scheme_label(scheme: str, params: dict[str, Any]) -> str:
    """``reduce-broadcast+overlap4``, ``reduce-broadcast+backward``: part of run ids, so the
    spelling of existing parameters never changes."""
    extra = "".join(
        f"+{k}" if k == ddp_options.BACKWARD else f"+{k}{_short(v)}"
        for k, v in sorted(params.items())
    )
    return f"{scheme}{extra}"


def _short(v: Any) -> str:
    if isinstance(v, dict):
        return build_compressor(v).label if "name" in v else "-".join(map(str, v.values()))
    return str(v)


def _params(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "name"}


def _layers_for(comp: dict[str, Any], sc: Scenario) -> dict[str, Any]:
    if comp["name"] == "none" and not sc.layers.overrides:
        return {}
    return sc.layers.to_dict()


def resolve_scheme(scheme: str, comp: dict[str, Any]) -> str:
    if scheme != "auto":
        return scheme
    if comp["name"] == "none":
        return "allreduce"
    return ddp_options.DDP if build_compressor(comp).hook_only else "reduce-broadcast"


def incompatibility(
    backend: str,
    scheme: str,
    comp: dict[str, Any],
    *,
    world_size: int | None = None,
    params: dict[str, Any] | None = None,
) -> str | None:
    """Why a combination cannot run, or None."""
    from qbench.compress.qsgd import QSGD

    name = comp["name"]
    why = ddp_options.incompatibility(backend, scheme, params or {}, name)
    if why:
        return why
    if build_compressor(comp).hook_only and scheme != ddp_options.DDP:
        return (
            f"{name} is torch's DDP communication hook, not a codec the {scheme} scheme can "
            f"call; use `scheme: ddp`"
        )
    if scheme == "gossip":
        return _gossip_incompatibility(comp, world_size, params or {})
    if scheme == "async-ps":
        return _async_ps_incompatibility(backend, world_size)
    if scheme == "push-sum" and getattr(build_compressor(comp), "error_feedback", False):
        return (
            f"push-sum keeps its own error feedback (Choco's public copies per link); set "
            f"`error_feedback: false` on {comp['name']}"
        )
    if scheme == "allreduce" and name not in ("none", "fp16", "bf16"):
        return (
            f"allreduce sums raw buffers and cannot sum packed {name} payloads; "
            "use compressor none, fp16 or bf16, or scheme reduce-broadcast"
        )
    if scheme == "allreduce" and name == "bf16" and backend == "mpi":
        return (
            "MPI cannot sum bf16 buffers (numpy, hence mpi4py, has no bfloat16 datatype); "
            "use backend gloo or nccl, or compressor fp16"
        )
    # integer-allreduce: compressor none (groups the layer policy keeps in fp32) takes a plain
    # fp32 allreduce; anything else must be qsgd levels that sum as bounded integers.
    if scheme == "integer-allreduce" and name != "none":
        c = build_compressor(comp)
        if not isinstance(c, QSGD):
            return (
                f"integer-allreduce sums qsgd levels as integers and needs compressor qsgd, "
                f"got {name}; e.g. `{{name: qsgd, bits: 8}}`, or scheme reduce-broadcast"
            )
        if c.bits < 2:
            return (
                "integer-allreduce needs qsgd bits >= 2 (levels -L..L, L = 2^(bits-1) - 1), "
                "got bits 1; e.g. `bits: 2`"
            )
        if c.norm != "max":
            return (
                f"integer-allreduce scales buckets by the max |x| over ranks, got qsgd norm "
                f"{c.norm}; use `norm: max`"
            )
    return None


def _overlap_problem(scheme: str, params: dict[str, Any], sc: Scenario, compute: str) -> str | None:
    """What the DDP loop (communication during backward) does not offer."""
    if ddp_options.overlap(scheme, params) != ddp_options.BACKWARD:
        return None
    if scheme == ddp_options.DDP and sc.layers.overrides:
        return (
            "ddp sends every tensor through one torch hook; layer overrides need qbench's hook: "
            "use e.g. `{name: reduce-broadcast, backward: true}`"
        )
    if sc.telemetry:
        return (
            "telemetry shadows each layer's encode after backward; DDP runs communicate during "
            "backward and record none; drop `telemetry` or the DDP schemes"
        )
    if compute == "fp16":
        return (
            "fp16 compute zeroes an overflowing rank's gradient before it is communicated, but "
            "DDP communicates during backward; use compute bf16 with DDP"
        )
    return None


def _async_ps_incompatibility(backend: str, world_size: int | None) -> str | None:
    """async-ps: rank 0 serves and the others train; the server receives from any source."""
    if world_size is not None and world_size < 2:
        return (
            f"async-ps needs a server (rank 0) and at least one worker: world_size >= 2, "
            f"got {world_size}"
        )
    if backend == "nccl":
        return (
            "async-ps receives from whichever worker sends first, which nccl cannot; "
            "use backend gloo or mpi"
        )
    return None


def _gossip_incompatibility(
    comp: dict[str, Any], world_size: int | None, params: dict[str, Any]
) -> str | None:
    from qbench.aggregate import topology

    if world_size is not None:
        why = topology.incompatibility(params.get("topology", "ring"), world_size)
        if why:
            return why
    if getattr(build_compressor(comp), "error_feedback", False):
        return (
            f"gossip algorithms carry their own error feedback (Choco's x_hat, DeepSqueeze's "
            f"delta); set `error_feedback: false` on {comp['name']}"
        )
    return None
