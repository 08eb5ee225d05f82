"""Layer policy: the 99 % threshold of seed 002 and per-layer overrides."""

from __future__ import annotations

import pytest

from qbench.errors import UserError
from qbench.spec import layers, matrix, scenario

QSGD = {"name": "qsgd", "bits": 4}


def test_threshold_quantizes_at_least_the_fraction() -> None:
    sizes = [1000, 500, 10, 10, 5]
    t = layers.threshold(sizes, 0.99)
    quantized = sum(s for s in sizes if s >= t)
    assert quantized >= 0.99 * sum(sizes)
    # and it is the largest such threshold: one size up would fall short
    assert t == 10
    assert layers.threshold(sizes, 0.5) == 1000


def test_plan_groups_small_tensors_in_fp32() -> None:
    params = [("a.weight", 1000), ("a.bias", 10), ("b.weight", 2000), ("b.bias", 20)]
    groups = layers.plan(params, QSGD, layers.LayerPolicy())
    by_name = {n: g.compressor for g in groups for n in g.names}
    assert by_name["a.weight"] == QSGD and by_name["b.weight"] == QSGD
    assert by_name["a.bias"] == {"name": "none"} and by_name["b.bias"] == {"name": "none"}
    assert sum(g.numel for g in groups) == 3030
    assert [g.names for g in groups if g.compressor == QSGD] == [("a.weight", "b.weight")]


def test_overrides_first_match_wins_and_zero_threshold() -> None:
    params = [("conv.weight", 1000), ("fc.weight", 500), ("fc.bias", 5)]
    policy = layers.LayerPolicy(
        full_precision_below=0,
        overrides={"fc.bias": {"name": "none"}, "fc.*": {"name": "qsgd", "bits": 8}},
    )
    by_name = {n: g.compressor for g in layers.plan(params, QSGD, policy) for n in g.names}
    assert by_name == {
        "conv.weight": QSGD,
        "fc.weight": {"name": "qsgd", "bits": 8},
        "fc.bias": {"name": "none"},
    }


def test_fp32_runs_stay_fp32() -> None:
    groups = layers.plan([("w", 10**6), ("b", 1)], {"name": "none"}, layers.LayerPolicy())
    assert len(groups) == 1 and groups[0].compressor == {"name": "none"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("layers: {bogus: 1}\n", "unknown key layers.bogus"),
        ("layers: {full_precision_below: -3}\n", "full_precision_below"),
        ("layers: {quantized_fraction: 1.5}\n", "quantized_fraction"),
        ("layers: {overrides: {'fc.*': {name: qsgd, bits: 99}}}\n", "bits"),
        ("layers: {overrides: {'fc.*': {name: topq}}}\n", "unknown compressor 'topq'"),
    ],
)
def test_bad_layer_settings(text: str, needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        matrix.expand(scenario.loads("name: t\nmodel: mlp\n" + text))


def test_override_with_compressor_excludes_allreduce() -> None:
    text = "name: t\nmodel: mlp\nscheme: [allreduce]\nlayers: {overrides: {'0.*': onebit}}\n"
    with pytest.raises(UserError, match="no runnable"):
        matrix.expand(scenario.loads(text))


def test_policy_is_part_of_run_identity_only_when_it_matters() -> None:
    base = "name: t\nmodel: mlp\nworld_size: 2\ncompressor: [none, onebit]\n"
    a = matrix.expand(scenario.loads(base)).runs
    b = matrix.expand(scenario.loads(base + "layers: {quantized_fraction: 0.9}\n")).runs
    assert a[0].run_id == b[0].run_id  # fp32: the policy decides nothing
    assert a[1].run_id != b[1].run_id


def test_resnet20_plan_matches_readme() -> None:
    from qbench import models

    model = models.get("resnet20").build()
    params = [(n, p.numel()) for n, p in model.named_parameters()]
    fp32, quantized = layers.plan(params, QSGD, layers.LayerPolicy())
    assert fp32.compressor == {"name": "none"} and quantized.compressor == QSGD
    assert (len(fp32.names), fp32.numel) == (45, 2522)
    assert len(quantized.names) == 20
    assert round(100 * quantized.numel / (fp32.numel + quantized.numel), 2) == 99.07


def test_onebit_per_column_buckets_are_last_dimension() -> None:
    """CNTK's 1bitSGD quantizes per column: a 3x3 conv gets columns of 3 values (seed 002)."""
    from qbench.compress import from_spec

    params = [("conv.weight", 16 * 8 * 3 * 3), ("fc.weight", 10 * 64), ("fc2.weight", 5 * 64)]
    cols = {"conv.weight": 3, "fc.weight": 64, "fc2.weight": 64}
    spec = {"name": "onebit", "columns": True}
    groups = layers.plan(params, spec, layers.LayerPolicy(full_precision_below=0), cols)
    by_name = {n: g.compressor for g in groups for n in g.names}
    assert by_name["conv.weight"]["bucket_size"] == 3
    assert by_name["fc.weight"]["bucket_size"] == 64
    assert len(groups) == 2  # tensors with equal column length share a group
    conv = from_spec(by_name["conv.weight"])
    assert conv.label == "1bit-col"
    # 3 sign bits + two fp32 means per column: ~22 bits per value, no compression at all
    assert conv.wire_nbytes(1152) * 8 / 1152 > 20
