"""Scenario -> run matrix: a list of RunSpec (stable ids) plus the excluded combinations.

Pure: no processes, no files. Combinations that cannot work are never dropped silently; they are
returned as :class:`Excluded` with the reason.

Why one module: a RunSpec's fields, its id and the expansion that fills them in are one
contract (the id hashes exactly what expansion resolves), so they change together.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from qbench import catalog
from qbench.catalog.schemes import spelling
from qbench.errors import UserError
from qbench.spec import checks, codec_times, network, rules
from qbench.spec import workload as user
from qbench.spec.loop import LoopChoice, loop_for
from qbench.spec.network import Link, Topology
from qbench.spec.scenario import REPLAY, ROUNDED_COMPUTE, Scenario

# Fields added after results existed: left out of the hash while they hold their default.
_OPTIONAL_ID_FIELDS: dict[str, Any] = {
    "model_params": {}, "repeat": 0, "nodes": 1, "device": "", "epochs": 0, "lr_schedule": {},
    "weight_decay": 0.0, "skew": 0.0, "compute": "fp32", "norm": "batchnorm", "weight_bits": 0,
    "steps_per_epoch": 0, "profile": False, "workload": {}, "data": {}, "optimizer": {},
    "loss": {}, "nonfinite": "fail", "rounding": "per-rank", "dilation": 1.0, "timeline": "",
    "codec_time": "",
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
    """Emulated link settings as written and recorded; empty = unshaped. Read the rate from
    :attr:`link`."""
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
    """Compute precision (qbench.run.precision): fp32, bf16, fp16, int8 or int8-asym
    (fake-quantized)."""
    norm: str = "batchnorm"
    weight_bits: int = 0
    """Quantize all parameters to this many bits after each step (0: no)."""
    rounding: str = "per-rank"
    """Stochastic rounding's draws (qbench.run.rounding): ``per-rank`` or ``shared``; always
    ``per-rank`` in a run that rounds nothing stochastically."""
    steps_per_epoch: int = 0  # accuracy mode: at most this many steps per epoch (0: all)
    profile: bool = False  # profiler traces (qbench.run.profile); labelled ``profiled``
    # The user's workload (qbench.spec.workload): empty for the zoo, built-in data, SGD, CE.
    workload: dict[str, Any] = field(default_factory=dict)
    """Model factory; ``model`` is then its label."""
    data: dict[str, Any] = field(default_factory=dict)
    """Dataset factory; ``dataset`` is then its label."""
    optimizer: dict[str, Any] = field(default_factory=dict)
    """An optimizer other than SGD: name and parameters besides lr, momentum, weight_decay."""
    loss: dict[str, Any] = field(default_factory=dict)
    nonfinite: str = "fail"
    dilation: float = 1.0
    """Time dilation (``qbench.run.replay``): links shaped at their rates / D, replayed compute
    and codec time stretched D times; reports divide the measured times by D."""
    timeline: str = ""
    """A supplied replay timeline (absolute path); empty: measured by the sweep's first run."""
    codec_time: str = ""
    """A ``bench kernels --json`` file (absolute path) whose encode / decode times the flat
    loop's codec calls replay (``qbench.run.replay``); empty: the real codec's time."""
    """A NaN or inf in a gradient fails the run (``fail``) or skips the step (``skip``)."""

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
        replayed = f"-{REPLAY}" if self.compute == REPLAY else ""  # seen in every progress line
        return f"{'-'.join(parts)}-w{self.world_size}{nodes}{rep}{replayed}-{digest}"

    @property
    def scheme_label(self) -> str:
        """The scheme plus its parameters, e.g. ``reduce-broadcast+overlap4``."""
        return catalog.scheme_label(self.scheme, self.scheme_params)

    @property
    def compressor_label(self) -> str:
        return catalog.compressor_label(self.compressor)

    @property
    def loop(self) -> LoopChoice:
        """The training loop that runs it (``qbench.spec.loop``: the one place it is chosen)."""
        return loop_for(self.scheme, self.scheme_params, self.compute)

    @property
    def device_kind(self) -> str:
        """Where the ranks compute: cuda or cpu."""
        return self.device or natural_device(self.backend)

    def labels(self) -> dict[str, Any]:
        """Flat columns reports group by (stored in run.json); the driver adds the model's
        size and FLOPs (``numel``, ``gflops_per_sample``: qbench.models, which needs torch)."""
        c = catalog.compressor(self.compressor)
        return {
            "model": self.model,
            "dataset": self.dataset,
            "backend": self.backend,
            "device": self.device_kind,
            "scheme": self.scheme_label,
            "mode": "overlap" if self.scheme_params.get("overlap", 1) > 1 else "breakdown",
            # communication during backward (DDP buckets) or after it (one flat gradient)
            "overlap": spelling.overlap(self.scheme, self.scheme_params),
            "compressor": c.label,
            "compressor_name": c.name,
            "bits": c.nominal_bits,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "global_batch": self.batch_size * self.world_size,
            # seed 002 section 4.4: NCCL "simulated" low precision sends the bytes but does not
            # reduce the gradients; every table and figure must say so.
            "simulated": not catalog.SCHEMES[self.scheme].reduces,
            "network": self.link.label,
            "model_params": dict(self.model_params),
            "seed": self.seed,
            "repeat": self.repeat,
            "nodes": self.nodes,
            "price_per_hour": self.price_per_hour,
            "epochs": self.epochs,
            "skew": self.skew,
            "target_accuracy": self.target_accuracy,
            "compute": self.compute,
            **({"dilation": self.dilation} if self.dilation != 1 else {}),
            # the device whose codec times the run replayed (qbench.run.replay.codec)
            **(
                {"codec_time": codec_times.read_once(self.codec_time).device}
                if self.codec_time
                else {}
            ),
            "norm": self.norm,
            "weight_bits": self.weight_bits,
            **({"rounding": self.rounding} if self.rounding != "per-rank" else {}),
            "optimizer": self.optimizer.get("name", "sgd" if self.momentum == 0 else "momentum"),
            "loss": self.loss.get("name", self.loss.get("factory", "cross-entropy")),
        }

    @cached_property
    def link(self) -> Link:
        """The link, its rate parsed once per spec (not a field: run.json keeps ``network``)."""
        return network.link(self.network)

    @property
    def topology(self) -> Topology:
        """Nodes, ranks per node and the links between and inside them."""
        return network.topology(self.network, self.world_size, self.nodes)

    @property
    def shaped_topology(self) -> Topology:
        """The links as shaped: :attr:`topology`'s rates divided by ``dilation``."""
        return network.dilated(self.topology, self.dilation)

    @property
    def emulated_hosts(self) -> bool:
        """Whether the ranks run on emulated hosts (network namespaces) of this machine."""
        return network.emulates_hosts(self.network)

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


@dataclass(frozen=True)
class _Point:
    """One combination of the scenario's axes, before it is checked."""

    model: str
    model_spec: dict[str, Any]
    """The model as the scenario wrote it (include / exclude may name it so)."""
    model_params: dict[str, Any]
    workload: dict[str, Any]
    dataset: str
    data: dict[str, Any]
    network: dict[str, Any]
    world_size: int
    nodes: int
    backend: str
    device: str
    compressor: catalog.CompressorSpec
    scheme_spec: dict[str, Any]
    """The scheme as the scenario wrote it."""
    scheme: str
    """Resolved (``auto``) and canonical (``spelling.canonical``)."""
    scheme_params: dict[str, Any]
    seed: int
    repeat: int
    skew: float
    compute: str
    weight_bits: int


def expand(sc: Scenario) -> Matrix:
    """Cross-product of the scenario's axes; validates names and parameters first."""
    models_ = _check(sc)
    runs: list[RunSpec] = []
    excluded: list[Excluded] = []
    seen: set[str] = set()
    for point in _points(sc, models_):
        why = _why_excluded(sc, point)
        if why:
            excluded.append(Excluded(_describe(point), why))
            continue
        spec = _run_spec(sc, point)
        if spec.run_id not in seen:  # "auto" may resolve to a scheme also listed explicitly
            seen.add(spec.run_id)
            runs.append(spec)
    if not runs:
        raise checks.EmptyMatrix(sc.name, excluded)  # --dry-run lists every reason
    # Repeats interleaved: every configuration's first repeat, then every second one, ...; a
    # slow spell of a shared machine then hits one repeat of many configurations, not all the
    # repeats of one (their median is what reports and the cost model compare).
    runs.sort(key=lambda r: r.repeat)  # stable: matrix order within a repeat
    if sc.cover:
        runs, dropped = cover(runs)
        excluded += [Excluded(r.run_id, "cover: its every axis value runs in another run")
                     for r in dropped]  # fmt: skip
    return Matrix(runs, excluded)


def axis_values(r: RunSpec) -> set[tuple[str, Any]]:
    """(axis, value) pairs of a run, for ``cover``: each axis, and scheme with compressor."""
    return {
        ("model", r.model), ("dataset", r.dataset), ("backend", r.backend),
        ("world_size", r.world_size), ("nodes", r.nodes), ("device", r.device),
        ("network", network.label(r.network)), ("compute", r.compute), ("skew", r.skew),
        ("weight_bits", r.weight_bits), ("scheme", r.scheme_label),
        ("compressor", r.compressor_label), ("method", (r.scheme_label, r.compressor_label)),
    }  # fmt: skip


def cover(runs: list[RunSpec]) -> tuple[list[RunSpec], list[RunSpec]]:
    """(kept, dropped): in matrix order, a run is kept when it brings an (axis, value) pair no
    kept run has, so every value of every axis runs at least once (a greedy covering set)."""
    seen: set[tuple[str, Any]] = set()
    kept: list[RunSpec] = []
    dropped: list[RunSpec] = []
    for r in runs:
        values = axis_values(r)
        (kept if values - seen else dropped).append(r)
        seen |= values
    return kept, dropped


def _check(sc: Scenario) -> list[user.Model]:
    """Every name and parameter of the scenario validated (UserError naming the bad one);
    returns the models with their normalised parameters."""
    model_entries = [user.model(m) for m in sc.model]
    user.datasets_of(sc)
    for c in (*sc.compressor, *sc.layers.overrides.values()):
        catalog.compressor(c)
    for s in sc.scheme:
        if s["name"] != "auto":
            catalog.scheme(s)
            continue
        for comp in sc.compressor:  # auto: the parameters must suit what it resolves to
            resolved = spelling.resolve_auto(catalog.compressor(comp))
            try:
                catalog.scheme({**s, "name": resolved})
            except UserError as e:
                raise UserError(
                    f"scheme auto is {resolved} for compressor {comp['name']}, and {e}; "
                    f"name the scheme, e.g. `scheme: [{{name: reduce-broadcast, overlap: 4}}]`"
                ) from None
    return model_entries


def _points(sc: Scenario, model_entries: list[user.Model]) -> Iterator[_Point]:
    # Nested products (same order as one flat product): typed, where an 11-way one is not.
    places = list(itertools.product(sc.world_size, sc.nodes, sc.backend, sc.device))
    variants = list(itertools.product(sc.compressor, sc.scheme))
    draws = list(itertools.product(sc.seed, range(sc.repeats), sc.skew, sc.compute, sc.weights))
    data_entries = user.datasets_of(sc)
    models_ = zip(sc.model, model_entries, strict=True)
    axes = itertools.product(models_, data_entries, sc.network, places, variants, draws)
    for (written, (model, mparams, factory)), (dataset, data), net, place, variant, draw in axes:
        comp, scheme_spec = variant
        ws, nodes, backend, dev = place
        nodes = int(net.get("nodes", nodes))  # a cluster setting names its nodes
        seed, rep, skew, compute, weights = draw
        spec = catalog.compressor(comp)
        name = spelling.resolve_auto(spec) if scheme_spec["name"] == "auto" else scheme_spec["name"]
        scheme, params = spelling.canonical(name, _params(scheme_spec), spec.name)
        yield _Point(
            model, dict(written), mparams, factory, dataset, data, dict(net), ws, nodes, backend,
            dev, spec, scheme_spec, scheme, params, seed, rep, skew, compute,
            int(weights.get("bits", 0)),
        )  # fmt: skip


def _why_excluded(sc: Scenario, p: _Point) -> str | None:
    """The first reason the combination cannot run (``rules.why_not``), else why the
    scenario's include / exclude drop it, or None."""
    candidate = rules.Candidate(
        backend=p.backend, scheme=p.scheme, params=p.scheme_params, compressor=p.compressor,
        overrides=tuple(catalog.compressor(c) for c in sc.layers.overrides.values()),
        world_size=p.world_size, nodes=p.nodes, network=p.network, launcher=sc.launcher,
        device=p.device, gpus_per_node=sc.gpus_per_node, accuracy=bool(sc.epochs),
        momentum=user.optimizer(sc)[1], optimizer=user.optimizer(sc)[3].get("name", ""),
        telemetry=sc.telemetry, profile=sc.profile, compute=p.compute, dilation=sc.dilation,
        codec_time=sc.codec_time, weight_bits=p.weight_bits, model=p.model,
        model_params=p.model_params, factory=bool(p.workload), dataset=p.dataset, skew=p.skew,
    )  # fmt: skip
    kind = _device(p) or rules.natural_device(p.backend)
    return rules.why_not(candidate) or _filtered(_filter_values(p, kind), sc.include, sc.exclude)


def _device(p: _Point) -> str:
    """RunSpec.device: '' when it is the backend's own."""
    return rules.device_for(p.backend, p.device, rules.torch_ddp(p.scheme, p.compressor.name))[0]


def _filter_values(p: _Point, device: str) -> dict[str, tuple[Any, ...]]:
    """What include / exclude entries may match per axis: names, labels and full mappings."""
    c = p.compressor
    return {
        "model": (p.model, p.model_spec, {"name": p.model, **p.model_params}),
        "dataset": (p.dataset, *((p.data,) if p.data else ())),
        "world_size": (p.world_size,), "nodes": (p.nodes,), "backend": (p.backend,),
        "device": (p.device, device),
        "scheme": (p.scheme, p.scheme_spec["name"], dict(p.scheme_spec),
                   {"name": p.scheme, **p.scheme_params}),
        "compressor": (c.name, c.label, dict(c.given)),
        "network": (network.label(p.network), dict(p.network)), "seed": (p.seed,),
        "repeat": (p.repeat,), "skew": (p.skew,), "compute": (p.compute,),
    }  # fmt: skip


def _describe(p: _Point) -> str:
    where = f"w{p.world_size}{f' n{p.nodes}' if p.nodes > 1 else ''}"
    extras = (
        (f" repeat{p.repeat}" if p.repeat else "") + (f" skew{p.skew:g}" if p.skew else "")
        + (f" {p.compute}" if p.compute != "fp32" else "")
        + (f" w{p.weight_bits}bits" if p.weight_bits else "")
    )  # fmt: skip
    return (
        f"{p.model} {p.backend} {catalog.scheme_label(p.scheme, p.scheme_params)} "
        f"{p.compressor.label} {where} {network.label(p.network)} seed{p.seed}{extras}"
    )


def _run_spec(sc: Scenario, p: _Point) -> RunSpec:
    device = _device(p)
    lr, momentum, weight_decay, optimizer = user.optimizer(sc)
    return RunSpec(
        scenario=sc.name, model=p.model, dataset=p.dataset, world_size=p.world_size,
        backend=p.backend, scheme=p.scheme, compressor=dict(p.compressor.given),
        batch_size=sc.batch_for(p.world_size), warmup=sc.warmup, iterations=sc.iterations,
        lr=lr, momentum=momentum, seed=p.seed, timeout=sc.timeout,
        telemetry=sc.telemetry, layers=_layers_for(p.compressor.given, sc),
        scheme_params=p.scheme_params, network=p.network, model_params=p.model_params,
        repeat=p.repeat, nodes=p.nodes, price_per_hour=sc.price_per_hour, device=device,
        epochs=sc.epochs or 0, lr_schedule=dict(sc.lr_schedule),
        weight_decay=weight_decay, skew=p.skew, target_accuracy=sc.target_accuracy,
        compute=p.compute, norm=sc.norm, weight_bits=p.weight_bits, profile=sc.profile,
        steps_per_epoch=sc.steps_per_epoch or 0, workload=p.workload, data=p.data,
        optimizer=optimizer, loss=dict(sc.loss), nonfinite=sc.nonfinite,
        rounding=_rounding(sc, p), dilation=sc.dilation,
        timeline=str(Path(sc.timeline).resolve()) if sc.timeline else "",
        codec_time=str(Path(sc.codec_time).resolve()) if sc.codec_time else "",
    )  # fmt: skip


def _rounding(sc: Scenario, p: _Point) -> str:
    """The scenario's ``rounding`` where the run rounds stochastically, else the default (a
    run that draws nothing keeps the id it has without the key)."""
    rounds = p.compute in ROUNDED_COMPUTE or p.weight_bits
    return sc.rounding if rounds else "per-rank"


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


def _params(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "name"}


def _layers_for(comp: dict[str, Any], sc: Scenario) -> dict[str, Any]:
    if comp["name"] == "none" and not sc.layers.overrides:
        return {}
    return sc.layers.to_dict()


def resolve_scheme(scheme: str, comp: dict[str, Any]) -> str:
    """``auto`` resolved for ``comp`` (see ``catalog.spelling.resolve_auto``)."""
    return spelling.resolve_auto(catalog.compressor(comp)) if scheme == "auto" else scheme


incompatibility = rules.incompatibility
natural_device = rules.natural_device
