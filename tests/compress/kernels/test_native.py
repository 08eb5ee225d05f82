"""The compiled CPU path (kernels/cpu/qbench_cpu.c) against the torch reference, byte for byte."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from qbench.compress.kernels import abi as kernel_abi
from qbench.compress.kernels import native
from qbench.compress.kernels.buckets import tree_sum
from qbench.compress.onebit import OneBit
from qbench.compress.qsgd import QSGD
from tests import compiled


@pytest.fixture(autouse=True, scope="module")
def _c_kernels() -> None:
    compiled.require_c_kernels()  # skips without a C compiler; a broken build fails


QSGD_VARIANTS = [
    (bits, layout, norm)
    for bits in (1, 2, 3, 4, 5, 6, 7, 8, 16)
    for layout in ("intervals", "sign")
    for norm in ("max", "l2")
    if not (layout == "sign" and bits == 1)
]
BUCKETS = (1, 7, 64, 512)
LENGTHS = (0, 1, 9, 63, 1000, 4097)
KEYS = [dict(step=0), dict(step=3, rank=1), dict(step=2**40 + 5, rank=7, stream=1)]


def _grad(n: int, seed: int = 0) -> torch.Tensor:
    """Gaussian values plus the awkward ones: zeros, -0.0, an all-zero bucket, a huge value."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 3
    x[::11] = 0.0
    x[5::13] = -0.0
    if n > 600:
        x[512:576] = 0.0
        x[700] = 3e30
    return x


def _bits(t: torch.Tensor) -> bytes:
    """Exact bytes (-0.0 differs from 0.0, as on the wire)."""
    return bytes(t.contiguous().view(torch.uint8).tolist())


T = TypeVar("T")


def _both(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, T]:
    """fn's result with the torch reference, then with the native path."""
    with native.backend("torch"):
        ref = fn(*args, **kwargs)
    with native.backend("native"):
        got = fn(*args, **kwargs)
    return ref, got


# -- QSGD -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("bits", "layout", "norm"), QSGD_VARIANTS)
def test_qsgd_payloads_and_decodes_are_identical(bits: int, layout: str, norm: str) -> None:
    for bucket_size in BUCKETS:
        c = QSGD(bits=bits, layout=layout, norm=norm, bucket_size=bucket_size)  # type: ignore[arg-type]
        for n in LENGTHS:
            x = _grad(n, seed=n + bits)
            for key in KEYS:
                for offset in (0, 3, 2**32 - 2):  # the last wraps the draws' index mod 2^32
                    ref, got = _both(c.encode, x, offset=offset, **key)
                    where = (bucket_size, n, key, offset)
                    assert _bits(got.to_wire()) == _bits(ref.to_wire()), where
                    assert [b.dtype for b in got.buffers.values()] == [torch.uint8, torch.float32]
            dec_ref, dec_got = _both(c.decode, ref)
            assert _bits(dec_got) == _bits(dec_ref), (bucket_size, n)


@pytest.mark.parametrize("bits", [2, 4, 8, 16])
def test_qsgd_l2_near_underflow(bits: int) -> None:
    # Alone in its bucket, x = -4.5e-23 has x * x = 1.43 * 2^-149 (subnormal), rounded to 2^-149:
    # s = 3.7e-23, x / s = -1.2 and t + u < -1, which must clamp to level 0 as floor does.
    x = torch.zeros(64)
    x[0], x[8], x[16:18], x[24] = -4.5e-23, 4.5e-23, torch.tensor([2e-23, -3e-23]), -1e-30
    for layout in ("intervals", "sign"):
        c = QSGD(bits=bits, layout=layout, norm="l2", bucket_size=8)  # type: ignore[arg-type]
        for step in range(8):
            ref, got = _both(c.encode, x, step=step)
            assert _bits(got.to_wire()) == _bits(ref.to_wire()), (layout, step)


def test_qsgd_decode_accumulates_like_add() -> None:
    c = QSGD(bits=4, bucket_size=64)
    x = _grad(1000)
    payload = c.encode(x, step=1)
    base = _grad(1000, seed=9)
    ref, got = base.clone(), base.clone()
    with native.backend("torch"):
        assert c.decode(payload, out=ref) is ref
    with native.backend("native"):
        assert c.decode(payload, out=got) is got
    assert _bits(got) == _bits(ref)
    # An out the kernel cannot take (strided, other shape) goes through out.add_.
    strided = torch.zeros(2000)[::2]
    with native.backend("native"):
        c.decode(payload, out=strided)
    assert _bits(strided) == _bits(torch.zeros(1000).add_(c.decode(payload)))


def test_qsgd_from_wire_at_any_byte() -> None:
    c = QSGD(bits=3, bucket_size=7)
    payload = c.encode(_grad(1001), step=4)
    wire = torch.cat([torch.zeros(3, dtype=torch.uint8), payload.to_wire()])[3:]
    with native.backend("native"):
        decoded = c.decode(c.from_wire(wire, 1001))
    with native.backend("torch"):
        assert _bits(decoded) == _bits(c.decode(payload))


def test_qsgd_native_rejects_a_short_payload() -> None:
    c = QSGD(bits=4, bucket_size=8)
    payload = c.encode(_grad(100))
    payload.buffers["levels"] = payload.buffers["levels"][:-1]
    with native.backend("native"), pytest.raises(ValueError, match="needs 50 uint8 levels"):
        c.decode(payload)


QSGD_100 = "qsgd: payload of 100 values needs 50 uint8 levels and 13 float32 scales, got "


@pytest.mark.parametrize(
    ("levels", "scales", "got"),
    [
        (lambda v: v.view(torch.int8), lambda s: s, "50 torch.int8 and 13 torch.float32"),
        (lambda v: v, lambda s: s[:-1], "50 torch.uint8 and 12 torch.float32"),
        (lambda v: v, lambda s: s.double(), "50 torch.uint8 and 13 torch.float64"),
    ],
    ids=["int8-levels", "short-scales", "float64-scales"],
)
def test_qsgd_native_rejects_a_malformed_payload(
    levels: Callable[[torch.Tensor], torch.Tensor],
    scales: Callable[[torch.Tensor], torch.Tensor],
    got: str,
) -> None:
    # 100 4-bit codes: 50 bytes; 13 buckets of 8, one float32 scale each (the short levels case
    # is the test above).
    c = QSGD(bits=4, bucket_size=8)
    payload = c.encode(_grad(100))
    payload.buffers["levels"] = levels(payload.buffers["levels"])
    payload.buffers["scales"] = scales(payload.buffers["scales"])
    with native.backend("native"), pytest.raises(ValueError) as e:
        c.decode(payload)
    assert str(e.value) == QSGD_100 + got


def test_qsgd_strided_input() -> None:
    c = QSGD(bits=5, bucket_size=16)
    x = _grad(2001)[::2]
    ref, got = _both(c.encode, x, step=1)
    assert _bits(got.to_wire()) == _bits(ref.to_wire())


# -- 1bitSGD --------------------------------------------------------------------------------------
@pytest.mark.parametrize("bucket_size", [1, 5, 8, 64, 300])
@pytest.mark.parametrize("error_feedback", [True, False])
def test_onebit_steps_are_identical(bucket_size: int, error_feedback: bool) -> None:
    for n in LENGTHS:
        ref_c = OneBit(bucket_size=bucket_size, error_feedback=error_feedback)
        got_c = OneBit(bucket_size=bucket_size, error_feedback=error_feedback)
        for step in range(4):
            g = _grad(n, seed=step)
            with native.backend("torch"):
                ref = ref_c.encode(g, name="w")
                ref_out = ref_c.decode(ref)
            with native.backend("native"):
                got = got_c.encode(g, name="w")
                got_out = got_c.decode(got)
            assert _bits(got.to_wire()) == _bits(ref.to_wire()), (n, step)
            assert _bits(got_out) == _bits(ref_out), (n, step)
            assert ref_c.state.keys() == got_c.state.keys()
            if error_feedback:
                assert _bits(got_c.state["w"]) == _bits(ref_c.state["w"]), (n, step)


def test_onebit_all_negative_zero_bucket() -> None:
    # A bucket of -0.0 only: its avg+ is -0.0 when no padding takes part, else +0.0.
    for n in (8, 5):
        c = OneBit(bucket_size=8, error_feedback=False)
        g = torch.full((n,), -0.0)
        ref, got = _both(c.encode, g)
        assert _bits(got.to_wire()) == _bits(ref.to_wire())


def test_onebit_decode_accumulates_and_residual_in_place() -> None:
    c = OneBit(bucket_size=64)
    with native.backend("native"):
        c.encode(_grad(1000), name="w")
        residual = c.state["w"]
        payload = c.encode(_grad(1000, seed=1), name="w")
        assert c.state["w"] is residual  # updated in place, no new buffer per step
        out = torch.ones(1000)
        c.decode(payload, out=out)
        assert _bits(out) == _bits(1.0 + c.decode(payload))


@pytest.mark.parametrize(
    "make", [lambda: QSGD(bits=4, bucket_size=512), OneBit], ids=["qsgd-4b-b512", "onebit"]
)
def test_large_decodes_stream_every_value(
    make: Callable[[], QSGD | OneBit], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode of 2^20 values or more (QB_STREAM_MIN) into a buffer stores them with streaming
    stores from the buffer's first 16-byte boundary on: into a buffer one float past one, the
    head, the body and the tail must all hold the reference's values."""
    monkeypatch.setattr(native, "threads", lambda: 1)  # one call over all the values
    n = 2**20 + 13
    c = make()
    payload = c.encode(_grad(n), step=1)
    with native.backend("torch"):
        ref = c.decode(payload)
    out = torch.full((n + 1,), float("nan"))[1:]
    with native.backend("native"):
        assert c.decode(payload, out=out, accumulate=False) is out
    assert torch.equal(out.view(torch.int32), ref.view(torch.int32))


ONEBIT_100 = "onebit: payload of 100 values needs 13 uint8 signs and 26 float32 means, got "


@pytest.mark.parametrize(
    ("signs", "means", "got"),
    [
        (lambda s: s[:-1], lambda m: m, "12 torch.uint8 and 26 torch.float32"),  # short signs
        (lambda s: s.view(torch.int8), lambda m: m, "13 torch.int8 and 26 torch.float32"),
        (lambda s: s, lambda m: m[:-1], "13 torch.uint8 and 25 torch.float32"),
        (lambda s: s, lambda m: m.double(), "13 torch.uint8 and 26 torch.float64"),
    ],
    ids=["short-signs", "int8-signs", "short-means", "float64-means"],
)
def test_onebit_native_rejects_a_malformed_payload(
    signs: Callable[[torch.Tensor], torch.Tensor],
    means: Callable[[torch.Tensor], torch.Tensor],
    got: str,
) -> None:
    # 100 values: ceil(100 / 8) = 13 bytes of signs; 13 buckets of 8, 2 float32 means each. The
    # kernels read exactly these sizes, so a malformed payload must fail before they run.
    c = OneBit(bucket_size=8, error_feedback=False)
    payload = c.encode(_grad(100))
    payload.buffers["signs"] = signs(payload.buffers["signs"])
    payload.buffers["means"] = means(payload.buffers["means"])
    with native.backend("native"), pytest.raises(ValueError) as e:
        c.decode(payload)
    assert str(e.value) == ONEBIT_100 + got


def test_onebit_residual_on_another_device_is_refused() -> None:
    c = OneBit(bucket_size=8)
    c.state["w"] = torch.zeros(10, dtype=torch.float64)
    with pytest.raises(ValueError, match="reset"):
        c.encode(_grad(10), name="w")


# -- backend switch and build ---------------------------------------------------------------------
def test_backend_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.ones(3)
    with native.backend("torch"):
        assert native.kernels_for(x) is None
    with native.backend("native"):
        assert native.kernels_for(x) is native.CPU
    monkeypatch.setenv(native.ENV_BACKEND, "torch")
    assert native.get_backend() == "torch" and native.kernels_for(x) is None
    monkeypatch.setenv(native.ENV_BACKEND, "fast")
    with pytest.raises(ValueError, match="'fast'"):
        native.get_backend()
    with pytest.raises(ValueError, match="auto, torch, native"):
        native.set_backend("cuda")


def test_forcing_native_without_it_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_reason", "RuntimeError: no C compiler found")
    assert not native.available()
    with native.backend("auto"):
        assert native.kernels_for(torch.ones(2)) is None  # silent fallback
        assert QSGD().encode(torch.ones(5)).nbytes == 7
    with native.backend("native"), pytest.raises(RuntimeError, match="no C compiler"):
        QSGD().encode(torch.ones(5))


def _fresh_build(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    monkeypatch.setenv(kernel_abi.ENV_CACHE, str(cache))
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_reason", None)


def test_build_failure_is_recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fresh_build(monkeypatch, tmp_path)
    monkeypatch.setenv("CC", "/bin/false")
    assert not native.available()
    assert "/bin/false" in native.why_unavailable()
    assert list(tmp_path.iterdir()) == []  # no half-written library left behind


def test_build_is_cached_by_content(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fresh_build(monkeypatch, tmp_path)
    first = native._build(native.kernel_dir())
    assert first.parent == tmp_path and first.suffix == ".so"
    mtime = os.stat(first).st_mtime_ns
    assert native._build(native.kernel_dir()) == first and os.stat(first).st_mtime_ns == mtime
    assert native.available() and native.why_unavailable() == ""


def test_tree_sum_order() -> None:
    rows = torch.tensor([[1e8, 1.0, -1e8, 1.0, 3.0]])
    # Padded to 8: (1e8 + 3, 1, -1e8, 1) -> (1e8 + 3 - 1e8, 1 + 1) -> 0 + 2 in float32, where
    # 1e8 + 3 rounds to 1e8; summed left to right it would be 4.
    assert tree_sum(rows).tolist() == [2.0]
    assert tree_sum(torch.zeros(0, 4)).shape == (0,)


@pytest.fixture(autouse=True)
def _restore_backend() -> Iterator[None]:
    before = native._backend
    yield
    native._backend = before
