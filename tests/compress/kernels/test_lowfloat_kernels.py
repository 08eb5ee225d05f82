"""The compiled FP8 / MX / NVFP4 kernels (kernels/cpu/qbench_cpu.c on kernels/lowfloat_math.h)
against the torch reference of qbench.compress.lowfloat (blockscale.py, minifloat.py), byte for
byte: codes, scales, tensor scales, decoded floats (also added into ``out``) and error-feedback
residuals, for every codec, element format, rounding and error-feedback setting.

The inputs aim at every branch of the element rounding: exact ties between neighbours (blocks
are led by a value that makes their scale a power of two, or 448 x one for NVFP4's first block,
so that x / scale lands exactly on a midpoint), the floats just either side of each tie, the
values at and beyond the largest (saturation), the format's subnormals, float32 subnormals,
zeros and -0.0, blocks of zeros whose scale is 0, and a huge dynamic range.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from qbench.compress import from_spec
from qbench.compress import minifloat as mf
from qbench.compress.base import Payload
from qbench.compress.kernels import cuda, native
from qbench.compress.kernels.cuda import emulate as cuda_emulate
from qbench.compress.lowfloat import ScaledFloat
from tests import compiled


@pytest.fixture(autouse=True, scope="module")
def _kernels() -> None:
    compiled.require_c_kernels()  # skips without a C compiler; a broken build fails


@pytest.fixture(autouse=True)
def _restore_backend() -> Iterator[None]:
    backend = native._backend
    yield
    native._backend = backend


ELEMENTS = ["e4m3", "e5m2", "e3m2", "e2m3", "e2m1"]
SIZES = [0, 1, 15, 16, 17, 31, 32, 33, 1000, 4097]
_CHOICES: list[dict[str, Any]] = [
    {"rounding": r, "error_feedback": ef}
    for r, ef in itertools.product(["nearest", "stochastic"], [False, True])
]
SPECS = (
    [{"name": "fp8", "format": f, "block_size": b, **c}
     for f in ("e4m3", "e5m2") for b in (0, 7, 128) for c in _CHOICES]
    + [{"name": "mx", "element": e, **c} for e in ELEMENTS for c in _CHOICES]
    + [{"name": "nvfp4", **c} for c in _CHOICES]
    + [{"name": "nvfp4", "scope": "global", "rounding": "stochastic"}]
)  # fmt: skip


def _id(spec: dict[str, Any]) -> str:
    return spec["name"] + ":" + ",".join(f"{k}={v}" for k, v in spec.items() if k != "name")


def _codec(spec: Any) -> ScaledFloat:
    codec = from_spec(spec)
    assert isinstance(codec, ScaledFloat)
    return codec


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().view(torch.uint8).numpy().tobytes()


def _assert_same(want: list[torch.Tensor], got: list[torch.Tensor], where: object) -> None:
    assert len(want) == len(got), where
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (where, i)
        if _bytes(g) != _bytes(w):
            bad = (g.reshape(-1).view(torch.uint8) != w.reshape(-1).view(torch.uint8)).nonzero()
            first = int(bad[0, 0]) // w.element_size()
            pytest.fail(
                f"{where}, output {i}, element {first}: kernel "
                f"{g.reshape(-1)[first].item()!r}, reference {w.reshape(-1)[first].item()!r}"
            )


def _outputs(codec: ScaledFloat, p: Payload, name: str = "w") -> list[torch.Tensor]:
    """The payload's buffers, its decode, its decode added into 0.5s, and the residual."""
    out = [*p.buffers.values(), codec.decode(p), codec.decode(p, out=torch.full((p.numel,), 0.5))]
    if codec.error_feedback:
        out.append(codec.state[name].clone())
    return out


def _both(spec: Any, inputs: list[torch.Tensor], offset: int = 0) -> tuple[list[Any], list[Any]]:
    """Per step, the outputs of a fresh codec on the C kernels, then on the torch reference
    (error feedback carries across the steps)."""
    runs = []
    for backend in ("native", "torch"):
        codec, outs = _codec(spec), []
        with native.backend(backend):
            for step, x in enumerate(inputs):
                p = codec.encode(x, step=step, rank=1, offset=offset, name="w")
                outs.append(_outputs(codec, p))
        runs.append(outs)
    return runs[0], runs[1]


# -- inputs ---------------------------------------------------------------------------------------
def _random(n: int, seed: int) -> torch.Tensor:
    """Gaussian values over a huge dynamic range, with exact zeros, -0.0 and float32 subnormals."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 6)
    x[3::17] = 0.0
    x[5::19] = -0.0
    x[7::23] = torch.tensor([1e-45, -3e-42, 1.1e-38, -5e-39])[torch.arange(len(x[7::23])) % 4]
    return x


def _grid(fmt: mf.Format) -> torch.Tensor:
    """Magnitudes in units of the element format: its values, the midpoints between neighbours
    (exact ties), and just beyond the largest up to the next power of two (saturation)."""
    v = fmt.finite
    mids = (v[1:] + v[:-1]) / 2
    top = 2.0 ** (fmt.emax + 1)
    beyond = torch.tensor([fmt.max_normal * (1 + 2**-20), (fmt.max_normal + top) / 2, top * 0.999])
    return torch.cat([v, mids, beyond]).float()


def _adversarial(codec: ScaledFloat, n: int, seed: int) -> torch.Tensor:
    """Blocks led by a value that sets a known scale, filled with ties, their float32 neighbours,
    saturating values, subnormals and zeros of both signs; some whole blocks of zeros, -0.0 or
    float32 subnormals (scales that are 0, or too small for their format)."""
    g = torch.Generator().manual_seed(seed)
    scaling, fmt = codec.scaling, codec.scaling.element
    block = scaling.block_of(n)
    units = _grid(fmt)
    x = torch.empty(n)
    exponents = [0, -7, 12, -30, 40, -100, 3, -126, 90, -1]
    for b, start in enumerate(range(0, n, block)):
        cnt = min(block, n - start)
        k = exponents[b % len(exponents)]
        if scaling.kind == "fp8":
            lead_units, unit = fmt.max_normal, 2.0**k  # scale: exactly 2^k
        elif scaling.kind == "mx":
            lead_units = fmt.max_normal if b % 3 else float(units[-1])  # X = 2^k either way
            unit = 2.0**k
        else:  # NVFP4: block 0 sets the tensor scale 2^-3; the others have E4M3 scales 2^j
            k = -3
            j = [8, 0, -5, 3, -9, 6, -12][b % 7] if b else 0
            lead_units, unit = (448.0 * 6.0, 2.0**k) if b == 0 else (6.0, 2.0 ** (j + k))
        pool = units[units <= lead_units] * unit
        pool = torch.cat([pool, pool.nextafter(pool.new_tensor(math.inf))])
        pool = torch.cat([pool, pool.nextafter(pool.new_zeros(()))])
        pool = pool[torch.isfinite(pool) & (pool <= lead_units * unit)]
        values = pool[torch.randint(len(pool), (cnt,), generator=g)]
        values *= torch.where(torch.rand(cnt, generator=g) < 0.5, -1.0, 1.0)
        values[torch.rand(cnt, generator=g) < 0.05] = 0.0
        values[torch.rand(cnt, generator=g) < 0.05] = -0.0
        values[0] = lead_units * unit * (-1.0 if b % 2 else 1.0)
        kind = b % 9
        if kind == 4:
            values[:] = 0.0
        elif kind == 5:
            values[:] = -0.0
        elif kind == 6:  # float32 subnormals only
            values = torch.randint(1, 2**23, (cnt,), generator=g, dtype=torch.int32).view(
                torch.float32
            ) * torch.where(torch.rand(cnt, generator=g) < 0.5, -1.0, 1.0)
        x[start : start + cnt] = values
    return x


def _three_steps(codec: ScaledFloat, n: int, data: str) -> list[torch.Tensor]:
    """Three steps' gradients of n values: random, or adversarial for ``codec``."""
    if data == "random":
        return [_random(n, seed=100 * n + step) for step in range(3)]
    return [_adversarial(codec, n, seed=n + step) for step in range(3)]


# -- the whole pipeline ---------------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_kernels_match_the_reference_byte_for_byte(spec: dict[str, Any]) -> None:
    codec = _codec(spec)
    for n in SIZES:
        for data in ("random", "adversarial"):
            inputs = _three_steps(codec, n, data)
            want, got = _both(spec, inputs, offset=12345)
            for step in range(3):
                _assert_same(want[step], got[step], (n, data, step))


@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_every_float32_magnitude_rounds_as_the_reference(element: str, rounding: str) -> None:
    # MX with scale 2^0 (each block led by a value just under 2^(emax+1)): the element rounding
    # of a dense sweep of float32 bit patterns from 0 to that lead, both signs; FP8 likewise
    # with scale 1 (one block led by the largest value).
    fmt = mf.FORMATS[element]
    lead = torch.tensor(2.0 ** (fmt.emax + 1)).nextafter(torch.tensor(0.0))
    patterns = torch.arange(0, int(lead.view(torch.int32)), 1021, dtype=torch.int32)
    sweep = patterns.view(torch.float32)
    sweep = torch.cat([sweep, -sweep[1::2]])
    blocks = len(sweep) // 31 + 1
    values = torch.zeros(blocks * 31)
    values[: len(sweep)] = sweep
    rows = torch.cat([lead.expand(blocks, 1), values.view(blocks, 31)], 1)
    specs: list[Any] = [{"name": "mx", "element": element, "rounding": rounding}]
    inputs = [rows.reshape(-1)]
    if element in ("e4m3", "e5m2"):
        top = torch.tensor([fmt.max_normal])
        specs.append({"name": "fp8", "format": element, "rounding": rounding})
        inputs.append(torch.cat([top, sweep[sweep.abs() <= fmt.max_normal]]))
    for spec, x in zip(specs, inputs, strict=True):
        want, got = _both(spec, [x])
        _assert_same(want[0], got[0], spec)


@pytest.mark.parametrize(
    "spec",
    ["mx:rounding=stochastic", "nvfp4:rounding=stochastic,scope=global",
     "fp8:block_size=64,rounding=stochastic", "fp8:format=e5m2,rounding=stochastic"],
)  # fmt: skip
def test_a_range_draws_by_global_index(spec: str) -> None:
    x = _random(3000, seed=7)
    for start, offset in ((0, 0), (64, 64), (1000, 1000), (5, 2**32 - 5), (128, 2**33 + 128)):
        part = x[start:]
        want, got = _both(spec, [part], offset=offset)
        _assert_same(want[0], got[0], (start, offset))
    # the draws come from the global index: a block-aligned range encodes as the whole does
    codec = _codec(spec)
    if codec.scaling.kind != "nvfp4" and codec.scaling.block:  # (NVFP4's tensor scale differs)
        with native.backend("native"):
            whole = codec.encode(x, step=1, rank=1)
            tail = codec.encode(x[1024:], step=1, rank=1, offset=1024)
        bits = codec.scaling.element.bits
        assert torch.equal(tail.buffers["codes"], whole.buffers["codes"][1024 * bits // 8 :])


# -- error feedback -------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["fp8:error_feedback=true,block_size=32", "mx:error_feedback=true",
                                  "nvfp4:error_feedback=true,rounding=stochastic"])  # fmt: skip
def test_error_feedback_over_three_steps_updates_the_residual_in_place(spec: str) -> None:
    inputs = [_random(1000, seed=s) for s in range(3)]
    want, got = _both(spec, inputs)
    for step in range(3):
        _assert_same(want[step], got[step], step)
    codec = _codec(spec)
    with native.backend("native"):
        codec.encode(inputs[0], name="w")
        residual = codec.state["w"]
        codec.encode(inputs[1], name="w")
        assert codec.state["w"] is residual  # updated in place, no new buffer
        # a strided residual is read, and replaced by a new buffer with the same values
        strided = torch.linspace(-1, 1, 2000)[::2]
        codec.state["w"] = strided
        p = codec.encode(inputs[2], name="w")
        assert codec.state["w"] is not strided
        got_strided = [*p.buffers.values(), codec.state["w"]]
    reference = _codec(spec)
    reference.state["w"] = torch.linspace(-1, 1, 2000)[::2]
    with native.backend("torch"):
        p = reference.encode(inputs[2], name="w")
    _assert_same([*p.buffers.values(), reference.state["w"]], got_strided, "strided")


def test_a_residual_of_another_shape_takes_the_reference() -> None:
    codec = _codec("mx:error_feedback=true")
    codec.state["w"] = torch.zeros(10)
    with native.backend("native"), pytest.raises(RuntimeError, match="size of tensor"):
        codec.encode(torch.ones(33), name="w")


def test_overflow_through_the_residual_matches_the_reference() -> None:
    # grad is finite, grad + residual is not (inf, or a NaN from inf - inf): the reference
    # encodes it all the same (NaN and inf scales, NaN codes); so must the kernels
    for spec in ("fp8:error_feedback=true,block_size=16", "mx:error_feedback=true,element=e4m3",
                 "mx:error_feedback=true,element=e5m2", "nvfp4:error_feedback=true"):  # fmt: skip
        x = _random(200, seed=3)
        runs = []
        for backend in ("native", "torch"):
            codec = _codec(spec)
            residual = torch.zeros(200)
            residual[40:48] = torch.tensor([3e38, -3e38, math.inf, -math.inf, math.nan, 1, 2, 3])
            x[40:44] = torch.tensor([3e38, -3e38, 1.0, 2.0])
            codec.state["w"] = residual
            with native.backend(backend):
                runs.append(_outputs(codec, codec.encode(x, name="w")))
        _assert_same(runs[1], runs[0], spec)


# Every path of the C encode's check: 100 values are one chunk of short blocks; 5,000 are
# several chunks (the NaN in the first or the last), and for FP8 with one scale per tensor (or
# blocks of 2,048) the long-block path, whose block max is taken chunk by chunk.
NAN_AT = [(100, 70), (5000, 3), (5000, 4321)]


@pytest.mark.parametrize("spec", ["fp8", "fp8:block_size=16", "fp8:block_size=2048", "mx", "nvfp4"])
@pytest.mark.parametrize("error_feedback", [False, True])
@pytest.mark.parametrize(("n", "at"), NAN_AT, ids=[f"{n}-at-{i}" for n, i in NAN_AT])
def test_nan_and_inf_gradients_are_refused_as_the_reference_does(
    spec: str, error_feedback: bool, n: int, at: int
) -> None:
    for bad in (math.nan, math.inf, -math.inf):
        x = _random(n, seed=1)
        x[at] = bad
        messages, residuals = [], []
        for backend in ("native", "torch"):
            codec = _codec(spec)
            codec.error_feedback = error_feedback
            codec.state["w"] = torch.full((n,), 0.25)
            with native.backend(backend), pytest.raises(ValueError) as info:
                codec.encode(x, name="w", offset=10)
            messages.append(str(info.value))
            residuals.append(codec.state["w"])
        assert messages[0] == messages[1]
        assert f"value {at + 10} is" in messages[0]
        assert torch.equal(residuals[0], torch.full((n,), 0.25))  # left as it was


# -- decode ---------------------------------------------------------------------------------------
def test_decode_adds_into_out_and_checks_the_payload() -> None:
    codec = _codec("nvfp4")
    x = _random(100, seed=2)
    with native.backend("native"):
        p = codec.encode(x)
        strided = torch.zeros(200)[::2]  # not a plain buffer: the generic out.add_
        codec.decode(p, out=strided)
        plain = codec.decode(p, out=torch.zeros(100))
    with native.backend("torch"):
        want = codec.decode(p)
    _assert_same([want + 0.0, want + 0.0], [strided.contiguous(), plain], "out")
    bad = [
        {"codes": p.buffers["codes"][:-1]},
        {"scales": p.buffers["scales"].float()},
        {"tensor_scale": torch.ones(2)},
    ]
    for change in bad:
        broken = Payload(numel=100, buffers={**p.buffers, **change})
        with native.backend("native"), pytest.raises(ValueError, match="payload of 100 values"):
            codec.decode(broken)


def test_the_kernels_run_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    for name in ("lowfloat_encode", "lowfloat_decode"):
        real = getattr(native.CPU, name)
        monkeypatch.setattr(
            native.CPU, name, lambda *a, _n=name, _f=real, **k: calls.append(_n) or _f(*a, **k)
        )
    codec = _codec("mx")
    with native.backend("native"):
        codec.decode(codec.encode(torch.ones(40)))
    with native.backend("torch"):
        codec.decode(codec.encode(torch.ones(40)))
    assert calls == ["lowfloat_encode", "lowfloat_decode"]


# -- the CUDA kernels (kernels/lowfloat.cu), emulated on CPU threads ---------------------------
def _canonical(t: torch.Tensor) -> torch.Tensor:
    """Every float NaN as one pattern: the GPU's float units return one canonical NaN where x86
    and torch keep a payload (tests/compress/kernels/cuda/test_cuda_emulate.py: _bytes)."""
    t = t.detach().contiguous()
    return torch.where(t.isnan(), torch.tensor(math.nan), t) if t.is_floating_point() else t


def _emulated(
    spec: Any, inputs: list[torch.Tensor], offset: int = 0, mode: str = "emulate"
) -> list[Any]:
    """_both's first half on the CUDA kernels (QBENCH_CUDA=emulate: compressor ->
    native.kernels_for -> cuda.CUDA -> the emulator)."""
    codec, outs = _codec(spec), []
    with native.backend("native"), cuda_emulate.emulation(mode):
        for step, x in enumerate(inputs):
            p = codec.encode(x, step=step, rank=1, offset=offset, name="w")
            outs.append([_canonical(t) for t in _outputs(codec, p)])
    return outs


@pytest.fixture
def _emulator() -> Iterator[None]:
    compiled.require_emulator()  # skips without a C++ compiler; a broken build fails
    mode = cuda_emulate._mode
    yield
    cuda_emulate._mode = mode


@pytest.mark.usefixtures("_emulator")
@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_cuda_kernels_match_the_reference_byte_for_byte(spec: dict[str, Any]) -> None:
    codec = _codec(spec)
    for n in SIZES:
        for data in ("random", "adversarial"):
            inputs = _three_steps(codec, n, data)
            got = _emulated(spec, inputs, offset=2**32 - 9)
            _, want = _both(spec, inputs, offset=2**32 - 9)
            for step in range(3):
                _assert_same([_canonical(t) for t in want[step]], got[step], (n, data, step))


@pytest.mark.usefixtures("_emulator")
@pytest.mark.parametrize("mode", ["emulate", "racecheck"])
def test_cuda_grid_stride_loops_and_schedules(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # Two blocks of threads for thousands of groups: every loop strides; racecheck also runs
    # each launch under several thread and block schedules and requires the same bytes.
    monkeypatch.setattr(cuda, "_MAX_BLOCKS", 2)
    for spec in ("fp8:block_size=7,error_feedback=true", "fp8:rounding=stochastic",
                 "mx:element=e3m2,error_feedback=true", "nvfp4:rounding=stochastic"):  # fmt: skip
        inputs = [_random(5000, seed=s) for s in range(2)]
        got = _emulated(spec, inputs, mode=mode)
        _, want = _both(spec, inputs)
        for step in range(2):
            _assert_same([_canonical(t) for t in want[step]], got[step], (spec, step))


@pytest.mark.usefixtures("_emulator")
@pytest.mark.parametrize("spec", ["fp8", "fp8:block_size=2048", "mx", "nvfp4"])
@pytest.mark.parametrize("error_feedback", [False, True])
def test_cuda_kernels_refuse_a_nan_far_into_a_grid_stride(
    spec: str, error_feedback: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One block of 256 threads striding over 40,000 values (625 runs of 64 for the block
    maxima): the flag of a NaN or inf met in the third pass must still refuse the encode."""
    monkeypatch.setattr(cuda, "_MAX_BLOCKS", 1)
    for bad in (math.nan, -math.inf):
        x = _random(40_000, seed=1)
        x[39_000] = bad
        codec = _codec(spec)
        codec.error_feedback = error_feedback
        with (
            native.backend("native"),
            cuda_emulate.emulation("emulate"),
            pytest.raises(ValueError, match=f"value 39000 is {bad}"),
        ):
            codec.encode(x, name="w")


@pytest.mark.usefixtures("_emulator")
def test_cuda_kernels_refuse_nan_and_every_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    launched: list[str] = []
    real = cuda_emulate.launch

    def spy(sources: Any, name: str, *args: Any) -> None:
        launched.append(name)
        real(sources, name, *args)

    monkeypatch.setattr(cuda_emulate, "launch", spy)
    codec = _codec("nvfp4:error_feedback=true")
    codec.state["w"] = torch.full((40,), 0.25)
    x = torch.ones(40)
    x[33] = math.nan
    with native.backend("native"), cuda_emulate.emulation("emulate"):
        with pytest.raises(ValueError, match="value 33 is nan"):
            codec.encode(x, name="w")
        # one check, after every launch: the new residual went to a buffer of its own
        assert launched == ["qb_lf_amax", "qb_lf_encode_vec"]
        assert torch.equal(codec.state["w"], torch.full((40,), 0.25))
        off = torch.ones(41)[1:]  # 4 bytes past a 16-byte boundary: the general path
        off[33] = math.nan
        with pytest.raises(ValueError, match="value 33 is nan"):
            codec.encode(off, name="w")
        assert launched[2:] == ["qb_lf_maxes", "qb_lf_top", "qb_lf_scales", "qb_lf_quantize"]
        assert torch.equal(codec.state["w"], torch.full((40,), 0.25))
        codec.decode(codec.encode(torch.ones(40), name="w"))
        codec.decode(codec.encode(torch.ones(40), name="w"), out=torch.zeros(41)[1:])
    lowfloat = set(cuda._SOURCES["lowfloat.cu"])
    units = {k for k in lowfloat if k.startswith("qb_lf_units_")}  # test_integer_units.py's
    assert len(units) == 3 and set(launched) == lowfloat - units
