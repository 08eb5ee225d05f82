"""The typed view over run.json (qbench.records.view): a run's compressor and scheme parameters
come from its recorded spec, and a record without a spec still reads through its labels."""

from __future__ import annotations

import pytest

from qbench.errors import UserError
from qbench.records.view import run_specs

# A run.json's two halves as a run writes them (schema version 2): the spec as given, and the
# labels made from it. The labels here deliberately disagree with the spec, so a reader that
# parses labels gets different numbers than one that reads the spec.
RECORD = {
    "schema_version": 2,
    "labels": {"compressor": "qsgd-2b-b128", "scheme": "reduce-broadcast+overlap2"},
    "spec": {
        "compressor": {"name": "qsgd", "bits": 4, "bucket_size": 512},
        "scheme": "reduce-broadcast",
        "scheme_params": {"overlap": 4},
    },
}


def test_parameters_come_from_the_spec_not_the_labels() -> None:
    specs = run_specs(RECORD)
    assert specs.compressor.name == "qsgd"
    assert specs.compressor.params["bits"] == 4
    assert specs.compressor.params["bucket_size"] == 512
    assert specs.scheme.name == "reduce-broadcast"
    assert specs.scheme.params["overlap"] == 4


def test_defaults_are_filled_in_as_the_run_filled_them() -> None:
    record = {**RECORD, "spec": {"compressor": {"name": "none"}, "scheme": "ddp"}}
    specs = run_specs(record)  # no scheme_params: older runs of a scheme without parameters
    assert specs.compressor.name == "none"
    assert specs.compressor.nominal_bits == 32
    assert specs.scheme.name == "ddp"


def test_a_record_without_a_spec_reads_through_its_labels() -> None:
    specs = run_specs({"schema_version": 1, "labels": RECORD["labels"]})
    assert specs.compressor.params["bits"] == 2
    assert specs.compressor.params["bucket_size"] == 128
    assert specs.scheme.params["overlap"] == 2


def test_an_unknown_compressor_is_a_user_error() -> None:
    record = {**RECORD, "spec": {**RECORD["spec"], "compressor": {"name": "nosuch"}}}
    with pytest.raises(UserError, match="nosuch"):
        run_specs(record)
