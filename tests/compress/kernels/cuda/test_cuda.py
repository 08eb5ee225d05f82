"""The CUDA path (kernels/*.cu through CuPy) against the torch reference, byte for byte.

The GPU tests need a CUDA device and CuPy and skip with the reason otherwise; with both, kernels
that NVRTC cannot compile fail them, as tests/compiled.py fails the CPU kernel tests. Without a
GPU the kernels still run, on CPU threads, through the same cuda.py launches:
test_cuda_emulate.py (against the C kernels), test_cuda_racecheck.py (the race detector) and
test_cuda_coverage.py (every kernel line), beside this file. What only a GPU tests is left
here: CuPy's compilation and loading of the sources, DLPack, streams, and the device's own
arithmetic.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import torch

from qbench.compress import from_spec
from qbench.compress.kernels import cuda, native
from qbench.compress.onebit import OneBit
from qbench.compress.qsgd import QSGD

T = TypeVar("T", bound=Callable[..., Any])


def _gpu_skip_reason() -> str:
    """No GPU, or no CuPy: the reasons to skip. With both, the kernels must compile (NVRTC) and
    load, or the tests fail (``_cuda_kernels``): a compile error is a bug, not a missing tool."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if importlib.util.find_spec("cupy") is None:
        return f"CUDA kernels unavailable: {cuda.why_unavailable()}"  # says how to install CuPy
    return ""


_GPU_SKIP = _gpu_skip_reason()


@pytest.fixture
def _cuda_kernels() -> None:
    reason = cuda.why_unavailable()
    if reason:
        pytest.fail(
            f"a GPU and CuPy are here, but the CUDA kernels do not build: {reason}", pytrace=False
        )


def needs_gpu(test: T) -> T:
    """Skip without a GPU or CuPy; with both, fail when the kernels do not build."""
    test = pytest.mark.usefixtures("_cuda_kernels")(test)
    return pytest.mark.skipif(bool(_GPU_SKIP), reason=_GPU_SKIP)(test)


QSGD_VARIANTS = [
    (bits, layout, norm)
    for bits in (1, 2, 3, 4, 5, 6, 7, 8, 16)
    for layout in ("intervals", "sign")
    for norm in ("max", "l2")
    if not (layout == "sign" and bits == 1)
]


def _grad(n: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 3
    x[::11] = 0.0
    x[5::13] = -0.0
    if n > 600:
        x[512:576] = 0.0
    return x


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.detach().cpu().contiguous().view(torch.uint8).tolist())


# -- on a GPU -------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize(("bits", "layout", "norm"), QSGD_VARIANTS)
@pytest.mark.parametrize("bucket_size", [7, 64, 512])  # 7: the two-kernel path; else fused
def test_qsgd_cupy_matches_torch(bits: int, layout: str, norm: str, bucket_size: int) -> None:
    c = QSGD(bits=bits, layout=layout, norm=norm, bucket_size=bucket_size)  # type: ignore[arg-type]
    for n in (0, 1, 9, 1000, 4097, 100_003):
        x = _grad(n, seed=n)
        with native.backend("torch"):
            ref = c.encode(x, step=3, rank=1, offset=5)  # the CPU reference
            ref_cuda = c.encode(x.cuda(), step=3, rank=1, offset=5)  # torch on the GPU
            ref_out = c.decode(ref)
        with native.backend("native"):
            got = c.encode(x.cuda(), step=3, rank=1, offset=5)
            got_out = c.decode(got)
            acc = torch.ones(n, device="cuda")
            c.decode(got, out=acc)
        assert all(b.is_cuda for b in got.buffers.values())
        assert _bits(got.to_wire()) == _bits(ref.to_wire()) == _bits(ref_cuda.to_wire()), n
        assert _bits(got_out) == _bits(ref_out), n
        assert _bits(acc) == _bits(torch.ones(n).add_(ref_out)), n


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize(("bits", "bucket_size"), [(2, 128), (4, 512), (8, 512), (16, 8192)])
@pytest.mark.parametrize("layout", ["intervals", "sign"])
@pytest.mark.parametrize("norm", ["max", "l2"])
def test_qsgd_one_pass_at_scale(bits: int, bucket_size: int, layout: str, norm: str) -> None:
    """Issue 48's formats at 2^24 and 2^26 + 7 values, draws from an offset past 2^32, against
    torch on the GPU: 16-byte aligned tensors (the one-pass kernels) and views 4 bytes in (the
    general ones)."""
    c = QSGD(bits=bits, layout=layout, norm=norm, bucket_size=bucket_size)  # type: ignore[arg-type]
    gen = torch.Generator(device="cuda").manual_seed(bits)
    for n in (2**24, 2**26 + 7):
        base = torch.randn(n + 1, device="cuda", generator=gen) * 3
        base[::11] = 0.0
        for start in (0, 1):  # 16-byte aligned, then 4 bytes in
            x = base[start : start + n]
            with native.backend("torch"):
                ref = c.encode(x, step=3, rank=1, offset=2**32 + 5)
                ref_out = c.decode(ref)
            with native.backend("native"):
                got = c.encode(x, step=3, rank=1, offset=2**32 + 5)
                got_out = c.decode(got)
                acc = torch.ones(n + 1, device="cuda")[start : start + n]
                c.decode(got, out=acc)
            assert torch.equal(got.to_wire(), ref.to_wire()), n
            assert torch.equal(got_out.view(torch.int32), ref_out.view(torch.int32)), n
            want = (torch.ones(n, device="cuda") + ref_out).view(torch.int32)
            assert torch.equal(acc.view(torch.int32), want), n


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("bucket_size", [1, 5, 8, 40, 64, 256, 300])  # 8 .. 256: one pass
@pytest.mark.parametrize("error_feedback", [True, False])
def test_onebit_cupy_matches_torch(bucket_size: int, error_feedback: bool) -> None:
    for n in (0, 9, 1000, 100_003):
        ref_c = OneBit(bucket_size=bucket_size, error_feedback=error_feedback)
        got_c = OneBit(bucket_size=bucket_size, error_feedback=error_feedback)
        for step in range(4):
            g = _grad(n, seed=step)
            with native.backend("torch"):
                ref = ref_c.encode(g, name="w")
                ref_out = ref_c.decode(ref)
            with native.backend("native"):
                got = got_c.encode(g.cuda(), name="w")
                got_out = got_c.decode(got)
            assert _bits(got.to_wire()) == _bits(ref.to_wire()), (n, step)
            assert _bits(got_out) == _bits(ref_out), (n, step)
            if error_feedback:
                assert got_c.state["w"].is_cuda
                assert _bits(got_c.state["w"]) == _bits(ref_c.state["w"]), (n, step)


@pytest.mark.gpu
@needs_gpu
def test_onebit_one_pass_at_scale() -> None:
    """Issue 48's format, bucket 64 with error feedback, at 2^24 and 2^26 + 7 values against the
    CPU reference: 16-byte aligned tensors (the one-pass encode, its residual updated in place,
    the 16-byte decode) and views 4 bytes in (the general kernels)."""

    def same(got: torch.Tensor, want: torch.Tensor) -> bool:
        return torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))

    for n in (2**24, 2**26 + 7):
        ref_c, got_c = OneBit(bucket_size=64), [OneBit(bucket_size=64) for _ in range(2)]
        for step in range(2):  # no residual yet, then the residual of step 0
            g = _grad(n + 1, seed=step)
            with native.backend("torch"):
                ref = ref_c.encode(g[1:], name="w")
                ref_out = ref_c.decode(ref)
            for start in (0, 1):  # 16-byte aligned, then 4 bytes in
                x = g.cuda()[1:] if start else g[1:].cuda()
                acc = torch.ones(n + start, device="cuda")[start:]
                with native.backend("native"):
                    got = got_c[start].encode(x, name="w")
                    got_out = got_c[start].decode(got)
                    got_c[start].decode(got, out=acc)
                where = (n, step, start)
                assert same(got.to_wire(), ref.to_wire()), where
                assert same(got_out, ref_out) and same(acc, ref_out + 1.0), where
                assert same(got_c[start].state["w"], ref_c.state["w"]), where


LOWFLOAT_SPECS = [
    "fp8", "fp8:format=e5m2,block_size=128,rounding=stochastic", "mx", "mx:element=e4m3",
    "mx:element=e3m2,rounding=stochastic,error_feedback=true", "mx:element=e2m3", "nvfp4",
    "nvfp4:rounding=stochastic,error_feedback=true",
]  # fmt: skip


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("spec", LOWFLOAT_SPECS)
def test_lowfloat_cupy_matches_torch(spec: str) -> None:
    """FP8 / MX / NVFP4 (kernels/lowfloat.cu) byte for byte against the CPU reference, the
    residual too; torch on the GPU as well (its scale divisions are by tensors for this)."""
    ref_c, gpu_ref_c, got_c = (from_spec(spec) for _ in range(3))
    for n in (0, 1, 33, 1000, 100_003):
        for c in (ref_c, gpu_ref_c, got_c):
            c.reset()
        for step in range(3):
            g = _grad(n, seed=step)
            with native.backend("torch"):
                ref = ref_c.encode(g, step=step, offset=7, name="w")
                ref_out = ref_c.decode(ref)
                gpu_ref = gpu_ref_c.encode(g.cuda(), step=step, offset=7, name="w")
            with native.backend("native"):
                got = got_c.encode(g.cuda(), step=step, offset=7, name="w")
                got_out = got_c.decode(got)
            wire = _bits(ref.to_wire())
            assert _bits(got.to_wire()) == wire == _bits(gpu_ref.to_wire()), (n, step)
            assert _bits(got_out) == _bits(ref_out), (n, step)
            if got_c.stateful:
                assert _bits(got_c.state["w"]) == _bits(ref_c.state["w"]), (n, step)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize(
    "spec", ["fp8:block_size=128,error_feedback=true", "fp8:format=e5m2,rounding=stochastic",
             "mx:element=e3m2,rounding=stochastic,error_feedback=true",
             "nvfp4:error_feedback=true"],
)  # fmt: skip
def test_lowfloat_cupy_matches_the_c_kernels_at_scale(spec: str) -> None:
    """The one-pass kernels (kernels/lowfloat.cu: qb_lf_amax, qb_lf_encode_vec,
    qb_lf_decode_vec) at the sizes issue 48 times, with a tail group and grid-stride loops past
    _MAX_BLOCKS, draws keyed past 2^32 and two steps of error feedback, against the C kernels
    (the torch reference's twin, tests/compress/kernels/test_lowfloat_kernels.py)."""
    for n, offset in ((2**24 + 3, 2**32 + 5), (2**26 + 7, 2**33 - 3)):
        cpu, gpu = from_spec(spec), from_spec(spec)
        for step in range(2):
            g = torch.randn(n, generator=torch.Generator().manual_seed(step)) * 3
            with native.backend("native"):
                want = cpu.encode(g, step=step, offset=offset, name="w")
                got = gpu.encode(g.cuda(), step=step, offset=offset, name="w")
                want_out = cpu.decode(want)
                got_out = gpu.decode(got)
                acc = gpu.decode(got, out=torch.full((n,), 0.5, device="cuda"))
            assert torch.equal(got.to_wire().cpu(), want.to_wire()), (n, step)
            assert _bits(got_out) == _bits(want_out), (n, step)
            assert _bits(acc) == _bits(torch.full((n,), 0.5).add_(want_out)), (n, step)
            if gpu.stateful:
                assert _bits(gpu.state["w"]) == _bits(cpu.state["w"]), (n, step)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("spec", ["mx:error_feedback=true", "nvfp4:error_feedback=true",
                                  "fp8:block_size=24,error_feedback=true"])  # fmt: skip
def test_lowfloat_cupy_refuses_nan_and_takes_views(spec: str) -> None:
    """A NaN in the last group is refused after the launches, the residual left as it was; a
    gradient 4 bytes past a 16-byte boundary takes the general kernels, to the same bytes."""
    c = from_spec(spec)
    c.state["w"] = torch.full((1003,), 0.25, device="cuda")
    x = _grad(1003).cuda()
    x[1002] = float("nan")
    with native.backend("native"), pytest.raises(ValueError, match="value 1002 is nan"):
        c.encode(x, name="w")
    assert torch.equal(c.state["w"].cpu(), torch.full((1003,), 0.25))
    cpu, gpu, g = from_spec(spec), from_spec(spec), _grad(1004)
    with native.backend("native"):
        want = cpu.encode(g[1:], offset=2**32 + 1, name="w")
        got = gpu.encode(g.cuda()[1:], offset=2**32 + 1, name="w")
        assert _bits(gpu.decode(got)) == _bits(cpu.decode(want))
    assert _bits(got.to_wire()) == _bits(want.to_wire())
    assert _bits(gpu.state["w"]) == _bits(cpu.state["w"])


@pytest.mark.gpu
@needs_gpu
def test_kernels_follow_the_current_stream() -> None:
    c = QSGD(bits=4, bucket_size=512)
    x = _grad(1 << 20).cuda()
    stream = torch.cuda.Stream()
    with native.backend("native"):
        expected = c.encode(x, step=1).to_wire()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            y = x * 1.0  # queued on the side stream, consumed there without a sync
            got = c.encode(y, step=1).to_wire()
        stream.synchronize()
    assert torch.equal(got, expected)


# -- without a GPU --------------------------------------------------------------------------------
def test_missing_cupy_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    monkeypatch.setattr(cuda, "_reason", None)
    monkeypatch.setattr(cuda, "_functions", {})
    assert not cuda.available()
    assert "CuPy is not installed" in cuda.why_unavailable()
    assert "qbench[cuda12]" in cuda.why_unavailable()


@pytest.fixture(autouse=True)
def _restore_backend() -> Iterator[None]:
    before = native._backend
    yield
    native._backend = before
