"""The codec roofline's arithmetic (qbench.spec.roofline), each number worked out by hand."""

from __future__ import annotations

import math

import pytest

from qbench import catalog
from qbench.bench.render import link_rate
from qbench.errors import UserError
from qbench.spec import roofline

N = 2**20


def test_qsgd_4bit_encode_moves_4_5_bytes_a_value() -> None:
    """4 bytes of gradient in, half a byte of levels out, and a 4-byte scale per 512 values:
    4.5078125 bytes a value, so its floor is 4.5078125 / 8 of a copy's time."""
    wire = catalog.compressor("qsgd:bits=4,bucket_size=512").wire_bytes(N)
    assert wire == N // 2 + 4 * (N // 512)
    moved = roofline.moved_bytes(wire, N, "encode", error_feedback=False)
    assert moved == 4.5078125 * N
    assert roofline.floor_seconds(moved, N, copy_seconds=8.0) == 4.5078125
    assert roofline.floor_seconds(moved, N, copy_seconds=1.0) == pytest.approx(4.5 / 8, rel=2e-3)
    # decode: the same payload in, 4 bytes a value out
    assert roofline.moved_bytes(wire, N, "decode", error_feedback=False) == 4.5078125 * N


def test_onebit_with_error_feedback_reads_and_writes_the_residual() -> None:
    """4 (gradient) + 1/8 (signs) + 8 (residual in and out) + 1/8 (avg+ and avg-, 8 bytes per
    64 values) = 12.25 bytes a value."""
    spec = catalog.compressor("onebit:bucket_size=64")
    assert spec.error_feedback
    wire = spec.wire_bytes(N)
    assert wire == N // 8 + 8 * (N // 64)
    assert roofline.moved_bytes(wire, N, "encode", error_feedback=True) == 12.25 * N
    assert roofline.moved_bytes(wire, N, "encode", error_feedback=False) == 4.25 * N
    assert roofline.moved_bytes(wire, N, "decode", error_feedback=True) == 4.25 * N


def test_fp32_moves_what_a_copy_moves() -> None:
    """``none`` sends the fp32 values: encode and decode each read 4 and write 4 bytes a value,
    so the floor is one copy's time; a decode that accumulates also reads its buffer."""
    wire = catalog.compressor("none").wire_bytes(N)
    assert wire == 4 * N
    for op in ("encode", "decode"):
        moved = roofline.moved_bytes(wire, N, op, error_feedback=False)
        assert moved == 8 * N
        assert roofline.floor_seconds(moved, N, copy_seconds=3e-3) == 3e-3
    assert roofline.moved_bytes(wire, N, "decode", error_feedback=False, accumulate=True) == 12 * N
    with pytest.raises(ValueError, match="'copy'"):
        roofline.moved_bytes(wire, N, "copy", error_feedback=False)


def test_rates_are_input_bytes_and_copy_bytes() -> None:
    assert roofline.input_gbps(10**9, 2.0) == 2.0  # 4 GB of fp32 in 2 s
    assert roofline.copy_gbps(10**9, 2.0) == 4.0  # 8 GB moved in 2 s


def test_breakeven_by_hand() -> None:
    """C_enc 10 GB/s, C_dec 20 GB/s, r = 8: B* = (1 - 1/8) / (1/10e9 + 1/20e9) = 5.8333e9 B/s
    = 46.667 Gbit/s; half the codec hidden doubles it, three quarters quadruples it."""
    assert roofline.breakeven_gbit(10e9, 20e9, 8) == pytest.approx(46.6667, rel=1e-5)
    assert roofline.breakeven_gbit(10e9, 20e9, 8, overlap=0.5) == pytest.approx(93.3333, rel=1e-5)
    assert roofline.breakeven_gbit(10e9, 20e9, 8, 0.75) == pytest.approx(186.667, rel=1e-5)
    # The same from times: 10^6 values (4 MB) in 0.4 ms and 0.2 ms, 500 kB on the wire.
    assert roofline.breakeven_of_times(10**6, 500_000, 4e-4, 2e-4) == pytest.approx(46.6667)
    # Compression pays against a raw send exactly up to B*: check the two sides of it.
    n, wire, t_enc, t_dec = 10**6, 500_000, 4e-4, 2e-4
    b = roofline.breakeven_of_times(n, wire, t_enc, t_dec)
    assert b is not None
    for factor, pays in ((0.99, True), (1.01, False)):
        rate = b * factor * 1e9 / 8  # bytes/s
        assert (wire / rate + t_enc + t_dec < 4 * n / rate) is pays


def test_breakeven_edges() -> None:
    assert roofline.breakeven_gbit(10e9, 20e9, 8, overlap=1.0) == math.inf  # any link
    assert roofline.breakeven_gbit(10e9, 20e9, 1.0) is None  # fp32: never
    assert roofline.breakeven_gbit(10e9, 20e9, 0.5) is None  # a payload bigger than fp32
    assert roofline.breakeven_gbit(10e9, 20e9, 1.0, overlap=1.0) is None  # never, even hidden
    assert roofline.breakeven_of_times(256, 1024, 1e-6, 1e-6) is None  # r = 1
    assert roofline.breakeven_of_times(256, 0, 1e-6, 1e-6) == pytest.approx(1024 * 8 / 2e-6 / 1e9)
    with pytest.raises(ValueError, match="overlap"):
        roofline.breakeven_gbit(1.0, 1.0, 2.0, overlap=1.5)
    assert [link_rate(x) for x in (None, math.inf, 46.6667, 0.0193, 12345.6)] == [
        "never", "any", "46.7", "0.0193", "12,346",
    ]  # fmt: skip


@pytest.mark.parametrize("bad", [1.0, 1.5, -0.1, math.nan])
def test_overlap_must_be_a_fraction_below_one(bad: float) -> None:
    with pytest.raises(UserError) as e:
        roofline.check_overlap(bad)
    assert "0 <= F < 1" in str(e.value) and "--overlap 0.5" in str(e.value)
    assert "\n" not in str(e.value)


def test_overlap_in_range_is_fine() -> None:
    for ok in (0.0, 0.5, 0.999):
        roofline.check_overlap(ok)


def test_place_puts_both_ops_on_the_roofline() -> None:
    """1bitSGD at 1024 values: 256 wire bytes, EF; the copy took 1 µs (8 kB: 8.192 GB/s)."""
    placed = roofline.place(
        1024, {"encode": 3e-6, "decode": 1e-6}, 1e-6, wire_bytes=256, measured=999,
        error_feedback=True, overlap=0.5,
    )  # fmt: skip
    enc, dec = placed["encode"], placed["decode"]
    assert enc.moved_bytes == 12 * 1024 + 256 and dec.moved_bytes == 256 + 4 * 1024
    assert enc.floor_seconds == pytest.approx((12 * 1024 + 256) / 8192 * 1e-6)
    assert enc.floor_ratio == pytest.approx(3e-6 / enc.floor_seconds)
    assert dec.floor_ratio == pytest.approx(1e-6 / (4352 / 8192 * 1e-6))
    assert enc.copy_gbps == pytest.approx(8.192)
    # r = 16: (1 - 1/16) * 4096 B / 4 µs = 960 MB/s = 7.68 Gbit/s, the same on both rows.
    assert enc.breakeven_gbit == dec.breakeven_gbit == pytest.approx(7.68)
    assert enc.breakeven_overlap_gbit == pytest.approx(15.36)
    # No catalog size (a data-dependent payload): the measured one counts.
    measured = roofline.place(
        1024, {"encode": 1.0, "decode": 1.0}, 1.0, wire_bytes=None, measured=999,
        error_feedback=False, overlap=0.0,
    )  # fmt: skip
    assert measured["encode"].moved_bytes == 4096 + 999


def test_summary_takes_the_median_copy_per_size() -> None:
    # skewed, as a busy machine's samples are: 256's median is 2 us, its mean 4 us
    doc = roofline.summary(0.25, [(256, [1e-6, 9e-6]), (1024, [4e-6]), (256, [2e-6])])
    assert doc["overlap"] == 0.25
    assert doc["copy"] == [
        {"numel": 256, "copy_seconds": 2e-6, "copy_gbps": pytest.approx(1.024), "samples": 3},
        {"numel": 1024, "copy_seconds": 4e-6, "copy_gbps": pytest.approx(2.048), "samples": 1},
    ]


def test_breakeven_just_above_no_compression_and_to_the_last_digit() -> None:
    """r = 1.25 (a 16-bit payload plus headers) still pays on slow links: (1 - 0.8) * 1e9 B/s
    = 1.6 Gbit/s with both codecs at 2 GB/s; r = 2: 4 Gbit/s. The formula's units are exact."""
    assert roofline.breakeven_gbit(2e9, 2e9, 1.25) == pytest.approx(1.6, rel=1e-12)
    assert roofline.breakeven_gbit(2e9, 2e9, 2.0) == pytest.approx(4.0, rel=1e-12)
    # one wire byte for 1,000 values (r = 4,000), not "free": (1 - 1/4000) * 4000 B / 2 s
    assert roofline.breakeven_of_times(1000, 1, 1.0, 1.0) == pytest.approx(
        (1 - 1 / 4000) * 2000 * 8 / 1e9, rel=1e-12
    )


def test_place_passes_error_feedback_and_accumulation_through() -> None:
    placed = roofline.place(
        1024, {"encode": 1e-6, "decode": 1e-6}, 1e-6, wire_bytes=256, measured=0,
        error_feedback=True, overlap=0.0, accumulate=True,
    )  # fmt: skip
    assert placed["encode"].error_feedback is True and placed["decode"].error_feedback is True
    assert placed["decode"].moved_bytes == 256 + 8 * 1024  # the accumulating buffer is read too
    assert placed["encode"].moved_bytes == 256 + 12 * 1024


def test_the_overlap_message_in_full() -> None:
    with pytest.raises(UserError) as e:
        roofline.check_overlap(2.0)
    assert str(e.value) == (
        "overlap is the fraction of codec time hidden, 0 <= F < 1, got 2; e.g. `--overlap 0.5`"
    )
