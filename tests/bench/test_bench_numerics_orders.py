"""The reduction orders of ``qbench bench numerics`` (qbench.bench.numerics.orders): each against
its encode sequence written out by hand (only what travels is rounded), the draws of every
encode apart from every other's, and the integer order against a numpy reference written from
the formats' definitions."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch

from qbench import compress
from qbench.aggregate.base import split_ranges
from qbench.bench.numerics import orders
from qbench.compress import Key, integer_sum
from qbench.compress.kernels.draws import uniform
from tests.paths import ROOT

STOCHASTIC = "qsgd:bits=4,bucket_size=4"  # stochastic: the draws' keys change the bits


def _x(k: int, n: int, seed: int = 0) -> torch.Tensor:
    """Gradient-like rows: a shared direction plus per-rank noise."""
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(n, generator=g) * 1e-2 + 5e-3 * torch.randn(k, n, generator=g)


def _roundtrip(comp: compress.Compressor) -> Any:
    def rt(v: torch.Tensor, stream: int, offset: int) -> torch.Tensor:
        return comp.decode(comp.encode(v.contiguous(), stream=stream, offset=offset))

    return rt


# -- each order, by hand -------------------------------------------------------------------------
def test_ring_at_two_ranks_is_the_hand_computed_sequence() -> None:
    comp = compress.from_spec(STOCHASTIC, seed=3)
    rt, x = _roundtrip(comp), _x(2, 10)
    assert split_ranges(10, 2, 4) == [(0, 4), (4, 10)]
    c0 = rt(x[1, 0:4], 1, 0) + x[0, 0:4]  # chunk 0 starts at rank 1, ends at its owner 0
    c1 = rt(x[0, 4:10], 1, 4) + x[1, 4:10]  # chunk 1 starts at rank 0, ends at rank 1
    want = torch.cat([rt(c0 / 2, 2, 0), rt(c1 / 2, 2, 4)])  # the owners' means, allgathered
    got = orders.ring(orders.Rounder(comp), x)
    assert torch.equal(got, want)
    assert torch.equal(orders.ring(orders.Rounder(comp, batch=False), x), want)
    assert not torch.equal(got, orders.ring(orders.Rounder(compress.from_spec(
        STOCHASTIC, seed=4)), x))  # fmt: skip


def test_tree_rounds_only_the_partial_sum_a_node_sends_up() -> None:
    """Three ranks: rank 1 sends to rank 0 (level 1), rank 2 moves up unsent and sends to rank
    0 at level 2; rank 0's own values are never rounded before the root's mean."""
    comp = compress.from_spec(STOCHASTIC, seed=3)
    rt, x = _roundtrip(comp), _x(3, 12)
    s = x[0] + rt(x[1], 1, 0)  # level 1: rank 0 keeps its own fp32 gradient
    s = s + rt(x[2], 2, 0)  # level 2: the unpaired rank 2, sent for the first time
    want = rt(s / 3, 3, 0)  # the root's mean, broadcast; the root decodes it too
    assert torch.equal(orders.tree(orders.Rounder(comp), x), want)
    assert torch.equal(orders.tree(orders.Rounder(comp, batch=False), x), want)


def test_alltoall_keeps_each_owners_own_shard_in_fp32() -> None:
    comp = compress.from_spec(STOCHASTIC, seed=3)
    rt, x = _roundtrip(comp), _x(2, 10)
    # owner 0 receives rank 1's shard 0 (offset 1 n + 0), owner 1 rank 0's shard 1 (offset 4)
    s0 = x[0, 0:4] + rt(x[1, 0:4], 0, 10)
    s1 = rt(x[0, 4:10], 0, 4) + x[1, 4:10]
    want = torch.cat([rt(s0 / 2, 1, 0), rt(s1 / 2, 1, 4)])  # each shard's mean, allgathered
    assert torch.equal(orders.alltoall(orders.Rounder(comp), x), want)
    assert torch.equal(orders.alltoall(orders.Rounder(comp, batch=False), x), want)


def test_allgather_decodes_every_payload_its_own_included() -> None:
    comp = compress.from_spec(STOCHASTIC, seed=3)
    rt, x = _roundtrip(comp), _x(3, 12)
    want = (rt(x[0], 0, 0) + rt(x[1], 0, 12) + rt(x[2], 0, 24)) / 3
    assert torch.equal(orders.allgather(orders.Rounder(comp), x), want)


@pytest.mark.parametrize("spec", ["qsgd:bits=4,bucket_size=8", "mx:element=e2m1", "bf16"])
@pytest.mark.parametrize("order", ["ring", "tree", "allgather", "alltoall"])
def test_merged_calls_give_the_bits_of_one_call_per_message(spec: str, order: str) -> None:
    """The Rounder merges a stream's messages into one call only where that changes no bit."""
    comp = compress.from_spec(spec, seed=1)
    x = _x(6, 200)  # 25 qsgd buckets of 8 but not whole MX blocks of 32: rows merge for one only
    run = orders.ORDERS[order]
    assert run is not None
    merged, single = orders.Rounder(comp), orders.Rounder(comp, batch=False)
    assert torch.equal(run(merged, x), run(single, x))
    assert merged.calls == single.calls  # messages counted the same either way


@pytest.mark.parametrize("order", ["ring", "tree", "allgather", "alltoall"])
def test_per_tensor_formats_are_called_once_per_message(order: str) -> None:
    comp = compress.from_spec("fp8:format=e4m3")  # one scale per call
    assert orders.grid(comp) is None
    rt = orders.Rounder(comp)
    run = orders.ORDERS[order]
    assert run is not None
    run(rt, _x(4, 64))
    assert rt.calls == orders.calls(order, 4, per_call=True)
    assert rt.calls == {"ring": 16, "tree": 4, "allgather": 4, "alltoall": 16}[order]


# -- the draws -----------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 5, 8])
@pytest.mark.parametrize("order", ["ring", "tree", "allgather", "alltoall"])
def test_no_two_encodes_share_a_draw(order: str, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every message draws from (stream, element range)s no other message touches, and the final
    copy (ring and alltoall: the allgather; tree: the root's broadcast) has a stream of its own:
    two encodes on one stream and offset would round with the same uniforms, correlated."""
    comp = compress.from_spec(STOCHASTIC, seed=0)
    sent: list[tuple[int, int, int]] = []  # (stream, first element, end), one per message
    encode = comp.encode

    def spy(x: torch.Tensor, **kw: Any) -> Any:
        sent.append((kw["stream"], kw["offset"], kw["offset"] + x.numel()))
        return encode(x, **kw)

    monkeypatch.setattr(comp, "encode", spy)
    run = orders.ORDERS[order]
    assert run is not None
    run(orders.Rounder(comp, batch=False), _x(k, 64))
    assert len(sent) == orders.calls(order, k, per_call=True)  # one call per message here
    spans = sorted(sent)
    for (s0, a0, b0), (s1, a1, b1) in itertools.pairwise(spans):
        assert s0 != s1 or b0 <= a1, f"{order}: stream {s0} draws [{a0}, {b0}) and [{a1}, {b1})"
    final = {"ring": k, "tree": 1, "alltoall": k, "allgather": 0}[order]
    if final:
        last = {stream for stream, _, _ in sent[-final:]}
        before = {stream for stream, _, _ in sent[:-final]}
        assert len(last) == 1 and not last & before, f"{order}: final copy on stream {last}"


# -- the integer order against numpy -------------------------------------------------------------
def _minifloat_grid(exp: int, man: int, bias: int, top: float) -> np.ndarray:
    """Every non-negative value of a minifloat (subnormals, then normals up to ``top``),
    ascending: consecutive values differ by one in their code, so an even index is an even
    mantissa."""
    sub = [m / 2**man * 2.0 ** (1 - bias) for m in range(2**man)]
    normal = [(1 + m / 2**man) * 2.0 ** (e - bias) for e in range(1, 2**exp) for m in range(2**man)]
    return np.array([v for v in sub + normal if v <= top])


def _mx_mean(x: np.ndarray, grid: np.ndarray, emax: int) -> np.ndarray:
    """OCP MX v1.0 on scales the ranks share, nearest rounding: per block of 32, X = 2^(floor(
    log2 amax) - emax) with amax the ranks' largest |x| in the block; each value x / X saturated
    to the largest element and rounded to nearest, ties to even; the mean of the K decoded
    gradients, float64 (exact: a few bits per value)."""
    k, n = x.shape
    blocks = np.zeros((k, -(-n // 32) * 32))
    blocks[:, :n] = x
    b = blocks.reshape(k, -1, 32)
    amax = np.abs(b).max(axis=(0, 2))
    _, exponent = np.frexp(amax)  # amax = m 2^exponent, m in [0.5, 1): floor(log2) exact
    scale = np.where(amax > 0, 2.0 ** (exponent - 1 - emax), 1.0)[None, :, None]
    v = np.minimum(np.abs(b) / scale, grid[-1])
    i = np.clip(np.searchsorted(grid, v), 1, len(grid) - 1)
    low, high = grid[i - 1], grid[i]
    up = (high - v < v - low) | ((high - v == v - low) & (i % 2 == 0))
    q = np.sign(b) * np.where(up, high, low)
    return (q * scale).sum(axis=0).reshape(-1)[:n] / k


def _qsgd_mean(x: np.ndarray, bits: int, bucket: int, seed: int) -> np.ndarray:
    """QSGD's levels on the shared bucket max s (the ranks' largest |x| in the bucket): L =
    2^(bits-1) - 1, t = x / s L (float32), q = floor(t) + [u < t - floor(t)] with u the codec's
    keyed draws at rank r's element offsets r n ..; the mean s sum(q) / (K L)."""
    k, n = x.shape
    top = 2 ** (bits - 1) - 1
    padded = np.zeros((k, -(-n // bucket) * bucket), np.float32)
    padded[:, :n] = x
    s = np.abs(padded.reshape(k, -1, bucket)).max(axis=(0, 2)).repeat(bucket)[:n]
    safe = np.where(s > 0, s, np.float32(1)).astype(np.float32)
    t = (x / safe).astype(np.float32) * np.float32(top)
    u = np.stack([uniform(Key(seed=seed), r * n, n).numpy() for r in range(k)])
    q = np.floor(t) + (u < t - np.floor(t))
    return s.astype(np.float64) * q.sum(axis=0) / (k * top)


E2M1 = _minifloat_grid(2, 1, 1, 6.0)
E4M3 = _minifloat_grid(4, 3, 7, 448.0)


@pytest.mark.parametrize("k", [16, 6])
@pytest.mark.parametrize(
    ("spec", "reference"),
    [
        ("mx:element=e2m1", lambda x, seed: _mx_mean(x, E2M1, 2)),
        ("mx:element=e4m3", lambda x, seed: _mx_mean(x, E4M3, 8)),
        ("qsgd:bits=8,bucket_size=128", lambda x, seed: _qsgd_mean(x, 8, 128, seed)),
    ],
)  # fmt: skip
def test_integer_order_matches_a_numpy_reference(spec: str, reference: Any, k: int) -> None:
    """The integer order's mean against the formats' definitions in numpy: the same float32
    result to its last bit (one rounding of the exact mean; QSGD's decode: a few)."""
    assert list(E2M1) == [0, 0.5, 1, 1.5, 2, 3, 4, 6] and E4M3[-1] == 448 and len(E4M3) == 127
    comp = compress.from_spec(spec, seed=2)
    view = integer_sum.for_compressor(comp)
    assert view is not None
    x = _x(k, 1000) * torch.logspace(-3, 1, 1000)  # blocks of very different scales
    got = orders.integer(view, x, comp.seed).double().numpy()
    want = reference(x.numpy(), comp.seed)
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=2**-21 if "qsgd" in spec else 2**-24, atol=0)


# -- benchmarks/mx_ring_saturation.py (docs/results/numerics.md) ---------------------------------
def test_the_fitting_mx_scale_saturates_nothing_and_differs_by_one_doubling() -> None:
    """The experiment that separates the MX ring's two causes of bias: its ``FitMX`` scale puts
    every block's max |x| within the largest element value, where the specification's does not,
    and is the specification's or twice it."""
    import importlib.util

    from qbench.compress import blockscale as bs
    from qbench.compress import minifloat as mf
    from qbench.compress.kernels import native

    path = ROOT / "benchmarks" / "mx_ring_saturation.py"
    spec = importlib.util.spec_from_file_location("mx_ring_saturation", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = _x(1, 32 * 500)[0] * torch.logspace(-30, 30, 32 * 500)
    amax = bs.blocks(x, 32).abs().amax(dim=1).double()
    for element in ("e2m1", "e4m3"):
        spec_codes = module.MX(element=element).scaling.scales(amax.float())[0]
        fit = module.FitMX(element=element)
        fit_codes = fit.scaling.scales(amax.float())[0]
        top = mf.FORMATS[element].max_normal
        assert (amax / mf.e8m0_value(spec_codes) > top).any()  # the specification saturates
        assert (amax / mf.e8m0_value(fit_codes) <= top).all()
        assert set((fit_codes.long() - spec_codes.long()).tolist()) == {0, 1}
        with native.backend("torch"):  # the compiled kernels compute the specification's scale
            decoded = fit.decode(fit.encode(x))
        # each block's largest value, rounded to nearest and not clipped: within half a step
        top_at = bs.blocks(x, 32).abs().argmax(dim=1) + 32 * torch.arange(500)
        error = (decoded - x)[top_at].abs()
        assert (error <= x[top_at].abs() / 2 ** (mf.FORMATS[element].man + 1)).all()
