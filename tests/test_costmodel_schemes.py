"""The cost model's scheme labels and compressor facts (qbench/costmodel/schemes.py), against
literal expectations: what each label parses to, the exact message of each label it rejects,
the bits per value of fixed-size compressors, and the integer widths' overflow error."""

from __future__ import annotations

import pytest

from qbench import catalog
from qbench.costmodel import Scheme
from qbench.costmodel.schemes import int_sum_bytes, nominal_bits_per_value, qsgd_params
from qbench.errors import UserError

# label: (name, overlap, backward, bucket_cap_mb)
PARSED = {
    "allreduce": ("allreduce", 1, False, None),
    "reduce-broadcast+overlap2": ("reduce-broadcast", 2, False, None),
    "integer-allreduce:overlap=16": ("integer-allreduce", 16, False, None),
    "ddp": ("ddp", 1, True, None),
    # allreduce per DDP bucket is ddp, however it is spelt
    "allreduce+backward": ("ddp", 1, True, None),
    "allreduce:backward=TRUE": ("ddp", 1, True, None),
    "reduce-broadcast+backward": ("reduce-broadcast", 1, True, None),
    "reduce-broadcast:backward=false": ("reduce-broadcast", 1, False, None),
    # several KEY=VALUE items, spaces around them
    "reduce-broadcast: backward = true , bucket_cap_mb = 5": ("reduce-broadcast", 1, True, 5.0),
    "ddp+bucket_cap_mb10.0": ("ddp", 1, True, 10.0),
    "ddp:bucket_cap_mb=0.5": ("ddp", 1, True, 0.5),  # below 1 MB is a size too
    "ddp:bucket_cap_mb=100000": ("ddp", 1, True, 1e5),  # the largest cap
    "ddp:gradient_as_bucket_view=true": ("ddp", 1, True, None),
}


@pytest.mark.parametrize("label", sorted(PARSED))
def test_labels_parse_to_the_written_scheme(label: str) -> None:
    name, overlap, backward, cap = PARSED[label]
    assert Scheme.parse(label) == Scheme(name, overlap, backward, cap)


# label: the whole error message
REJECTED = {
    "gossip": "the cost model has no scheme 'gossip'; valid: allreduce, reduce-broadcast, "
    "allgather, integer-allreduce, simulated-lowprec, lowprec-allreduce, ddp",
    "allreduce:zeta=1,alpha=2": "scheme 'allreduce:zeta=1,alpha=2': unknown parameter 'alpha'",
    "reduce-broadcast:overlap=x": "scheme 'reduce-broadcast:overlap=x': overlap must be a whole "
    "number",
    "reduce-broadcast:overlap=0": "scheme 'reduce-broadcast:overlap=0': overlap must be >= 1 and "
    "needs one of reduce-broadcast, integer-allreduce",
    "allgather+overlap2": "scheme 'allgather+overlap2': overlap must be >= 1 and needs one of "
    "reduce-broadcast, integer-allreduce",
    "ddp:backward=maybe": "scheme 'ddp:backward=maybe': backward must be true or false, got "
    "'maybe'",
    "ddp:gradient_as_bucket_view=1": "scheme 'ddp:gradient_as_bucket_view=1': "
    "gradient_as_bucket_view must be true or false, got '1'",
    "ddp:bucket_cap_mb=abc": "scheme 'ddp:bucket_cap_mb=abc': bucket_cap_mb must be a size in "
    "MB > 0, got 'abc'",
    "ddp:bucket_cap_mb=0": "scheme 'ddp:bucket_cap_mb=0': bucket_cap_mb must be a size in MB > "
    "0, got '0'",
    "ddp:bucket_cap_mb=100000.5": "scheme 'ddp:bucket_cap_mb=100000.5': bucket_cap_mb must be a "
    "size in MB > 0, got '100000.5'",
    # the first '=' splits key from value
    "ddp:bucket_cap_mb=1=2": "scheme 'ddp:bucket_cap_mb=1=2': bucket_cap_mb must be a size in MB "
    "> 0, got '1=2'",
    "simulated-lowprec+backward": "scheme 'simulated-lowprec+backward': only allreduce, "
    "reduce-broadcast, allgather, integer-allreduce run per bucket during backward",
    "allreduce:bucket_cap_mb=10": "scheme 'allreduce:bucket_cap_mb=10': DDP options need "
    "`backward=true` (or ddp)",
    "allreduce:gradient_as_bucket_view=false": "scheme 'allreduce:gradient_as_bucket_view=false': "
    "DDP options need `backward=true` (or ddp)",
    "reduce-broadcast:backward=true,overlap=2": "scheme 'reduce-broadcast:backward=true,"
    "overlap=2': the cost model has no per-bucket pipeline",
    "reduce-broadcast+over-lap": "scheme 'reduce-broadcast+over-lap': cannot read 'over-lap'; "
    "e.g. `+overlap16`",
    "reduce-broadcast:overlap": "scheme 'reduce-broadcast:overlap': 'overlap' is not KEY=VALUE; "
    "e.g. `:overlap=16`",
}


@pytest.mark.parametrize("label", sorted(REJECTED))
def test_rejected_labels_say_why(label: str) -> None:
    with pytest.raises(UserError) as got:
        Scheme.parse(label)
    assert str(got.value) == REJECTED[label]


def test_a_run_overlap_label_moves_a_scheme_to_backward_or_rejects() -> None:
    flat = Scheme("reduce-broadcast")
    assert flat.per_bucket(None) is flat and flat.per_bucket("none") is flat
    assert flat.per_bucket("backward") == Scheme("reduce-broadcast", 1, True, None)
    with pytest.raises(UserError) as got:
        Scheme("ddp", backward=True).per_bucket("sideways")
    assert str(got.value) == "overlap must be backward or none, got 'sideways'"


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
    assert nominal_bits_per_value(label) == NOMINAL[label]


def test_labels_without_a_fixed_size_or_an_entry() -> None:
    assert nominal_bits_per_value("adaptive-c6-m4-f3%") is None  # depends on the data
    assert nominal_bits_per_value("powersgd-r1") is None
    assert nominal_bits_per_value("no-such-compressor") is None
    assert qsgd_params("qsgd-6b-b256") == (6, 256)
    assert qsgd_params("fp16") is None and qsgd_params("no-such-compressor") is None


def test_integer_widths_that_overflow_int32_are_user_errors() -> None:
    # 8 bits: level 127; 2^24 ranks x 127 = 2130706432 still fits int32, 2^25 ranks do not
    assert int_sum_bytes("gloo", 2**24, 8) == 4
    with pytest.raises(UserError) as got:
        int_sum_bytes("gloo", 2**25, 8)
    assert str(got.value) == "integer-allreduce: 33554432 ranks x 8-bit levels overflow int32"


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
