"""The one value of a run: :class:`RunSpec`, nested and typed (``qbench.spec.parts``), built by
the matrix, sent to the worker, and read back from any stored run.json.

``spec.json`` and run.json's ``spec`` keep the flat mapping every record has held since schema
1 (:meth:`RunSpec.to_dict`, :meth:`RunSpec.from_dict`: the only place a run's settings are a
dict); the run id hashes that mapping, so ids are those of earlier results (tests/run_ids.txt
pins the shipped scenarios').
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from qbench import catalog
from qbench.catalog.schemes import spelling
from qbench.spec import codec_times
from qbench.spec import network as net
from qbench.spec.layers import LayerPolicy
from qbench.spec.loop import LoopChoice, loop_for
from qbench.spec.parts import (
    REPLAY,
    Compute,
    LrSchedule,
    Measurement,
    Method,
    Placement,
    Replay,
    Workload,
)  # fmt: skip

# Fields added after results existed: left out of the hash while they hold their default.
_OPTIONAL_ID_FIELDS: dict[str, Any] = {
    "model_params": {}, "repeat": 0, "nodes": 1, "device": "", "epochs": 0, "lr_schedule": {},
    "weight_decay": 0.0, "skew": 0.0, "compute": "fp32", "norm": "batchnorm", "weight_bits": 0,
    "steps_per_epoch": 0, "profile": False, "workload": {}, "data": {}, "optimizer": {},
    "loss": {}, "nonfinite": "fail", "rounding": "per-rank", "dilation": 1.0, "timeline": "",
    "codec_time": "",
}  # fmt: skip
_NOT_HASHED = ("timeout", "scenario", "price_per_hour", "target_accuracy")
"""They change nothing measured."""


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Everything a worker needs to run one configuration. Its hash is the run id."""

    scenario: str
    workload: Workload
    method: Method
    placement: Placement
    compute: Compute
    measurement: Measurement

    @property
    def run_id(self) -> str:
        """Readable slug + hash of the flat mapping (see ``_NOT_HASHED``)."""
        d = self.to_dict()
        for key in _NOT_HASHED:
            d.pop(key)
        for key, default in _OPTIONAL_ID_FIELDS.items():  # ids of earlier results stay valid
            if d[key] == default:
                d.pop(key)
        digest = hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
        p, m = self.placement, self.measurement
        parts = (self.workload.model, p.backend, self.method.scheme_label, self.compressor_label)
        nodes = f"n{p.nodes}" if p.nodes > 1 else ""
        rep = f"-r{m.repeat}" if m.repeat else ""
        replayed = f"-{REPLAY}" if self.compute.replay else ""  # seen in every progress line
        return f"{'-'.join(parts)}-w{p.world_size}{nodes}{rep}{replayed}-{digest}"

    @property
    def compressor_label(self) -> str:
        return self.method.compressor.label

    @property
    def loop(self) -> LoopChoice:
        """The training loop that runs it (``qbench.spec.loop``: the one place it is chosen)."""
        return loop_for(self.method.scheme.name, self.method.scheme_params, self.compute.name)

    @property
    def clock(self) -> Replay:
        """The run's clock: its replay, or for measured compute the real clock (no dilation,
        no replayed codec time)."""
        return self.compute.replay or Replay()

    @cached_property
    def link(self) -> net.Link:
        """The link, its rate parsed once per spec."""
        return self.placement.network.link

    @property
    def shaped_topology(self) -> net.Topology:
        """The links as shaped: the topology's rates divided by a replay's dilation."""
        topo = self.placement.topology
        return self.compute.replay.shaped(topo) if self.compute.replay else topo

    def labels(self) -> dict[str, Any]:
        """Flat columns reports group by (stored in run.json); the driver adds the model's
        size and FLOPs (``numel``, ``gflops_per_sample``: qbench.models, which needs torch)."""
        w, m, p, c = self.workload, self.method, self.placement, self.compute
        meas = self.measurement
        comp, params, replay = m.compressor, m.scheme_params, c.replay
        return {
            "model": w.model, "dataset": w.dataset, "backend": p.backend,
            "device": p.device_kind, "scheme": m.scheme_label,
            "mode": "overlap" if params.get("overlap", 1) > 1 else "breakdown",
            # communication during backward (DDP buckets) or after it (one flat gradient)
            "overlap": spelling.overlap(m.scheme.name, params),
            "compressor": comp.label, "compressor_name": comp.name, "bits": comp.nominal_bits,
            "world_size": p.world_size, "batch_size": w.batch_size,
            "global_batch": w.batch_size * p.world_size,
            # seed 002 section 4.4: NCCL "simulated" low precision sends the bytes but does not
            # reduce the gradients; every table and figure must say so.
            "simulated": not m.scheme.entry.reduces,
            "network": self.link.label, "model_params": dict(w.model_params),
            "seed": meas.seed, "repeat": meas.repeat, "nodes": p.nodes,
            "price_per_hour": p.price_per_hour, "epochs": meas.epochs, "skew": w.skew,
            "target_accuracy": w.target_accuracy, "compute": c.name,
            **({"dilation": replay.dilation} if replay and replay.dilation != 1 else {}),
            # the device whose codec times the run replayed (qbench.run.replay.codec)
            **(
                {"codec_time": codec_times.read_once(replay.codec_time).device}
                if replay and replay.codec_time
                else {}
            ),
            "norm": c.norm, "weight_bits": c.weight_bits,
            **({"rounding": c.rounding} if c.rounding != "per-rank" else {}),
            "optimizer": w.optimizer.get("name", "sgd" if w.momentum == 0 else "momentum"),
            "loss": w.loss.get("name", w.loss.get("factory", "cross-entropy")),
        }  # fmt: skip

    def replaced(self, **settings: Any) -> RunSpec:
        """This spec with some settings changed, named as run.json names them
        (``replaced(compute="replay", dilation=2.0)``)."""
        return RunSpec.from_dict({**self.to_dict(), **settings})

    def to_dict(self) -> dict[str, Any]:
        """The flat mapping of spec.json and run.json (keys in the order records have)."""
        w, m, p, c = self.workload, self.method, self.placement, self.compute
        meas = self.measurement
        replay = c.replay or Replay()
        return copy.deepcopy({
            "scenario": self.scenario, "model": w.model, "dataset": w.dataset,
            "world_size": p.world_size, "backend": p.backend, "scheme": m.scheme.name,
            "compressor": m.compressor.given, "batch_size": w.batch_size,
            "warmup": meas.warmup, "iterations": meas.iterations, "lr": w.lr,
            "momentum": w.momentum, "seed": meas.seed, "timeout": meas.timeout,
            "telemetry": meas.telemetry, "layers": m.layers.to_dict() if m.layers else {},
            "scheme_params": m.scheme_params, "network": p.network.written(),
            "model_params": w.model_params, "repeat": meas.repeat, "nodes": p.nodes,
            "device": p.device, "price_per_hour": p.price_per_hour, "epochs": meas.epochs,
            "lr_schedule": w.lr_schedule.written(), "weight_decay": w.weight_decay, "skew": w.skew,
            "target_accuracy": w.target_accuracy, "compute": c.name, "norm": c.norm,
            "weight_bits": c.weight_bits, "rounding": c.rounding,
            "steps_per_epoch": meas.steps_per_epoch, "profile": meas.profile,
            "workload": w.factory, "data": w.data, "optimizer": w.optimizer, "loss": w.loss,
            "nonfinite": meas.nonfinite, "dilation": replay.dilation,
            "timeline": replay.timeline, "codec_time": replay.codec_time,
        })  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSpec:
        """A spec.json or a record's ``spec`` of any schema (keys added later take their
        defaults); UserError for a compressor or scheme this qbench does not know."""
        unknown = set(d) - set(_KEYS)
        if unknown:
            raise TypeError(f"unknown run spec keys: {', '.join(sorted(unknown))}")
        g = {**_DEFAULTS, **d}.__getitem__
        replay = Replay(timeline=g("timeline"), codec_time=g("codec_time"), dilation=g("dilation"))
        if g("compute") != REPLAY and replay != Replay():
            raise ValueError(f"timeline, codec_time and dilation need compute {REPLAY}: {replay}")
        layers = g("layers")
        return cls(
            scenario=g("scenario"),
            workload=Workload(
                model=g("model"), dataset=g("dataset"), batch_size=g("batch_size"), lr=g("lr"),
                momentum=g("momentum"), weight_decay=g("weight_decay"),
                model_params=g("model_params"), factory=g("workload"), data=g("data"),
                optimizer=g("optimizer"), loss=g("loss"),
                lr_schedule=LrSchedule.of(g("lr_schedule")), skew=g("skew"),
                target_accuracy=g("target_accuracy"),
            ),
            method=Method(
                scheme=catalog.scheme({"name": g("scheme"), **g("scheme_params")}),
                compressor=catalog.compressor(g("compressor")),
                layers=LayerPolicy(**layers) if layers else None,
            ),
            placement=Placement(
                backend=g("backend"), world_size=g("world_size"), device=g("device"),
                nodes=g("nodes"), network=net.Network.of(g("network")),
                price_per_hour=g("price_per_hour"),
            ),
            compute=Compute(
                precision="fp32" if g("compute") == REPLAY else g("compute"),
                replay=replay if g("compute") == REPLAY else None, norm=g("norm"),
                weight_bits=g("weight_bits"), rounding=g("rounding"),
            ),
            measurement=Measurement(
                warmup=g("warmup"), iterations=g("iterations"), seed=g("seed"),
                timeout=g("timeout"), epochs=g("epochs"), steps_per_epoch=g("steps_per_epoch"),
                repeat=g("repeat"), telemetry=g("telemetry"), profile=g("profile"),
                nonfinite=g("nonfinite"),
            ),
        )  # fmt: skip


_REQUIRED = (
    "scenario", "model", "dataset", "world_size", "backend", "scheme", "compressor",
    "batch_size", "warmup", "iterations", "lr", "momentum", "seed", "timeout",
)  # fmt: skip
_DEFAULTS: dict[str, Any] = {
    **_OPTIONAL_ID_FIELDS, "telemetry": False, "layers": {}, "scheme_params": {},
    "network": {}, "price_per_hour": None, "target_accuracy": None,
}  # fmt: skip
_KEYS = (*_REQUIRED, *_DEFAULTS)
