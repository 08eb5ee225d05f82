"""The CUDA kernels, emulated on CPU threads, against the C kernels, byte for byte.

Every launch goes the way it goes on a GPU: compressor -> native.kernels_for -> cuda.CUDA (its
launch configuration and argument conversion) -> cuda._launch, which hands CPU tensors to the
emulator under QBENCH_CUDA=emulate (qbench/compress/kernels/cuda/emulate.py,
docs/cuda-emulation.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from qbench.compress import integer_sum
from qbench.compress.base import Key
from qbench.compress.kernels import cuda, native
from qbench.compress.kernels.cuda import emulate as cuda_emulate
from qbench.compress.lowfloat import NVFP4
from qbench.compress.onebit import OneBit
from qbench.compress.qsgd import QSGD
from qbench.errors import UserError
from tests.compress.kernels.cuda.test_cuda import (
    QSGD_VARIANTS,  # the same variants the GPU tests run
)

pytestmark = pytest.mark.usefixtures("emulated_kernels", "restore_switches")
ALL_KERNELS = {name for names in cuda._SOURCES.values() for name in names}
Tensors = list[torch.Tensor]


def _grad(n: int, seed: int = 0) -> torch.Tensor:
    """Gaussian values, zeros, -0.0, an all-zero bucket, a huge value, a subnormal."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 3
    x[::11] = 0.0
    x[5::13] = -0.0
    if n > 600:
        x[512:576] = 0.0
        x[700] = 3e30
        x[701] = 1e-41
    return x


def _special(n: int) -> torch.Tensor:
    """NaN, +-Inf, huge, subnormal and signed zeros among ordinary values."""
    x = _grad(n, seed=5)
    specials = [float("nan"), float("inf"), -float("inf"), 3e38, -5e30, 1e-42, -0.0, 3e9]
    for i, v in enumerate(specials):
        x[(37 * i + 3) % n :: 97] = v
    return x


def _bytes(t: torch.Tensor) -> bytes:
    """Exact bytes, but every float NaN as one pattern: a GPU's float units return their one
    canonical NaN (0x7fffffff) where x86 keeps a payload or returns 0xffc00000, so NaN results
    (an l2 scale of inf decodes 0 * inf) differ in their bits between the GPU and the C loops."""
    t = t.detach().contiguous()
    if t.dtype == torch.float32:
        t = torch.where(t.isnan(), torch.tensor(float("nan")), t)
    return t.view(torch.uint8).numpy().tobytes()


def _c_and_emulated(
    fn: Callable[..., Tensors], *args: Any, mode: str = "emulate"
) -> tuple[Tensors, Tensors]:
    """fn(*args)'s tensors from the C kernels, then from the emulated CUDA kernels."""
    with native.backend("native"):
        with cuda_emulate.emulation("off"):
            want = fn(*args)
        with cuda_emulate.emulation(mode):
            got = fn(*args)
    return want, got


def _assert_same(want: list[torch.Tensor], got: list[torch.Tensor], where: object) -> None:
    assert len(want) == len(got)
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, (where, i)
        assert _bytes(g) == _bytes(w), (where, i)


def _qsgd_outputs(c: QSGD, x: torch.Tensor, offset: int = 77) -> Tensors:
    """Levels, scales, decode, decode added into ones (the accumulate path) and written over
    them (accumulate=False: a preallocated buffer)."""
    p = c.encode(x, step=2, rank=1, offset=offset)
    acc = c.decode(p, out=torch.ones(x.numel()))
    into = c.decode(p, out=torch.ones(x.numel()), accumulate=False)
    return [p.buffers["levels"], p.buffers["scales"], c.decode(p), acc, into]


def _onebit_outputs(bucket_size: int, error_feedback: bool, n: int, steps: int = 3) -> Tensors:
    """Per step of a fresh compressor: signs, means, decode, accumulated decode (into an aligned
    buffer and a view 4 bytes past one: the 16-byte and the scalar kernel), residual."""
    c = OneBit(bucket_size=bucket_size, error_feedback=error_feedback)
    outs: Tensors = []
    for step in range(steps):
        p = c.encode(_grad(n, seed=step), name="w")
        outs += [p.buffers["signs"], p.buffers["means"], c.decode(p)]
        outs.append(c.decode(p, out=torch.full((n,), 0.5)))
        outs.append(c.decode(p, out=torch.full((n + 1,), 0.5)[1:]))
        outs.append(c.decode(p, out=torch.full((n,), 0.5), accumulate=False))
        if error_feedback:
            outs.append(c.state["w"].clone())
    return outs


# -- QSGD -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("bits", "layout", "norm"), QSGD_VARIANTS)
def test_qsgd_matches_c(bits: int, layout: str, norm: str) -> None:
    # 5, 12: two kernels (groups of 8 cross buckets); 8, 264: fused, 264 a strided tree
    for bucket_size in (5, 8, 12, 264):
        c = QSGD(bits=bits, layout=layout, norm=norm, bucket_size=bucket_size)  # type: ignore[arg-type]
        for n in (0, 1, 100, 1003):  # 100 < 264: a single partial bucket
            x = _grad(n, seed=n + bits)
            want, got = _c_and_emulated(_qsgd_outputs, c, x)
            _assert_same(want, got, (bucket_size, n))


@pytest.mark.parametrize(("bits", "layout", "norm"), [(3, "sign", "l2"), (16, "intervals", "max")])
def test_qsgd_bucket_and_length_sweep(bits: int, layout: str, norm: str) -> None:
    # Around 8 (the packing group) and the block sizes 32..256 the launches pick.
    for bucket_size in (1, 2, 7, 16, 31, 33, 256, 300, 512, 2048):
        c = QSGD(bits=bits, layout=layout, norm=norm, bucket_size=bucket_size)  # type: ignore[arg-type]
        for n in (7, 8, 9, 257, 2053):
            x = _grad(n, seed=bucket_size)
            want, got = _c_and_emulated(_qsgd_outputs, c, x, 2**32 - 3)
            _assert_same(want, got, (bucket_size, n))


@pytest.mark.parametrize("layout", ["intervals", "sign"])
@pytest.mark.parametrize("norm", ["max", "l2"])
def test_qsgd_nan_inf_match_c(layout: str, norm: str) -> None:
    for bits, bucket_size in ((2, 8), (4, 7), (16, 64)):
        c = QSGD(bits=bits, layout=layout, norm=norm, bucket_size=bucket_size)  # type: ignore[arg-type]
        x = _special(1003)
        want, got = _c_and_emulated(_qsgd_outputs, c, x)
        _assert_same(want, got, (bits, bucket_size))
        with native.backend("torch"):
            ref = _qsgd_outputs(c, x)
        _assert_same(ref, got, (bits, bucket_size))


def test_nan_results_are_the_gpus_canonical_nan() -> None:
    c = QSGD(bits=4, norm="l2", bucket_size=8)
    x = torch.tensor([1.0, float("nan"), 2.0])
    with native.backend("native"), cuda_emulate.emulation("emulate"):
        scales = c.encode(x).buffers["scales"]
    assert scales.view(torch.int32).tolist() == [0x7FFFFFFF]  # x86 would keep 0x7fc00000


# -- 1bit -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("error_feedback", [True, False])
@pytest.mark.parametrize("bucket_size", [1, 5, 64, 300])
def test_onebit_matches_c(bucket_size: int, error_feedback: bool) -> None:
    for n in (0, 1, 9, 1003):
        want, got = _c_and_emulated(_onebit_outputs, bucket_size, error_feedback, n)
        _assert_same(want, got, n)


def test_onebit_nan_inf_and_a_strided_residual_match_c() -> None:
    def run() -> list[torch.Tensor]:
        c = OneBit(bucket_size=12)
        p = c.encode(_special(1003), name="w")
        outs = [p.buffers["signs"], p.buffers["means"], c.decode(p), c.state["w"].clone()]
        c.state["w"] = torch.linspace(-1, 1, 2006)[::2]  # not contiguous: copied, not updated
        p = c.encode(_grad(1003), name="w")
        return [*outs, p.buffers["signs"], p.buffers["means"], c.state["w"]]

    want, got = _c_and_emulated(run)
    _assert_same(want, got, "special")


# -- the launch path ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["emulate", "racecheck"])
def test_grid_stride_loops_match_c(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # Fewer blocks than buckets or groups: a block reuses its shared memory for the next bucket,
    # so a barrier missing after a block reduction shows here.
    monkeypatch.setattr(cuda, "_MAX_BLOCKS", 2)
    for norm, bucket_size in (("max", 7), ("l2", 8), ("max", 264), ("l2", 264), ("max", 300)):
        c = QSGD(bits=5, norm=norm, bucket_size=bucket_size)  # type: ignore[arg-type]
        want, got = _c_and_emulated(_qsgd_outputs, c, _grad(3001), mode=mode)
        _assert_same(want, got, (norm, bucket_size))
    for bucket_size in (40, 300):
        want, got = _c_and_emulated(_onebit_outputs, bucket_size, True, 3001, 2, mode=mode)
        _assert_same(want, got, ("onebit", bucket_size))


def test_every_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    launched: list[tuple[str, int, int, int]] = []
    real = cuda_emulate.launch

    def spy(
        sources: cuda_emulate.Sources,
        name: str,
        grid: int,
        block: int,
        args: tuple[object, ...],
        smem: int,
    ) -> None:
        launched.append((name, grid, block, smem))
        real(sources, name, grid, block, args, smem)

    monkeypatch.setattr(cuda_emulate, "launch", spy)
    with native.backend("native"), cuda_emulate.emulation("emulate"):
        _qsgd_outputs(QSGD(bits=4, bucket_size=8), _grad(100))  # one pass
        _qsgd_outputs(QSGD(bits=4, bucket_size=8), _grad(101)[1:])  # not 16-byte aligned: fused
        _qsgd_outputs(QSGD(bits=4, bucket_size=7), _grad(100))
        _onebit_outputs(64, True, 100, steps=1)  # one pass
        _onebit_outputs(60, True, 100, steps=1)  # not a multiple of 8: means, then signs
        nvfp4 = NVFP4()  # kernels/lowfloat.cu (tests/compress/kernels/test_lowfloat_kernels.py)
        nvfp4.decode(nvfp4.encode(_grad(100)))  # the tensor's max, then one pass
        off = nvfp4.encode(_grad(101)[1:])  # 4 bytes past a 16-byte boundary: any alignment
        nvfp4.decode(off, out=torch.zeros(101)[1:])
        # tests/compress/kernels/test_integer_units.py
        view = integer_sum.for_compressor(NVFP4(scope="global"))
        assert view is not None
        divisors = view.share(view.local_scales(_grad(100)))
        sums = view.encode(_grad(100), divisors, Key(), 0, torch.int8)
        view.decode(sums, divisors, 2, torch.empty(100))
    assert {name for name, *_ in launched} == ALL_KERNELS
    assert ("qb_qsgd_encode_fused", 13, 32, 128) in launched  # a block per bucket, 4 B per thread
    assert ("qb_qsgd_encode_vec", 1, 256, 0) in launched  # 256 buckets of 8 per block
    assert ("qb_onebit_means", 2, 64, 512) in launched  # 8 B per thread
    assert ("qb_onebit_encode_fused", 1, 256, 0) in launched  # 32 buckets of 64 per block
    assert ("qb_lf_amax", 1, 256, 32) in launched  # an int32 per warp


def test_racecheck_passes_every_kernel() -> None:
    with native.backend("native"):
        with cuda_emulate.emulation("off"):
            want = _qsgd_outputs(QSGD(bits=3, norm="l2", bucket_size=264), _grad(1003))
            want += _qsgd_outputs(QSGD(bits=6, layout="sign", bucket_size=12), _grad(1003))
            want += _onebit_outputs(300, True, 1003, steps=2)
        with cuda_emulate.emulation("racecheck"):
            got = _qsgd_outputs(QSGD(bits=3, norm="l2", bucket_size=264), _grad(1003))
            got += _qsgd_outputs(QSGD(bits=6, layout="sign", bucket_size=12), _grad(1003))
            got += _onebit_outputs(300, True, 1003, steps=2)
    _assert_same(want, got, "racecheck")


def test_launch_limits_are_a_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "_GROUP_THREADS", 2048)  # what no GPU launches
    with (
        native.backend("native"),
        cuda_emulate.emulation("emulate"),
        pytest.raises(RuntimeError, match="qb_qsgd_quantize: invalid configuration: 2048"),
    ):
        QSGD(bits=4, bucket_size=7).encode(_grad(100))


# -- arguments, as the driver reads them ----------------------------------------------------------
def test_arguments_must_have_the_parameters_types() -> None:
    emu = cuda_emulate.emulator(cuda._SOURCES)
    signs, x, out = torch.zeros(1, dtype=torch.uint8), torch.zeros(8), torch.zeros(8)
    emu.marshal("qb_onebit_decode", (signs, x, np.int64(8), np.int64(8), out, np.int32(0)))
    emu.marshal("qb_onebit_decode", (signs, x, 8, 8, out, np.int32(0)))  # Python int: int64
    bad = {
        "is int32_t": (signs, x, np.int32(8), np.int64(8), out, np.int32(0)),
        "is a torch.float32 tensor": (x, x, np.int64(8), np.int64(8), out, np.int32(0)),
        "is int64_t .* the parameter is int32_t": (signs, x, 8, 8, out, 0),
        "strided tensor": (signs, x, 8, 8, torch.zeros(16)[::2], np.int32(0)),
        "6 parameters": (signs, x),
        "is a raw address": (signs, np.uint64(64), 8, 8, out, np.int32(0)),
    }
    for message, args in bad.items():
        with pytest.raises(TypeError, match=message):
            emu.marshal("qb_onebit_decode", args)


# -- the switch -----------------------------------------------------------------------------------
def test_qbench_cuda_selects_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda_emulate._mode = None
    x = torch.zeros(4)
    monkeypatch.setenv("QBENCH_CUDA", "emulate")
    assert native.kernels_for(x) is cuda.CUDA
    monkeypatch.setenv("QBENCH_CUDA", "racecheck")
    assert native.kernels_for(x) is cuda.CUDA
    monkeypatch.setenv("QBENCH_CUDA", "off")
    assert native.kernels_for(x) is native.CPU
    monkeypatch.setenv("QBENCH_CUDA", "gpu")
    with pytest.raises(
        UserError, match="QBENCH_CUDA must be one of off, emulate, racecheck, got 'gpu'"
    ):
        native.kernels_for(x)
    monkeypatch.setenv("QBENCH_COMPRESS_BACKEND", "torch")  # the reference still wins
    assert native.kernels_for(x) is None


def test_a_missing_compiler_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_emulate, "_libraries", {})
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", "")
    with (
        native.backend("native"),
        cuda_emulate.emulation("emulate"),
        pytest.raises(UserError) as info,
    ):
        QSGD().encode(torch.zeros(4))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("QBENCH_CUDA=emulate: cannot build the CUDA emulator")
    assert "no C++ compiler found" in message
