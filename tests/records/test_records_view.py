"""The typed view over run.json (qbench.records.view): a run's compressor and scheme parameters
come from its recorded spec, and a record without a spec still reads through its labels."""

from __future__ import annotations

import pytest

from qbench.errors import UserError
from qbench.records import view
from qbench.records.view import run_specs, run_specs_each
from qbench.spec import scenario
from qbench.spec.matrix import expand

# A run.json's two halves as a run writes them (schema version 2): the spec as given, and the
# labels made from it.
RECORD = {
    "schema_version": 2,
    "labels": {"compressor": "qsgd-4b-b512", "scheme": "reduce-broadcast+overlap4"},
    "spec": {
        "compressor": {"name": "qsgd", "bits": 4, "bucket_size": 512},
        "scheme": "reduce-broadcast",
        "scheme_params": {"overlap": 4},
    },
}


@pytest.mark.parametrize("labels", [RECORD["labels"], {}], ids=["labelled", "no labels"])
def test_parameters_come_from_the_spec(labels: dict[str, str]) -> None:
    specs = run_specs({**RECORD, "labels": labels})
    assert specs.compressor.name == "qsgd"
    assert specs.compressor.params["bits"] == 4
    assert specs.compressor.params["bucket_size"] == 512
    assert specs.scheme.name == "reduce-broadcast"
    assert specs.scheme.params["overlap"] == 4


def test_defaults_are_filled_in_as_the_run_filled_them() -> None:
    labels = {"compressor": "fp32", "scheme": "ddp"}
    record = {"labels": labels, "spec": {"compressor": {"name": "none"}, "scheme": "ddp"}}
    specs = run_specs(record)  # no scheme_params: older runs of a scheme without parameters
    assert specs.compressor.name == "none"
    assert specs.compressor.nominal_bits == 32
    assert specs.scheme.name == "ddp"


def test_a_record_without_a_spec_reads_through_its_labels() -> None:
    labels = {"compressor": "qsgd-2b-b128", "scheme": "reduce-broadcast+overlap2"}
    specs = run_specs({"schema_version": 1, "labels": labels})
    assert specs.compressor.params["bits"] == 2
    assert specs.compressor.params["bucket_size"] == 128
    assert specs.scheme.params["overlap"] == 2


def test_a_default_that_changed_since_the_run_is_read_from_its_label() -> None:
    # fixedpoint's scope defaulted to global when this ran (label fixed-8b); today it is layer
    # (label fixed-8b-layer), so the spec as given no longer says what ran, and the label does
    record = {
        "labels": {"compressor": "fixed-8b", "scheme": "allreduce"},
        "spec": {"compressor": {"name": "fixedpoint", "bits": 8}, "scheme": "allreduce"},
    }
    assert run_specs(record).compressor.params["scope"] == "global"


def test_an_unknown_compressor_is_a_user_error() -> None:
    record = {**RECORD, "spec": {**RECORD["spec"], "compressor": {"name": "nosuch"}}}
    with pytest.raises(UserError, match="nosuch"):
        run_specs(record)


@pytest.mark.parametrize(
    ("spec", "label", "bits"),
    [({"bandwidth": "100mbit"}, "100mbit", 1e8), ({}, "unshaped", None),
     (None, "2.5mbit", 2.5e6), (None, "unshaped", None), (None, None, None)],
    ids=["shaped", "unshaped", "no spec, label", "no spec, unshaped", "neither"],
)  # fmt: skip
def test_the_link_comes_from_the_spec_or_else_the_label(
    spec: dict[str, str] | None, label: str | None, bits: float | None
) -> None:
    record: dict = {"labels": {**RECORD["labels"]}, "spec": {**RECORD["spec"]}}
    if spec is not None:
        record["spec"]["network"] = spec
    if label is not None:
        record["labels"]["network"] = label
    assert run_specs(record).link.bits_per_s == bits


def test_each_part_reads_on_its_own() -> None:
    """A compressor label that no longer parses leaves the scheme and link readable: an
    async-ps run is still told apart by its scheme (stats' order-independent detection)."""
    parts = run_specs_each(
        {"labels": {"compressor": "qsgd-4b", "scheme": "async-ps", "network": "1gbit"}}
    )
    assert parts.compressor is None
    assert parts.scheme is not None and parts.scheme.name == "async-ps"
    assert parts.link is not None and parts.link.bits_per_s == 1e9
    whole = run_specs_each({"spec": {"compressor": {"name": "qsgd"}, "scheme": "allreduce"}})
    assert whole.compressor is not None and whole.compressor.name == "qsgd"


def test_typed_columns_come_from_the_spec_not_the_labels() -> None:
    text = "name: t\nmodel: mlp\nworld_size: 2\nbackend: gloo\nscheme: [ddp, allreduce]\n"
    text += "network: [{bandwidth: 1gbit}]\ncompute: [fp32, replay]\n"
    for run in expand(scenario.loads(text)).runs:
        # labels that say otherwise where they are only display: not read
        shown = {"network": "10mbit", "compute": "fp32", "overlap": "none", "dilation": 3}
        record = {"spec": run.to_dict(), "labels": {**run.labels(), **shown}}
        got = view.columns(record)
        assert got == {
            "scheme_name": run.method.scheme.name,
            "backward": run.method.scheme.name == "ddp",
            "link_bits_per_s": 1e9,
            "replayed": run.compute.replay is not None,
        }
    assert view.columns({"spec": {}, "labels": {}})["replayed"] is False
