"""The cost model's schemes and compressor facts (qbench/costmodel/schemes.py, and the
``--scheme`` option that reads them), against literal expectations: the scheme each spec gives,
the exact message of each spec it rejects,
the bits per value of fixed-size compressors, and the integer widths' overflow error."""

from __future__ import annotations

import pytest

from qbench import catalog
from qbench.catalog import CompressorSpec
from qbench.catalog.schemes.traffic import int_sum_bytes
from qbench.cli.cost.configs import scheme_option
from qbench.costmodel import Scheme
from qbench.costmodel.schemes import nominal_bits_per_value
from qbench.errors import UserError


def spec(label: str) -> CompressorSpec:
    """The catalog's compressor behind a label (the model takes specs, tables name labels)."""
    return catalog.from_label(label)


# --scheme spec: (name, overlap, backward, bucket_cap_mb) of the model's scheme
PARSED = {
    "allreduce": ("allreduce", 1, False, None),
    "reduce-broadcast:overlap=2": ("reduce-broadcast", 2, False, None),
    "integer-allreduce:overlap=16": ("integer-allreduce", 16, False, None),
    "ddp": ("ddp", 1, True, None),
    # allreduce per DDP bucket is ddp, however it is spelt
    "allreduce:backward=true": ("ddp", 1, True, None),
    "allreduce:backward=TRUE": ("ddp", 1, True, None),
    "reduce-broadcast:backward=true": ("reduce-broadcast", 1, True, None),
    "reduce-broadcast:backward=false": ("reduce-broadcast", 1, False, None),
    # several KEY=VALUE items, spaces around them
    "reduce-broadcast: backward = true , bucket_cap_mb = 5": ("reduce-broadcast", 1, True, 5.0),
    "ddp:bucket_cap_mb=10": ("ddp", 1, True, 10.0),
    "ddp:bucket_cap_mb=0.5": ("ddp", 1, True, 0.5),  # below 1 MB is a size too
    "ddp:bucket_cap_mb=100000": ("ddp", 1, True, 1e5),  # the largest cap
    "ddp:gradient_as_bucket_view=true": ("ddp", 1, True, None),
    "lowprec-allreduce": ("lowprec-allreduce", 1, False, None),  # the model's own projection
}


@pytest.mark.parametrize("text", sorted(PARSED))
def test_scheme_options_are_read_by_the_catalog(text: str) -> None:
    s = scheme_option(text)
    assert (s.name, s.overlap, s.backward, s.bucket_cap_mb) == PARSED[text]


# --scheme spec: the whole error message (the catalog's, but for what the model cannot time)
REJECTED = {
    "gossip": "the cost model has no scheme 'gossip'; valid: allreduce, reduce-broadcast, "
    "allgather, simulated-lowprec, integer-allreduce, hierarchical, lowprec-allreduce, ddp",
    "allreduce:zeta=1,alpha=2": "scheme allreduce: unknown parameter 'zeta'; valid: backward, "
    "bucket_cap_mb, gradient_as_bucket_view",
    "reduce-broadcast:overlap=x": "scheme reduce-broadcast: overlap must be an integer (a chunk "
    "count >= 1), got 'x' (str); e.g. `overlap: 4`",
    "reduce-broadcast:overlap=0": "scheme reduce-broadcast: overlap must be a chunk count >= 1, "
    "got 0; e.g. `overlap: 4`",
    "allgather:overlap=2": "scheme allgather: unknown parameter 'overlap'; valid: backward, "
    "bucket_cap_mb, gradient_as_bucket_view",
    "ddp:backward=maybe": "scheme ddp: unknown parameter 'backward'; valid: bucket_cap_mb, "
    "gradient_as_bucket_view",
    "ddp:gradient_as_bucket_view=1": "scheme ddp: gradient_as_bucket_view must be true or false, "
    "got 1 (int); e.g. `gradient_as_bucket_view: false`",
    "ddp:bucket_cap_mb=abc": "scheme ddp: bucket_cap_mb must be a number (a size in MB > 0), got "
    "'abc' (str); e.g. `bucket_cap_mb: 25.0`",
    "ddp:bucket_cap_mb=0": "scheme ddp: bucket_cap_mb must be a size in MB > 0, got 0; e.g. "
    "`bucket_cap_mb: 25.0`",
    "ddp:bucket_cap_mb=100000.5": "scheme ddp: bucket_cap_mb must be a size in MB > 0, got "
    "100000.5; e.g. `bucket_cap_mb: 25.0`",
    "simulated-lowprec:backward=true": "scheme simulated-lowprec takes no parameters, got "
    "'backward'",
    "allreduce:bucket_cap_mb=10": "scheme allreduce: bucket_cap_mb and gradient_as_bucket_view "
    "need `backward: true`",
    "reduce-broadcast:backward=true,overlap=2": "scheme reduce-broadcast: the cost model has no "
    "per-bucket pipeline",
    "reduce-broadcast:overlap": "scheme spec 'reduce-broadcast:overlap': 'overlap' is not "
    "KEY=VALUE; e.g. `--scheme reduce-broadcast:overlap=4`",
    "lowprec-allreduce:overlap=2": "scheme 'lowprec-allreduce:overlap=2': lowprec-allreduce "
    "takes no parameters",
    # the cost model's old spellings: refused, naming the catalog spec that says the same
    "reduce-broadcast+overlap16": "scheme 'reduce-broadcast+overlap16': write it as a spec, e.g. "
    "`--scheme reduce-broadcast:overlap=16`",
    "reduce-broadcast+backward": "scheme 'reduce-broadcast+backward': write it as a spec, e.g. "
    "`--scheme reduce-broadcast:backward=true`",
    "ddp+bucket_cap_mb10.0": "scheme 'ddp+bucket_cap_mb10.0': write it as a spec, e.g. "
    "`--scheme ddp:bucket_cap_mb=10.0`",
    "allreduce+backward": "scheme 'allreduce+backward': write it as a spec, e.g. "
    "`--scheme allreduce:backward=true`",
    "allgather+over-lap": "scheme 'allgather+over-lap': write it as a spec, e.g. "
    "`--scheme reduce-broadcast:overlap=16`",
}


@pytest.mark.parametrize("text", sorted(REJECTED))
def test_rejected_scheme_options_say_why(text: str) -> None:
    with pytest.raises(UserError) as got:
        scheme_option(text)
    assert str(got.value) == REJECTED[text]


def test_a_run_overlap_label_moves_a_scheme_to_backward_or_rejects() -> None:
    flat = Scheme("reduce-broadcast")
    assert flat.per_bucket(None) is flat and flat.per_bucket("none") is flat
    assert flat.per_bucket("backward") == Scheme("reduce-broadcast", 1, True, None)
    with pytest.raises(UserError) as got:
        Scheme("ddp", backward=True).per_bucket("sideways")
    assert str(got.value) == "overlap must be backward or none, got 'sideways'"


@pytest.mark.parametrize(
    ("flat", "message"),
    [(Scheme("simulated-lowprec"), "scheme simulated-lowprec: only allreduce, reduce-broadcast, "
      "allgather, integer-allreduce run per bucket during backward"),
     (Scheme("lowprec-allreduce"), "scheme lowprec-allreduce: only allreduce, reduce-broadcast, "
      "allgather, integer-allreduce run per bucket during backward"),
     (Scheme("reduce-broadcast", 4), "scheme reduce-broadcast: the cost model has no per-bucket "
      "pipeline")],
)  # fmt: skip
def test_schemes_the_model_cannot_time_per_bucket(flat: Scheme, message: str) -> None:
    assert Scheme("allreduce").per_bucket("backward") == Scheme("ddp", 1, True, None)
    with pytest.raises(UserError) as got:
        flat.per_bucket("backward")
    assert str(got.value) == message


# label: wire bits per value at 2^20 values, metadata included
NOMINAL = {
    "fp32": 32.0,
    "bf16": 16.0,
    "qsgd-4b-b512": 4 + 32 / 512,  # 2^19 bytes of levels + 2048 fp32 scales: 4.0625
    "qsgd-16b-b1024": 16 + 32 / 1024,
    "1bit-b64": 1 + 64 / 64,  # a sign bit, and two fp32 means per 64 values
    "fixed-8b": 8 + 16 / 2**20,  # one int16 exponent for the whole gradient
    "fixed-8b-d0.5": 8.0,  # a given step: no exponent sent
    "topk-1%": 64 * 10486 / 2**20,  # ceil(0.01 x 2^20) = 10486 fp32 values + int32 indices
}


@pytest.mark.parametrize("label", sorted(NOMINAL))
def test_nominal_bits_per_value_at_a_mebivalue(label: str) -> None:
    assert nominal_bits_per_value(spec(label)) == NOMINAL[label]


def test_compressors_without_a_fixed_size() -> None:
    assert nominal_bits_per_value(spec("adaptive-c6-m4-f3%")) is None  # depends on the data
    assert nominal_bits_per_value(spec("powersgd-r1")) is None  # on the model's matrices


def test_integer_widths_that_overflow_int32_are_user_errors() -> None:
    # 8 bits: level 127; 2^24 ranks x 127 = 2130706432 still fits int32, 2^25 ranks do not
    assert int_sum_bytes("gloo", 2**24, 127) == 4
    with pytest.raises(UserError) as got:
        int_sum_bytes("gloo", 2**25, 127)
    assert str(got.value) == "integer-allreduce: 33554432 ranks x integers up to 127 overflow int32"


# a run's recorded scheme spec (as qbench.records.view returns it) -> the model's scheme
RECORDED = [
    ({"name": "reduce-broadcast", "overlap": 16}, ("reduce-broadcast", 16, False, None)),
    ({"name": "integer-allreduce"}, ("integer-allreduce", 1, False, None)),
    ({"name": "ddp", "bucket_cap_mb": 10}, ("ddp", 1, True, 10.0)),
    ({"name": "allreduce", "backward": True}, ("ddp", 1, True, None)),
    ({"name": "reduce-broadcast", "backward": True, "bucket_cap_mb": 5.0},
     ("reduce-broadcast", 1, True, 5.0)),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "want"), RECORDED)
def test_a_recorded_spec_is_read_as_is(
    raw: dict[str, object], want: tuple[str, int, bool, float | None]
) -> None:
    s = Scheme.of(catalog.scheme(raw))
    assert (s.name, s.overlap, s.backward, s.bucket_cap_mb) == want


@pytest.mark.parametrize(
    ("raw", "message"),
    [({"name": "gossip"}, "the cost model has no scheme 'gossip'"),
     ({"name": "reduce-broadcast", "backward": True, "overlap": 4}, "no per-bucket pipeline")],
)  # fmt: skip
def test_a_recorded_spec_the_model_cannot_time(raw: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        Scheme.of(catalog.scheme(raw))
