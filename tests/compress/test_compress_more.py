"""More compressors: fp16/bf16 casts, fixed-point rounding, top-k, entropy-adaptive + Huffman."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from qbench.compress import Compressor, Payload, build, huffman
from qbench.compress.adaptive import Adaptive
from qbench.compress.fixedpoint import FixedPoint
from qbench.compress.fp16 import BFloat16, Half
from qbench.compress.kernels.bitpack import unpack
from qbench.compress.topk import TopK
from qbench.errors import UserError

ODD_LENGTHS = (0, 1, 7, 9, 63, 1023, 4097)
FIXED_BITS = tuple(range(2, 17))
ADAPTIVE_CONFIGS = ((2, 1), (3, 2), (6, 4), (8, 8), (12, 4), (15, 1))  # (floor c, probe M)


def _grad(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _fixed_size() -> list[Compressor]:
    out: list[Compressor] = [build("fp16"), build("bf16")]
    out += [build("fixedpoint", bits=b) for b in FIXED_BITS]
    out += [build("fixedpoint", bits=b, delta=0.01) for b in (2, 5, 8, 9, 16)]
    for ratio in (0.01, 0.3, 1.0):
        out += [build("topk", ratio=ratio), build("topk", ratio=ratio, error_feedback=False)]
    return out


FIXED = _fixed_size()
ADAPTIVE = [build("adaptive", floor_bits=c, probe_bits=m) for c, m in ADAPTIVE_CONFIGS]


def _expected_nbytes(c: Compressor, n: int) -> int:
    """Wire size written out from each algorithm's definition."""
    if isinstance(c, Half | BFloat16):
        return 2 * n
    if isinstance(c, FixedPoint):
        levels = _ceil(n * c.bits, 8)  # every width packed exactly (16 bits: int16)
        return levels + (2 if c.delta == "auto" else 0)
    assert isinstance(c, TopK)
    k = max(1, math.ceil(c.ratio * n - 1e-9)) if n else 0
    return 8 * k


def _adaptive_expected_nbytes(payload: Payload) -> int:
    """From the header: 16 + 4 bytes, then plain codes or blocks + codebook + Huffman stream."""
    width, coding, k, block = payload.buffers["header"].tolist()
    n = payload.numel
    if coding == 0:
        return 20 + _ceil(n * width, 8)
    blocks = payload.buffers["block_bits"] if k >= 2 else torch.zeros(0)
    assert blocks.numel() == (_ceil(n, block) if k >= 2 else 0)
    return 20 + 2 * blocks.numel() + 3 * k + _ceil(int(blocks.sum()), 8)


def _skewed(n: int, seed: int = 0) -> torch.Tensor:
    """Mostly tiny values and a few large ones: a peaked level histogram (Huffman wins)."""
    x = _grad(n, seed) * 0.01
    x[:: max(1, n // 5)] = 3.0
    return x


# -- sizes and the wire -----------------------------------------------------------------------
@pytest.mark.parametrize("c", FIXED, ids=lambda c: c.label)
def test_nbytes_is_exact_and_matches_wire_layout(c: Compressor) -> None:
    for n in ODD_LENGTHS:
        payload = c.encode(_grad(n), name=f"g{n}")
        layout = c.wire_layout(n)
        assert payload.nbytes == c.wire_nbytes(n) == _expected_nbytes(c, n)
        assert payload.nbytes == payload.to_wire().numel()
        assert [f.name for f in layout] == list(payload.buffers)
        for f in layout:
            buf = payload.buffers[f.name]
            assert (buf.dtype, buf.numel()) == (f.dtype, f.numel), (n, f)


@pytest.mark.parametrize("c", ADAPTIVE, ids=lambda c: c.label)
def test_adaptive_nbytes_is_exact(c: Adaptive) -> None:
    widths = set()
    for n in (*ODD_LENGTHS, 20001):
        for x in (_grad(n, seed=n), _skewed(n), torch.zeros(n)):
            payload = c.encode(x)
            widths.add(c.last_width)
            assert payload.nbytes == payload.to_wire().numel() == _adaptive_expected_nbytes(payload)
            assert c.last_bits_per_value == (payload.nbytes * 8 / n if n else 0.0)
    assert min(widths) == c.floor_bits  # all-zero tensors: entropy 0
    assert c.fixed_size is False
    with pytest.raises(NotImplementedError, match="exchange sizes"):
        c.wire_layout(10)


def _shifted(wire: torch.Tensor, by: int = 3) -> torch.Tensor:
    """The same bytes starting at an odd byte offset of a larger allocation."""
    return torch.cat([torch.zeros(by, dtype=torch.uint8), wire])[by:]


@pytest.mark.parametrize("c", FIXED + ADAPTIVE, ids=lambda c: c.label)
def test_wire_round_trip_decodes_identically(c: Compressor) -> None:
    for n in ODD_LENGTHS:
        for x in (_grad(n, seed=n), _skewed(n)):
            payload = c.encode(x, step=3, name=f"g{n}")
            wire = payload.to_wire()
            assert wire.dtype == torch.uint8 and wire.numel() == payload.nbytes
            for received in (wire, _shifted(wire)):
                decoded = c.decode(c.from_wire(received, n))
                assert torch.equal(decoded, c.decode(payload))
                assert decoded.dtype == torch.float32 and decoded.shape == (n,)


def test_adaptive_wire_is_self_describing() -> None:
    c = build("adaptive")
    x, y = _skewed(30001), _grad(1000, seed=1)
    first, second = c.encode(x).to_wire(), c.encode(y).to_wire()
    both = torch.cat([first, second])
    # A receiver that knows only each chunk's element count and byte size.
    part = both[first.numel() :]
    assert torch.equal(c.decode(c.from_wire(part, 1000)), c.decode(c.encode(y)))
    assert torch.equal(c.decode(c.from_wire(both[: first.numel()], 30001)), c.decode(c.encode(x)))
    with pytest.raises(ValueError, match="bytes"):
        c.from_wire(first[:-1], 30001)
    with pytest.raises(ValueError, match="bytes"):
        c.from_wire(both, 30001)
    with pytest.raises(ValueError, match="header"):
        c.from_wire(torch.zeros(40, dtype=torch.uint8), 10)


def test_adaptive_uses_huffman_when_it_pays() -> None:
    c = build("adaptive")
    big = c.encode(_skewed(100_000))
    assert big.buffers["header"].tolist()[1] == 1 and "symbols" in big.buffers
    # 20 values: any codebook costs more than 20 plain codes.
    small = c.encode(_grad(20))
    assert list(small.buffers) == ["header", "scale", "stream"]
    zeros = c.encode(torch.zeros(5000))  # one symbol: a zero-length code, no stream at all
    assert zeros.buffers["stream"].numel() == 0 and zeros.nbytes == 16 + 4 + 2 + 1
    assert torch.equal(c.decode(c.from_wire(zeros.to_wire(), 5000)), torch.zeros(5000))


# -- fp16 / bf16 ------------------------------------------------------------------------------
def test_half_casts() -> None:
    x = torch.tensor([1.0, -2.5, 1e-3, 1e5, 3e38, 0.1])
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        c = build(name)
        payload = c.encode(x)
        assert payload.buffers["values"].dtype == dtype
        assert torch.equal(c.decode(payload), x.to(dtype).float())
        assert (c.label, c.nominal_bits, c.stateful) == (name, 16.0, False)
    assert math.isinf(build("fp16").decode(build("fp16").encode(x))[3])  # beyond 65504
    assert build("bf16").decode(build("bf16").encode(x))[4] == pytest.approx(3e38, rel=1e-2)


# -- fixed point ------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [2, 4, 8, 10, 16])
@pytest.mark.parametrize("delta", ["auto", 0.25])
def test_fixedpoint_is_unbiased_within_range(bits: int, delta: float | str) -> None:
    c = build("fixedpoint", bits=bits, delta=delta)
    high = 2 ** (bits - 1) - 1
    x = _grad(400, seed=bits).clamp(-2.0, 2.0) * (0.95 * high * 0.25 / 2)  # inside the range
    x[::41] = 0.0
    step = 2.0 ** _exponent_by_search(x, high) if delta == "auto" else 0.25
    steps = 100
    decoded = torch.stack([c.decode(c.encode(x, step=k)) for k in range(steps)]).double()
    assert torch.equal(torch.remainder(decoded / step, 1.0), torch.zeros_like(decoded))
    err = decoded - x.double()
    assert float(err.abs().max()) < step  # one of the two grid points around x
    bound = 5 * step / (2 * math.sqrt(steps))
    assert bool((err.mean(0).abs() <= bound).all())
    totals = err.sum(1)
    assert abs(totals.mean()) <= 4 * totals.std() / math.sqrt(steps) + 1e-12


def _exponent_by_search(x: torch.Tensor, high: int) -> int:
    """The exponent ``delta: auto`` must pick: the smallest e with max |x| <= high * 2^e."""
    top = float(x.abs().max())
    e = -200
    while high * 2.0**e < top:
        e += 1
    return e


def test_fixedpoint_clips_at_the_range_ends() -> None:
    c = build("fixedpoint", bits=4, delta=0.5)  # codes -8..7: values -4.0 .. 3.5
    x = torch.tensor([-10.0, -4.0, -4.2, 3.5, 3.6, 10.0, 1e30, -1e30])
    for step in range(20):
        decoded = c.decode(c.encode(x, step=step))
        assert decoded.tolist() == [-4.0, -4.0, -4.0, 3.5, 3.5, 3.5, 3.5, -4.0]


def test_fixedpoint_codes_are_twos_complement() -> None:
    c = build("fixedpoint", bits=4, delta=1.0)
    payload = c.encode(torch.tensor([-8.0, -1.0, 0.0, 7.0, 3.0]))  # integers: rounding is exact
    assert list(payload.buffers) == ["levels"]
    assert payload.buffers["levels"].tolist() == [0xF8, 0x70, 0x03]  # nibbles 8, 15, 0, 7, 3
    assert unpack(payload.buffers["levels"], 4, 5).tolist() == [8, 15, 0, 7, 3]
    wide_c = build("fixedpoint", bits=12, delta=1.0)
    wide = wide_c.encode(torch.tensor([-2048.0, 2047.0, -1.0]))
    # 12-bit codes 0x800, 0x7FF, 0xFFF, planar: low bytes, then the high nibbles packed
    assert wide.buffers["levels"].tolist() == [0x00, 0xFF, 0xFF, 0x78, 0x0F]
    assert wide_c.decode(wide).tolist() == [-2048.0, 2047.0, -1.0]
    full = build("fixedpoint", bits=16, delta=1.0).encode(torch.tensor([-32768.0, 32767.0]))
    assert full.buffers["levels"].tolist() == [-32768, 32767]


def test_fixedpoint_auto_exponent() -> None:
    c = build("fixedpoint", bits=8)
    # per tensor by default (the label says so: run ids of the per-call default stay apart)
    assert c.label == "fixed-8b-layer" and c.nominal_bits == 8.0
    assert build("fixedpoint", bits=8, scope="global").label == "fixed-8b"
    cases = [(1.0, -6), (127 * 2.0**-7, -7), (127 * 2.0**-7 * 1.0001, -6), (0.0, 0)]
    for top, exponent in cases:
        payload = c.encode(torch.tensor([top, -top / 3, 0.0]))
        assert payload.buffers["exponent"].tolist() == [exponent]
        # The largest value is never clipped: it rounds to one of its two grid neighbours.
        assert abs(float(c.decode(payload)[0]) - top) < 2.0**exponent
    for scale in (1e-40, 1e-30, 1e30, 1e37):  # subnormal to near float32's max
        x = _grad(1000) * scale
        decoded = c.decode(c.from_wire(c.encode(x).to_wire(), 1000))
        assert float((decoded - x).abs().max()) <= float(x.abs().max()) / 63


# -- top-k ------------------------------------------------------------------------------------
def test_topk_keeps_exactly_the_k_largest() -> None:
    c = build("topk", ratio=0.07, error_feedback=False)
    perm = torch.randperm(100, generator=torch.Generator().manual_seed(0))
    x = (perm + 1).float() * torch.where(perm % 3 == 0, -1.0, 1.0)  # distinct magnitudes
    payload = c.encode(x)
    indices = payload.buffers["indices"]
    assert indices.dtype == torch.int32 and indices.numel() == c.k(100) == 7
    assert torch.equal(indices, indices.sort().values)
    expected = set(x.abs().argsort(descending=True)[:7].tolist())
    assert set(indices.tolist()) == expected
    assert torch.equal(payload.buffers["values"], x[indices.long()])
    decoded = c.decode(payload)
    mask = torch.zeros(100, dtype=torch.bool)
    mask[indices.long()] = True
    assert torch.equal(decoded[mask], x[mask]) and not decoded[~mask].any()
    assert (c.k(0), c.k(1), c.k(1000), build("topk", ratio=1.0).k(9)) == (0, 1, 70, 9)


def test_topk_error_feedback_identity() -> None:
    c = build("topk", ratio=0.05)
    assert c.stateful
    residual = torch.zeros(1001)
    for step in range(6):
        g = _grad(1001, seed=step)
        decoded = c.decode(c.encode(g, step=step, name="w"))
        new_residual = c.state["w"]
        assert torch.equal(decoded + new_residual, g + residual)
        assert int((decoded != 0).sum()) == c.k(1001)
        residual = new_residual.clone()
    # Entries left out accumulate until they win a slot: the residual stays bounded.
    assert float(residual.abs().max()) < 10.0
    with pytest.raises(ValueError, match="shape"):
        c.encode(_grad(5), name="w")
    c.reset()
    assert c.state == {}


def test_topk_without_error_feedback_and_labels() -> None:
    c = build("topk", ratio=0.001, error_feedback=False)
    c.encode(_grad(50), name="w")
    assert c.state == {}
    assert (c.label, c.nominal_bits) == ("topk-0.1%-layer-noef", pytest.approx(0.064))
    assert build("topk").label == "topk-1%-layer"
    assert build("topk", scope="global").label == "topk-1%"  # the label of the old default


# -- Huffman ----------------------------------------------------------------------------------
def _huffman_round_trip(values: np.ndarray, block: int = 512) -> huffman.Encoded:
    book = huffman.build_codebook(values)
    encoded = huffman.encode(values, book, block)
    assert encoded.stream.size == _ceil(encoded.total_bits, 8)
    decoded = huffman.decode(encoded.stream, encoded.block_bits, book, values.size, block)
    assert decoded.dtype == np.int64 and np.array_equal(decoded, values)
    return encoded


@pytest.mark.parametrize("block", [1, 7, 512])
def test_huffman_round_trip_is_lossless(block: int) -> None:
    rng = np.random.default_rng(block)
    for n in (1, 2, 511, 512, 513, 5000):
        _huffman_round_trip(rng.geometric(0.3, n) - 1, block)  # skewed
        _huffman_round_trip(rng.integers(0, 1000, n), block)  # flat, sparse alphabet
        _huffman_round_trip(np.full(n, 42), block)  # one symbol
        _huffman_round_trip(np.where(rng.random(n) < 0.9, 3, 65000), block)  # two symbols


def test_huffman_edge_cases() -> None:
    empty = _huffman_round_trip(np.zeros(0, np.int64))
    assert empty.total_bits == 0
    single = _huffman_round_trip(np.full(1000, 7))
    assert single.total_bits == 0  # implied by the count: a zero-length code
    two = _huffman_round_trip(np.array([5, 9, 9, 5, 9]))
    assert two.total_bits == 5  # one bit each
    book = huffman.build_codebook(np.zeros(0, np.int64))
    assert book.symbols.size == 0
    assert huffman.decode(np.zeros(0, np.uint8), np.zeros(0, np.int64), book, 0, 512).size == 0


def test_huffman_code_is_canonical_prefix_free_and_optimal() -> None:
    rng = np.random.default_rng(1)
    values = np.minimum(rng.geometric(0.2, 20000) - 1, 60)
    book = huffman.build_codebook(values)
    lengths = book.lengths.astype(np.int64)
    assert float(np.sum(2.0**-lengths)) == 1.0  # Kraft equality: complete prefix code
    counts = np.bincount(values)[book.symbols]
    p = counts / counts.sum()
    entropy = float(-(p * np.log2(p)).sum())
    mean_len = float((p * lengths).sum())
    assert entropy <= mean_len < entropy + 1  # Huffman's bound
    encoded = huffman.encode(values, book, 512)
    assert encoded.total_bits == int((counts * lengths).sum())


def test_huffman_limits_code_lengths() -> None:
    # Fibonacci counts give a maximally deep tree: 25 symbols would need 24-bit codes.
    fib = [1, 1]
    while len(fib) < 25:
        fib.append(fib[-1] + fib[-2])
    values = np.repeat(np.arange(25), fib)
    book = huffman.build_codebook(values)
    assert book.max_len <= huffman.MAX_LEN
    _huffman_round_trip(values)


def test_huffman_rejects_a_corrupt_stream() -> None:
    values = np.random.default_rng(2).geometric(0.3, 2000) - 1
    book = huffman.build_codebook(values)
    encoded = huffman.encode(values, book, 512)
    bad = encoded.block_bits.copy()
    bad[0] += 1
    bad[1] -= 1
    with pytest.raises(ValueError, match="corrupt"):
        huffman.decode(encoded.stream, bad, book, values.size, 512)
    with pytest.raises(ValueError, match="block"):
        huffman.decode(encoded.stream, encoded.block_bits[:-1], book, values.size, 512)


def test_huffman_handles_a_million_values_quickly() -> None:
    values = np.clip(np.round(np.random.default_rng(3).normal(256, 30, 1_000_000)), 0, 510)
    values = values.astype(np.int64)
    start = time.perf_counter()
    encoded = _huffman_round_trip(values)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0  # typically ~0.2 s; generous for a loaded machine
    assert encoded.total_bits / values.size < 9.0


# -- adaptive ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("floor_bits", "probe_bits"), ADAPTIVE_CONFIGS)
def test_adaptive_width_within_floor_and_ceiling(floor_bits: int, probe_bits: int) -> None:
    c = Adaptive(floor_bits=floor_bits, probe_bits=probe_bits)
    gen = torch.Generator().manual_seed(0)
    vectors = {
        "gaussian": _grad(5000),
        "uniform": torch.rand(20000, generator=gen) * 2 - 1,  # flat: entropy close to M
        "skewed": _skewed(5000),
        "zeros": torch.zeros(5000),
        "constant": torch.full((5000,), -0.3),
        "tiny": _grad(3),
    }
    widths = {}
    for kind, x in vectors.items():
        c.encode(x, step=1)
        widths[kind] = c.last_width
        assert floor_bits <= c.last_width <= floor_bits + probe_bits, kind
    assert widths["zeros"] == widths["constant"] == floor_bits  # one bin: H = 0
    assert widths["uniform"] == floor_bits + probe_bits  # H just under M rounds up to M


def test_adaptive_defaults_follow_the_paper() -> None:
    c = build("adaptive")
    assert (c.sample_fraction, c.probe_bits, c.floor_bits) == (0.03, 4, 6)
    assert (c.label, c.nominal_bits, c.stateful) == ("adaptive-c6-m4-f3%-layer-minmax", 8.0, False)
    assert c.granularity == "tensor"  # section 3.4: N = H + c per layer


def test_adaptive_bits_per_value_on_a_gaussian(record_property: pytest.RecordProperty) -> None:
    c = build("adaptive")
    x = _grad(100_000, seed=5)
    payload = c.encode(x)
    record_property("adaptive_width", c.last_width)
    record_property("adaptive_bits_per_value", c.last_bits_per_value)
    print(f"adaptive: N={c.last_width}, {c.last_bits_per_value:.3f} bits/value")
    assert c.last_bits_per_value == payload.nbytes * 8 / 100_000
    assert 1.0 < c.last_bits_per_value < c.last_width  # Huffman beats plain N-bit codes
    decoded = c.decode(payload)
    spacing = float(x.abs().max()) / (2 ** (c.last_width - 1) - 1)
    assert float((decoded - x).abs().max()) <= spacing * (1 + 1e-5)


def test_adaptive_quantizer_is_unbiased() -> None:
    c = Adaptive(floor_bits=2, probe_bits=2)  # coarse grid: 1 to 7 levels a side
    x = _grad(300, seed=11)
    x[::29] = 0.0
    steps = 100
    decoded = torch.stack([c.decode(c.encode(x, step=k)) for k in range(steps)]).double()
    err = decoded - x.double()
    assert torch.equal(err[:, ::29], torch.zeros(steps, 11, dtype=torch.float64))
    spacing = float(x.abs().max())  # the widest grid (N = c = 2) has levels -s, 0, s
    bound = 5 * spacing / (2 * math.sqrt(steps))
    assert bool((err.mean(0).abs() <= bound).all())
    for weights in (torch.ones_like(x), torch.sign(x)):
        totals = err @ weights.double()
        assert abs(totals.mean()) <= 4 * totals.std() / math.sqrt(steps) + 1e-9


# -- determinism, registry, errors --------------------------------------------------------------
def _wire_bytes(c: Compressor, x: torch.Tensor, **kw: int) -> bytes:
    return bytes(c.encode(x, name="w", **kw).to_wire().tolist())


@pytest.mark.parametrize(
    ("name", "params", "stochastic"),
    [
        ("fp16", {}, False),
        ("bf16", {}, False),
        ("fixedpoint", {"bits": 6}, True),
        ("fixedpoint", {"bits": 12, "delta": 0.001}, True),
        ("topk", {"ratio": 0.1}, False),
        ("adaptive", {}, True),
    ],
)
def test_same_key_gives_identical_bytes(
    name: str, params: dict[str, object], stochastic: bool
) -> None:
    x = _grad(3001)
    first = _wire_bytes(build(name, seed=7, **params), x, step=5, rank=1)
    assert _wire_bytes(build(name, seed=7, **params), x, step=5, rank=1) == first
    others = [
        _wire_bytes(build(name, seed=7, **params), x, step=6, rank=1),
        _wire_bytes(build(name, seed=7, **params), x, step=5, rank=1, stream=1),
        _wire_bytes(build(name, seed=8, **params), x, step=5, rank=1),
    ]
    assert all((other != first) == stochastic for other in others)


STOCHASTIC = [
    ("qsgd", {"bits": 4, "bucket_size": 64}),
    ("qsgd", {"bits": 2, "layout": "sign", "bucket_size": 128}),
    ("qsgd", {"bits": 8, "norm": "l2", "bucket_size": 512}),
    ("qsgd", {"bits": 16, "bucket_size": 8192}),
    ("fixedpoint", {"bits": 6}),
    ("fixedpoint", {"bits": 12, "delta": 0.01}),  # range +-20.47: nothing clipped
    ("adaptive", {}),
]
KEY_CHANGES = {
    "rank": {"rank": 1},
    "offset": {"offset": 8192},  # the same values as the next range of a longer vector
    "step": {"step": 3},
    "stream": {"stream": 1},
}


@pytest.mark.parametrize("change", list(KEY_CHANGES))
@pytest.mark.parametrize(("name", "params"), STOCHASTIC, ids=lambda v: str(v))
def test_rounding_errors_of_other_keys_are_uncorrelated(
    name: str, params: dict[str, object], change: str
) -> None:
    """Two ranks (or offsets, steps, streams) rounding the same values must draw independently.

    With independent draws and unbiased rounding E[e_i e'_i] = E[e_i] E[e'_i] = 0, so the mean of
    the 8192 products is 0 within 5 standard errors and the correlation is about 1/sqrt(8192)
    = 0.011 (bound 0.1). Draws reused across keys give e = e': the mean of the products is then
    E[e^2] > 0, dozens of standard errors, and the correlation 1. The mean-error tests above
    cannot see this, since every rank's error is unbiased either way."""
    n, c = 8192, build(name, **params)
    x = _grad(n, seed=5)

    def error(**key: int) -> torch.Tensor:
        return (c.decode(c.encode(x, name="w", **key)) - x).double()

    first = {"step": 2, "rank": 0, "stream": 0, "offset": 0}
    e, e_other = error(**first), error(**(first | KEY_CHANGES[change]))
    products = e * e_other
    assert float(products.mean().abs()) <= 5 * float(products.std()) / math.sqrt(n)
    correlation = float(products.sum() / (e.square().sum() * e_other.square().sum()).sqrt())
    assert abs(correlation) < 0.1


def test_registry_has_the_new_compressors() -> None:
    names = {"fp16": Half, "bf16": BFloat16, "fixedpoint": FixedPoint, "topk": TopK}
    for name, cls in {**names, "adaptive": Adaptive}.items():
        assert isinstance(build(name), cls)


@pytest.mark.parametrize(
    ("name", "params", "needles"),
    [
        ("fixedpoint", {"bits": 1}, ["bits", "2..16", "1", "bits: 8"]),
        ("fixedpoint", {"bits": 17}, ["bits", "17"]),
        ("fixedpoint", {"bits": "8"}, ["bits", "int", "'8'"]),
        ("fixedpoint", {"bits": True}, ["bits", "True"]),
        ("fixedpoint", {"delta": 0}, ["delta", "> 0", "0", "delta: auto"]),
        ("fixedpoint", {"delta": -0.5}, ["delta", "-0.5"]),
        ("fixedpoint", {"delta": "fast"}, ["delta", "'fast'", "'auto'"]),
        ("fixedpoint", {"delta": float("inf")}, ["delta", "inf"]),
        ("fixedpoint", {"step": 1}, ["'step'", "valid: bits, delta"]),
        ("topk", {"ratio": 0.0}, ["ratio", "(0, 1]", "0.0", "ratio: 0.01"]),
        ("topk", {"ratio": 1.5}, ["ratio", "1.5"]),
        ("topk", {"ratio": "1%"}, ["ratio", "'1%'"]),
        ("topk", {"error_feedback": "yes"}, ["error_feedback", "'yes'"]),
        ("topk", {"k": 5}, ["'k'", "valid: ratio, error_feedback"]),
        ("adaptive", {"sample_fraction": 0.0}, ["sample_fraction", "(0, 1]", "0.03"]),
        ("adaptive", {"sample_fraction": 3.0}, ["sample_fraction", "3.0"]),
        ("adaptive", {"probe_bits": 0}, ["probe_bits", "0", "probe_bits: 4"]),
        ("adaptive", {"floor_bits": 1}, ["floor_bits", "1", "floor_bits: 6"]),
        ("adaptive", {"floor_bits": 12, "probe_bits": 6}, ["<= 16", "12 + 6"]),
        ("adaptive", {"floor_bits": 6.5}, ["floor_bits", "6.5"]),
        ("adaptive", {"F": 0.1}, ["'F'", "valid: sample_fraction, probe_bits, floor_bits"]),
        ("fp16", {"bits": 8}, ["fp16 takes no parameters, got 'bits'"]),
    ],
)
def test_build_errors(name: str, params: dict[str, object], needles: list[str]) -> None:
    with pytest.raises(UserError) as info:
        build(name, **params)
    message = str(info.value)
    assert "\n" not in message and message.startswith(name)
    for needle in needles:
        assert needle in message, (needle, message)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["fp16", "bf16", "fixedpoint", "topk", "adaptive"])
def test_cuda_matches_cpu_bit_for_bit(name: str) -> None:
    g = _grad(20001)
    c_cpu, c_gpu = build(name), build(name)
    for step in range(3):
        p_cpu = c_cpu.encode(g, step=step, name="w")
        p_gpu = c_gpu.encode(g.cuda(), step=step, name="w")
        assert all(b.is_cuda for b in p_gpu.buffers.values())
        assert torch.equal(p_gpu.to_wire().cpu(), p_cpu.to_wire())
        decoded = c_gpu.decode(c_gpu.from_wire(p_gpu.to_wire(), g.numel()))
        assert decoded.is_cuda and torch.equal(decoded.cpu(), c_cpu.decode(p_cpu))
