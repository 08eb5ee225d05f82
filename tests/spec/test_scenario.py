"""Scenario validation and matrix expansion (pure, fast)."""

from __future__ import annotations

import pytest

from qbench.errors import UserError
from qbench.spec import matrix, scenario

BASE = "name: t\nmodel: mlp\n"


def parse(extra: str) -> scenario.Scenario:
    return scenario.loads(BASE + extra, "t.yaml")


def test_minimal_defaults() -> None:
    sc = parse("")
    assert sc.model == ({"name": "mlp"},)
    assert sc.world_size == (1, 2)
    assert sc.compressor == ({"name": "none"},)


def test_scalars_and_lists_are_axes() -> None:
    sc = parse("world_size: 4\nbackend: [gloo, mpi]\ncompressor: [none, {name: qsgd, bits: 2}]\n")
    assert sc.world_size == (4,)
    assert sc.backend == ("gloo", "mpi")
    assert sc.compressor == ({"name": "none"}, {"name": "qsgd", "bits": 2})


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        ("bogus: 1\n", ["unknown key 'bogus'", "valid keys"]),
        ("iteration: 3\n", ["unknown key 'iteration'", "did you mean 'iterations'"]),
        ("world_size: [0]\n", ["world_size", "got 0"]),
        ("world_size: two\n", ["world_size must be int", "'two'"]),
        ("backend: tcp\n", ["backend 'tcp'", "gloo"]),
        ("momentum: 2\n", ["momentum", "2"]),
        ("batch_size: {1: 32}\nworld_size: [1, 2]\n", ["no entry for world_size 2"]),
        ("compressor: [{bits: 4}]\n", ["has no name"]),
        ("iterations: true\n", ["iterations must be int"]),
    ],
)
def test_bad_values_name_key_and_value(extra: str, needles: list[str]) -> None:
    with pytest.raises(UserError) as e:
        parse(extra)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg


def test_malformed_yaml_names_line() -> None:
    with pytest.raises(UserError, match=r"bad.yaml: line \d+ is not valid YAML"):
        scenario.loads("name: t\nmodel: mlp\nworld_size: [1, 2\n", "bad.yaml")


def test_not_a_mapping() -> None:
    with pytest.raises(UserError, match="mapping"):
        scenario.loads("- a\n- b\n", "x.yaml")


def test_missing_file() -> None:
    with pytest.raises(UserError, match="not found"):
        scenario.load("/nonexistent/s.yaml")


def test_batch_map_per_world_size() -> None:
    sc = parse("world_size: [1, 2]\nbatch_size: {1: 16, 2: 8}\n")
    runs = matrix.expand(sc).runs
    assert {(r.placement.world_size, r.workload.batch_size) for r in runs} == {(1, 16), (2, 8)}


def test_expand_cross_product_and_exclusions() -> None:
    sc = parse(
        "world_size: [1, 2]\nbackend: [gloo, mpi]\nscheme: [allreduce, reduce-broadcast]\n"
        "compressor: [none, {name: qsgd, bits: 4}]\n"
    )
    m = matrix.expand(sc)
    # 2 ws x 2 backends x (none: 2 schemes + qsgd: reduce-broadcast only)
    assert len(m.runs) == 2 * 2 * 3
    assert len(m.excluded) == 2 * 2
    assert all("reduce-broadcast" in e.reason for e in m.excluded)
    assert len({r.run_id for r in m.runs}) == len(m.runs)


def test_auto_scheme_resolution() -> None:
    m = matrix.expand(parse("compressor: [none, onebit]\nworld_size: 2\n"))
    assert {(r.method.compressor.given["name"], r.method.scheme.name) for r in m.runs} == {
        ("none", "allreduce"),
        ("onebit", "reduce-broadcast"),
    }


def test_a_replayed_run_computes_in_fp32_and_names_its_clock() -> None:
    """`compute: replay` stands for the model's work, which was measured in fp32: the run's
    precision is fp32 (what its codecs and the report's precision column read), with the
    replay's clock beside it; a real run's precision is its compute's."""
    replayed, real = matrix.expand(parse("world_size: 2\ncompute: [replay, bf16]\n")).runs
    assert replayed.compute.precision == "fp32" and replayed.compute.replay is not None
    assert real.compute.precision == "bf16" and real.compute.replay is None


def test_run_id_is_stable_and_config_sensitive() -> None:
    a = matrix.expand(parse("world_size: 2\n")).runs[0]
    b = matrix.expand(parse("world_size: 2\ntimeout: 99\n")).runs[0]
    c = matrix.expand(parse("world_size: 2\nlr: 0.2\n")).runs[0]
    assert a.run_id == b.run_id  # timeout changes nothing measured
    assert a.run_id != c.run_id
    assert matrix.RunSpec.from_dict(a.to_dict()) == a


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("model: [mlp, nosuch]\n", "unknown model 'nosuch'; valid: alexnet, "),
        ("compressor: [{name: qsgd, bits: 12}]\n", "bits"),
        ("compressor: [{name: zip}]\n", "unknown compressor 'zip'"),
        ("dataset: cifar100\n", "unknown dataset 'cifar100'"),
    ],
)
def test_expand_rejects_unknown_names(extra: str, needle: str) -> None:
    text = BASE.replace("model: mlp\n", "") + extra
    if "model:" not in text:
        text += "model: mlp\n"
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        matrix.expand(scenario.loads(text, "t.yaml"))


def test_embedded_default_expands() -> None:
    from importlib import resources

    text = resources.files("qbench.spec").joinpath("default.yaml").read_text()
    m = matrix.expand(scenario.loads(text))
    flat = 2 * 2 * 2 * 5  # models x world sizes x backends x compressors
    ddp = 2 * 2  # models x world sizes: DDP fp32 on gloo
    assert len(m.runs) == flat + ddp
    assert {r.placement.backend for r in m.runs if r.method.scheme.name == "ddp"} == {"gloo"}
    assert any("mpi has no DDP" in e.reason for e in m.excluded)  # said, never silently dropped


def test_set_overrides_top_level_keys() -> None:
    text = "name: s\nmodel: mlp\nseed: [0, 1, 2]\nworld_size: [1, 2]\n"
    out = scenario.with_overrides(text, "s.yaml", ["seed=0", "world_size=[2, 4, 8]", "lr=0.1"])
    sc = scenario.loads(out)
    assert (sc.seed, sc.world_size, sc.lr) == ((0,), (2, 4, 8), 0.1)
    assert out.startswith("# s.yaml with --set seed=0")
    assert scenario.with_overrides(text, "s.yaml", []) == text


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["seed"], "expected KEY=VALUE"),
        (["=3"], "expected KEY=VALUE"),
        (["seed=[0"], "not valid YAML"),
        (["seedz=0"], "unknown key 'seedz'"),
        (["world_size=two"], "world_size must be int"),
    ],
)
def test_bad_set_is_one_line(sets: list[str], needle: str) -> None:
    text = "name: s\nmodel: mlp\n"
    with pytest.raises(UserError, match=needle):
        scenario.loads(scenario.with_overrides(text, "s.yaml", sets))


def test_weights_is_an_axis() -> None:
    sc = scenario.loads("name: s\nmodel: mlp\nweights: [none, {bits: 8}, {bits: 6}]\n")
    assert sc.weights == ({}, {"bits": 8}, {"bits": 6})
    runs = matrix.expand(sc).runs
    assert sorted(r.compute.weight_bits for r in runs if r.placement.world_size == 1) == [0, 6, 8]
    assert len({r.run_id for r in runs}) == len(runs)
    single = scenario.loads("name: s\nmodel: mlp\nweights: {bits: 8}\n")
    assert single.weights == ({"bits": 8},)
    assert scenario.loads("name: s\nmodel: mlp\n").weights == ({},)


@pytest.mark.parametrize(
    ("value", "needle"),
    [("{bits: 1}", r"weights.bits must be a whole number in \[2, 32\]"),
     ("[none, {bytes: 8}]", "weights: unknown key 'bytes'")],
)  # fmt: skip
def test_bad_weights_name_the_value(value: str, needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        scenario.loads(f"name: s\nmodel: mlp\nweights: {value}\n")
