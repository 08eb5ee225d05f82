"""The FP8 / MX / NVFP4 codecs (qbench.compress.lowfloat) and their integer view
(qbench.compress.integer_sum): round trips of every representable value, saturation, packing,
stochastic rounding, error feedback, and sums on shared scales. The element formats themselves
are checked against the specifications in tests/compress/test_minifloat.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from qbench.compress import Key, blockscale, from_spec, integer_sum
from qbench.compress import minifloat as mf
from qbench.compress.lowfloat import ScaledFloat

ELEMENTS = ["e4m3", "e5m2", "e3m2", "e2m3", "e2m1"]


def _float(spec: object) -> ScaledFloat:
    codec = from_spec(spec)
    assert isinstance(codec, ScaledFloat)
    return codec


def _every_value(fmt: mf.Format) -> torch.Tensor:
    """Every finite value of ``fmt``, both signs, largest first (so it sets the scale)."""
    finite = fmt.finite.float().flip(0)
    return torch.cat([finite, -finite])


@pytest.mark.parametrize("element", ELEMENTS)
def test_mx_sends_every_representable_value_exactly(element: str) -> None:
    fmt = mf.FORMATS[element]
    x = _every_value(fmt)
    for shift in (-20, 0, 7):  # any power-of-two multiple: only the E8M0 scale changes
        y = torch.ldexp(x, torch.tensor(shift))
        codec = from_spec({"name": "mx", "element": element})
        # a block's scale comes from its max |x|: each value goes in a block of 32 led by the
        # format's largest value, so every block has the scale 2^shift
        rows = torch.cat([torch.cat([y[:1], v.expand(31)]) for v in y])
        assert torch.equal(codec.decode(codec.encode(rows)), rows), shift


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_sends_every_representable_value_exactly_and_never_saturates(fmt: str) -> None:
    x = _every_value(mf.FORMATS[fmt])
    codec = from_spec({"name": "fp8", "format": fmt})
    assert torch.equal(codec.decode(codec.encode(x)), x)  # max |x| is the largest: scale 1
    y = torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 1e-3
    payload = codec.encode(y)
    got = codec.decode(payload)
    assert float(got.abs().max()) == pytest.approx(float(y.abs().max()), rel=1e-6)
    # half a step: 2^-(man+1) of a normal value; in the subnormals half the smallest value
    fmt_ = mf.FORMATS[fmt]
    scale = float(payload.buffers["scales"])
    bound = y.abs() * 2.0 ** -(fmt_.man + 1) + scale * float(fmt_.finite[1]) / 2
    assert ((got - y).abs() <= bound * (1 + 1e-6)).all()


def test_mx_saturates_a_blocks_top_as_the_specification_says() -> None:
    # max |x| = 7.5: X = 2^(floor(log2 7.5) - 2) = 2^0, so 7.5 / X is above E2M1's 6
    x = torch.tensor([7.5, 5.1, -7.0, 0.24] + [0.0] * 28)
    codec = from_spec("mx")
    got = codec.decode(codec.encode(x))
    assert got[:4].tolist() == [6.0, 6.0, -6.0, 0.0]  # 5.1: 6 is nearer than 4; 0.24: 0
    payload = codec.encode(x)
    assert payload.buffers["scales"].tolist() == [127]  # E8M0 code of 2^0


def test_nvfp4_uses_the_e4m3_block_scale_and_the_fp32_tensor_scale() -> None:
    x = torch.tensor([6.0, 3.0, -1.5] + [0.0] * 13 + [0.6, 0.3] + [0.0] * 14)
    codec = from_spec("nvfp4")
    payload = codec.encode(x)
    tensor = float(payload.buffers["tensor_scale"])
    assert tensor == pytest.approx(6.0 / (448 * 6))
    scales = mf.E4M3.decode(payload.buffers["scales"]) * tensor
    assert scales.tolist() == pytest.approx([1.0, 0.1], rel=1 / 16)  # block max / 6, in E4M3
    assert codec.decode(payload).tolist() == pytest.approx(x.tolist(), rel=0.07, abs=1e-6)


@pytest.mark.parametrize(
    "spec", ["fp8", "fp8:block_size=100,format=e5m2", "mx", "mx:element=e3m2", "nvfp4"]
)
def test_wire_bytes_are_packed_exactly_and_survive_the_wire(spec: str) -> None:
    codec = _float(spec)
    x = torch.randn(1001, generator=torch.Generator().manual_seed(2))
    payload = codec.encode(x)
    assert payload.nbytes == codec.wire_nbytes(1001)
    bits = codec.scaling.element.bits
    assert payload.buffers["codes"].numel() == math.ceil(1001 * bits / 8)
    back = codec.from_wire(payload.to_wire(), 1001)
    assert torch.equal(codec.decode(back), codec.decode(payload))


@pytest.mark.parametrize("spec", ["fp8:rounding=stochastic", "mx:element=e2m3,rounding=stochastic"])
def test_stochastic_rounding_is_keyed_like_every_codec(spec: str) -> None:
    codec = from_spec(spec)
    x = torch.randn(256, generator=torch.Generator().manual_seed(3))
    a = codec.decode(codec.encode(x, step=1, rank=0))
    assert torch.equal(a, codec.decode(codec.encode(x, step=1, rank=0)))  # reproducible
    assert not torch.equal(a, codec.decode(codec.encode(x, step=2, rank=0)))  # new draws
    if codec.name == "mx":  # a block-aligned range draws as the whole does
        head = codec.decode(codec.encode(x[128:], step=1, offset=128))
        assert torch.equal(head, a[128:])


def test_fp8_stochastic_rounding_is_unbiased_and_nearest_is_not() -> None:
    x = torch.full((64,), 1.0)
    x[0] = 448.0  # scale 1: the other values sit at 1.0 + a quarter step below
    x[1:] = 1.0 + 0.03125  # E4M3 steps are 0.125 at 1: a quarter of the way up
    sr, rn = from_spec("fp8:rounding=stochastic"), from_spec("fp8")
    mean = torch.stack([sr.decode(sr.encode(x, step=s)) for s in range(400)]).mean(0)
    assert float(mean[1:].mean()) == pytest.approx(1.03125, abs=0.004)
    assert float(rn.decode(rn.encode(x))[1]) == 1.0


def test_error_feedback_carries_the_rounding_error_to_the_next_step() -> None:
    codec = from_spec("mx:error_feedback=true")
    plain = from_spec("mx")
    g = torch.randn(512, generator=torch.Generator().manual_seed(4))
    sent = torch.zeros(512)
    for step in range(50):
        sent += codec.decode(codec.encode(g, step=step, name="w"))
    # what was sent over 50 steps is 50 g up to one step's residual; without feedback the
    # rounding error of every step adds up
    assert float((sent / 50 - g).norm()) < 0.1 * float((plain.decode(plain.encode(g)) - g).norm())
    codec.reset()
    first = codec.decode(codec.encode(g, step=0, name="w"))
    assert torch.equal(codec.state["w"], g - first)  # the residual is what was not sent


@pytest.mark.parametrize(
    "spec", ["mx", "mx:element=e4m3,rounding=stochastic", "nvfp4:scope=global",
             "fp8:block_size=64", "qsgd:bits=4,bucket_size=64"],
)  # fmt: skip
def test_integer_view_sums_codes_on_shared_scales_exactly(spec: str) -> None:
    world, n = 3, 300
    xs = [torch.randn(n, generator=torch.Generator().manual_seed(10 + r)) * (r + 1)
          for r in range(world)]  # fmt: skip
    codecs = [from_spec(spec) for _ in range(world)]
    view = integer_sum.for_compressor(codecs[0])
    assert view is not None
    scales = view.share(torch.stack([view.local_scales(x) for x in xs]).amax(0))
    ints = [view.encode(x, scales, Key(step=0, rank=r), 0, torch.int32) for r, x in
            enumerate(xs)]  # fmt: skip
    assert max(int(q.abs().max()) for q in ints) <= view.top
    got = view.decode(torch.stack(ints).sum(0, dtype=torch.int32), scales, world, torch.empty(n))
    if codecs[0].name == "qsgd":
        _check_qsgd_levels(xs, view, ints, got)
    else:  # the same values as each rank's codec on those scales
        floats = [_float(spec) for _ in range(world)]
        scaling = floats[0].scaling
        amax = torch.stack([blockscale.blocks(x, scaling.block).abs().amax(1) for x in xs]).amax(0)
        total = torch.zeros(n, dtype=torch.float64)
        for r, (c, x) in enumerate(zip(floats, xs, strict=True)):
            enc = c.encode_blocks(x, Key(step=0, rank=r), 0, amax)
            total += blockscale.decode(enc, scaling, n).double()
        # fp32 products in the reference: equal to float32 rounding of the largest terms
        atol = 1e-6 * max(float(x.abs().max()) for x in xs)
        assert torch.allclose(got, (total / world).float(), rtol=1e-6, atol=atol)


def _check_qsgd_levels(
    xs: list[torch.Tensor], view: integer_sum.IntegerSum, ints: list[torch.Tensor],
    got: torch.Tensor,
) -> None:  # fmt: skip
    """Against numpy in fp64 (4 bits: L = 7 levels of the ranks' shared bucket max s, buckets
    of 64): each rank's integer is floor or ceil of x L / s, so the mean is s sum / (K L), off
    the exact mean by less than one level s / L; the draws are unbiased, so over S steps each
    integer's mean is x L / s within sqrt(1 / (4 S)) (a rounding to nearest, or draws that do
    not change with the step, keep an error near 1 / 12 or 1 / 6 in mean square)."""
    world, n, top, bucket = len(xs), xs[0].numel(), 7, 64
    x = np.stack([v.numpy() for v in xs]).astype(np.float64)
    padded = np.pad(np.abs(x), ((0, 0), (0, -n % bucket))).reshape(world, -1, bucket)
    s = np.repeat(padded.max(axis=(0, 2)), bucket)[:n]
    t = x * top / s
    q = np.stack([v.numpy() for v in ints]).astype(np.float64)
    assert np.all((q == np.floor(t)) | (q == np.ceil(t)))
    mean = got.numpy().astype(np.float64)
    assert np.allclose(mean, s * q.sum(0) / (world * top), rtol=2.0**-22, atol=0)
    assert np.all(np.abs(mean - x.mean(0)) < s / top)
    steps = 200
    scales = torch.from_numpy(s[::bucket].astype(np.float32))
    draws = sum(
        view.encode(xs[0], scales, Key(step=k, rank=0), 0, torch.int32).double()
        for k in range(steps)
    )  # fmt: skip
    assert isinstance(draws, torch.Tensor)
    err = draws.numpy() / steps - t[0]
    assert float((err**2).mean()) < 1.5 / (4 * steps)


def test_formats_without_an_integer_view_say_why() -> None:
    assert integer_sum.for_compressor(from_spec("mx:element=e5m2")) is None
    assert integer_sum.for_compressor(from_spec("fp8")) is None  # one scale per tensor
    assert integer_sum.for_compressor(from_spec("nvfp4")) is None  # per-tensor scales
    assert integer_sum.for_compressor(from_spec("onebit")) is None


def test_codecs_refuse_nan_as_the_others_do() -> None:
    x = torch.ones(40)
    x[33] = math.nan
    for spec in ("fp8", "mx", "nvfp4"):
        with pytest.raises(ValueError, match="value 33 is nan"):
            from_spec(spec).encode(x)
