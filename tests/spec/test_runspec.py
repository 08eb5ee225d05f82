"""RunSpec, the one value of a run (issue 45 item 1): nested, typed, and the same flat record.

* Its parts hold no ``dict[str, Any]`` but a user's factory parameters (and the epoch schedule),
  and no plain ``str`` whose values form a closed set: those are ``Literal`` types, whose values
  are the tuples the scenario checks against.
* Every run of every shipped scenario writes the flat mapping records have always held and
  reads back equal; a record of schema 1 (no keys added later) still loads.
* The replay's clock is one value: dilation, the replayed timeline and codec time.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping

import pytest

from qbench.spec import parts, scenario
from qbench.spec.runspec import RunSpec
from tests import shipped_results

PARTS = (parts.Workload, parts.Method, parts.Placement, parts.Compute, parts.Measurement,
         parts.Replay, parts.LrSchedule)  # fmt: skip
FACTORY_FIELDS = {"model_params", "factory", "data", "optimizer", "loss"}
"""The mappings left: a user factory's own parameters (and a zoo model's)."""
OPEN_STRINGS = {"model", "dataset", "timeline", "codec_time"}
"""Strings whose values are open: a zoo model or a factory's label, a dataset, paths."""
FLAT_KEYS = [
    "scenario", "model", "dataset", "world_size", "backend", "scheme", "compressor", "batch_size",
    "warmup", "iterations", "lr", "momentum", "seed", "timeout", "telemetry", "layers",
    "scheme_params", "network", "model_params", "repeat", "nodes", "device", "price_per_hour",
    "epochs", "lr_schedule", "weight_decay", "skew", "target_accuracy", "compute", "norm",
    "weight_bits", "rounding", "steps_per_epoch", "profile", "workload", "data", "optimizer",
    "loss", "nonfinite", "dilation", "timeline", "codec_time",
]  # fmt: skip
"""run.json's ``spec`` keys, in the order every record since schema 1 has them."""


def _fields() -> list[tuple[str, str, object]]:
    return [(cls.__name__, name, hint) for cls in PARTS
            for name, hint in typing.get_type_hints(cls).items()]  # fmt: skip


def test_no_part_holds_a_loose_dict_but_a_factorys_parameters() -> None:
    loose = [f"{c}.{n}" for c, n, hint in _fields()
             if typing.get_origin(hint) in (dict, Mapping) or hint is parts.Factory]  # fmt: skip
    assert sorted(loose) == sorted(f"Workload.{n}" for n in FACTORY_FIELDS)


def test_closed_sets_are_literals_and_the_scenario_checks_against_them() -> None:
    plain = [f"{c}.{n}" for c, n, hint in _fields() if hint is str and n not in OPEN_STRINGS]
    assert plain == []
    assert scenario.BACKENDS == parts.BACKENDS and scenario.NORMS == parts.NORMS
    assert scenario.NONFINITE == parts.NONFINITE and scenario.ROUNDING == parts.ROUNDINGS
    assert (*parts.PRECISIONS, parts.REPLAY) == scenario.COMPUTE


def _shipped_runs() -> list[RunSpec]:
    return [r for path in (*shipped_results.SHIPPED, shipped_results.DEFAULT)
            for r in shipped_results.runs(path)]  # fmt: skip


def test_every_shipped_run_writes_the_flat_record_and_reads_back_equal() -> None:
    runs = _shipped_runs()
    assert len(runs) > 500
    for run in runs:
        flat = json.loads(json.dumps(run.to_dict()))  # as spec.json holds it
        assert list(flat) == FLAT_KEYS
        back = RunSpec.from_dict(flat)
        assert back == run and back.run_id == run.run_id and back.labels() == run.labels()


def test_a_schema_1_record_loads_with_the_later_keys_defaults() -> None:
    old = {"scenario": "s", "model": "mlp", "dataset": "synthetic", "world_size": 2,
           "backend": "gloo", "scheme": "reduce-broadcast", "compressor": {"name": "qsgd"},
           "batch_size": 8, "warmup": 1, "iterations": 3, "lr": 0.1, "momentum": 0.9,
           "seed": 0, "timeout": 60}  # fmt: skip
    spec = RunSpec.from_dict(old)
    assert spec.method.compressor.name == "qsgd" and spec.method.layers is None
    assert spec.compute.name == "fp32" and spec.compute.replay is None
    assert spec.placement.network.written() == {} and not spec.link.shaped
    assert {k: v for k, v in spec.to_dict().items() if k in old} == old


def test_unknown_keys_and_a_clock_without_replay_are_refused() -> None:
    (run,) = shipped_results.runs(shipped_results.DEFAULT)[:1]
    with pytest.raises(TypeError, match=r"unknown run spec keys: colour, size$"):
        RunSpec.from_dict({**run.to_dict(), "size": 2, "colour": "red"})
    with pytest.raises(ValueError, match="need compute replay"):
        RunSpec.from_dict({**run.to_dict(), "dilation": 4.0})


def test_the_replay_owns_the_clock() -> None:
    run = shipped_results.runs(shipped_results.DEFAULT)[0]
    assert run.clock == parts.Replay() and run.shaped_topology == run.placement.topology
    slow = run.replaced(compute="replay", dilation=4.0, network={"bandwidth": "1gbit"})
    assert slow.compute.replay is slow.clock and slow.clock.dilation == 4.0
    assert slow.shaped_topology.inter.bits_per_s == 1e9 / 4  # shaped at rate / D
    assert slow.clock.stretched(0.5) == 2.0 and slow.clock.undone(2.0) == 0.5
    assert slow.labels()["dilation"] == 4.0 and slow.run_id.endswith(slow.run_id[-10:])
    assert dataclasses.replace(slow.clock, dilation=1.0) == parts.Replay()


EVERY_KEY_SET = {
    "scenario": "s", "model": "mlp", "dataset": "synthetic", "world_size": 4, "backend": "mpi",
    "scheme": "reduce-broadcast", "compressor": {"name": "qsgd", "bits": 4}, "batch_size": 16,
    "warmup": 2, "iterations": 5, "lr": 0.05, "momentum": 0.5, "seed": 3, "timeout": 90.0,
    "telemetry": True,
    "layers": {"full_precision_below": 0, "quantized_fraction": 0.5, "overrides": {}},
    "scheme_params": {"overlap": 2}, "network": {"nodes": 2, "inter": "1gbit"},
    "model_params": {"width": 8}, "repeat": 2, "nodes": 2, "device": "cpu",
    "price_per_hour": 3.5, "epochs": 4, "lr_schedule": {"every": 2, "gamma": 0.5},
    "weight_decay": 0.01, "skew": 0.25, "target_accuracy": 0.9, "compute": "replay",
    "norm": "range-evonorm", "weight_bits": 8, "rounding": "shared", "steps_per_epoch": 7,
    "profile": True, "workload": {"factory": "pkg.models:make"}, "data": {"factory": "pkg:d"},
    "optimizer": {"name": "adam", "betas": (0.9, 0.99)}, "loss": {"name": "mse"},
    "nonfinite": "skip", "dilation": 4.0, "timeline": "/runs/timeline.json", "codec_time": "",
}  # fmt: skip
"""A record whose every key holds something other than its default, so that a key the spec
dropped or took from the wrong place shows."""


def test_a_record_with_every_key_set_reads_back_whole() -> None:
    spec = RunSpec.from_dict(EVERY_KEY_SET)
    assert spec.to_dict() == EVERY_KEY_SET and list(spec.to_dict()) == FLAT_KEYS
    assert spec.replaced() == spec and spec.replaced(seed=4).measurement.seed == 4
    assert spec.compute.replay == parts.Replay(timeline="/runs/timeline.json", dilation=4.0)
    timed = {**EVERY_KEY_SET, "codec_time": "/gpu/kernels.json"}  # labels() would read it
    assert RunSpec.from_dict(timed).to_dict() == timed
    copy = spec.to_dict()
    copy["optimizer"]["betas"], copy["compressor"]["bits"] = (0.1, 0.2), 8  # the spec's own
    assert spec.to_dict() == EVERY_KEY_SET


def test_the_labels_a_run_stores() -> None:
    from qbench.catalog.schemes import spelling

    assert RunSpec.from_dict(EVERY_KEY_SET).labels() == {
        "model": "mlp", "dataset": "synthetic", "backend": "mpi", "device": "cpu",
        "scheme": "reduce-broadcast+overlap2", "mode": "overlap",
        "overlap": spelling.overlap("reduce-broadcast", {"overlap": 2}),
        "compressor": "qsgd-4b-b512", "compressor_name": "qsgd", "bits": 4, "world_size": 4,
        "batch_size": 16, "global_batch": 64, "simulated": False, "network": "2nodes-1gbit",
        "model_params": {"width": 8}, "seed": 3, "repeat": 2, "nodes": 2,
        "price_per_hour": 3.5, "epochs": 4, "skew": 0.25, "target_accuracy": 0.9,
        "compute": "replay", "dilation": 4.0, "norm": "range-evonorm", "weight_bits": 8,
        "rounding": "shared", "optimizer": "adam", "loss": "mse",
    }  # fmt: skip
    plain = RunSpec.from_dict({**EVERY_KEY_SET, "optimizer": {}, "loss": {}, "momentum": 0.0,
                               "rounding": "per-rank", "dilation": 1.0,
                               "scheme": "simulated-lowprec", "scheme_params": {}})  # fmt: skip
    labels = plain.labels()
    assert (labels["optimizer"], labels["loss"], labels["mode"]) == ("sgd", "cross-entropy",
                                                                     "breakdown")  # fmt: skip
    assert "rounding" not in labels and "dilation" not in labels and labels["simulated"]
    assert plain.replaced(scheme="ddp").labels()["overlap"] == "backward"  # DDP's buckets
    momentum = plain.replaced(momentum=0.9, loss={"factory": "pkg:loss"}).labels()
    assert (momentum["optimizer"], momentum["loss"]) == ("momentum", "pkg:loss")


@pytest.mark.parametrize(
    ("written", "rates"),
    [
        ({}, [1.0, 1.0, 1.0, 1.0]),  # constant
        ({"milestones": [1, 3]}, [1.0, 0.1, 0.1, 0.01]),  # gamma 0.1 unless given
        ({"milestones": [2], "gamma": 0.5}, [1.0, 1.0, 0.5, 0.5]),  # from the milestone on
        ({"every": 2}, [1.0, 1.0, 0.1, 0.1]),
        ({"every": 1, "gamma": 0.5}, [1.0, 0.5, 0.25, 0.125]),
        ({"gamma": 0.5}, [1.0, 1.0, 1.0, 1.0]),  # a factor without steps: constant
    ],
)
def test_lr_schedule_rates_by_hand(written: dict, rates: list[float]) -> None:
    schedule = parts.LrSchedule.of(written)
    assert [schedule.lr(1.0, epoch) for epoch in range(4)] == pytest.approx(rates)
    assert schedule.lr(2.0, 3) == pytest.approx(2 * rates[3])  # times the base rate
    assert schedule.written() == written  # what the run id hashes: the keys as written


def test_lr_schedule_keeps_what_the_scenario_wrote() -> None:
    got = parts.LrSchedule.of({"gamma": 1, "milestones": [30, 45]})
    assert got == parts.LrSchedule(milestones=(30, 45), gamma=1)
    assert got.written() == {"milestones": [30, 45], "gamma": 1}  # a list, as JSON holds it
    assert json.dumps(got.written(), sort_keys=True) == '{"gamma": 1, "milestones": [30, 45]}'
    assert parts.LrSchedule.of({"every": 30}) == parts.LrSchedule(every=30)
