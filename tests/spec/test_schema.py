"""Scenario keys beyond the basic axes: device, nodes, repeats, include / exclude, price,
launcher; and how a re-run sorts the matrix (retry-failed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qbench.errors import UserError
from qbench.launch import sweep
from qbench.records.schema import RunRecord, buckets_frame, epochs_frame
from qbench.records.store import ResultStore
from qbench.spec import matrix, scenario
from tests import paths
from tests.paths import ROOT

BASE = "name: t\nmodel: mlp\nworld_size: 2\n"


def expand(extra: str) -> matrix.Matrix:
    return matrix.expand(scenario.loads(BASE + extra, "t.yaml"))


def ids(m: matrix.Matrix) -> list[str]:
    return [r.run_id for r in m.runs]


def test_defaults_keep_run_ids_of_earlier_versions() -> None:
    """Keys added later (device, nodes, repeats, price) leave the id alone at their default."""
    plain = expand("")
    assert ids(plain) == ids(expand("nodes: 1\nrepeats: 1\ndevice: auto\nprice_per_hour: 3.5"))
    assert plain.runs[0].placement.price_per_hour is None
    priced = expand("price_per_hour: 3.5")
    assert priced.runs[0].labels()["price_per_hour"] == 3.5


def test_device_axis_excludes_what_cannot_run() -> None:
    m = expand("backend: [gloo, mpi, nccl]\ndevice: [auto, cpu, cuda]")
    kept = {(r.placement.backend, r.placement.device_kind) for r in m.runs}
    assert kept == {("gloo", "cpu"), ("mpi", "cpu"), ("mpi", "cuda"), ("nccl", "cuda")}
    reasons = " ".join(e.reason for e in m.excluded)
    assert "nccl reduces GPU tensors only" in reasons and "gloo has no CUDA" in reasons
    mpi_cuda = next(
        r for r in m.runs if r.placement.backend == "mpi" and r.placement.device_kind == "cuda"
    )
    assert mpi_cuda.labels()["device"] == "cuda"
    # auto and the explicit natural device are the same run
    assert len({r.run_id for r in m.runs}) == len(m.runs) == 4


def test_nodes_must_divide_world_size_and_fit_gpus() -> None:
    m = expand("world_size: [2, 3, 8]\nnodes: [1, 2]\nbackend: nccl\ngpus_per_node: 4")
    got = {(r.placement.world_size, r.placement.nodes) for r in m.runs}
    assert got == {(2, 1), (3, 1), (2, 2), (8, 2)}
    reasons = {e.description.split()[4]: e.reason for e in m.excluded}
    assert "does not split evenly over nodes 2" in reasons["w3"]
    assert "8 ranks per node but gpus_per_node is 4" in " ".join(e.reason for e in m.excluded)
    two = next(r for r in m.runs if r.placement.nodes == 2 and r.placement.world_size == 2)
    assert "-w2n2-" in two.run_id


def test_repeats_make_distinct_runs() -> None:
    m = expand("repeats: 3")
    assert [r.measurement.repeat for r in m.runs] == [0, 1, 2]
    assert len(set(ids(m))) == 3
    assert ids(m)[0] == ids(expand(""))[0]  # repeat 0 is the run without repeats
    assert "-r2-" in ids(m)[2]


def test_repeats_are_interleaved_across_configurations() -> None:
    """All first repeats, then all second ones: a slow spell of the machine hits one repeat of
    several configurations rather than every repeat of one."""
    m = expand("repeats: 2\nworld_size: [1, 2]")
    assert [(r.measurement.repeat, r.placement.world_size) for r in m.runs] == [
        (0, 1),
        (0, 2),
        (1, 1),
        (1, 2),
    ]


def test_include_and_exclude_filter_by_name_label_or_mapping() -> None:
    text = (
        "backend: [gloo, mpi]\nworld_size: [1, 2]\n"
        "compressor: [none, {name: qsgd, bits: 4}, {name: qsgd, bits: 8}]\n"
    )
    m = expand(text + "exclude: [{backend: mpi, compressor: qsgd}]\n")
    assert not any(
        r.placement.backend == "mpi" and r.method.compressor.given["name"] == "qsgd" for r in m.runs
    )
    assert len(m.runs) == 12 - 4
    assert any("dropped by exclude entry 1" in e.reason for e in m.excluded)
    m = expand(text + "include: [{compressor: qsgd-8b-b512, world_size: 2}, {compressor: none}]\n")
    got = sorted((r.compressor_label, r.placement.world_size, r.placement.backend) for r in m.runs)
    assert got == sorted(
        [("qsgd-8b-b512", 2, b) for b in ("gloo", "mpi")]
        + [("fp32", w, b) for w in (1, 2) for b in ("gloo", "mpi")]
    )
    assert sum(e.reason == "matches no include entry" for e in m.excluded) == 6
    m = expand(text + "include: [{compressor: {name: qsgd, bits: 4}}]\n")
    assert {r.compressor_label for r in m.runs} == {"qsgd-4b-b512"}


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("exclude: [{backnd: mpi}]", "unknown axis 'backnd' \\(did you mean 'backend'\\?\\)"),
        ("include: [{}]", "include has an empty entry"),
        ("exclude: mpi", "exclude entry 'mpi' must be a mapping"),
        ("repeats: 0", "repeats must be in \\[1, 1000\\], got 0"),
        ("nodes: 0", "nodes must be >= 1, got 0"),
        ("gpus_per_node: 0", "gpus_per_node must be in"),
        ("price_per_hour: -1", "price_per_hour must be in"),
        ("launcher: pbs", "launcher 'pbs' is not one of local, slurm"),
        ("device: tpu", "device 'tpu' is not one of auto, cpu, cuda"),
        ("slurm: gpu", "slurm must be a mapping, got 'gpu'"),
        ("model: {params: 3}", "model .* has no name"),
        ("include: [{backend: mpi}]\nbackend: gloo", "expands to no runnable combination"),
    ],
)
def test_bad_schema_values_are_one_line_errors(extra: str, match: str) -> None:
    text = BASE.replace("model: mlp\n", "") if extra.startswith("model:") else BASE
    with pytest.raises(UserError, match=match) as e:
        matrix.expand(scenario.loads(text + extra, "t.yaml"))
    assert "\n" not in str(e.value)


def _record(store: ResultStore, spec: matrix.RunSpec, status: str) -> None:
    store.write_record(RunRecord(run_id=spec.run_id, status=status, labels={}, spec=spec.to_dict()))
    if status == "ok":
        store.iterations_path(spec.run_id).parent.mkdir(parents=True, exist_ok=True)
        store.iterations_path(spec.run_id).write_bytes(b"")


def test_plan_keeps_failed_runs_unless_retry_failed(tmp_path: Path) -> None:
    m = expand(
        "world_size: [1, 2]\ncompressor: [none, {name: qsgd, bits: 4}, {name: qsgd, bits: 8}]"
    )
    store = ResultStore(tmp_path)
    statuses = ["ok", "failed", "timeout", "running", "interrupted"]
    for spec, status in zip(m.runs, statuses, strict=False):
        _record(store, spec, status)
    p = sweep.plan(m, store)
    assert [s.run_id for s in p.done] == [m.runs[0].run_id]
    assert [s.run_id for s in p.kept_failed] == [m.runs[1].run_id, m.runs[2].run_id]
    # running (driver killed mid-run), interrupted and new runs are (re)done
    assert [s.run_id for s in p.todo] == [r.run_id for r in m.runs[3:]]
    retry = sweep.plan(m, store, retry_failed=True)
    assert not retry.kept_failed and len(retry.todo) == len(m.runs) - 1
    # an ok record without its iterations file is not complete
    store.iterations_path(m.runs[0].run_id).unlink()
    assert m.runs[0] in sweep.plan(m, store).todo


SHIPPED = paths.sweep_scenarios()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_scenarios_expand(path: Path) -> None:
    m = matrix.expand(scenario.load(path))
    assert m.runs


def test_gpu_smoke_scenario_and_workflow_agree() -> None:
    import yaml

    m = matrix.expand(scenario.load(ROOT / "scenarios" / "smoke-2gpu.yaml"))
    assert {r.placement.backend for r in m.runs} == {"nccl", "mpi"}
    assert {r.placement.device_kind for r in m.runs} == {"cuda"}
    assert {r.method.compressor.given["name"] for r in m.runs} == {"none", "qsgd", "onebit"}
    assert max(r.placement.world_size for r in m.runs) == 2
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "gpu-smoke.yml").read_text())
    steps = " ".join(str(s.get("run", "")) for s in flow["jobs"]["smoke-2gpu"]["steps"])
    assert "qbench sweep scenarios/smoke-2gpu.yaml" in steps and "pytest -m gpu" in steps
    assert "gpu-2" in flow["jobs"]["smoke-2gpu"]["runs-on"]


def test_push_sum_exclusions_say_why() -> None:
    text = (
        "name: s\nmodel: mlp\nworld_size: 4\n"
        "scheme: [{name: push-sum}, {name: push-sum, qgm: true}]\n"
        "compressor: [none, onebit, {name: onebit, error_feedback: false}]\n"
    )
    m = matrix.expand(scenario.loads(text))
    reasons = [e.reason for e in m.excluded]
    assert any("push-sum keeps its own error feedback" in r for r in reasons)
    assert any("set `momentum: 0`" in r for r in reasons)  # qgm with the default momentum 0.9
    assert {r.method.scheme_params.get("qgm") for r in m.runs} == {None}
    ok = matrix.expand(scenario.loads(text + "momentum: 0\n"))
    assert any(r.method.scheme_params.get("qgm") for r in ok.runs)


def test_frames_have_exactly_the_schemas_columns_and_dtypes() -> None:
    # a row with a column the schema lacks and without most of its own: the schema decides
    rows = [{"t_ready": 0.5, "run_id": "r", "rank": 1, "iteration": 3, "warmup": False,
             "bucket": 0, "numel": 10, "payload_bytes": 40, "stray": "x"}]  # fmt: skip
    buckets = buckets_frame(rows)
    assert list(buckets.columns) == ["run_id", "rank", "iteration", "warmup", "bucket", "numel",
                                     "payload_bytes", "t_handed", "t_ready"]  # fmt: skip
    assert str(buckets["rank"].dtype) == "int32" and str(buckets["run_id"].dtype) == "string"
    assert buckets["t_ready"].tolist() == [0.5] and buckets["t_handed"].isna().all()
    two = [{"run_id": "r", "epoch": e, "iteration": 50 * e, "bytes_sent": 7 + e} for e in (1, 2)]
    epochs = epochs_frame(two)
    assert epochs["epoch"].tolist() == [1, 2] and str(epochs["epoch"].dtype) == "int32"
    assert str(epochs["bytes_sent"].dtype) == "int64" and epochs["top1"].isna().all()
