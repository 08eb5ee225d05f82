"""The C library as loaded (``-march=native``: on an AVX-512 CPU, the 16-lane loops of QSGD's
codes up to 8 bits and of 1bitSGD's encode for buckets of 16 to 256 values; on an AVX2 CPU
without AVX-512, the 8-lane loops, buckets of 8 to 128) against the same source built here
without ``-march=native`` (the plain loops) and with ``-mavx2`` alone (the 8-lane loops, which
an AVX-512 build skips), byte for byte, on awkward values: zeros of both signs, NaN, infinities,
subnormals, values whose squares underflow. Where both builds run the same loops this holds
trivially; tests/compress/kernels/test_native.py holds the loaded library to the torch reference.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pytest
import torch

from qbench.compress.base import Key
from qbench.compress.kernels import abi as kernel_abi
from qbench.compress.kernels import native, rng
from qbench.compress.onebit import OneBit
from qbench.compress.qsgd import QSGD
from tests import compiled

QSGD_BITS = (1, 2, 3, 4, 5, 6, 7, 8, 16)
SIZES = (0, 1, 15, 16, 17, 100, 1000, 4097)
ONEBIT_BUCKETS = (8, 16, 32, 64, 128, 256, 512)  # 16..256: the 16-lane loops; 8, 512: plain


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:  # no /proc: not Linux
        return False


@pytest.fixture(scope="module", params=[(), ("-mavx2",)], ids=["plain", "avx2"])
def libs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ctypes.CDLL, ctypes.CDLL]]:
    """(the loaded library, the one built with these flags instead of -march=native)."""
    compiled.require_c_kernels()
    if request.param and not _cpu_has("avx2"):
        pytest.skip("the 8-lane loops need a CPU with AVX2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native, "_ARCH_FLAGS", request.param)
        mp.setenv(kernel_abi.ENV_CACHE, str(tmp_path_factory.mktemp("portable")))
        other = native._open(native._build(native.kernel_dir()))
    yield native._library(), other


def _values(n: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 3
    specials = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-40, -3e-23, 4.5e-23]
    for i, v in enumerate(specials):
        x[i * 37 % max(n, 1) :: 97] = v
    if n > 300:
        x[256:288] = -0.0  # whole buckets of -0.0 (for 16 and 32)
        x[288:300] = 1e-30  # squares underflow: an l2 scale from subnormals
    return x


def _bytes(t: torch.Tensor | None) -> bytes:
    return b"" if t is None else bytes(t.view(torch.uint8).tolist())


def _qsgd(lib: ctypes.CDLL, x: torch.Tensor, *args: int) -> tuple[bytes, bytes]:
    bits, bucket, layout, norm, key_hash, offset = args
    n = x.numel()
    levels = torch.zeros(2 * n if bits == 16 else (n * bits + 7) // 8, dtype=torch.uint8)
    scales = torch.zeros(-(-n // bucket))
    rc = lib.qb_qsgd_encode(
        x.data_ptr(), n, bucket, bits, layout, norm, key_hash, offset, levels.data_ptr(),
        scales.data_ptr(),
    )  # fmt: skip
    assert rc == 0
    return _bytes(levels), _bytes(scales)


@pytest.mark.parametrize("bits", QSGD_BITS)
def test_qsgd_codes_match_the_plain_loops(libs: tuple[ctypes.CDLL, ctypes.CDLL], bits: int) -> None:
    for layout in (0, 1) if bits > 1 else (0,):  # intervals, sign
        for norm in (0, 1):  # max, l2
            for bucket in (1, 7, 16, 64, 512):
                for n in SIZES:
                    x = _values(n, seed=n + bits)
                    for key_hash, offset in ((0x9E3779B1, 0), (12345, 2**32 - 50)):
                        args = (bits, bucket, layout, norm, key_hash, offset)
                        assert _qsgd(libs[0], x, *args) == _qsgd(libs[1], x, *args), (*args, n)


def test_qsgd_draws_at_the_fixed_point_edges(libs: tuple[ctypes.CDLL, ctypes.CDLL]) -> None:
    """Level positions t = (k + f) * 2^-24 next to each value's own draw u = k * 2^-24, where the
    16-lane loops' ceiling of t * 2^24 decides whether u < t - floor(t) (values from randn land
    there once in 2^24 draws): 2-bit sign layout with a bucket max of 1, so t = |x|."""
    n = 4096
    c = QSGD(bits=2, layout="sign", norm="max", bucket_size=n)
    key = Key(seed=c.seed, step=5, rank=0, stream=0)
    k = rng.uniform_reference(key, 0, n).double() * 2**24
    f = torch.tensor([0.0, 0.25, 0.5, 0.75]).double().repeat(n // 4)
    x = torch.where(k < 2**22, (k + f) * 2**-24, 0.5).float()  # exact: 4k + 3 < 2^24
    x[1::2] *= -1
    x[0] = 1.0
    wires = []
    for backend in ("torch", "native"):
        with native.backend(backend):
            wires.append(_bytes(c.encode(x, step=5).to_wire()))
    assert wires[0] == wires[1]
    args = (2, n, 1, 0, rng.key_hash(key), 0)  # the same call on both libraries
    assert _qsgd(libs[0], x, *args) == _qsgd(libs[1], x, *args)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _onebit(
    lib: ctypes.CDLL, g: torch.Tensor, r: torch.Tensor | None, ef: int, bucket: int
) -> bytes:
    n = g.numel()
    signs = torch.zeros((n + 7) // 8, dtype=torch.uint8)
    means = torch.zeros(2 * -(-n // bucket))
    r_out = torch.full((n,), 7.0) if ef else None
    args = (_ptr(g), _ptr(r), _ptr(r_out), ef, n, bucket, signs.data_ptr(), means.data_ptr())
    assert lib.qb_onebit_encode(*args) == 0
    return _bytes(signs) + _bytes(means) + _bytes(r_out)


@pytest.mark.parametrize("bucket", ONEBIT_BUCKETS)
def test_onebit_encode_matches_the_plain_loops(
    libs: tuple[ctypes.CDLL, ctypes.CDLL], bucket: int
) -> None:
    for n in SIZES:
        g, r = _values(n, seed=n), _values(n, seed=n + 1) * 0.1
        for residual, ef in ((None, 0), (r, 1), (None, 1)):  # no feedback, feedback, first step
            got, want = (_onebit(lib, g, residual, ef, bucket) for lib in libs)
            assert got == want, (n, ef)


@pytest.mark.parametrize("bucket_size", [8, 16, 32, 128, 256])
def test_onebit_bucket_sizes_of_the_vector_loops_match_torch(bucket_size: int) -> None:
    """test_native.py's 1bitSGD sizes reach the 16- or 8-lane loops only at 64: the others here."""
    for n in SIZES:
        x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3
        x[: min(n, 32)] = -0.0  # an all -0.0 bucket: avg+ is -0.0 unless padding takes part
        payloads, residuals = [], []
        for backend in ("torch", "native"):
            c = OneBit(bucket_size=bucket_size)
            with native.backend(backend):
                c.encode(x, name="w")
                payloads.append(_bytes(c.encode(x * 0.5, name="w").to_wire()))
            residuals.append(_bytes(c.state["w"]))
        assert payloads[0] == payloads[1] and residuals[0] == residuals[1], n
