"""MX and NVFP4 block scaling: exact where the values are representable, the error within the
format's spacing (and saturation's reach) of each block's scale, NaN blocks, zero blocks, the
NVFP4 scales' ranges, stochastic rounding's mean."""

from __future__ import annotations

import math

import pytest
import torch

from qbench.compress import blockscale as bs
from qbench.compress import minifloat as mf

MX = ["e4m3", "e5m2", "e3m2", "e2m3", "e2m1"]


def _bound(fmt: mf.Format) -> float:
    """The most a value can move, in units of its block's scale: half the widest gap of the
    grid, or saturation's reach from the top binade's end down to the largest normal."""
    gaps = fmt.finite[1:] - fmt.finite[:-1]
    return max(float(gaps.max()) / 2, 2.0 ** (fmt.emax + 1) - fmt.max_normal)


@pytest.mark.parametrize("name", MX)
def test_mx_is_exact_on_representable_blocks(name: str) -> None:
    fmt = mf.FORMATS[name]
    values = fmt.finite[-bs.MX_BLOCK :] if len(fmt.finite) >= bs.MX_BLOCK else fmt.finite
    x = torch.cat([values, -values]).float() * 2.0**-5
    enc = bs.encode(x, bs.mx(fmt))
    assert torch.equal(bs.decode(enc, bs.mx(fmt), x.numel()), x)


@pytest.mark.parametrize("name", MX)
def test_mx_error_stays_within_the_block_scales_spacing(name: str) -> None:
    fmt = mf.FORMATS[name]
    x = torch.randn(3001, generator=torch.Generator().manual_seed(0)) * 10
    enc = bs.encode(x, bs.mx(fmt))
    got = bs.decode(enc, bs.mx(fmt), x.numel())
    scale = mf.e8m0_value(enc.scales).float().repeat_interleave(bs.MX_BLOCK)[: x.numel()]
    assert ((got - x).abs() <= _bound(fmt) * scale * (1 + 1e-6)).all()
    assert enc.codes.shape == (math.ceil(3001 / 32), 32)


def test_a_block_holding_nan_or_inf_decodes_as_nan_and_zeros_stay_zero() -> None:
    x = torch.zeros(96)
    x[5], x[40:64] = math.nan, torch.arange(24.0)
    x[70] = math.inf
    enc = bs.encode(x, bs.mx(mf.E2M1))
    assert enc.scales[0].item() == mf.E8M0_NAN and enc.scales[2].item() == mf.E8M0_NAN
    got = bs.decode(enc, bs.mx(mf.E2M1), 96)
    assert torch.isnan(got[:32]).all() and torch.isnan(got[64:]).all()
    assert torch.isfinite(got[32:64]).all() and (got[32:40] == 0).all()
    zeros = bs.encode(torch.zeros(32), bs.mx(mf.E4M3))
    assert zeros.scales.item() == 0 and (bs.decode(zeros, bs.mx(mf.E4M3), 32) == 0).all()


def test_mx_stochastic_rounding_is_unbiased() -> None:
    x = torch.linspace(-3, 3, 32)
    n = 20_000
    draws = torch.rand(n, 32, generator=torch.Generator().manual_seed(2))
    got = torch.stack([bs.decode(bs.encode(x, bs.mx(mf.E2M1), d[None]), bs.mx(mf.E2M1), 32)
                       for d in draws[:2000]])  # fmt: skip
    sem = got.std(0) / len(got) ** 0.5
    assert ((got.mean(0) - x).abs() <= 4 * sem + 1e-6).all()


def test_nvfp4_scales_fit_e4m3_and_the_error_its_blocks() -> None:
    x = torch.randn(4000, generator=torch.Generator().manual_seed(3)) * torch.linspace(
        1e-3, 50, 4000
    )
    enc = bs.encode(x, bs.NVFP4)
    assert float(enc.tensor_scale) == pytest.approx(float(x.abs().max()) / bs.NVFP4_RANGE)
    scales = mf.E4M3.decode(enc.scales)
    assert torch.isfinite(scales).all() and float(scales.max()) <= 448
    got = bs.decode(enc, bs.NVFP4, x.numel())
    block = (scales * enc.tensor_scale).repeat_interleave(bs.NVFP4_BLOCK)[: x.numel()]
    # E2M1's widest gap is 2 (4 to 6); the rounded block scale may leave the block's max up to
    # E4M3's relative step (1/8) past 6: saturation's reach
    assert ((got - x).abs() <= block * 1.0 + x.abs() / 8 + 1e-9).all()
    assert (bs.decode(bs.encode(torch.zeros(20), bs.NVFP4), bs.NVFP4, 20) == 0).all()
