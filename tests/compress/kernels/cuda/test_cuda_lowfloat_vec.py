"""FP8 / MX / NVFP4's one-pass CUDA encode and 16-byte decode (kernels/lowfloat.cu: qb_lf_amax,
qb_lf_encode_vec, qb_lf_decode_vec), emulated, against the C kernels and the torch reference
byte for byte, and the launches that choose them over the general kernels (views at any 4-byte
offset, blocks that are not 8, 16, ..., 256 values): every block width of a warp's lanes, tails
of fewer than 8 values, error feedback over steps, draws past 2^32, NaN refusals in a tail."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from qbench.compress import from_spec
from qbench.compress.base import Payload
from qbench.compress.kernels import cuda, native
from qbench.compress.kernels.cuda import emulate as cuda_emulate
from qbench.compress.lowfloat import ScaledFloat
from tests.compress.kernels.cuda.emulated import assert_same, three_ways
from tests.compress.kernels.test_lowfloat_kernels import _adversarial, _canonical, _random

pytestmark = pytest.mark.usefixtures("emulated_kernels", "restore_switches")

Tensors = list[torch.Tensor]
VEC = ["qb_lf_encode_vec"]
WHOLE = ["qb_lf_amax", "qb_lf_encode_vec"]  # the tensor's max first
GENERAL = ["qb_lf_maxes", "qb_lf_scales", "qb_lf_quantize"]


def _codec(spec: str) -> ScaledFloat:
    codec = from_spec(spec)
    assert isinstance(codec, ScaledFloat)
    return codec


def _steps(spec: str, inputs: Tensors, offset: int, residual: torch.Tensor | None) -> Tensors:
    """Per step of a fresh codec (``residual``: its first residual, else none): the payload, its
    decode, that decode added into 0.5s, written over a view 4 bytes past a 16-byte boundary,
    and with error feedback the residual; NaNs as one pattern (the GPU's)."""
    codec, outs = _codec(spec), []
    if residual is not None:
        codec.state["w"] = residual.clone()
    for step, x in enumerate(inputs):
        p = codec.encode(x, step=step, rank=1, offset=offset, name="w")
        off = torch.zeros(p.numel + 1)[1:]
        codec.decode(p, out=off, accumulate=False)
        outs += [*p.buffers.values(), codec.decode(p), off]
        outs.append(codec.decode(p, out=torch.full((p.numel,), 0.5)))
        if codec.error_feedback:
            outs.append(codec.state["w"].clone())  # the C kernels update it in place
    return [_canonical(t) for t in outs]


def _three_ways(fn: Callable[..., Tensors], *args: Any, mode: str = "emulate") -> None:
    """fn(*args) on the torch reference, the C kernels and the emulated CUDA kernels: the same
    bytes from all three."""
    want, got = three_ways(fn, *args, mode=mode)
    assert_same(want, got, ("C vs CUDA", args[0]))


def _adversarial_for(codec: ScaledFloat) -> Callable[[int, int], torch.Tensor]:
    return lambda n, seed: _adversarial(codec, n, seed)


# -- the one pass ---------------------------------------------------------------------------------
SIZES = [1, 7, 8, 9, 31, 255, 256, 257, 1003, 2053]  # tails of 1 to 7 values, partial warps


@pytest.mark.parametrize(
    ("spec", "block"),
    [("fp8:block_size=8,error_feedback=true", 8),  # a lane per block: no shuffle
     ("fp8:block_size=16,format=e5m2,rounding=stochastic", 16),
     ("fp8:block_size=32,error_feedback=true,rounding=stochastic", 32),
     ("fp8:block_size=64", 64),
     ("fp8:block_size=128,error_feedback=true", 128),
     ("fp8:block_size=256,format=e5m2,error_feedback=true", 256),  # a whole warp per block
     ("mx:element=e4m3,error_feedback=true", 32),
     ("mx:element=e5m2,rounding=stochastic", 32),
     ("mx:element=e3m2,error_feedback=true,rounding=stochastic", 32),  # 6-bit: 4 + 2, 2 + 4
     ("mx:element=e2m3,error_feedback=true", 32),
     ("mx:element=e2m1,rounding=stochastic", 32),
     ("nvfp4:error_feedback=true", 16),
     ("nvfp4:rounding=stochastic,scope=global", 16)],
)  # fmt: skip
def test_one_pass_matches_c_and_torch(spec: str, block: int, launched: list[str]) -> None:
    first = ["qb_lf_amax"] if spec.startswith("nvfp4") else []
    for n in SIZES:
        for data in ("random", "adversarial"):
            codec = _codec(spec)
            make = _random if data == "random" else _adversarial_for(codec)
            inputs = [make(n, 10 * n + s) for s in range(2)]
            residual = _random(n, seed=n) if n % 2 else None  # a residual, or none yet
            launched.clear()
            _three_ways(_steps, spec, inputs, 2**32 - 9, residual)
            encodes = [k for k in launched if "decode" not in k]
            assert encodes == 2 * (first + VEC), (n, launched)
            # every decode but the one into a view off a 16-byte boundary
            assert launched.count("qb_lf_decode_vec") == 4 and launched.count("qb_lf_decode") == 2


@pytest.mark.parametrize(
    "spec", ["fp8", "fp8:format=e5m2,error_feedback=true,rounding=stochastic",
             "fp8:block_size=2048,error_feedback=true"],
)  # fmt: skip
def test_one_scale_per_tensor_takes_the_tensor_max_then_one_pass(
    spec: str, launched: list[str]
) -> None:
    # FP8 with one scale per tensor, or a block longer than the tensor: qb_lf_amax's max
    for n in (1, 9, 1003, 2048):
        launched.clear()
        _three_ways(_steps, spec, [_random(n, seed=n), _random(n, seed=n + 1)], 5, None)
        assert [k for k in launched if "decode" not in k] == 2 * WHOLE, launched
        assert launched.count("qb_lf_decode_vec") == 4  # one block: a shift of 62


def test_draws_past_two_to_the_32() -> None:
    for offset in (0, 2**32 - 3, 2**33 + 5, 2**40 + 1):
        for spec in ("mx:rounding=stochastic", "fp8:block_size=128,rounding=stochastic"):
            _three_ways(_steps, spec, [_random(1003, seed=3)], offset, None)


# -- the general path -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "decode"),
    [("fp8:block_size=24,error_feedback=true", "qb_lf_decode"),
     ("fp8:block_size=512", "qb_lf_decode_vec"),  # 2 ^ k: a shift of 6
     ("fp8:block_size=4096,rounding=stochastic", "qb_lf_decode_vec")],
)  # fmt: skip
def test_other_blocks_take_the_general_kernels(spec: str, decode: str, launched: list[str]) -> None:
    n = 5003  # more than one block of each
    _three_ways(_steps, spec, [_random(n, seed=1), _random(n, seed=2)], 7, None)
    assert [k for k in launched if "decode" not in k] == 2 * GENERAL, launched
    # per step: into a view off a 16-byte boundary, then fresh, then added into 0.5s
    assert [k for k in launched if "decode" in k] == 2 * ["qb_lf_decode", decode, decode]


def _views(spec: str, n: int, g_at: int, r_at: int) -> Tensors:
    """An encode of a gradient and a residual that start ``g_at`` and ``r_at`` floats into their
    buffers (contiguous views: 16-byte aligned only at a multiple of 4): payload, decode and the
    new residual."""
    g = torch.cat([torch.zeros(g_at), _random(n, seed=4)])[g_at:]
    codec = _codec(spec)
    codec.state["w"] = torch.cat([torch.zeros(r_at), _random(n, seed=5)])[r_at:]
    p = codec.encode(g, offset=3, name="w")
    return [_canonical(t) for t in [*p.buffers.values(), codec.decode(p), codec.state["w"]]]


@pytest.mark.parametrize(
    "spec", ["mx:error_feedback=true", "nvfp4:error_feedback=true",
             "fp8:block_size=128,error_feedback=true,rounding=stochastic"],
)  # fmt: skip
def test_views_off_a_16_byte_boundary_take_the_general_kernels(
    spec: str, launched: list[str]
) -> None:
    nvfp4 = spec.startswith("nvfp4")
    general = [GENERAL[0], *(["qb_lf_top"] if nvfp4 else []), *GENERAL[1:]]
    fast = [*(["qb_lf_amax"] if nvfp4 else []), *VEC]
    for g_at, r_at in ((1, 0), (0, 3), (2, 2), (4, 8), (0, 0)):
        launched.clear()
        _three_ways(_views, spec, 1003, g_at, r_at)
        aligned = g_at % 4 == 0 and r_at % 4 == 0
        assert [k for k in launched if "decode" not in k] == (fast if aligned else general)


def test_misaligned_codes_decode_with_the_general_kernel(launched: list[str]) -> None:
    codec = _codec("mx:element=e3m2")
    with native.backend("native"), cuda_emulate.emulation("emulate"):
        p = codec.encode(_random(1003, seed=6))
        want = codec.decode(p)
        codes = torch.cat([torch.zeros(4, dtype=torch.uint8), p.buffers["codes"]])[4:]
        assert codes.data_ptr() % 8 == 4
        off = Payload(numel=p.numel, buffers={**p.buffers, "codes": codes})
        launched.clear()
        got = codec.decode(off)
    assert launched == ["qb_lf_decode"]
    assert torch.equal(got, want)


# -- grid-stride loops and schedules --------------------------------------------------------------
@pytest.mark.parametrize("mode", ["emulate", "racecheck"])
def test_grid_stride_loops_and_schedules(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # Two blocks of threads for ~600 warps' worth of groups: each warp strides as a whole (the
    # last iteration has lanes past the end in its shuffles); racecheck runs several schedules.
    monkeypatch.setattr(cuda, "_MAX_BLOCKS", 2)
    for spec in ("mx:element=e3m2,error_feedback=true", "nvfp4:rounding=stochastic",
                 "fp8:error_feedback=true", "fp8:block_size=256,rounding=stochastic"):  # fmt: skip
        inputs = [_random(5001, seed=8), _random(5001, seed=9)]
        _three_ways(_steps, spec, inputs, 11, None, mode=mode)


# -- NaN and inf ----------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["mx", "nvfp4", "fp8", "fp8:block_size=64"])
@pytest.mark.parametrize("at", [0, 999, 1002])  # 1002: in the tail group of 1003 values
def test_nan_or_inf_anywhere_is_refused_and_the_residual_kept(spec: str, at: int) -> None:
    for bad in (math.nan, math.inf, -math.inf):
        x = _random(1003, seed=1)
        x[at] = bad
        codec = _codec(spec)
        codec.error_feedback = True
        codec.state["w"] = torch.full((1003,), 0.25)
        with (
            native.backend("native"),
            cuda_emulate.emulation("emulate"),
            pytest.raises(ValueError, match=f"value {at} is {bad}"),
        ):
            codec.encode(x, name="w")
        assert torch.equal(codec.state["w"], torch.full((1003,), 0.25))


def test_a_nan_in_the_residual_is_encoded_not_refused() -> None:
    # grad finite, grad + residual not: the reference encodes it (NaN and inf scales)
    residual = torch.zeros(1003)
    residual[[3, 40, 1002]] = torch.tensor([math.nan, math.inf, -math.inf])
    for spec in ("mx:error_feedback=true,element=e4m3", "nvfp4:error_feedback=true",
                 "fp8:error_feedback=true,block_size=16"):  # fmt: skip
        _three_ways(_steps, spec, [_random(1003, seed=2)], 0, residual)
