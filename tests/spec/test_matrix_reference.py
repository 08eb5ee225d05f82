"""Matrix expansion against expectations written out by hand from the scenario (issue 24).

Every expected RunSpec field, label, run id, description and reason below is read off the
scenario text and the rules in docs/scenarios.md, never computed by qbench.spec.matrix: the run
id's digest is recomputed here with hashlib from a dict written out in the test.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from qbench.errors import UserError
from qbench.spec import checks, matrix, scenario

# Every key a scenario may set to something other than its default, in iteration mode.
FULL = """
name: ref
model: mlp
world_size: 4
nodes: 2
backend: mpi
device: cpu
scheme: [{name: reduce-broadcast, overlap: 4}]
compressor: [{name: qsgd, bits: 4}]
network: {bandwidth: 1gbit}
batch_size: {4: 16}
warmup: 2
iterations: 7
lr: 0.1
momentum: 0.5
weight_decay: 0.001
seed: 3
repeats: 2
skew: 0.5
compute: bf16
norm: range-evonorm
weights: {bits: 8}
rounding: shared
price_per_hour: 2.5
timeout: 77
telemetry: true
nonfinite: skip
"""

# FULL's first run, field by field (layers: the default policy, written out because the run is
# compressed; device "": cpu is mpi's own device).
FULL_RUN: dict[str, Any] = {
    "scenario": "ref", "model": "mlp", "dataset": "synthetic", "world_size": 4,
    "backend": "mpi", "scheme": "reduce-broadcast", "compressor": {"name": "qsgd", "bits": 4},
    "batch_size": 16, "warmup": 2, "iterations": 7, "lr": 0.1, "momentum": 0.5, "seed": 3,
    "timeout": 77.0, "telemetry": True,
    "layers": {"full_precision_below": "auto", "quantized_fraction": 0.99, "overrides": {}},
    "scheme_params": {"overlap": 4}, "network": {"bandwidth": "1gbit"}, "model_params": {},
    "repeat": 0, "nodes": 2, "device": "", "price_per_hour": 2.5, "epochs": 0,
    "lr_schedule": {}, "weight_decay": 0.001, "skew": 0.5, "target_accuracy": None,
    "compute": "bf16", "norm": "range-evonorm", "weight_bits": 8, "rounding": "shared",
    "steps_per_epoch": 0, "profile": False, "workload": {}, "data": {}, "optimizer": {},
    "loss": {},
    "nonfinite": "skip", "dilation": 1.0, "timeline": "", "codec_time": "",
}  # fmt: skip


def expand(text: str) -> matrix.Matrix:
    return matrix.expand(scenario.loads(text, "t.yaml"))


def sha10(d: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def test_every_scenario_key_reaches_its_run_spec_field() -> None:
    m = expand(FULL)
    assert m.excluded == []
    assert [r.to_dict() for r in m.runs] == [FULL_RUN, {**FULL_RUN, "repeat": 1}]


def test_labels_written_out() -> None:
    run = expand(FULL).runs[0]
    assert run.labels() == {
        "model": "mlp", "dataset": "synthetic", "backend": "mpi", "device": "cpu",
        "scheme": "reduce-broadcast+overlap4", "mode": "overlap", "overlap": "none",
        "compressor": "qsgd-4b-b512", "compressor_name": "qsgd", "bits": 4.0, "world_size": 4,
        "batch_size": 16, "global_batch": 64, "simulated": False, "network": "1gbit",
        "model_params": {}, "seed": 3, "repeat": 0, "nodes": 2, "price_per_hour": 2.5,
        "epochs": 0, "skew": 0.5, "target_accuracy": None, "compute": "bf16",
        "norm": "range-evonorm", "weight_bits": 8, "rounding": "shared",
        "optimizer": "momentum", "loss": "cross-entropy",
    }  # fmt: skip


def test_run_id_is_slug_and_digest_of_what_changes_the_run() -> None:
    runs = expand(FULL).runs
    # hashed: every field but timeout, scenario, price and target accuracy, less the fields
    # added after results existed that hold their defaults (so old ids stay valid)
    hashed = {
        "model": "mlp", "dataset": "synthetic", "world_size": 4, "backend": "mpi",
        "scheme": "reduce-broadcast", "compressor": {"name": "qsgd", "bits": 4},
        "batch_size": 16, "warmup": 2, "iterations": 7, "lr": 0.1, "momentum": 0.5, "seed": 3,
        "telemetry": True, "layers": FULL_RUN["layers"], "scheme_params": {"overlap": 4},
        "network": {"bandwidth": "1gbit"}, "nodes": 2, "weight_decay": 0.001, "skew": 0.5,
        "compute": "bf16", "norm": "range-evonorm", "weight_bits": 8, "rounding": "shared",
        "nonfinite": "skip",
    }  # fmt: skip
    slug = "mlp-mpi-reduce-broadcast+overlap4-qsgd-4b-b512-w4n2"
    assert runs[0].run_id == f"{slug}-{sha10(hashed)}"
    assert runs[1].run_id == f"{slug}-r1-{sha10({**hashed, 'repeat': 1})}"


def test_run_id_of_a_default_run_hashes_the_original_fields_only() -> None:
    run = expand("name: s\nmodel: mlp\nworld_size: 2\n").runs[0]
    hashed = {
        "model": "mlp", "dataset": "synthetic", "world_size": 2, "backend": "gloo",
        "scheme": "allreduce", "compressor": {"name": "none"}, "batch_size": 32, "warmup": 5,
        "iterations": 20, "lr": 0.05, "momentum": 0.9, "seed": 0, "telemetry": False,
        "layers": {}, "scheme_params": {}, "network": {},
    }  # fmt: skip
    assert run.run_id == f"mlp-gloo-allreduce-fp32-w2-{sha10(hashed)}"


@pytest.mark.parametrize(
    ("field", "value"),
    [("timeout", 1.0), ("scenario", "other"), ("price_per_hour", 9.0),
     ("target_accuracy", 0.5)],
)  # fmt: skip
def test_run_id_ignores_what_changes_nothing_measured(field: str, value: Any) -> None:
    run = expand(FULL).runs[0]
    changed = matrix.RunSpec.from_dict({**run.to_dict(), field: value})
    assert changed.run_id == run.run_id


@pytest.mark.parametrize(
    ("field", "value"),
    [("model_params", {"params": "1M"}), ("device", "cpu"), ("epochs", 3),
     ("lr_schedule", {"every": 2}), ("steps_per_epoch", 5), ("profile", True),
     ("workload", {"factory": "m:f"}), ("data", {"factory": "m:d"}),
     ("optimizer", {"name": "adam"}), ("loss", {"name": "mse"}), ("weight_decay", 0.5),
     ("skew", 0.25), ("compute", "fp16"), ("norm", "batchnorm"), ("weight_bits", 6),
     ("nodes", 1), ("repeat", 1), ("rounding", "per-rank"),
     ("nonfinite", "fail"), ("dilation", 10.0), ("timeline", "/gpu/timeline.json"),
     ("codec_time", "/gpu/kernels.json")],
)  # fmt: skip
def test_run_id_changes_with_every_field_added_later(field: str, value: Any) -> None:
    run = expand(FULL).runs[0]
    if field in ("dilation", "timeline", "codec_time"):  # a replayed run's clock
        run = run.replaced(compute="replay")
    changed = matrix.RunSpec.from_dict({**run.to_dict(), field: value})
    assert changed.run_id != run.run_id
    assert matrix.RunSpec.from_dict(run.to_dict()) == run


def test_shared_rounding_reaches_only_the_runs_that_round_stochastically() -> None:
    """fp32 runs draw nothing: they keep the id and labels they have without the key; the
    int8 run records ``rounding: shared`` in its spec, its hash and its labels."""
    text = "name: s\nmodel: mlp\nworld_size: 2\ncompute: [fp32, int8]\n"
    plain, shared = expand(text).runs, expand(text + "rounding: shared\n").runs
    assert [r.compute.rounding for r in shared] == ["per-rank", "shared"]
    assert shared[0].run_id == plain[0].run_id and "rounding" not in shared[0].labels()
    assert shared[1].run_id != plain[1].run_id and shared[1].labels()["rounding"] == "shared"
    assert "rounding" not in plain[1].labels()


@pytest.mark.parametrize(
    ("extra", "want"),
    [
        # no overlap parameter, or overlap 1: the breakdown mode; DDP overlaps with backward
        ("scheme: reduce-broadcast\ncompressor: {name: qsgd, bits: 4}\n",
         {"mode": "breakdown", "overlap": "none", "scheme": "reduce-broadcast"}),
        ("scheme: {name: reduce-broadcast, overlap: 1}\ncompressor: {name: qsgd, bits: 4}\n",
         {"mode": "breakdown", "scheme": "reduce-broadcast+overlap1"}),
        ("scheme: ddp\n", {"mode": "breakdown", "overlap": "backward", "scheme": "ddp"}),
        ("scheme: simulated-lowprec\ncompressor: {name: qsgd, bits: 8}\n",
         {"simulated": True, "scheme": "simulated-lowprec"}),
        ("momentum: 0\n", {"optimizer": "sgd"}),
        ("optimizer: adam\n", {"optimizer": "adam"}),
        ("loss: mse\n", {"loss": "mse"}),
        ("loss: {factory: 'mypkg.losses:focal'}\n", {"loss": "mypkg.losses:focal"}),
        ("compressor: onebit\n", {"compressor": "1bit-b64", "compressor_name": "onebit",
                                  "bits": 1.0, "scheme": "reduce-broadcast"}),
    ],
)  # fmt: skip
def test_labels_per_scheme_optimizer_and_loss(extra: str, want: dict[str, Any]) -> None:
    labels = expand(f"name: s\nmodel: mlp\nworld_size: 2\n{extra}").runs[0].labels()
    assert {k: labels[k] for k in want} == want


def test_model_params_and_seed_in_labels_are_the_scenarios() -> None:
    run = expand("name: s\nmodel: {name: synthetic, params: 1M}\nworld_size: 2\nseed: 7\n").runs[0]
    labels = run.labels()
    assert (labels["model"], labels["model_params"], labels["seed"]) == (
        "synthetic", {"params": 1_000_000, "gflops": 0.1, "width": None}, 7)  # fmt: skip
    assert labels["device"] == "cpu"


# -- devices and placement: the reasons word for word, and what a runnable pair records ------
NCCL_CPU = "nccl reduces GPU tensors only; use device cuda (or auto) or backend gloo"
GLOO_CUDA = (
    "gloo has no CUDA all-to-all for the compressed schemes; use nccl or mpi for device cuda "
    "(gloo on CUDA runs only DDP with torch's hooks: none, fp16, bf16, powersgd)"
)


@pytest.mark.parametrize(
    ("backend", "device", "recorded", "kind", "why"),
    [
        ("nccl", "auto", "", "cuda", None), ("nccl", "cuda", "", "cuda", None),
        ("nccl", "cpu", None, None, NCCL_CPU),
        ("gloo", "auto", "", "cpu", None), ("gloo", "cpu", "", "cpu", None),
        ("gloo", "cuda", None, None, GLOO_CUDA),
        ("mpi", "auto", "", "cpu", None), ("mpi", "cpu", "", "cpu", None),
        ("mpi", "cuda", "cuda", "cuda", None),
    ],
)  # fmt: skip
def test_device_recorded_only_when_not_the_backends_own(
    backend: str, device: str, recorded: str | None, kind: str | None, why: str | None
) -> None:
    backends = backend if backend == "gloo" else f"[{backend}, gloo]"
    text = f"name: s\nmodel: mlp\nworld_size: 2\nbackend: {backends}\ndevice: {device}\n"
    if backend == "gloo" and why:
        with pytest.raises(checks.EmptyMatrix) as e:
            expand(text)
        assert [x.reason for x in e.value.excluded] == [why]
        return
    m = expand(text)
    mine = [r for r in m.runs if r.placement.backend == backend]
    if why:
        assert mine == []
        assert [x.reason for x in m.excluded] == [why]
        return
    assert [(r.placement.device, r.placement.device_kind, r.labels()["device"]) for r in mine] == [
        (recorded, kind, kind)]  # fmt: skip


def test_gloo_ranks_share_a_gpu_under_torchs_ddp_only() -> None:
    """gloo stages CUDA tensors through the host: DDP with torch's hooks runs on CUDA with two
    ranks on one GPU; a qbench codec (compressed all-to-all) and nccl (one GPU a rank) do not."""
    text = (
        "name: s\nmodel: mlp\nworld_size: 2\ngpus_per_node: 1\nbackend: [gloo, nccl]\n"
        "device: cuda\nscheme: ddp\ncompressor: [none, fp16, qsgd]\n"
    )
    m = expand(text)
    assert sorted(
        (r.placement.backend, r.compressor_label, r.placement.device_kind) for r in m.runs
    ) == [("gloo", "fp16", "cuda"), ("gloo", "fp32", "cuda")]
    reasons = {x.reason for x in m.excluded}
    assert GLOO_CUDA in reasons
    assert "2 ranks per node but gpus_per_node is 1; each CUDA rank needs its own GPU" in reasons


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ("world_size: 3\nnodes: 2\n", "world_size 3 does not split evenly over nodes 2"),
        ("world_size: 4\nbackend: nccl\ngpus_per_node: 2\n",
         "4 ranks per node but gpus_per_node is 2; each CUDA rank needs its own GPU"),
        ("world_size: 2\nbackend: nccl\nnetwork: {bandwidth: 1gbit}\n",
         "network emulates hosts and links between CPU processes (gloo, mpi); nccl would talk "
         "GPU to GPU inside one host and bypass them; use gloo or remove `network:`"),
        ("world_size: 2\nbackend: nccl\nnetwork: {nodes: 2}\n",
         "network emulates hosts and links between CPU processes (gloo, mpi); nccl would talk "
         "GPU to GPU inside one host and bypass them; use gloo or remove `network:`"),
        ("world_size: 3\nnetwork: {nodes: 2, inter: 1gbit}\n",
         "world_size 3 does not split evenly over nodes 2"),
    ],
)  # fmt: skip
def test_placement_and_link_reasons_word_for_word(extra: str, why: str) -> None:
    with pytest.raises(checks.EmptyMatrix) as e:
        expand(f"name: s\nmodel: mlp\n{extra}")
    assert [x.reason for x in e.value.excluded] == [why]


@pytest.mark.parametrize(
    "extra",
    ["world_size: 4\nnodes: 2\nbackend: nccl\ngpus_per_node: 2\n",  # 2 per node: fits
     "world_size: 4\nbackend: mpi\ngpus_per_node: 1\n",  # cpu ranks need no GPU
     "world_size: 4\nnodes: 4\n"],
)  # fmt: skip
def test_placement_that_fits_runs(extra: str) -> None:
    assert len(expand(f"name: s\nmodel: mlp\n{extra}").runs) == 1


# -- descriptions of excluded combinations ------------------------------------------------------
def test_description_names_every_axis_off_its_default() -> None:
    text = (
        FULL.replace("world_size: 4\n", "world_size: [4, 8]\n").replace(
            "batch_size: {4: 16}\n", "batch_size: 16\n"
        )
        + "exclude: [{world_size: 8}]\n"
    )
    m = expand(text)
    assert [(e.description, e.reason) for e in m.excluded] == [
        ("mlp mpi reduce-broadcast+overlap4 qsgd-4b-b512 w8 n2 1gbit seed3 skew0.5 bf16 w8bits",
         "dropped by exclude entry 1 {'world_size': 8}"),
        ("mlp mpi reduce-broadcast+overlap4 qsgd-4b-b512 w8 n2 1gbit seed3 repeat1 skew0.5 bf16 "
         "w8bits", "dropped by exclude entry 1 {'world_size': 8}"),
    ]  # fmt: skip


def test_description_of_a_default_combination_is_short() -> None:
    m = expand("name: s\nmodel: mlp\nworld_size: [1, 2]\nexclude: [{backend: mpi}, "
               "{world_size: 1}]\n")  # fmt: skip
    assert [(e.description, e.reason) for e in m.excluded] == [
        (
            "mlp gloo allreduce fp32 w1 unshaped seed0",
            "dropped by exclude entry 2 {'world_size': 1}",
        )
    ]


# -- include / exclude: a value may be a name, a label or the full mapping ------------------------
BIG = """name: s
model: [mlp, {name: synthetic, params: 1M}]
world_size: [1, 2]
backend: [gloo, mpi]
scheme: [auto, {name: reduce-broadcast, overlap: 2}]
compressor: [none, {name: qsgd, bits: 4}]
network: [unshaped, {bandwidth: 1gbit}]
seed: [0, 1]
repeats: 2
skew: [0, 0.5]
compute: [fp32, bf16]
"""


@pytest.mark.parametrize(
    ("entry", "test"),
    [
        ("{model: synthetic}", lambda r: r.workload.model == "synthetic"),
        ("{model: {name: synthetic, params: 1M}}", lambda r: r.workload.model == "synthetic"),
        ("{model: [mlp]}", lambda r: r.workload.model == "mlp"),
        ("{dataset: synthetic}", lambda r: True),
        ("{world_size: 2}", lambda r: r.placement.world_size == 2),
        ("{nodes: 1}", lambda r: True),
        ("{backend: mpi}", lambda r: r.placement.backend == "mpi"),
        ("{device: auto}", lambda r: True),
        ("{device: cpu}", lambda r: True),
        # the scheme as written (auto), as resolved, as the whole mapping written or resolved
        ("{scheme: auto}", lambda r: r.method.scheme_params == {}),
        ("{scheme: allreduce}", lambda r: r.method.scheme.name == "allreduce"),
        ("{scheme: reduce-broadcast}", lambda r: r.method.scheme.name == "reduce-broadcast"),
        ("{scheme: {name: reduce-broadcast, overlap: 2}}", lambda r: r.method.scheme_params != {}),
        ("{compressor: qsgd}", lambda r: r.method.compressor.name == "qsgd"),
        ("{compressor: qsgd-4b-b512}", lambda r: r.method.compressor.name == "qsgd"),
        ("{compressor: {name: qsgd, bits: 4}}", lambda r: r.method.compressor.name == "qsgd"),
        ("{compressor: fp32}", lambda r: r.method.compressor.name == "none"),
        ("{network: 1gbit}", lambda r: r.placement.network.written() != {}),
        ("{network: {bandwidth: 1gbit}}", lambda r: r.placement.network.written() != {}),
        ("{network: unshaped}", lambda r: r.placement.network.written() == {}),
        ("{seed: 1}", lambda r: r.measurement.seed == 1),
        ("{repeat: 1}", lambda r: r.measurement.repeat == 1),
        ("{skew: 0.5}", lambda r: r.workload.skew == 0.5),
        ("{compute: bf16}", lambda r: r.compute.name == "bf16"),
        ("{backend: mpi, world_size: [1, 2], compute: fp32}",
         lambda r: r.placement.backend == "mpi" and r.compute.name == "fp32"),
    ],
)  # fmt: skip
def test_include_matches_names_labels_and_mappings(entry: str, test: Any) -> None:
    every = expand(BIG).runs
    kept = expand(BIG + f"include: [{entry}]\n")
    want = [r.run_id for r in every if test(r)]
    assert want, "the entry must match some runs"
    assert [r.run_id for r in kept.runs] == want
    assert {e.reason for e in kept.excluded} <= {"matches no include entry"}
    if len(want) == len(every):
        return
    dropped = expand(BIG + f"exclude: [{{backend: nccl}}, {entry}]\n")
    assert [r.run_id for r in dropped.runs] == [r.run_id for r in every if not test(r)]
    written = scenario.loads(BIG + f"exclude: [{entry}]\n").exclude[0]
    assert {e.reason for e in dropped.excluded} == {f"dropped by exclude entry 2 {written}"}


def test_exclude_before_include_and_first_exclude_entry_named() -> None:
    m = expand("name: s\nmodel: mlp\nworld_size: [1, 2]\nbackend: [gloo, mpi]\n"
               "exclude: [{backend: mpi}, {world_size: 1}]\ninclude: [{backend: mpi}, "
               "{world_size: 2}]\n")  # fmt: skip
    assert [(r.placement.backend, r.placement.world_size) for r in m.runs] == [("gloo", 2)]
    assert sorted(e.reason for e in m.excluded) == [
        "dropped by exclude entry 1 {'backend': 'mpi'}",
        "dropped by exclude entry 1 {'backend': 'mpi'}",
        "dropped by exclude entry 2 {'world_size': 1}",
    ]


# -- expansion order, duplicates, empty matrices, --quick's cover ---------------------------------
def test_repeats_interleaved_and_matrix_order_within_a_repeat() -> None:
    runs = expand("name: s\nmodel: mlp\nworld_size: [1, 2]\nbackend: [gloo, mpi]\nrepeats: 2\n"
                  "seed: [0, 1]\n").runs  # fmt: skip
    assert [
        (r.measurement.repeat, r.placement.world_size, r.placement.backend, r.measurement.seed)
        for r in runs
    ] == [
        (0, 1, "gloo", 0),
        (0, 1, "gloo", 1),
        (0, 1, "mpi", 0),
        (0, 1, "mpi", 1),
        (0, 2, "gloo", 0),
        (0, 2, "gloo", 1),
        (0, 2, "mpi", 0),
        (0, 2, "mpi", 1),
        (1, 1, "gloo", 0),
        (1, 1, "gloo", 1),
        (1, 1, "mpi", 0),
        (1, 1, "mpi", 1),
        (1, 2, "gloo", 0),
        (1, 2, "gloo", 1),
        (1, 2, "mpi", 0),
        (1, 2, "mpi", 1),
    ]


def test_auto_resolving_to_a_listed_scheme_runs_once() -> None:
    m = expand("name: s\nmodel: mlp\nworld_size: 2\nscheme: [auto, allreduce]\n"
               "compressor: [none, {name: qsgd, bits: 4}]\n")  # fmt: skip
    assert [(r.method.scheme.name, r.method.compressor.given["name"]) for r in m.runs] == [
        ("allreduce", "none"), ("reduce-broadcast", "qsgd")]  # fmt: skip
    assert [e.description for e in m.excluded] == [
        "mlp gloo allreduce qsgd-4b-b512 w2 unshaped seed0"
    ]


def test_empty_matrix_says_how_many_and_the_first_reason() -> None:
    with pytest.raises(checks.EmptyMatrix) as e:
        expand("name: s\nmodel: mlp\nworld_size: [1, 2]\nexclude: [{model: mlp}]\n")
    assert str(e.value) == (
        "scenario 's' expands to no runnable combination: every one of its 2 is excluded, e.g. "
        "mlp gloo allreduce fp32 w1 unshaped seed0: dropped by exclude entry 1 {'model': 'mlp'}; "
        "`qbench sweep SCENARIO --dry-run` lists every reason"
    )


def test_cover_keeps_a_run_per_new_axis_value() -> None:
    text = "name: s\nmodel: mlp\nworld_size: [1, 2]\nbackend: [gloo, mpi]\nseed: [0, 1]\n"
    every = expand(text).runs
    m = expand(text + "cover: true\n")
    # seeds are not covered (--quick keeps the first): (ws1 gloo s0) is new, (ws1 mpi s0) a new
    # backend, (ws2 gloo s0) a new world size; the rest bring nothing new
    kept = [(r.placement.world_size, r.placement.backend, r.measurement.seed) for r in m.runs]
    assert kept == [(1, "gloo", 0), (1, "mpi", 0), (2, "gloo", 0)]
    assert [e.description for e in m.excluded] == [
        r.run_id
        for r in every
        if (r.placement.world_size, r.placement.backend, r.measurement.seed) not in kept
    ]
    assert {e.reason for e in m.excluded} == {"cover: its every axis value runs in another run"}


def test_cover_keeps_the_rules_exclusions_beside_its_own() -> None:
    m = expand("name: s\nmodel: mlp\nworld_size: [1, 2]\nscheme: [allreduce, reduce-broadcast]\n"
               "compressor: {name: qsgd, bits: 4}\ncover: true\n")  # fmt: skip
    assert [(r.placement.world_size, r.method.scheme.name) for r in m.runs] == [
        (1, "reduce-broadcast"),
        (2, "reduce-broadcast"),
    ]
    assert [e.reason.split(";")[0] for e in m.excluded] == [
        "allreduce sums raw buffers and cannot sum packed qsgd payloads"
    ] * 2


def test_cover_counts_scheme_with_compressor_as_one_value() -> None:
    runs = expand(
        "name: s\nmodel: mlp\nworld_size: 2\nscheme: [reduce-broadcast, allgather]\n"
        "compressor: [{name: qsgd, bits: 4}, {name: qsgd, bits: 8}]\n"
    ).runs
    kept, dropped = matrix.cover(runs)
    # compressors outer, schemes inner: rb+q4 new; ag+q4 a new scheme; rb+q8 a new compressor;
    # ag+q8 brings only its pair
    assert [(r.method.scheme.name, r.method.compressor.given["bits"]) for r in kept] == [
        ("reduce-broadcast", 4),
        ("allgather", 4),
        ("reduce-broadcast", 8),
        ("allgather", 8),
    ]
    assert dropped == []


def test_axis_values_of_a_run() -> None:
    run = expand(FULL).runs[0]
    assert matrix.axis_values(run) == {
        ("model", "mlp"), ("dataset", "synthetic"), ("backend", "mpi"), ("world_size", 4),
        ("nodes", 2), ("device", ""), ("network", "1gbit"), ("compute", "bf16"), ("skew", 0.5),
        ("weight_bits", 8), ("scheme", "reduce-broadcast+overlap4"),
        ("compressor", "qsgd-4b-b512"), ("method", ("reduce-broadcast+overlap4", "qsgd-4b-b512")),
    }  # fmt: skip


def test_auto_with_parameters_its_resolution_rejects_word_for_word() -> None:
    with pytest.raises(UserError) as e:
        expand("name: s\nmodel: mlp\nscheme: {name: auto, overlap: 4}\ncompressor: none\n")
    assert str(e.value).startswith("scheme auto is allreduce for compressor none, and ")
    assert str(e.value).endswith(
        "; name the scheme, e.g. `scheme: [{name: reduce-broadcast, overlap: 4}]`"
    )


def test_auto_is_checked_after_a_named_scheme() -> None:
    with pytest.raises(UserError) as e:
        expand("name: s\nmodel: mlp\nscheme: [reduce-broadcast, {name: auto, overlap: 4}]\n")
    assert str(e.value) == (
        "scheme auto is allreduce for compressor none, and scheme allreduce: unknown parameter "
        "'overlap'; valid: backward, bucket_cap_mb, gradient_as_bucket_view; name the scheme, "
        "e.g. `scheme: [{name: reduce-broadcast, overlap: 4}]`"
    )


@pytest.mark.parametrize(
    ("scheme", "comp", "want"),
    [("auto", {"name": "none"}, "allreduce"), ("auto", {"name": "qsgd", "bits": 4},
      "reduce-broadcast"), ("allgather", {"name": "qsgd", "bits": 4}, "allgather")],
)  # fmt: skip
def test_auto_resolves_by_compressor(scheme: str, comp: dict[str, Any], want: str) -> None:
    text = f"name: s\nmodel: mlp\nscheme: [{scheme}]\ncompressor: [{json.dumps(comp)}]\n"
    assert {r.method.scheme.name for r in expand(text).runs} == {want}


# Accuracy mode with the user's own model, data, optimizer and loss: the fields FULL leaves at
# their defaults.
ACCURACY = """
name: acc
model: {factory: "mypkg.nets:build", params: {width: 8}, input_shape: [4], num_classes: 3}
dataset: {factory: "mypkg.data:splits", name: toy}
epochs: 3
steps_per_epoch: 5
lr_schedule: {milestones: [2], gamma: 0.5}
target_accuracy: 0.9
profile: true
optimizer: {name: adam, lr: 0.01}
loss: {name: cross-entropy, label_smoothing: 0.1}
world_size: 2
"""


def test_accuracy_mode_and_the_users_workload_reach_the_run_spec() -> None:
    (run,) = expand(ACCURACY).runs
    assert run.to_dict() == {
        "scenario": "acc", "model": "build", "dataset": "toy", "world_size": 2,
        "backend": "gloo", "scheme": "allreduce", "compressor": {"name": "none"},
        "batch_size": 32, "warmup": 5, "iterations": 20,
        "lr": 0.01, "momentum": 0.0,  # adam: lr its own, no momentum
        "seed": 0, "timeout": 600.0, "telemetry": False, "layers": {}, "scheme_params": {},
        "network": {}, "model_params": {}, "repeat": 0, "nodes": 1, "device": "",
        "price_per_hour": None, "epochs": 3, "lr_schedule": {"milestones": [2], "gamma": 0.5},
        "weight_decay": 0.0, "skew": 0.0, "target_accuracy": 0.9, "compute": "fp32",
        "norm": "batchnorm", "weight_bits": 0, "rounding": "per-rank", "steps_per_epoch": 5,
        "profile": True,
        "workload": {"factory": "mypkg.nets:build", "params": {"width": 8}, "input_shape": [4],
                     "num_classes": 3, "vocab_size": None, "input_dtype": "float32"},
        "data": {"factory": "mypkg.data:splits", "params": {}},
        "optimizer": {"name": "adam", "betas": [0.9, 0.999], "eps": 1e-08, "amsgrad": False},
        "loss": {"name": "cross-entropy", "label_smoothing": 0.1},
        "nonfinite": "fail", "dilation": 1.0, "timeline": "", "codec_time": "",
    }  # fmt: skip
    labels = run.labels()
    assert (labels["model"], labels["dataset"], labels["epochs"], labels["target_accuracy"],
            labels["optimizer"], labels["loss"]) == (
        "build", "toy", 3, 0.9, "adam", "cross-entropy")  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "kept"),
    [
        ('{dataset: toy}', 1),
        ('{dataset: {factory: "mypkg.data:splits", params: {}}}', 1),  # the factory's spec
        ("{dataset: {}}", 0),  # an empty mapping is no dataset's
        ('{model: {factory: "mypkg.nets:build", params: {width: 8}, input_shape: [4], '
         "num_classes: 3}}", 1),  # as written
        ("{model: build}", 1),
    ],
)  # fmt: skip
def test_include_matches_the_users_model_and_data(entry: str, kept: int) -> None:
    text = f"{ACCURACY}include: [{entry}]\n"
    if kept:
        assert len(expand(text).runs) == kept
        return
    with pytest.raises(checks.EmptyMatrix) as e:
        expand(text)
    assert [x.reason for x in e.value.excluded] == ["matches no include entry"]


def test_an_empty_mapping_matches_no_built_in_dataset() -> None:
    with pytest.raises(checks.EmptyMatrix) as e:
        expand("name: s\nmodel: mlp\nworld_size: 2\ninclude: [{dataset: {}}]\n")
    assert [x.reason for x in e.value.excluded] == ["matches no include entry"]


def test_include_matches_a_models_normalised_parameters_and_a_schemes_canonical_form() -> None:
    text = ("name: s\nmodel: {name: synthetic, params: 1M}\nworld_size: 2\n"
            "scheme: {name: allreduce, backward: true}\n")  # fmt: skip
    assert [r.method.scheme.name for r in expand(text).runs] == [
        "ddp"
    ]  # allreduce per bucket is ddp
    normalised = "{name: synthetic, params: 1000000, gflops: 0.1, width: null}"
    for entry in (f"{{model: {normalised}}}", "{scheme: {name: ddp}}",
                  "{scheme: {name: allreduce, backward: true}}"):  # fmt: skip
        assert len(expand(f"{text}include: [{entry}]\n").runs) == 1, entry
    for entry in ("{model: {name: synthetic}}", "{scheme: {name: allreduce}}"):
        with pytest.raises(checks.EmptyMatrix):
            expand(f"{text}include: [{entry}]\n")


def test_overlap_above_one_is_the_overlap_mode() -> None:
    run = expand("name: s\nmodel: mlp\nworld_size: 2\ncompressor: {name: qsgd, bits: 4}\n"
                 "scheme: {name: reduce-broadcast, overlap: 2}\n").runs[0]  # fmt: skip
    assert run.labels()["mode"] == "overlap"


@pytest.mark.parametrize(
    ("extra", "run", "excluded"),
    [
        # the catalog's rules see the run's world size, accuracy mode, telemetry and compute
        ("world_size: [1, 2]\nscheme: async-ps\ncompressor: {name: qsgd, bits: 4}\n",
         ("async-ps", 2),
         ("mlp gloo async-ps qsgd-4b-b512 w1 unshaped seed0",
          "async-ps needs a server (rank 0) and at least one worker: world_size >= 2, got 1")),
        ("world_size: 2\nepochs: 1\ndataset: digits\nscheme: [reduce-broadcast, "
         "simulated-lowprec]\ncompressor: {name: qsgd, bits: 4}\n",
         ("reduce-broadcast", 2),
         ("mlp gloo simulated-lowprec qsgd-4b-b512 w2 unshaped seed0",
          "simulated-lowprec does not reduce the gradients (speed only, seed 002 section 4.4), "
          "so it cannot train; drop it from accuracy (epochs) scenarios")),
        ("world_size: 2\ntelemetry: true\nscheme: [allreduce, ddp]\n", ("allreduce", 2),
         ("mlp gloo ddp fp32 w2 unshaped seed0",
          "telemetry shadows each layer's encode after backward; DDP runs communicate during "
          "backward and record none; drop `telemetry` or the DDP schemes")),
        ("world_size: 2\ncompute: fp16\nscheme: [allreduce, ddp]\n", ("allreduce", 2),
         ("mlp gloo ddp fp32 w2 unshaped seed0 fp16",
          "fp16 compute zeroes an overflowing rank's gradient before it is communicated, but "
          "DDP communicates during backward; use compute bf16 with DDP")),
        # ... and the scenario's profiling and optimizer
        ("world_size: 2\nprofile: true\nscheme: [reduce-broadcast, async-ps]\n"
         "compressor: {name: qsgd, bits: 4}\n", ("reduce-broadcast", 2),
         ("mlp gloo async-ps qsgd-4b-b512 w2 unshaped seed0",
          "profile traces the lock-step loops (flat and DDP); async-ps runs an event loop of its "
          "own without those phases; drop `profile` for it")),
        ("world_size: 2\noptimizer: adam\nscheme: [reduce-broadcast, async-ps]\n"
         "compressor: {name: qsgd, bits: 4}\n", ("reduce-broadcast", 2),
         ("mlp gloo async-ps qsgd-4b-b512 w2 unshaped seed0",
          "async-ps updates the model on its server by its own rule (SGD; Nesterov for variant "
          "accelerated), so optimizer adam cannot apply; remove `optimizer:`")),
        # replayed compute: the async server's loop has none (it would compute for real)
        ("world_size: 2\ncompute: replay\nscheme: [reduce-broadcast, async-ps]\n"
         "compressor: {name: qsgd, bits: 4}\n", ("reduce-broadcast", 2),
         ("mlp gloo async-ps qsgd-4b-b512 w2 unshaped seed0 replay",
          "compute replay: async-ps runs a loop of its own that cannot sleep through the "
          "model's work, so it would compute for real under a replay label; use "
          "`compute: fp32` for async-ps")),
    ],
)  # fmt: skip
def test_rules_see_each_runs_settings(
    extra: str, run: tuple[str, int], excluded: tuple[str, str]
) -> None:
    m = expand(f"name: s\nmodel: mlp\n{extra}")
    assert [(r.method.scheme.name, r.placement.world_size) for r in m.runs] == [run]
    assert [(e.description, e.reason) for e in m.excluded] == [excluded]
