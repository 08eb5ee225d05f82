"""The C kernels cut over threads (qbench.compress.kernels.native: ``threads()``, ``SPLIT_MIN``)
give the bytes of the one-thread call at any thread count; a decode into a preallocated buffer
(``accumulate=False``) gives the bytes of a plain decode.

``SPLIT_MIN`` is lowered so that a few thousand values make several ranges per thread: sizes
that are not multiples of the bucket, buckets that are not multiples of the byte-aligned range
step, draws whose index wraps past 2^32 inside the tensor, the residual of 1bitSGD's error
feedback step after step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import torch

from qbench import compress
from qbench.catalog import specs
from qbench.compress.kernels import native
from qbench.compress.onebit import OneBit
from qbench.compress.qsgd import QSGD
from tests import compiled

T = TypeVar("T")
THREADS = (1, 2, 3, 4)
SIZES = (0, 1, 9, 1000, 4097, 20_011)
QSGD_VARIANTS = [
    (1, "intervals", "max"), (2, "sign", "l2"), (3, "intervals", "l2"), (4, "intervals", "max"),
    (4, "sign", "max"), (7, "sign", "l2"), (8, "intervals", "max"), (16, "sign", "max"),
    (16, "intervals", "l2"),
]  # fmt: skip


@pytest.fixture(autouse=True, scope="module")
def _c_kernels() -> None:
    compiled.require_c_kernels()  # skips without a C compiler; a broken build fails


@pytest.fixture(autouse=True)
def _small_ranges(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(native, "SPLIT_MIN", 64)
    before = torch.get_num_threads()
    with native.backend("native"):
        yield
    torch.set_num_threads(before)


def _grad(n: int, seed: int = 0) -> torch.Tensor:
    """Gaussian values plus zeros, -0.0 and an all-zero stretch."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 3
    x[::11] = 0.0
    x[5::13] = -0.0
    x[600:700] = 0.0
    return x


def _bytes(t: torch.Tensor | None) -> bytes:
    return b"" if t is None else bytes(t.contiguous().view(torch.uint8).tolist())


def _per_thread_count(fn: Callable[..., T], *args: Any, **kwargs: Any) -> dict[int, T]:
    """fn(*args, **kwargs) with torch (so the kernels) at each thread count."""
    out = {}
    for t in THREADS:
        torch.set_num_threads(t)
        out[t] = fn(*args, **kwargs)
    return out


def _same(results: dict[int, T]) -> bool:
    return all(r == results[1] for r in results.values())


def test_large_calls_are_cut_into_aligned_ranges() -> None:
    torch.set_num_threads(3)
    ranges = native._ranges(20_011, 24)
    assert 3 < len(ranges) <= 3 * native.RANGES_PER_THREAD
    assert ranges[0][0] == 0 and ranges[-1][1] == 20_011
    assert all(a % 24 == 0 and b == c for (a, b), (c, _) in itertools.pairwise(ranges))
    assert native._ranges(100, 8) == [(0, 100)]  # under SPLIT_MIN: one call
    torch.set_num_threads(1)
    assert native._ranges(20_011, 24) == [(0, 20_011)]


def _qsgd_wire(c: QSGD, x: torch.Tensor, offset: int) -> bytes:
    return _bytes(c.encode(x, step=2, offset=offset).to_wire())


def _decode(c: compress.Compressor, payload: compress.Payload) -> bytes:
    return _bytes(c.decode(payload))


@pytest.mark.parametrize(("bits", "layout", "norm"), QSGD_VARIANTS)
def test_qsgd_bytes_do_not_depend_on_threads(bits: int, layout: str, norm: str) -> None:
    for bucket_size in (1, 7, 64, 100, 512):
        c = QSGD(bits=bits, layout=layout, norm=norm, bucket_size=bucket_size)  # type: ignore[arg-type]
        for n in SIZES:
            x = _grad(n, seed=n + bits)
            for offset in (0, 2**32 - 5000):  # the second wraps the draws' index mod 2^32
                assert _same(_per_thread_count(_qsgd_wire, c, x, offset)), (bucket_size, n, offset)
            decoded = _per_thread_count(_decode, c, c.encode(x, step=2))
            assert _same(decoded), (bucket_size, n)


def _onebit_steps(bucket_size: int, error_feedback: bool, n: int) -> list[bytes]:
    """Three steps' payloads, residuals and decodes: the first without a residual yet."""
    c = OneBit(bucket_size=bucket_size, error_feedback=error_feedback)
    out = []
    for step in range(3):
        payload = c.encode(_grad(n, seed=step), name="w")
        out += [_bytes(payload.to_wire()), _bytes(c.state.get("w")), _bytes(c.decode(payload))]
    return out


@pytest.mark.parametrize("bucket_size", [1, 3, 16, 64, 100])
@pytest.mark.parametrize("error_feedback", [True, False])
def test_onebit_bytes_and_residuals_do_not_depend_on_threads(
    bucket_size: int, error_feedback: bool
) -> None:
    for n in SIZES:
        assert _same(_per_thread_count(_onebit_steps, bucket_size, error_feedback, n)), n


def _payloads(n: int) -> dict[str, tuple[compress.Compressor, compress.Payload]]:
    """A payload of n values from each path: the QSGD and 1bitSGD kernels, MX's single-thread
    kernel, fp16's torch decode, and per-tensor QSGD (pieces decoded one after another)."""
    x = _grad(n)
    out = {}
    for spec, pieces in [
        ("qsgd:bits=4,bucket_size=64", None), ("onebit:bucket_size=16", None), ("mx", None),
        ("fp16", None), ("qsgd:bits=3,bucket_size=7,align=tensor", [n // 3, n - n // 3]),
    ]:  # fmt: skip
        params = specs.parse_cli(spec)
        c = compress.build(params.pop("name"), **params)
        out[spec] = (c, c.encode(x, step=1, pieces=pieces))
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_into_a_buffer_writes_the_decoded_values(threads: int) -> None:
    torch.set_num_threads(threads)
    for n in (0, 1000, 20_011):
        for spec, (c, payload) in _payloads(n).items():
            parts = payload.parts or (payload,)  # pieces: each decoded, not added to zeros
            want = _bytes(torch.cat([c.decode(part) for part in parts]))
            buf = torch.full((n,), float("nan"))  # nothing of it may be read
            assert c.decode(payload, buf, accumulate=False) is buf
            assert _bytes(buf) == want, (spec, n)
            ones = torch.ones(n)  # the default still adds
            assert _bytes(c.decode(payload, ones)) == _bytes(1.0 + c.decode(payload)), (spec, n)
