"""integer-allreduce's compiled quantize/dequantize equal its torch reference exactly."""

from __future__ import annotations

import pytest
import torch

from qbench.compress import integer_sum as ia
from qbench.compress.base import Key
from qbench.compress.kernels import native
from qbench.compress.kernels.buckets import buckets
from qbench.compress.kernels.rng import uniform_reference
from tests import compiled


@pytest.fixture(autouse=True, scope="module")
def _c_kernels() -> None:
    compiled.require_c_kernels()  # skips without a C compiler; a broken build fails


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32])
@pytest.mark.parametrize(
    ("n", "bucket", "top", "offset"),
    [(1, 4, 1, 0), (10_007, 512, 7, 3), (4096, 128, 127, 2**32 - 9)],
)
def test_native_matches_reference(
    dtype: torch.dtype, n: int, bucket: int, top: int, offset: int
) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    x[: min(n, bucket)] = 0.0  # an all-zero bucket
    scales = buckets(x, bucket).abs().amax(dim=1) * 1.5  # shared scale >= local max
    key = Key(seed=4, step=9, rank=1)
    want = ia.quantize(x, scales, uniform_reference(key, offset, n), top, bucket).to(dtype)
    got = ia._quantize_native(native.int_kernels(), x, scales, top, bucket, key, offset, dtype)
    assert torch.equal(got, want)
    sums = want * 3
    ref = ia.dequantize(sums, scales, top * 3, bucket, torch.empty(n))
    out = ia._dequantize_native(native.int_kernels(), sums, scales, top * 3, bucket, torch.empty(n))
    assert torch.equal(out, ref)


def test_native_floor_on_exact_grid_points() -> None:
    """Values exactly on the level grid (t integer, negative too) and just off it: the
    truncation-based floor of the C loop must agree with torch.floor everywhere."""
    top, bucket, n = 7, 16, 16 * 15
    grid = torch.arange(-top, top + 1, dtype=torch.float32) / top  # t = -7 .. 7 exactly
    x = torch.cat([grid, grid * (1 - 2**-20), grid * (1 + 2**-23)]).repeat(6)[:n]
    x[::bucket] = 1.0  # each bucket's max |x| is 1, so s = 1 and t = x * top
    scales = buckets(x, bucket).abs().amax(dim=1)
    key = Key(seed=1, step=2, rank=0)
    want = ia.quantize(x, scales, uniform_reference(key, 0, n), top, bucket).to(torch.int8)
    got = ia._quantize_native(native.int_kernels(), x, scales, top, bucket, key, 0, torch.int8)
    assert torch.equal(got, want)


@pytest.mark.parametrize(("n", "bucket"), [(1, 4), (10_007, 512), (4096, 128)])
def test_native_bucket_absmax_matches_torch(n: int, bucket: int) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3
    x[: min(n, bucket)] = 0.0
    want = buckets(x, bucket).abs().amax(dim=1)
    got = torch.empty_like(want)
    assert native.int_kernels().qb_bucket_absmax(x.data_ptr(), n, bucket, got.data_ptr()) == 0
    assert torch.equal(got, want)


def test_qsgd_levels_take_the_kernels_on_cpu_and_torch_elsewhere_with_equal_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """QSGDLevels' three steps through their public methods: on CPU each calls its compiled
    function once; where there are none (a GPU tensor, no compiler) each takes torch's path,
    and the scales, levels and mean are the same integers and floats."""
    from qbench.compress import from_spec

    levels = ia.for_compressor(from_spec("qsgd:bits=4,bucket_size=128"))
    assert isinstance(levels, ia.QSGDLevels) and (levels.top, levels.block) == (7, 128)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    key, offset, world = Key(seed=2, step=5, rank=1), 77, 3
    calls: list[str] = []
    for name in ("_absmax_native", "_quantize_native", "_dequantize_native"):
        real = getattr(ia, name)
        monkeypatch.setattr(
            ia, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k)
        )

    def steps() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scales = levels.local_scales(x) * 1.25  # a shared max above this rank's
        q = levels.encode(x, scales, key, offset, torch.int16)
        return scales, q, levels.decode(q * world, scales, world, torch.zeros(1000))

    compiled_ = steps()
    assert calls == ["_absmax_native", "_quantize_native", "_dequantize_native"]
    monkeypatch.setattr(native, "int_kernels", lambda: None)
    calls.clear()
    reference = steps()
    assert calls == []
    for got, want in zip(compiled_, reference, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    scales, q, mean = reference
    assert q.dtype == torch.int16 and int(q.abs().max()) <= 7
    want_scales = buckets(x, 128).abs().amax(dim=1) * 1.25
    assert torch.equal(scales, want_scales)
    # every rank sent these levels: the mean is the levels times scale / top, bucket by bucket
    assert torch.allclose(
        mean, (q.float().view(-1) * want_scales.repeat_interleave(128)[:1000] / 7)
    )
    # the draws are this key's at this offset: another offset gives other levels
    assert not torch.equal(levels.encode(x, scales, key, offset + 1, torch.int16), q)


def test_the_units_kernels_refuse_bad_arguments_naming_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A non-zero return of qb_lf_units_* is an error naming the C function and its code."""
    from qbench.compress.kernels import abi
    from qbench.compress.kernels.abi import LowFloatFormat
    from qbench.compress.kernels.native import units as nu

    lib = native.int_kernels()
    no_block = LowFloatFormat("mx", "e4m3", 0, False)
    with pytest.raises(RuntimeError) as e:
        nu.encode(lib, torch.ones(64), torch.ones(2), no_block, 0, 0, torch.int32)
    assert str(e.value) == "qb_lf_units_encode failed with code 1 (1: bad arguments)"
    view = LowFloatFormat("mx", "e4m3", 32, False)
    sums = torch.ones(64, dtype=torch.int32)
    with pytest.raises(RuntimeError) as e:  # zero ranks
        nu.decode(lib, sums, torch.ones(2), view, 0, torch.empty(64))
    assert str(e.value) == "qb_lf_units_decode failed with code 1 (1: bad arguments)"
    monkeypatch.setitem(abi.LOWFLOAT_KINDS, "mx", 99)  # a scaling kind the library lacks
    with pytest.raises(RuntimeError) as e:
        nu.divisors(lib, torch.ones(2), view)
    assert str(e.value) == "qb_lf_units_divisors failed with code 1 (1: bad arguments)"
