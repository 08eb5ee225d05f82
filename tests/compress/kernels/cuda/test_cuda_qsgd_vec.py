"""QSGD's one-pass kernels (qb_qsgd_encode_vec, qb_qsgd_decode_vec, kernels/qsgd.cu) emulated on
CPU threads, byte for byte against the C kernels and the torch reference; which tensors take them
and which take the general kernels; their launches (test_cuda_emulate.py has the general ones)."""

from __future__ import annotations

import pytest
import torch

from qbench.compress.base import Payload
from qbench.compress.kernels import cuda, native
from qbench.compress.kernels.cuda import emulate as cuda_emulate
from qbench.compress.qsgd import QSGD
from tests.compress.kernels.cuda.test_cuda_emulate import (
    Tensors,
    _assert_same,
    _c_and_emulated,
    _grad,
    _qsgd_outputs,
    _special,
)

pytestmark = pytest.mark.usefixtures("emulated_kernels", "restore_switches")

# The formats issue 48 times: (bits, bucket_size); 8192 takes 1024 threads per bucket.
TARGETS = [(2, 128), (4, 512), (8, 512), (16, 8192)]
VEC = {"qb_qsgd_encode_vec", "qb_qsgd_decode_vec"}
Launch = tuple[str, int, int, int]


def _qsgd(bits: int, bucket_size: int, layout: str = "intervals", norm: str = "max") -> QSGD:
    return QSGD(bits=bits, bucket_size=bucket_size, layout=layout, norm=norm)  # type: ignore[arg-type]


def _names(launches: list[Launch]) -> set[str]:
    return {name for name, *_ in launches}


@pytest.mark.parametrize("norm", ["max", "l2"])
@pytest.mark.parametrize("layout", ["intervals", "sign"])
@pytest.mark.parametrize(("bits", "bucket_size"), TARGETS)
def test_one_pass_matches_c_and_torch(
    bits: int, bucket_size: int, layout: str, norm: str, launches: list[Launch]
) -> None:
    c = _qsgd(bits, bucket_size, layout, norm)
    # one value; one whole group; a short last group; one whole bucket; a short last bucket
    # ending in a short group. Draws from offsets that wrap past 2^32 inside the tensor.
    for n, offset in ((1, 0), (8, 5), (13, 2**32 - 5), (bucket_size, 2**32 + 77)):
        want, got = _c_and_emulated(_qsgd_outputs, c, _grad(n, seed=n + bits), offset)
        _assert_same(want, got, n)
    x = _special(2 * bucket_size + 29)  # NaN, infinities, subnormals, signed zeros
    want, got = _c_and_emulated(_qsgd_outputs, c, x, 2**32 - 3)
    _assert_same(want, got, "special")
    with native.backend("torch"):
        _assert_same(_qsgd_outputs(c, x, 2**32 - 3), got, "torch")
    assert _names(launches) == VEC


def test_views_not_16_byte_aligned_take_the_general_kernels(launches: list[Launch]) -> None:
    def run() -> Tensors:
        c = _qsgd(4, 512, "sign", "l2")
        x = _grad(2001, seed=3)[1:]  # 4 bytes into its storage
        p = c.encode(x, offset=9)
        out = torch.ones(2001)[1:]
        shifted = torch.empty(p.buffers["levels"].numel() + 1, dtype=torch.uint8)[1:]
        shifted.copy_(p.buffers["levels"])  # the codes one byte into their storage
        moved = Payload(numel=p.numel, buffers={"levels": shifted, "scales": p.buffers["scales"]})
        return [*p.buffers.values(), c.decode(p, out=out), c.decode(moved)]

    want, got = _c_and_emulated(run)
    _assert_same(want, got, "views")
    assert _names(launches) == {"qb_qsgd_encode_fused", "qb_qsgd_decode"}


def test_buckets_over_8192_values_take_the_general_kernel(launches: list[Launch]) -> None:
    c = _qsgd(16, 8200, "intervals", "l2")  # a multiple of 8, over 1024 threads of 8
    want, got = _c_and_emulated(_qsgd_outputs, c, _grad(8200 + 21), 11)
    _assert_same(want, got, "8200")
    assert _names(launches) == {"qb_qsgd_encode_fused", "qb_qsgd_decode_vec"}


@pytest.mark.parametrize(
    ("bits", "bucket_size", "norm", "n", "config"),
    [
        (2, 128, "max", 128 * 129, (5, 256, 0)),  # 16 threads per bucket, 16 buckets a batch
        (2, 128, "l2", 128 * 40, (2, 256, 0)),  # 2 batches per block
        (1, 8, "max", 8 * 300, (1, 256, 0)),  # a thread per bucket
        (1, 8, "l2", 8 * 300, (5, 256, 0)),  # l2: a bucket padded to 8 threads (+0.0 leaves)
        (4, 512, "l2", 512 * 17, (3, 256, 8192)),  # 64 threads, 2 warps: 8 floats each shared
        (8, 264, "max", 264 * 5, (1, 256, 8192)),  # 33 groups: 64 threads per bucket
        (16, 8192, "l2", 8192 * 4 + 8, (3, 1024, 32768)),  # a bucket per batch
    ],
)
def test_one_pass_launches(
    bits: int, bucket_size: int, norm: str, n: int, config: tuple[int, int, int],
    launches: list[Launch],
) -> None:  # fmt: skip
    with native.backend("native"), cuda_emulate.emulation("emulate"):
        c = _qsgd(bits, bucket_size, "intervals", norm)
        c.decode(c.encode(_grad(n)))
    groups = -(-n // 8)
    assert launches == [
        ("qb_qsgd_encode_vec", *config),
        ("qb_qsgd_decode_vec", -(-groups // 256), 256, 8192),  # a thread per group of 8
    ]


@pytest.mark.parametrize(
    ("bits", "bucket_size", "layout", "norm", "n"),
    [
        (2, 128, "intervals", "l2", 128 * 16 * 5 + 77),  # 5 blocks' worth of buckets, 2 blocks
        (3, 264, "sign", "l2", 264 * 4 * 3 + 8),  # swaps through shared memory, reused
        (8, 512, "sign", "max", 512 * 4 * 3 + 3),
        (16, 8192, "intervals", "l2", 8192 * 3 + 5),
    ],
)
def test_grid_stride_under_every_schedule(
    monkeypatch: pytest.MonkeyPatch, bits: int, bucket_size: int, layout: str, norm: str, n: int
) -> None:
    # Fewer blocks than batches of buckets: a block's next batch reuses the shared buffers, whose
    # turns must stay ordered by the barriers; racecheck runs 4 schedules of threads and blocks.
    monkeypatch.setattr(cuda, "_MAX_BLOCKS", 2)
    c = _qsgd(bits, bucket_size, layout, norm)
    want, got = _c_and_emulated(_qsgd_outputs, c, _grad(n, seed=bits), 2**32 + 1, mode="racecheck")
    _assert_same(want, got, (bits, bucket_size))
