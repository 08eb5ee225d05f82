"""Scenario -> run matrix: a list of RunSpec (``qbench.spec.runspec``, stable ids) plus the
excluded combinations.

Pure: no processes, no files. Combinations that cannot work are never dropped silently; they are
returned as :class:`Excluded` with the reason.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from qbench import catalog
from qbench.catalog.schemes import spelling
from qbench.errors import UserError
from qbench.spec import checks, network, parts, rules
from qbench.spec import workload as user
from qbench.spec.layers import LayerPolicy
from qbench.spec.runspec import RunSpec
from qbench.spec.scenario import REPLAY, ROUNDED_COMPUTE, Scenario


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


@dataclass(frozen=True)
class _Parsed:
    """The scenario's entries, validated once: what its points are made of."""

    models: list[user.Model]
    """Each model with its normalised parameters."""
    compressors: list[catalog.CompressorSpec]
    """The compressor axis, in order."""
    overrides: tuple[catalog.CompressorSpec, ...]
    """The layer policy's per-layer compressors."""


def expand(sc: Scenario) -> Matrix:
    """Cross-product of the scenario's axes; validates names and parameters first."""
    parsed = _check(sc)
    runs: list[RunSpec] = []
    excluded: list[Excluded] = []
    seen: set[str] = set()
    for point in _points(sc, parsed):
        why = _why_excluded(sc, point, parsed.overrides)
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
    runs.sort(key=lambda r: r.measurement.repeat)  # stable: matrix order within a repeat
    if sc.cover:
        runs, dropped = cover(runs)
        excluded += [Excluded(r.run_id, "cover: its every axis value runs in another run")
                     for r in dropped]  # fmt: skip
    return Matrix(runs, excluded)


def axis_values(r: RunSpec) -> set[tuple[str, Any]]:
    """(axis, value) pairs of a run, for ``cover``: each axis, and scheme with compressor."""
    w, p, c = r.workload, r.placement, r.compute
    scheme, comp = r.method.scheme_label, r.compressor_label
    return {
        ("model", w.model), ("dataset", w.dataset), ("backend", p.backend),
        ("world_size", p.world_size), ("nodes", p.nodes), ("device", p.device),
        ("network", p.network.label), ("compute", c.name), ("skew", w.skew),
        ("weight_bits", c.weight_bits), ("scheme", scheme), ("compressor", comp),
        ("method", (scheme, comp)),
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


def _check(sc: Scenario) -> _Parsed:
    """Every name and parameter of the scenario validated (UserError naming the bad one), and
    the entries the points are made of."""
    model_entries = [user.model(m) for m in sc.model]
    user.datasets_of(sc)
    compressors = [catalog.compressor(c) for c in sc.compressor]
    overrides = tuple(catalog.compressor(c) for c in sc.layers.overrides.values())
    for s in sc.scheme:
        if s["name"] != "auto":
            catalog.scheme(s)
            continue
        for comp in compressors:  # auto: the parameters must suit what it resolves to
            resolved = spelling.resolve_auto(comp)
            try:
                catalog.scheme({**s, "name": resolved})
            except UserError as e:
                raise UserError(
                    f"scheme auto is {resolved} for compressor {comp.name}, and {e}; "
                    f"name the scheme, e.g. `scheme: [{{name: reduce-broadcast, overlap: 4}}]`"
                ) from None
    return _Parsed(model_entries, compressors, overrides)


def _points(sc: Scenario, parsed: _Parsed) -> Iterator[_Point]:
    # Nested products (same order as one flat product): typed, where an 11-way one is not.
    places = list(itertools.product(sc.world_size, sc.nodes, sc.backend, sc.device))
    variants = list(itertools.product(parsed.compressors, sc.scheme))
    draws = list(itertools.product(sc.seed, range(sc.repeats), sc.skew, sc.compute, sc.weights))
    data_entries = user.datasets_of(sc)
    models_ = zip(sc.model, parsed.models, strict=True)
    axes = itertools.product(models_, data_entries, sc.network, places, variants, draws)
    for (written, (model, mparams, factory)), (dataset, data), net, place, variant, draw in axes:
        spec, scheme_spec = variant
        ws, nodes, backend, dev = place
        nodes = int(net.get("nodes", nodes))  # a cluster setting names its nodes
        seed, rep, skew, compute, weights = draw
        name = spelling.resolve_auto(spec) if scheme_spec["name"] == "auto" else scheme_spec["name"]
        scheme, params = spelling.canonical(name, _params(scheme_spec), spec.name)
        yield _Point(
            model, dict(written), mparams, factory, dataset, data, dict(net), ws, nodes, backend,
            dev, spec, scheme_spec, scheme, params, seed, rep, skew, compute,
            int(weights.get("bits", 0)),
        )  # fmt: skip


def _why_excluded(
    sc: Scenario, p: _Point, overrides: tuple[catalog.CompressorSpec, ...]
) -> str | None:
    """The first reason the combination cannot run (``rules.why_not``), else why the
    scenario's include / exclude drop it, or None."""
    candidate = rules.Candidate(
        backend=p.backend, scheme=p.scheme, params=p.scheme_params, compressor=p.compressor,
        overrides=overrides,
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
    lr, momentum, weight_decay, optimizer = user.optimizer(sc)
    replay = parts.Replay(
        timeline=str(Path(sc.timeline).resolve()) if sc.timeline else "",
        codec_time=str(Path(sc.codec_time).resolve()) if sc.codec_time else "",
        dilation=sc.dilation,
    )
    layers = _layers_for(p.compressor.given, sc)
    return RunSpec(
        scenario=sc.name,
        workload=parts.Workload(
            model=p.model, dataset=p.dataset, batch_size=sc.batch_for(p.world_size), lr=lr,
            momentum=momentum, weight_decay=weight_decay, model_params=p.model_params,
            factory=p.workload, data=p.data, optimizer=optimizer, loss=dict(sc.loss),
            lr_schedule=parts.LrSchedule.of(sc.lr_schedule), skew=p.skew,
            target_accuracy=sc.target_accuracy,
        ),
        method=parts.Method(
            scheme=catalog.scheme({"name": p.scheme, **p.scheme_params}),
            compressor=p.compressor, layers=LayerPolicy(**layers) if layers else None,
        ),
        # the scenario checked each closed set (spec.scenario): the casts name their types
        placement=parts.Placement(
            backend=cast(parts.Backend, p.backend), world_size=p.world_size,
            device=cast(parts.Device, _device(p)), nodes=p.nodes,
            network=network.Network.of(p.network), price_per_hour=sc.price_per_hour,
        ),
        compute=parts.Compute(
            precision=cast(parts.Precision, "fp32" if p.compute == REPLAY else p.compute),
            replay=replay if p.compute == REPLAY else None, norm=cast(parts.Norm, sc.norm),
            weight_bits=p.weight_bits, rounding=cast(parts.Rounding, _rounding(sc, p)),
        ),
        measurement=parts.Measurement(
            warmup=sc.warmup, iterations=sc.iterations, seed=p.seed, timeout=sc.timeout,
            epochs=sc.epochs or 0, steps_per_epoch=sc.steps_per_epoch or 0, repeat=p.repeat,
            telemetry=sc.telemetry, profile=sc.profile,
            nonfinite=cast(parts.Nonfinite, sc.nonfinite),
        ),
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


incompatibility = rules.incompatibility
natural_device = rules.natural_device
