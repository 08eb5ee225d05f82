"""1bitSGD's one-pass CUDA encode and 16-byte decode (kernels/onebit.cu: qb_onebit_encode_fused,
qb_onebit_decode_vec), emulated, against the C kernels and the torch reference byte for byte,
and the launches that choose them over the general kernels (views at any 4-byte offset, buckets
that are not a multiple of 8 or whose tree is wider than a warp holds)."""

from __future__ import annotations

import pytest
import torch

from qbench.compress.kernels import cuda, native
from qbench.compress.kernels.cuda import emulate as cuda_emulate
from qbench.compress.onebit import OneBit
from tests.compress.kernels.cuda.emulated import assert_same, three_ways
from tests.compress.kernels.cuda.test_cuda_emulate import (
    Tensors,
    _grad,
    _onebit_outputs,
    _special,
)

pytestmark = pytest.mark.usefixtures("emulated_kernels", "restore_switches")

FUSED = {"qb_onebit_encode_fused", "qb_onebit_decode_vec"}
GENERAL_ENCODE = {"qb_onebit_means", "qb_onebit_signs"}


# -- the one pass ---------------------------------------------------------------------------------
@pytest.mark.parametrize("error_feedback", [True, False])
@pytest.mark.parametrize("bucket_size", [8, 16, 24, 40, 64, 128, 136, 256])
def test_one_pass_matches_c_and_torch(
    bucket_size: int, error_feedback: bool, launched: list[str]
) -> None:
    # 8: a bucket per lane; 24, 40, 136: lanes of +0.0 padding up to the tree width; 256: all
    # five shuffle levels. n: partial last groups and buckets, tensors of one bucket or less.
    for n in (1, 7, 8, 9, 63, 65, 257, 1003, 4099):
        launched.clear()
        want, got = three_ways(_onebit_outputs, bucket_size, error_feedback, n, nan_as_one=True)
        assert_same(want, got, (bucket_size, n), nan_as_one=True)
        assert FUSED.issubset(launched) and GENERAL_ENCODE.isdisjoint(launched), launched


@pytest.mark.parametrize("mode", ["emulate", "racecheck"])
def test_wider_buckets_and_odd_ones_take_the_general_kernels(
    mode: str, launched: list[str]
) -> None:
    # trees of 512 values (512: the 16-byte decode); not a multiple of 8
    for bucket_size, n in ((260, 1003), (512, 1003), (12, 1003), (3, 1003), (5, 9)):
        launched.clear()
        want, got = three_ways(_onebit_outputs, bucket_size, True, n, 2, mode=mode, nan_as_one=True)
        assert_same(want, got, bucket_size, nan_as_one=True)
        assert GENERAL_ENCODE.issubset(launched) and "qb_onebit_encode_fused" not in launched
        vec = bucket_size % 8 == 0  # else groups of 8 that buckets cross: the scalar decode
        assert ("qb_onebit_decode_vec" in launched) == vec, launched


def test_the_residual_is_updated_in_place(launched: list[str]) -> None:
    c = OneBit(bucket_size=64)
    with native.backend("native"), cuda_emulate.emulation("emulate"):
        c.encode(_grad(1003), name="w")
        residual = c.state["w"]
        c.encode(_grad(1003, seed=1), name="w")
    assert c.state["w"] is residual
    assert launched == ["qb_onebit_encode_fused"] * 2  # no other launch, no memset


def test_a_strided_residual_is_read_from_a_copy_into_a_new_one(launched: list[str]) -> None:
    def run() -> Tensors:
        c = OneBit(bucket_size=64)
        c.state["w"] = torch.linspace(-1, 1, 2006)[::2]  # not contiguous: copied, not updated
        p = c.encode(_grad(1003), name="w")
        return [p.buffers["signs"], p.buffers["means"], c.state["w"]]

    want, got = three_ways(run, nan_as_one=True)
    assert_same(want, got, "strided", nan_as_one=True)
    assert launched == ["qb_onebit_encode_fused"]


def test_nan_inf_and_signed_zeros_in_one_pass() -> None:
    def run() -> Tensors:
        c = OneBit(bucket_size=64)
        outs: Tensors = []
        for x in (_special(1003), -_special(4099)[:1003], _grad(1003)):  # NaN in the residual
            p = c.encode(x, name="w")
            outs += [p.buffers["signs"], p.buffers["means"], c.decode(p), c.state["w"].clone()]
        return outs

    want, got = three_ways(run, nan_as_one=True)
    assert_same(want, got, "special", nan_as_one=True)


@pytest.mark.parametrize("mode", ["emulate", "racecheck"])
@pytest.mark.parametrize("bucket_size", [8, 40, 64, 256])
def test_warps_stride_over_buckets(
    monkeypatch: pytest.MonkeyPatch, mode: str, bucket_size: int
) -> None:
    # 1 or 2 blocks of 8 warps: every warp takes several turns, the last with buckets past the
    # end; racecheck: the in-place residual under 4 schedules.
    for blocks in (1, 2):
        monkeypatch.setattr(cuda, "_MAX_BLOCKS", blocks)
        want, got = three_ways(
            _onebit_outputs, bucket_size, True, 9001, 2, mode=mode, nan_as_one=True
        )
        assert_same(want, got, (bucket_size, blocks), nan_as_one=True)


# -- alignment ------------------------------------------------------------------------------------
def _views(grad_at: int, residual_at: int, out_at: int) -> Tensors:
    """Two steps of bucket 64 with error feedback, grad, residual and decode target being views
    that start `*_at` floats into their buffers (0: 16-byte aligned, else 4, 8 or 12 bytes
    past)."""
    n = 1003
    c = OneBit(bucket_size=64)
    outs: Tensors = []
    for step in range(2):
        grad = torch.zeros(n + grad_at)
        grad[grad_at:] = _grad(n, seed=step)
        if step == 0:  # a plain (contiguous) residual: updated in place, wherever it starts
            c.state["w"] = torch.zeros(n + residual_at)[residual_at:].add_(0.25)
        p = c.encode(grad[grad_at:], name="w")
        out = torch.full((n + out_at,), 0.5)[out_at:]
        outs += [p.buffers["signs"], p.buffers["means"], c.decode(p, out=out), c.state["w"].clone()]
    return outs


@pytest.mark.parametrize(
    ("grad_at", "residual_at", "out_at"), [(0, 0, 0), (1, 0, 0), (0, 2, 0), (0, 0, 3), (3, 1, 2)]
)
def test_views_at_any_float_take_the_kernel_they_allow(
    grad_at: int, residual_at: int, out_at: int, launched: list[str]
) -> None:
    want, got = three_ways(_views, grad_at, residual_at, out_at, nan_as_one=True)
    assert_same(want, got, (grad_at, residual_at, out_at), nan_as_one=True)
    one_pass = grad_at == residual_at == 0
    assert ("qb_onebit_encode_fused" in launched) == one_pass, launched
    assert GENERAL_ENCODE.issubset(launched) == (not one_pass), launched
    decode = "qb_onebit_decode" if out_at else "qb_onebit_decode_vec"
    assert launched.count(decode) == 2, launched


def test_a_long_tensor_in_one_pass() -> None:
    # 2^16 + 7 values: 1025 buckets, 8193 groups over 33 blocks, the last group of 7.
    n = (1 << 16) + 7

    def run() -> Tensors:
        c = OneBit(bucket_size=64)
        outs: Tensors = []
        for step in range(2):
            p = c.encode(_grad(n, seed=step), name="w")
            outs += [p.buffers["signs"], p.buffers["means"], c.decode(p), c.state["w"].clone()]
        return outs

    want, got = three_ways(run, nan_as_one=True)
    assert_same(want, got, n, nan_as_one=True)
