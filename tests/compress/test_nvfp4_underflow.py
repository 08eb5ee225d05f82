"""NVFP4 on tensors too small for its fp32 tensor scale (issue 44, item 3).

The tensor scale is max |x| / 2688; below max |x| ~ 1.9e-42 it underflowed to 0, every block of
zeros got 0 / 0, the E4M3 NaN scale, and 64 finite values holding one 1e-43 decoded to 48 NaNs.
It is now at least the smallest normal float32 (qbench.compress.blockscale.Scaling.scales,
kernels/lowfloat_math.h: qb_lf_nvfp4_tensor). Every case below decodes finite and close, with
exact zeros where a block underflows, in the torch reference, the C kernels, the CUDA kernels
(emulated) and the integer view, byte for byte the same. The issue's example and the tiny
subnormals beside blocks of zeros fail on the old code; the other cases guard the floor's
boundaries (all zeros keep the tensor scale 1; a max under 2688 x 2^-126 takes the floor in
every implementation alike).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from qbench.compress import Key, from_spec, integer_sum
from qbench.compress import blockscale as bs
from qbench.compress.kernels import native
from qbench.compress.kernels.cuda import emulate as cuda_emulate
from qbench.compress.lowfloat import ScaledFloat
from tests import compiled

SPECS = [
    f"nvfp4:rounding={r}" + (",scope=global" if g else "")
    for g in (False, True)
    for r in ("nearest", "stochastic")
]
DUST = 6 * 2.0**-136  # a block under this max gets E4M3 scale 0 on any tensor scale >= 2^-126


def _subnormals(n: int, below: int, seed: int) -> torch.Tensor:
    """n float32 subnormals of either sign, bit patterns 1 .. below - 1."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(1, below, (n,), generator=g, dtype=torch.int32)
    return bits.view(torch.float32) * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)


def _cases() -> dict[str, torch.Tensor]:
    example = torch.zeros(64)
    example[5] = 1e-43  # the issue's: 48 NaNs from the old code
    zeros = torch.zeros(64)
    zeros[1::3] = -0.0
    tiny_and_zeros = torch.zeros(64)  # max ~1.8e-42 < 1.9e-42: old tensor scale 0
    tiny_and_zeros[16:32] = _subnormals(16, 1300, seed=1)
    normal = torch.randn(16, generator=torch.Generator().manual_seed(3)) + 3.0
    tiny_then_normal = torch.cat([torch.full((16,), 1e-43), normal])
    below_floor = torch.zeros(48)  # max ~3e-36: max / 2688 is subnormal, the floor wins
    below_floor[:16] = torch.linspace(-3e-36, 3e-36, 16)
    return {
        "issue-example": example,
        "all-zeros": zeros,
        "all-subnormal": _subnormals(64, 2**23, seed=2),
        "tiny-subnormals-and-zero-blocks": tiny_and_zeros,
        "tiny-block-then-normal-block": tiny_then_normal,
        "max-below-the-floor": below_floor,
    }


CASES = _cases()


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    backend, mode = native._backend, cuda_emulate._mode
    yield
    native._backend, cuda_emulate._mode = backend, mode


def _assert_close(x: torch.Tensor, got: torch.Tensor, where: object) -> None:
    """Finite, within half its block's max of each value (a generous NVFP4 bound), and exactly 0
    in every block whose max is under DUST."""
    bad = int((~torch.isfinite(got)).sum())
    assert bad == 0, f"{where}: {bad} of {got.numel()} decoded values are not finite"
    rows, dec = bs.blocks(x, bs.NVFP4_BLOCK), bs.blocks(got, bs.NVFP4_BLOCK)
    amax = rows.abs().amax(dim=1, keepdim=True)
    assert ((dec - rows).abs() <= amax / 2 + DUST).all(), (where, dec, rows)
    assert (dec[amax.squeeze(1) < DUST] == 0).all(), (where, "an underflowing block not 0")


def _run(spec: str, x: torch.Tensor, backend: str, emulate: bool = False) -> list[bytes]:
    """The payload's buffers and the decode, as bytes, after checking the decode."""
    codec = from_spec(spec)
    with native.backend(backend), cuda_emulate.emulation("emulate" if emulate else "off"):
        p = codec.encode(x, step=3, rank=1, offset=7)
        got = codec.decode(p)
    _assert_close(x, got, (spec, backend, "emulated" if emulate else ""))
    return [t.contiguous().view(torch.uint8).numpy().tobytes() for t in (*p.buffers.values(), got)]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("case", CASES)
def test_the_reference_decodes_tiny_tensors_finite(spec: str, case: str) -> None:
    _run(spec, CASES[case], "torch")


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("case", CASES)
def test_the_c_kernels_decode_tiny_tensors_as_the_reference(spec: str, case: str) -> None:
    compiled.require_c_kernels()
    assert _run(spec, CASES[case], "native") == _run(spec, CASES[case], "torch")


@pytest.mark.parametrize("spec", SPECS)
def test_the_cuda_kernels_decode_tiny_tensors_as_the_reference(spec: str) -> None:
    compiled.require_emulator()
    for case, x in CASES.items():
        assert _run(spec, x, "native", emulate=True) == _run(spec, x, "torch"), case


def _integer_mean(spec: str, xs: list[torch.Tensor], backend: str, emulate: bool) -> torch.Tensor:
    """The integer view's mean of ``xs`` (one per rank) on the scales the ranks share."""
    view = integer_sum.for_compressor(from_spec(spec))
    assert view is not None
    with native.backend(backend), cuda_emulate.emulation("emulate" if emulate else "off"):
        scales = view.share(torch.stack([view.local_scales(x) for x in xs]).amax(0))
        ints = [view.encode(x, scales, Key(step=0, rank=r), 0, torch.int32)
                for r, x in enumerate(xs)]  # fmt: skip
        total = torch.stack(ints).sum(0, dtype=torch.int32)
        return view.decode(total, scales, len(xs), torch.empty(xs[0].numel()))


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("case", CASES)
def test_the_integer_view_sums_tiny_tensors_finite(rounding: str, case: str) -> None:
    # three ranks on shared scales (scope global: the one NVFP4 with an integer view): the
    # mean of their integer sums is the mean of each rank's codec decode on those scales to one
    # float32 ulp (each rank's decode rounds to float32 before the mean, the integer sum rounds
    # once), and byte for byte the same on the torch reference, the C loops and the CUDA
    # kernels (emulated)
    spec = f"nvfp4:scope=global,rounding={rounding}"
    xs = [CASES[case] * (r + 1) for r in range(3)]
    got = _integer_mean(spec, xs, "torch", emulate=False)
    _assert_close(torch.stack(xs).mean(0), got, (spec, case))
    codec = from_spec(spec)
    assert isinstance(codec, ScaledFloat)
    amax = torch.stack([bs.blocks(x, bs.NVFP4_BLOCK).abs().amax(1) for x in xs]).amax(0)
    with native.backend("torch"):
        each = [codec.encode_blocks(x, Key(step=0, rank=r), 0, amax) for r, x in enumerate(xs)]
    want = sum(bs.decode(e, bs.NVFP4, got.numel()).double() for e in each) / 3
    assert torch.allclose(got.double(), want, rtol=2.0**-23, atol=0.0), (spec, case)
    compiled.require_c_kernels()
    assert torch.equal(_integer_mean(spec, xs, "native", emulate=False), got), "C"
    compiled.require_emulator()
    assert torch.equal(_integer_mean(spec, xs, "native", emulate=True), got), "CUDA"
