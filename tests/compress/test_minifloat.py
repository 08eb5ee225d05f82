"""The element formats against the specifications, written here independently: each code's
value from its bit fields (OCP 8-bit floating point v1.0; OCP Microscaling v1.0, section 5),
anchors the specifications state, torch's float8 casts, ties, saturation, NaN, stochastic
rounding's mean, and the MX block scale."""

from __future__ import annotations

import math

import pytest
import torch

from qbench.compress import minifloat as mf

# (exponent bits, mantissa bits, bias, NaN codes, largest finite, smallest subnormal)
SPEC = {
    "e4m3": (4, 3, 7, {0x7F}, 448.0, 2.0**-9),
    "e5m2": (5, 2, 15, {0x7D, 0x7E, 0x7F}, 57344.0, 2.0**-16),
    "e3m2": (3, 2, 3, set(), 28.0, 2.0**-4),
    "e2m3": (2, 3, 1, set(), 7.5, 2.0**-3),
    "e2m1": (2, 1, 1, set(), 6.0, 0.5),
}


def reference(name: str, code: int) -> float:
    """A non-negative code's value from the specification's fields, without qbench."""
    _, m_bits, bias, nans, _, _ = SPEC[name]
    if code in nans:
        return math.nan
    e, m = code >> m_bits, code % 2**m_bits
    if name == "e5m2" and e == 31:
        return math.inf  # m == 0; the other three are NaN above
    if e == 0:
        return 2.0 ** (1 - bias) * m / 2**m_bits
    return 2.0 ** (e - bias) * (1 + m / 2**m_bits)


@pytest.mark.parametrize("name", SPEC)
def test_every_code_has_the_specifications_value(name: str) -> None:
    fmt = mf.FORMATS[name]
    codes = torch.arange(2**fmt.bits)
    got = fmt.decode(codes.to(torch.uint8)).double()
    want = torch.tensor([reference(name, c % fmt.sign_bit) * (-1 if c >= fmt.sign_bit else 1)
                         for c in range(2**fmt.bits)], dtype=torch.float64)  # fmt: skip
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(got[ok], want[ok])
    _, _, _, _, largest, tiny = SPEC[name]
    assert fmt.max_normal == largest
    assert float(fmt.finite[1]) == tiny


@pytest.mark.parametrize("name", SPEC)
def test_each_codes_magnitude_is_the_specifications(name: str) -> None:
    """``Format.magnitude`` itself, code by code: the decode table above is built from it once
    and cached, so the test above alone would not see a later change to it."""
    fmt = mf.FORMATS[name]
    for code in range(fmt.sign_bit):
        got, want = fmt.magnitude(code), reference(name, code)
        assert (math.isnan(got) and math.isnan(want)) or got == want, (name, code, got, want)


def test_e2m1_holds_the_eight_magnitudes_of_fp4() -> None:
    assert mf.E2M1.finite.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.mark.parametrize("name", SPEC)
def test_every_finite_code_round_trips(name: str) -> None:
    fmt = mf.FORMATS[name]
    codes = torch.arange(2**fmt.bits).to(torch.uint8)
    values = fmt.decode(codes)
    finite = torch.isfinite(values)
    assert torch.equal(fmt.encode(values[finite]), codes[finite])


@pytest.mark.parametrize(("name", "dtype"), [("e4m3", torch.float8_e4m3fn),
                                             ("e5m2", torch.float8_e5m2)])  # fmt: skip
def test_nearest_rounding_agrees_with_torchs_float8_casts(name: str, dtype: torch.dtype) -> None:
    fmt = mf.FORMATS[name]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20_000, generator=gen) * torch.exp2(
        torch.randint(-20, 12, (20_000,), generator=gen).float()
    )
    x = x[x.abs() <= fmt.max_normal]  # torch overflows past it; qbench saturates (below)
    assert torch.equal(fmt.decode(fmt.encode(x)), x.to(dtype).float())


@pytest.mark.parametrize("name", SPEC)
def test_ties_go_to_the_even_code(name: str) -> None:
    fmt = mf.FORMATS[name]
    grid = fmt.finite
    mids = ((grid[:-1] + grid[1:]) / 2).float()
    codes = fmt.encode(mids).long()
    assert (codes % 2 == 0).all()
    assert ((codes == torch.arange(len(mids))) | (codes == torch.arange(1, len(mids) + 1))).all()


@pytest.mark.parametrize("name", SPEC)
def test_out_of_range_saturates_and_nan_stays_nan_where_the_format_has_it(name: str) -> None:
    fmt = mf.FORMATS[name]
    big = torch.tensor([1e30, -1e30, math.inf, -math.inf])
    assert fmt.decode(fmt.encode(big)).tolist() == [fmt.max_normal, -fmt.max_normal] * 2
    nan = fmt.decode(fmt.encode(torch.tensor([math.nan])))
    assert math.isnan(nan.item()) == bool(SPEC[name][3])  # FP6 / FP4: the block scale marks it


def test_negative_zero_keeps_its_sign() -> None:
    code = mf.E4M3.encode(torch.tensor([-0.0]))
    assert code.item() == 0x80 and mf.E4M3.decode(code).signbit().item()


@pytest.mark.parametrize("name", ["e4m3", "e2m1"])
def test_stochastic_rounding_is_unbiased_between_neighbours(name: str) -> None:
    fmt = mf.FORMATS[name]
    x = torch.tensor([0.3, 1.1, -2.6, 5.0]) * (1 if name == "e2m1" else 37)
    n = 40_000
    draws = torch.rand(n, len(x), generator=torch.Generator().manual_seed(1))
    values = fmt.decode(fmt.encode(x.expand(n, -1).contiguous(), draws))
    nearest = fmt.decode(fmt.encode(x))
    assert (values.mean(0) - x).abs().max() < 4 * (values.std(0) / n**0.5).max() + 1e-6
    assert not torch.equal(values.mean(0), nearest)  # it is not round-to-nearest
    for j in range(len(x)):  # only the two neighbours
        assert len(set(values[:, j].tolist())) <= 2


def test_mx_scale_puts_the_block_max_in_the_top_binade() -> None:
    amax = torch.tensor([1.0, 448.0, 1e-40, 0.0, math.nan, math.inf], dtype=torch.float64)
    codes = mf.mx_scale_exponent(amax, mf.E4M3)
    assert codes.tolist() == [127 - 8, 127, 0, 0, 255, 255]  # 1e-40 needs 2^-141: clamped
    scaled = amax[:2] / mf.e8m0_value(codes[:2])
    assert ((scaled >= 2**mf.E4M3.emax) & (scaled < 2 ** (mf.E4M3.emax + 1))).all()
    assert mf.E2M1.emax == 2 and mf.E4M3.emax == 8 and mf.E5M2.emax == 15
    assert math.isnan(mf.e8m0_value(torch.tensor([255])).item())


def test_the_catalogs_element_numbers_are_the_bit_fields_own() -> None:
    """qbench.catalog.wire.ELEMENTS repeats, without torch, what the planner needs of each
    format (bits, exponent and mantissa bits, the smallest positive value, the largest): it must
    be what the bit-field definitions give."""
    from qbench.catalog.wire import ELEMENTS

    for name, fmt in mf.FORMATS.items():
        smallest = float(fmt.finite[1])
        assert ELEMENTS[name] == (
            fmt.bits,
            fmt.exp,
            fmt.man,
            math.frexp(smallest)[1] - 1,
            fmt.max_normal,
        ), name
