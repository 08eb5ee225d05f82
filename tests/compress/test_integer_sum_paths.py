"""qbench.compress.integer_sum: which end runs each step, and what either end does at its edges.
FloatUnits (FP8 blocks, MX, NVFP4) takes the C loops for CPU float32 and the torch reference for
everything the loops cannot read (float64 inputs or scales, float sums, a strided ``out``),
with the same results; QSGD's levels decode into a strided ``out``; the C loops' refusals name
the call and its code; ``quantize`` against numpy on scales below |x|, of 0 and below 1, and
its draws on a grid (tests/compress/kernels/test_integer_native.py and
tests/compress/kernels/test_integer_units.py compare the ends on ordinary inputs)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from qbench.compress import from_spec
from qbench.compress import integer_sum as ia
from qbench.compress.base import Key
from qbench.compress.kernels import native
from qbench.compress.kernels.cuda import emulate as cuda_emulate
from qbench.compress.kernels.native import units as native_units
from qbench.compress.kernels.rng import uniform_reference
from tests import compiled

KEY = Key(seed=4, step=1, rank=2)


@pytest.fixture
def c_kernels() -> Iterator[None]:
    """The C loops, on (not the emulated CUDA kernels); skips without a C compiler."""
    compiled.require_c_kernels()
    with native.backend("native"), cuda_emulate.emulation("off"):
        yield


def _float_units(spec: str) -> ia.FloatUnits:
    view = ia.for_compressor(from_spec(spec))
    assert isinstance(view, ia.FloatUnits)
    return view


def _ranks(n: int, k: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return [torch.randn(n, generator=g) * torch.logspace(-2, 1, n) for _ in range(k)]


# -- FloatUnits: which end -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec", ["mx", "fp8:block_size=64,rounding=stochastic", "nvfp4:scope=global"]
)
def test_float_units_take_the_c_loops_on_cpu_float32_with_the_references_results(
    spec: str, c_kernels: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step through the view's public methods calls its C function once per rank (the
    block maxima, the shared divisors, each rank's integers, the decode); with the torch
    backend none, and the maxima, divisors, integers and mean are the same bits."""
    view = _float_units(spec)
    calls: list[str] = []
    for name in ("divisors", "encode", "decode"):
        real = getattr(native_units, name)
        monkeypatch.setattr(
            native_units, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k)
        )
    real_absmax = ia._absmax_native
    monkeypatch.setattr(ia, "_absmax_native", lambda *a: calls.append("absmax") or real_absmax(*a))
    n, xs = 1000, _ranks(1000)

    def steps() -> list[torch.Tensor]:
        maxima = [view.local_scales(x) for x in xs]
        shared = view.share(torch.stack(maxima).amax(0))
        ints = [view.encode(x, shared, KEY, r * n, torch.int32) for r, x in enumerate(xs)]
        sums = torch.stack(ints).sum(0, dtype=torch.int32)
        return [*maxima, shared, *ints, view.decode(sums, shared, 3, torch.empty(n))]

    compiled_ = steps()
    assert calls == ["absmax"] * 3 + ["divisors"] + ["encode"] * 3 + ["decode"]
    calls.clear()
    with native.backend("torch"):
        reference = steps()
    assert calls == []
    for got, want in zip(compiled_, reference, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    # the maxima are each block's max |x|; the mean is u d sum / K per block
    blocks = torch.nn.functional.pad(xs[0], (0, -n % view.block)).view(-1, view.block)
    assert torch.equal(compiled_[0], blocks.abs().amax(1))
    shared, sums, mean = compiled_[3], sum(i.double() for i in compiled_[4:7]), compiled_[7]
    d = shared.double().repeat_interleave(view.block)[:n]
    assert torch.equal(mean, (sums * (d * view.unit / 3)).float())


def test_what_the_c_loops_cannot_read_takes_torch_with_the_same_results(
    c_kernels: None,
) -> None:
    """MX (power-of-two divisors, so float64 arithmetic gives the float32 bits): float64 values
    or divisors, float sums and a strided ``out`` go to the torch reference, not to C loops
    that would read them as float32 or int32 (or write ``out`` as contiguous)."""
    view = _float_units("mx")
    n, xs = 700, _ranks(700)
    x = xs[0]
    amax = torch.stack([view.local_scales(r) for r in xs]).amax(0)
    d = view.share(amax)
    q = view.encode(x, d, KEY, 0, torch.int32)
    sums = q * 3
    mean = view.decode(sums, d, 3, torch.empty(n))

    assert torch.equal(view.local_scales(x.double()).double(), view.local_scales(x).double())
    assert torch.equal(view.share(amax.double()).double(), d.double())
    for values, divisors in ((x.double(), d), (x.double(), d.double()), (x, d.double())):
        assert torch.equal(view.encode(values, divisors, KEY, 0, torch.int32), q)
    assert torch.equal(view.decode(sums.float(), d, 3, torch.empty(n)), mean)
    assert torch.equal(view.decode(sums, d.double(), 3, torch.empty(n)), mean)
    buffer = torch.full((2 * n,), float("nan"))
    got = view.decode(sums, d, 3, buffer[::2])
    assert torch.equal(buffer[::2], mean) and torch.equal(got, mean)
    assert bool(buffer[1::2].isnan().all())  # nothing written between its elements


# -- FloatUnits: what the view says --------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "blockwise"),
    [("mx", True), ("fp8:block_size=64", True), ("nvfp4:scope=global", False)],
)
def test_blockwise_says_whether_a_slice_of_blocks_can_agree_on_its_scales_alone(
    spec: str, blockwise: bool
) -> None:
    """The divisors of a slice of blocks, from that slice's maxima alone, are the whole's where
    ``blockwise`` (the integer allreduce's pipeline relies on it); NVFP4's tensor scale comes
    from every block's max, so a slice without the largest block shares other divisors."""
    view = _float_units(spec)
    amax = torch.logspace(-3, 0, 8)
    amax[5] = 300.0
    whole = view.share_torch(amax)
    alone = torch.cat([view.share_torch(amax[:4]), view.share_torch(amax[4:])])
    assert view.blockwise is blockwise
    assert torch.equal(alone, whole) is blockwise


def test_a_catalog_grid_that_disagrees_with_the_element_table_is_refused() -> None:
    """The catalog's integer_grid gives the top the sum's dtype is sized for; one that is not
    the element table's largest value in units stops the view."""
    real = from_spec("fp8:block_size=64")
    top, block = real.spec.entry.integer_grid(real.spec.params)
    entry = SimpleNamespace(integer_grid=lambda params: (top - 1, block))
    comp = SimpleNamespace(scaling=real.scaling, rounding=real.rounding,
                           spec=SimpleNamespace(entry=entry, params=real.spec.params))  # fmt: skip
    with pytest.raises(AssertionError) as e:
        ia.FloatUnits(comp)  # type: ignore[arg-type]
    assert str(e.value) == "catalog disagrees"


# -- QSGD's levels and the C loops' edges ---------------------------------------------------------
def test_qsgd_levels_decode_into_a_strided_out(c_kernels: None) -> None:
    """A strided ``out`` (every other element of a buffer) gets the mean, on the C loops and on
    torch, and the elements between stay untouched."""
    levels = ia.for_compressor(from_spec("qsgd:bits=4,bucket_size=128"))
    assert isinstance(levels, ia.QSGDLevels)
    n, x = 300, _ranks(300, 1)[0]
    scales = levels.local_scales(x) * 1.25
    sums = levels.encode(x, scales, KEY, 0, torch.int32) * 3
    s = scales.double().repeat_interleave(128)[:n]
    want = (sums.double() / 21 * s).float()  # s sum / (K L), K = 3, L = 7
    for backend in ("native", "torch"):
        buffer = torch.full((2 * n,), float("nan"))
        with native.backend(backend):
            got = levels.decode(sums, scales, 3, buffer[::2])
        assert torch.allclose(buffer[::2], want, rtol=2**-22, atol=0), backend
        assert torch.equal(got, buffer[::2]), backend
        assert bool(buffer[1::2].isnan().all()), backend


def test_the_integer_loops_refuse_what_they_cannot_take_naming_the_call(c_kernels: None) -> None:
    """A width the C loops lack (8-byte integers) or a bucket shorter than 1 is a RuntimeError
    naming the C function and its return code, not garbage."""
    lib = native.int_kernels()
    x, scales = torch.randn(40), torch.ones(5)
    with pytest.raises(RuntimeError) as e:
        ia._quantize_native(lib, x, scales, 7, 8, KEY, 0, torch.int64)
    assert str(e.value) == "qb_int_quantize failed (1)"
    with pytest.raises(RuntimeError) as e:
        ia._dequantize_native(
            lib, torch.ones(40, dtype=torch.int64), scales, 21, 8, torch.empty(40)
        )
    assert str(e.value) == "qb_int_dequantize failed (1)"
    with pytest.raises(RuntimeError) as e:
        ia._absmax_native(lib, torch.empty(0), -1)
    assert str(e.value) == "qb_bucket_absmax failed (1)"


def _quantize_numpy(
    x: np.ndarray, s: np.ndarray, u: np.ndarray, top: int, bucket: int
) -> np.ndarray:
    """QSGD's levels by their definition, float32: s <= 0 divides by 1; t = x / s top; floor(t)
    plus [u < t - floor(t)], clipped to [-top, top]."""
    safe = np.where(s > 0, s, np.float32(1)).astype(np.float32).repeat(bucket)[: len(x)]
    t = (x / safe).astype(np.float32) * np.float32(top)
    return np.clip(np.floor(t) + (u < t - np.floor(t)), -top, top)


def test_quantize_and_its_c_twin_follow_the_definition_on_any_scales() -> None:
    """Buckets whose scale is their max |x|, a quarter of it (values past the top level: clipped
    to +-top both ways), 0 with values in it (divided by 1, as the C loop does), and a max below
    1: the torch reference (int32) and the C loop give numpy's integers."""
    top, bucket = 7, 8
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, bucket, generator=g)
    x[2] *= 0.05
    x[3] *= 0.01
    x = x.reshape(-1)[:30]  # a short last bucket
    amax = torch.nn.functional.pad(x, (0, 2)).view(4, bucket).abs().amax(1)
    scales = torch.stack([amax[0], amax[1] / 4, torch.tensor(0.0), amax[3]])
    assert 0 < float(scales[3]) < 1 and float(x[bucket : 2 * bucket].abs().max()) > scales[1]
    u = uniform_reference(KEY, 5, 30)
    want = _quantize_numpy(x.numpy(), scales.numpy(), u.numpy(), top, bucket)
    got = ia.quantize(x, scales, u, top, bucket)
    assert got.dtype == torch.int32
    assert np.array_equal(got.numpy(), want)
    assert want.min() == -top and want.max() == top  # the quarter scale clipped both ways
    if native.int_kernels() is not None:
        lib = native.int_kernels()
        twin = ia._quantize_native(lib, x, scales, top, bucket, KEY, 5, torch.int32)
        assert np.array_equal(twin.numpy(), want)


def test_a_level_rounds_up_for_exactly_its_fraction_of_a_grid_of_draws() -> None:
    """t = 7x on a scale of 1 with x in eighths is exact in float32: over the draws u = 0, 1/8,
    .. 7/8, t rounds up for exactly 8 (t - floor t) of them, so the draws' mean is t (also where
    t is a level: never up, u = 0 included)."""
    values = torch.tensor([0.0, 1 / 8, -5 / 8, 3 / 8, -1.0, 1.0, 7 / 8, -1 / 8])
    draws = torch.arange(8, dtype=torch.float32) / 8
    x, u = values.repeat_interleave(8), draws.repeat(len(values))
    q = ia.quantize(x, torch.ones(1), u, 7, len(x)).view(len(values), 8)
    assert torch.equal(q.sum(1), (values * 7 * 8).int())
    assert torch.equal(q[0], torch.zeros(8, dtype=torch.int32))
