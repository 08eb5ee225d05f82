"""Compressors: exact wire sizes, wire round trips, QSGD statistics, 1bitSGD error feedback."""

from __future__ import annotations

import math

import pytest
import torch

from qbench.compress import COMPRESSORS, Compressor, Payload, build, from_spec
from qbench.compress.kernels import native
from qbench.compress.kernels.bitpack import unpack
from qbench.compress.none import NoCompression
from qbench.compress.onebit import OneBit
from qbench.compress.qsgd import QSGD
from qbench.errors import UserError
from tests import compiled

QSGD_BITS = (1, 2, 3, 4, 5, 6, 7, 8, 16)
ODD_LENGTHS = (0, 1, 7, 9, 63, 1023, 4097)
QSGD_VARIANTS = [
    (bits, layout, norm)
    for bits in QSGD_BITS
    for layout in ("intervals", "sign")
    for norm in ("max", "l2")
    if not (layout == "sign" and bits == 1)
]


def _grad(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _expected_nbytes(c: Compressor, n: int) -> int:
    """The wire size written out from each algorithm's definition."""
    if isinstance(c, QSGD):
        levels = 2 * n if c.bits == 16 else _ceil(n * c.bits, 8)
        return levels + 4 * _ceil(n, c.bucket_size)
    if isinstance(c, OneBit):
        return _ceil(n, 8) + 2 * 4 * _ceil(n, c.bucket_size)
    assert isinstance(c, NoCompression)
    return 4 * n


def _all_compressors() -> list[Compressor]:
    out: list[Compressor] = [build("none")]
    for bits, layout, norm in QSGD_VARIANTS:
        out.append(build("qsgd", bits=bits, layout=layout, norm=norm, bucket_size=7))
    for bits in QSGD_BITS:  # bucket edge cases: one value per scale, one scale for most lengths
        out += [build("qsgd", bits=bits, bucket_size=1), build("qsgd", bits=bits, bucket_size=512)]
    for bucket_size in (1, 5, 64):
        out.append(build("onebit", bucket_size=bucket_size))
        out.append(build("onebit", bucket_size=bucket_size, error_feedback=False))
    return out


ALL = _all_compressors()


# -- sizes and the wire -----------------------------------------------------------------------
@pytest.mark.parametrize("c", ALL, ids=lambda c: c.label)
def test_nbytes_is_exact_and_matches_wire_layout(c: Compressor) -> None:
    for n in ODD_LENGTHS:
        payload = c.encode(_grad(n), name=f"g{n}")
        layout = c.wire_layout(n)
        assert payload.nbytes == c.wire_nbytes(n) == _expected_nbytes(c, n)
        assert [f.name for f in layout] == list(payload.buffers)
        for f in layout:
            buf = payload.buffers[f.name]
            assert (buf.dtype, buf.numel()) == (f.dtype, f.numel), (n, f)


@pytest.mark.parametrize("c", ALL, ids=lambda c: c.label)
def test_wire_round_trip_decodes_identically(c: Compressor) -> None:
    for n in ODD_LENGTHS:
        payload = c.encode(_grad(n, seed=n), step=3, name=f"g{n}")
        wire = payload.to_wire()
        assert wire.dtype == torch.uint8 and wire.numel() == payload.nbytes
        # A receiver's buffer may start at any byte of a larger allocation.
        shifted = torch.cat([torch.zeros(3, dtype=torch.uint8), wire])[3:]
        for received in (wire, shifted):
            decoded = c.decode(c.from_wire(received, n))
            assert torch.equal(decoded, c.decode(payload))
            assert decoded.dtype == torch.float32 and decoded.shape == (n,)


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_decode_into_out_adds(name: str) -> None:
    c = build(name)
    g = _grad(100)
    payload = c.encode(g)
    out = torch.ones(100)
    assert c.decode(payload, out=out) is out
    assert torch.allclose(out, 1.0 + c.decode(payload))


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_a_payload_counts_the_values_it_encodes(name: str) -> None:
    """``numel`` is what a receiver sizes its output by (a multi-piece decode, ``from_wire``)."""
    c = build(name)
    assert [c.encode(_grad(n), name=f"g{n}").numel for n in (1, 100)] == [1, 100]


def test_none_is_the_identity() -> None:
    c = build("none")
    g = _grad(9)
    payload = c.encode(g)
    assert payload.nbytes == 36 and list(payload.buffers) == ["values"]
    assert c.decode(payload) is g  # copy-free
    assert (c.label, c.nominal_bits, c.stateful) == ("fp32", 32.0, False)


# -- QSGD ---------------------------------------------------------------------------------------
def _level_spacing(x: torch.Tensor, c: QSGD) -> torch.Tensor:
    """Distance between the two levels around each value (0 in an all-zero bucket)."""
    pad = -x.numel() % c.bucket_size
    buckets = torch.cat([x, x.new_zeros(pad)]).view(-1, c.bucket_size).double()
    s = buckets.abs().amax(1) if c.norm == "max" else buckets.norm(dim=1)
    top = (2**c.bits - 1) / 2 if c.layout == "intervals" else 2 ** (c.bits - 1) - 1
    return (s / top).repeat_interleave(c.bucket_size)[: x.numel()]


@pytest.mark.parametrize(("bits", "layout", "norm"), QSGD_VARIANTS)
def test_qsgd_is_unbiased(bits: int, layout: str, norm: str) -> None:
    c = QSGD(bits=bits, layout=layout, norm=norm, bucket_size=64)  # type: ignore[arg-type]
    x = _grad(500, seed=bits)
    x[::37] = 0.0
    x[128:192] = 0.0  # an all-zero bucket
    steps = 100
    decoded = torch.stack([c.decode(c.encode(x, step=k)) for k in range(steps)]).double()
    err = decoded - x.double()
    delta = _level_spacing(x, c)
    # Per value: stochastic rounding between levels delta apart has std <= delta / 2.
    bound = 5 * delta / (2 * math.sqrt(steps)) + 1e-6 * delta.max()
    assert bool((err.mean(0).abs() <= bound).all())
    assert torch.equal(err[:, 128:192], torch.zeros(steps, 64, dtype=torch.float64))
    # Whole vector: t-tests across steps (independent draws) of the summed error, and of the
    # error signed like x (catches rounding towards or away from zero).
    for weights in (torch.ones_like(x), torch.sign(x)):
        totals = err @ weights.double()
        assert abs(totals.mean()) <= 4 * totals.std() / math.sqrt(steps) + 1e-9


@pytest.mark.parametrize("bits", [b for b in QSGD_BITS if b > 1])
@pytest.mark.parametrize("vector", ["gaussian", "flat"])
def test_qsgd_l2_variance_bound(bits: int, vector: str) -> None:
    """Alistarh et al., lemma 3.1: E||Q(v) - v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2 per bucket."""
    d, s = 64, 2 ** (bits - 1) - 1
    c = QSGD(bits=bits, layout="sign", norm="l2", bucket_size=d)
    # Equal magnitudes make the sqrt(d)/s bound nearly tight at small s.
    v = _grad(4 * d, seed=bits) if vector == "gaussian" else torch.sign(_grad(4 * d)) * 0.3
    steps = 100
    sq_err = [
        float((c.decode(c.encode(v, step=k)) - v).double().square().sum()) for k in range(steps)
    ]
    mse = sum(sq_err) / steps
    bound = min(d / s**2, math.sqrt(d) / s) * float(v.double().square().sum())
    assert mse <= bound
    # And the variance is the minimal one of rounding between adjacent levels: delta^2 p(1-p).
    delta = _level_spacing(v, c)
    p = (v.double().abs() / delta) % 1.0
    exact = float((delta.square() * p * (1 - p)).sum())
    assert mse == pytest.approx(exact, rel=0.1, abs=1e-9 * bound)


def test_qsgd_all_zero_bucket_encodes_to_zeros() -> None:
    for layout in ("intervals", "sign"):
        c = QSGD(bits=4, bucket_size=8, layout=layout)  # type: ignore[arg-type]
        x = torch.cat([torch.zeros(8), _grad(8)])
        payload = c.encode(x)
        assert payload.buffers["levels"][:4].tolist() == [0, 0, 0, 0]
        assert payload.buffers["scales"][0].item() == 0.0
        assert torch.equal(c.decode(payload)[:8], torch.zeros(8))


def test_qsgd_levels_hit_the_ends_exactly() -> None:
    # The max-|x| value of a bucket sits on the top level: decoded exactly, at every width.
    x = torch.tensor([-3.0, 1.0, 3.0, 0.5])
    for bits, layout, _ in QSGD_VARIANTS:
        c = QSGD(bits=bits, layout=layout, bucket_size=4)  # type: ignore[arg-type]
        decoded = c.decode(c.encode(x, step=1))
        assert decoded[[0, 2]].tolist() == [-3.0, 3.0]
        assert bool((decoded.abs() <= 3.0).all())


def _wire_bytes(c: Compressor, x: torch.Tensor, **kw: int) -> bytes:
    return bytes(c.encode(x, **kw).to_wire().tolist())


@pytest.mark.parametrize("bits", QSGD_BITS)
def test_qsgd_is_deterministic_per_key(bits: int) -> None:
    x = _grad(1001)
    first = _wire_bytes(QSGD(bits=bits, seed=7), x, step=5, rank=1)
    assert _wire_bytes(QSGD(bits=bits, seed=7), x, step=5, rank=1) == first
    for other in (dict(step=6, rank=1), dict(step=5, rank=2), dict(step=5, rank=1, stream=1)):
        assert _wire_bytes(QSGD(bits=bits, seed=7), x, **other) != first
    assert _wire_bytes(QSGD(bits=bits, seed=8), x, step=5, rank=1) != first


@pytest.mark.parametrize(("bits", "layout", "norm"), QSGD_VARIANTS)
def test_qsgd_range_encode_matches_whole_vector(bits: int, layout: str, norm: str) -> None:
    c = QSGD(bits=bits, layout=layout, norm=norm, bucket_size=64)  # type: ignore[arg-type]
    v = _grad(1000, seed=3)
    whole = c.encode(v, step=2)
    whole_codes = _codes(whole, bits)
    for a, b in ((128, 640), (0, 64), (960, 1000)):  # bucket-aligned, or running to the end
        part = c.encode(v[a:b], step=2, offset=a)
        assert torch.equal(_codes(part, bits), whole_codes[a:b])
        assert torch.equal(part.buffers["scales"], whole.buffers["scales"][a // 64 : _ceil(b, 64)])
        assert torch.equal(c.decode(part), c.decode(whole)[a:b])


def _codes(payload: Payload, bits: int) -> torch.Tensor:
    levels = payload.buffers["levels"]
    if bits == 16:
        return levels.view(-1, 2).to(torch.int32) @ torch.tensor([1, 256], dtype=torch.int32)
    return unpack(levels, bits, payload.numel).to(torch.int32)


def test_qsgd_labels_and_bits() -> None:
    assert build("qsgd").label == "qsgd-4b-b512"
    assert build("qsgd", bits=8, bucket_size=128, norm="l2", layout="sign").label == (
        "qsgd-8b-b128-l2-sign"
    )
    assert build("qsgd", bits=16).nominal_bits == 16
    assert build("qsgd").stateful is False


def test_qsgd_error_feedback_carries_the_quantization_error() -> None:
    """2-bit QSGD with error feedback (the low-bit outer gradients of issue 47): each step sends
    g + e_prev - e_new exactly, so what was sent differs from the gradients so far by the
    current residual; without it the error of the sum grows. Label and capabilities follow."""
    ef = build("qsgd", bits=2, bucket_size=128, error_feedback=True)
    plain = build("qsgd", bits=2, bucket_size=128)
    assert (ef.label, ef.stateful, plain.stateful) == ("qsgd-2b-b128-ef", True, False)
    assert ef.spec.entry.unbiased(ef.spec.params) is False
    sent_ef, sent_no, total, residual = torch.zeros(640), torch.zeros(640), torch.zeros(640), 0
    for step in range(60):
        g = _grad(640, seed=step) + 0.2
        total += g
        decoded = ef.decode(ef.encode(g, step=step, name="w"))
        assert float((decoded + ef.state["w"] - (g + residual)).abs().max()) <= 1e-5
        residual = ef.state["w"].clone()
        sent_ef += decoded
        sent_no += plain.decode(plain.encode(g, step=step, name="w"))
    assert float((total - sent_ef - ef.state["w"]).abs().max()) <= 1e-3
    assert (sent_ef - total).norm() < 0.25 * (sent_no - total).norm()
    assert plain.state == {}


def test_qsgd_error_feedback_is_the_same_bytes_on_the_c_kernels_and_torch() -> None:
    """Three steps through the compiled path and the torch reference: the same payloads and
    residuals, bit for bit (the residual is the payload's own decode subtracted)."""
    compiled.require_c_kernels()
    runs = {}
    for backend in ("native", "torch"):
        c = build("qsgd", bits=2, bucket_size=128, error_feedback=True)
        with native.backend(backend):
            out = []
            for step in range(3):
                payload = c.encode(_grad(1001, seed=step), step=step, name="w")
                out += [payload.buffers["levels"], payload.buffers["scales"], c.state["w"]]
        runs[backend] = out
    for a, b in zip(runs["native"], runs["torch"], strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# -- 1bitSGD ------------------------------------------------------------------------------------
def test_onebit_hand_example() -> None:
    c = OneBit(bucket_size=4, error_feedback=False)
    g = torch.tensor([1.0, -2.0, 3.0, -4.0, 0.0, 0.5, -1.0, 5.0, -3.0])
    payload = c.encode(g)
    # Bit set = negative, little-endian: values 1, 3, 6 in byte 0, value 8 in byte 1.
    assert payload.buffers["signs"].tolist() == [0b01001010, 0b00000001]
    # Interleaved [avg+, avg-] per bucket; 0 is ">= 0"; a bucket with no positives has avg+ 0.
    expected_means = [2.0, -3.0, 5.5 / 3, -1.0, 0.0, -3.0]
    assert payload.buffers["means"].tolist() == pytest.approx(expected_means)
    p = 5.5 / 3
    assert c.decode(payload).tolist() == pytest.approx([2, -3, 2, -3, p, p, -1, p, -3])
    assert c.state == {}


def test_onebit_error_feedback_identity() -> None:
    c = OneBit(bucket_size=64)
    assert c.stateful
    residual = torch.zeros(1001)
    for step in range(5):
        g = _grad(1001, seed=step)
        decoded = c.decode(c.encode(g, step=step, name="w"))
        new_residual = c.state["w"]
        assert new_residual.shape == g.shape and new_residual.device == g.device
        assert float((decoded + new_residual - (g + residual)).abs().max()) <= 1e-5
        residual = new_residual.clone()
    assert torch.count_nonzero(residual) > 0


def test_onebit_error_feedback_carries_the_error() -> None:
    # With feedback, what was sent so far differs from the gradients so far by exactly the
    # current residual, which stays bounded; without it the (biased) error keeps growing.
    c_ef, c_no = OneBit(bucket_size=16), OneBit(bucket_size=16, error_feedback=False)
    sent_ef, sent_no, total = torch.zeros(256), torch.zeros(256), torch.zeros(256)
    for step in range(100):
        g = _grad(256, seed=step) + 0.3
        total += g
        sent_ef += c_ef.decode(c_ef.encode(g, name="w"))
        sent_no += c_no.decode(c_no.encode(g, name="w"))
    assert float((total - sent_ef - c_ef.state["w"]).abs().max()) <= 1e-3
    assert (sent_ef - total).norm() < 0.25 * (sent_no - total).norm()


def test_onebit_without_error_feedback_keeps_no_state() -> None:
    c = build("onebit", error_feedback=False)
    g = _grad(300)
    first = c.encode(g, name="w").to_wire()
    assert torch.equal(c.encode(g, step=9, name="w").to_wire(), first)
    assert c.state == {}
    assert (c.label, c.nominal_bits) == ("1bit-b64-noef", 1.0)


def test_onebit_state_per_name_and_reset() -> None:
    c = build("onebit")
    assert c.label == "1bit-b64"
    c.encode(_grad(10), name="a")
    c.encode(_grad(20), name="b")
    assert {k: v.numel() for k, v in c.state.items()} == {"a": 10, "b": 20}
    with pytest.raises(ValueError, match="shape"):
        c.encode(_grad(11), name="a")
    c.reset()
    assert c.state == {}


def test_onebit_is_deterministic() -> None:
    g = _grad(777)
    assert torch.equal(OneBit().encode(g).to_wire(), OneBit().encode(g, step=4, rank=3).to_wire())


# -- registry and errors ----------------------------------------------------------------------
def test_registry() -> None:
    assert set(COMPRESSORS) >= {"none", "qsgd", "onebit"}
    for name, cls in COMPRESSORS.items():
        assert cls.name == name and isinstance(build(name), cls)
    c = build("qsgd", bits=4, bucket_size=512, norm="max")
    g = _grad(1000)
    payload = c.encode(g, step=0)
    assert torch.equal(c.decode(c.from_wire(payload.to_wire(), payload.numel)), c.decode(payload))


@pytest.mark.parametrize(
    ("name", "params", "needles"),
    [
        ("qsgdd", {}, ["'qsgdd'", "none, nvfp4, onebit, powersgd, qsgd"]),
        ("qsgd", {"bits": 12}, ["bits", "12", "bits: 4"]),
        ("qsgd", {"bits": 0}, ["bits", "0"]),
        (
            "qsgd",
            {"bucket": 5},
            ["'bucket'", "did you mean 'bucket_size'?", "valid: bits, bucket_size, norm, layout"],
        ),
        ("qsgd", {"bucket_size": 0}, ["bucket_size", ">= 1", "0"]),
        ("qsgd", {"norm": "inf"}, ["norm", "'inf'", "'l2'"]),
        ("qsgd", {"layout": "log"}, ["layout", "'log'"]),
        ("qsgd", {"bits": 1, "layout": "sign"}, ["sign", "bits"]),
        ("qsgd", {"bits": "4"}, ["bits", "int", "'4'"]),
        ("qsgd", {"bits": True}, ["bits", "int", "True"]),
        ("qsgd", {"bits": 4.0}, ["bits", "int", "4.0"]),
        ("onebit", {"bucket_size": -1}, ["bucket_size", "-1"]),
        ("onebit", {"error_feedback": "yes"}, ["error_feedback", "true or false", "'yes' (str)"]),
        ("onebit", {"bits": 1}, ["'bits'", "valid: bucket_size, error_feedback, columns"]),
        ("none", {"state": {}}, ["none takes no parameters, got 'state'"]),
    ],
)
def test_build_errors(name: str, params: dict[str, object], needles: list[str]) -> None:
    with pytest.raises(UserError) as info:
        build(name, **params)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_a_seed_in_a_spec_is_refused_not_silently_replaced() -> None:
    with pytest.raises(UserError, match=r"qsgd: seed is the run's .* remove `seed`"):
        from_spec({"name": "qsgd", "bits": 4, "seed": 3})
    assert from_spec({"name": "qsgd"}, seed=3).seed == 3  # the run's seed, passed apart


def test_direct_construction_validates_too() -> None:
    with pytest.raises(UserError, match="12"):
        QSGD(bits=12)
    with pytest.raises(UserError, match="bucket_size"):
        OneBit(bucket_size=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_cuda_matches_cpu(name: str) -> None:
    c_cpu, c_gpu = build(name), build(name)
    g = _grad(4097)
    for step in range(3):
        p_cpu, p_gpu = (
            c_cpu.encode(g, step=step, name="w"),
            c_gpu.encode(g.cuda(), step=step, name="w"),
        )
        assert all(b.is_cuda for b in p_gpu.buffers.values())
        assert p_gpu.nbytes == p_cpu.nbytes
        assert torch.allclose(c_gpu.decode(p_gpu).cpu(), c_cpu.decode(p_cpu), rtol=0, atol=1e-5)
    if name == "qsgd":  # max norm and counter-based draws: bit-identical on both devices
        assert torch.equal(p_gpu.to_wire().cpu(), p_cpu.to_wire())
