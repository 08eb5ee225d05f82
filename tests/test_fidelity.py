"""Fidelity: each algorithm against a small, independent reference written from its paper.

Every reference below is a few lines transcribed from the paper's equations (or, for
Range-EvoNorm, from the authors' released code), in numpy or plain torch, and imports nothing
from qbench; qbench's codecs and schemes are only the code under test. Compressors that choose
randomly are checked statistically over 48 keys (steps), with the tolerance stated where it is
used. docs/results/fidelity.md lists what each test checks and what it measured.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from qbench import aggregate, catalog, models
from qbench.aggregate.directed import Mixing
from qbench.compress import Compressor, from_spec
from qbench.compress.adaptive import widths
from qbench.run import evonorm
from qbench.spec import layers
from qbench.timing import PhaseTimer
from tests.threadcomm import ThreadComm, run_ranks

KEYS = 48
GROUPS = 32


# -- unbiasedness: a z-test of the summed error --------------------------------------------------
def _error_moments(
    c: Compressor, x: torch.Tensor, pieces: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per coordinate, over KEYS keys (steps 0..47): mean error and unbiased variance (float64)."""
    total = torch.zeros(x.numel(), dtype=torch.float64)
    squares = torch.zeros_like(total)
    for step in range(KEYS):
        e = c.decode(c.encode(x, step=step, pieces=pieces)).double() - x.double()
        total += e
        squares += e * e
    mean = total / KEYS
    return mean, (squares - KEYS * mean * mean) / (KEYS - 1)


def _z_rms(mean: torch.Tensor, var: torch.Tensor, order: torch.Tensor) -> float:
    """The coordinates cut into GROUPS groups along ``order``; per group the z statistic of the
    error summed over coordinates and keys, sum / sqrt(KEYS * sum of variances), which is about
    N(0, 1) for an unbiased compressor; the rms over groups (about 1; a bias of b levels in a
    group of m coordinates adds ~ b sqrt(KEYS m) / sd to its z)."""
    zs = []
    for idx in order.chunk(GROUPS):
        v = float(var[idx].sum())
        if v > 0:
            zs.append(float(mean[idx].sum()) * KEYS / math.sqrt(KEYS * v))
    assert len(zs) >= GROUPS // 2, "too few coordinates that round at all"
    return math.sqrt(sum(z * z for z in zs) / len(zs))


def _data(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g) * 2 - 1) * torch.rand(n, generator=g).add_(0.1)


UNBIASED: dict[str, tuple[dict[str, Any], int]] = {
    **{
        f"qsgd-{b}": ({"name": "qsgd", "bits": b, "bucket_size": 512}, 1 << 18)
        for b in (2, 4, 8, 16)
    },
    **{
        f"qsgd-sign-l2-{b}": (
            {"name": "qsgd", "bits": b, "bucket_size": 256, "norm": "l2", "layout": "sign"},
            1 << 16,
        )
        for b in (2, 4, 8, 16)
    },
    "qsgd-tensor-4": ({"name": "qsgd", "bits": 4, "bucket_size": 96, "align": "tensor"}, 1 << 16),
    **{f"fixedpoint-{b}": ({"name": "fixedpoint", "bits": b}, 1 << 16) for b in (2, 4, 8, 16)},
    "fixedpoint-delta": ({"name": "fixedpoint", "bits": 8, "delta": 1 / 64}, 1 << 16),
    # adaptive widths N = ceil(H) + c with M = 1: H in (0, 1] gives N = c + 1 (4, 8, 16 bits);
    # positive data in the symmetric probe's upper bin gives H = 0, N = c = 2
    "adaptive-2": (
        {"name": "adaptive", "floor_bits": 2, "probe_bits": 1, "entropy_grid": "symmetric"},
        1 << 13,
    ),
    **{
        f"adaptive-{c + 1}": ({"name": "adaptive", "floor_bits": c, "probe_bits": 1}, 1 << 13)
        for c in (3, 7, 15)
    },
    "adaptive-symmetric-global": (
        {"name": "adaptive", "scope": "global", "entropy_grid": "symmetric"}, 1 << 13,
    ),
    "none": ({"name": "none"}, 1 << 12),
}  # fmt: skip


def test_the_unbiased_list_covers_every_compressor_that_claims_it() -> None:
    claimed = {
        n for n, e in catalog.COMPRESSORS.items() if e.unbiased(catalog.compressor(n).params)
    }
    assert claimed == {spec["name"] for spec, _ in UNBIASED.values()}


@pytest.mark.parametrize("case", list(UNBIASED), ids=list(UNBIASED))
def test_unbiased_compressors_pass_a_z_test_at_every_width(case: str) -> None:
    spec, n = UNBIASED[case]
    c = from_spec(spec, seed=11)
    x = _data(n)
    if spec["name"] == "fixedpoint" and "delta" in spec:
        x = x * (100 / 64)  # within the 8-bit range of delta 1/64 (+-127/64): nothing clipped
    if case == "adaptive-2":
        x = x.abs()
    pieces = [n // 3, n - n // 3] if c.granularity == "tensor" else None
    if case in ("adaptive-2", "adaptive-4", "adaptive-8", "adaptive-16"):
        assert set(widths(c.encode(x, pieces=pieces))) == {int(case.split("-")[1])}
    mean, var = _error_moments(c, x, pieces)
    if spec["name"] == "none":
        assert float(mean.abs().max()) == 0.0
        return
    z = _z_rms(mean, var, torch.argsort(x))
    assert z < 1.3, (case, z)


def test_the_z_test_sees_float32_floor_of_t_plus_u_at_16_bits() -> None:
    """The same statistic on the rounding qbench used before (floor(t + u) in float32, t the
    16-bit level position): it must fail, or the test above could not see that bias."""
    g = torch.Generator().manual_seed(0)
    top = (1 << 16) - 1
    t = (torch.rand(1 << 18, generator=g) * top).float()
    total = torch.zeros(t.numel(), dtype=torch.float64)
    squares = torch.zeros_like(total)
    for _ in range(KEYS):
        u = (torch.randint(0, 1 << 24, t.shape, generator=g) / float(1 << 24)).float()
        e = torch.floor(t + u).double() - t.double()  # float32 sum, then floor
        total += e
        squares += e * e
    mean = total / KEYS
    assert _z_rms(mean, (squares - KEYS * mean * mean) / (KEYS - 1), torch.argsort(t)) > 1.3


# -- QSGD: Alistarh et al.'s variance bound, and the exact variance of stochastic rounding ------
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_qsgd_variance_is_within_alistarhs_bound(bits: int) -> None:
    """Alistarh et al. (NIPS 2017), Lemma 3.1: Q_s with s levels of |v_i| / ||v||_2 has
    E ||Q_s(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2 per bucket of d values. qbench's
    ``layout: sign, norm: l2`` is that quantizer with s = 2^(bits-1) - 1. Stochastic rounding
    to a grid of spacing D with fraction p has variance D^2 p (1 - p) exactly: the measured
    total must match that sum to its sampling error, and stay under the bound."""
    d, s = 256, (1 << (bits - 1)) - 1
    c = from_spec({"name": "qsgd", "bits": bits, "bucket_size": d, "norm": "l2", "layout": "sign"})
    x = _data(64 * d, seed=bits)
    buckets = x.double().reshape(-1, d)
    norms = buckets.norm(dim=1, keepdim=True)
    pos = buckets.abs() / norms * s
    frac = pos - pos.floor()
    exact = ((norms / s) ** 2 * frac * (1 - frac)).sum(dim=1)  # per bucket
    measured = torch.zeros_like(exact)
    for step in range(KEYS):
        e = (c.decode(c.encode(x, step=step)).double() - x.double()).reshape(-1, d)
        measured += (e * e).sum(dim=1) / KEYS
    bound = torch.minimum(torch.tensor(d / s**2), torch.tensor(math.sqrt(d) / s)) * norms[:, 0] ** 2
    assert bool((measured <= bound).all())
    # sum over 64 buckets of KEYS draws: relative sampling error ~ 1 / sqrt(64 * 48 * d / 2)
    assert float(measured.sum()) == pytest.approx(float(exact.sum()), rel=0.02)


def test_qsgd_align_tensor_keeps_every_bucket_inside_one_tensor() -> None:
    sizes = [700, 300]
    c = from_spec({"name": "qsgd", "bits": 8, "bucket_size": 512, "align": "tensor"})
    x = torch.cat([torch.randn(700), 100 * torch.randn(300)])
    payload = c.encode(x, pieces=sizes)
    scales = torch.cat([p.buffers["scales"] for p in payload.parts])
    # buckets [0, 512), [512, 700) of the first tensor, [700, 1000) of the second
    want = [x[:512].abs().max(), x[512:700].abs().max(), x[700:].abs().max()]
    assert scales.tolist() == [float(v) for v in want]
    contiguous = from_spec({"name": "qsgd", "bits": 8, "bucket_size": 512}).encode(x)
    assert contiguous.buffers["scales"].tolist() == [
        float(x[:512].abs().max()),
        float(x[512:].abs().max()),
    ]


# -- 1bitSGD (Seide et al. 2014) -------------------------------------------------------------
def _onebit_reference(v: np.ndarray, bucket: int) -> np.ndarray:
    """Each value replaced by the mean of the values of its sign in its bucket (>= 0 and < 0:
    the two reconstruction values of 1-bit quantization with error feedback, Seide et al.)."""
    out = np.empty_like(v)
    for a in range(0, v.size, bucket):
        b = v[a : a + bucket]
        neg = b < 0
        pos_mean = b[~neg].mean() if (~neg).any() else 0.0
        neg_mean = b[neg].mean() if neg.any() else 0.0
        out[a : a + bucket] = np.where(neg, neg_mean, pos_mean)
    return out


def test_onebit_reconstructs_sign_means_and_conserves_the_error() -> None:
    """With error feedback the value quantized is g + r; r' = (g + r) - Q(g + r). Summed over
    steps, what was sent plus the last residual equals what came in (Seide et al. section 3)."""
    c = from_spec({"name": "onebit", "bucket_size": 64})
    n, residual = 1000, np.zeros(1000)
    sent_total, grad_total = np.zeros(n), np.zeros(n)
    for step in range(20):
        g = torch.randn(n, generator=torch.Generator().manual_seed(step))
        decoded = c.decode(c.encode(g, step=step, name="w")).double().numpy()
        want = _onebit_reference(g.double().numpy() + residual, 64)
        np.testing.assert_allclose(decoded, want, rtol=1e-5, atol=1e-6)
        residual = g.double().numpy() + residual - want
        sent_total += decoded
        grad_total += g.double().numpy()
    np.testing.assert_allclose(c.state["w"].double().numpy(), residual, atol=1e-5)
    np.testing.assert_allclose(sent_total + c.state["w"].double().numpy(), grad_total, atol=1e-4)


# -- layer-wise top-k (seed 001) -------------------------------------------------------------
def _resnet20_gradient() -> tuple[list[tuple[str, int]], torch.Tensor]:
    torch.manual_seed(0)
    model = models.build("resnet20")
    loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 3, 32, 32)), torch.arange(8))
    loss.backward()
    named = [(n, p) for n, p in model.named_parameters()]
    return [(n, p.numel()) for n, p in named], torch.cat([p.grad.reshape(-1) for _, p in named])


def test_layerwise_topk_sends_ceil_ratio_numel_of_every_tensor_on_resnet20() -> None:
    """Seed 001: "only top K% (in terms of magnitude) of the weights/gradients of each layer are
    communicated". Over each group of the real layer plan, every tensor sends exactly
    ceil(0.01 n) values, its own largest; one top-k over the group starves small tensors."""
    params, grad = _resnet20_gradient()
    sizes = dict(params)
    groups = layers.plan(params, {"name": "topk"}, layers.LayerPolicy())
    starts = np.cumsum([0] + [m for _, m in params])
    flat = {n: grad[starts[i] : starts[i + 1]] for i, (n, _) in enumerate(params)}
    starved = 0
    for g in groups:
        if g.compressor["name"] != "topk":
            continue
        x = torch.cat([flat[n] for n in g.names])
        layer = from_spec({"name": "topk", "error_feedback": False}).encode(x, pieces=g.sizes)
        for part, name in zip(layer.parts, g.names, strict=True):
            v = flat[name].numpy()
            k = math.ceil(0.01 * v.size)
            assert part.buffers["values"].numel() == k, name
            top = np.sort(np.argsort(-np.abs(v), kind="stable")[:k])
            assert part.buffers["indices"].tolist() == top.tolist(), name
        one = from_spec({"name": "topk", "error_feedback": False, "scope": "global"}).encode(x)
        kept = one.buffers["indices"].long()
        pos = 0
        for name in g.names:
            starved += int(not ((kept >= pos) & (kept < pos + sizes[name])).any())
            pos += sizes[name]
    assert starved >= 5  # measured: 8 of the 20 compressed tensors get nothing with one top-k


# -- adaptive bit widths (seed 004) ----------------------------------------------------------
def _paper_entropy(w: np.ndarray, m: int) -> float:
    """Algorithm 3: Q = floor(2^M (w - w_min) / (w_max - w_min)) (w_max in the top bin), the
    normalised 2^M-bin histogram, H = -sum p log2 p."""
    q = np.minimum(np.floor((w - w.min()) / (w.max() - w.min()) * 2**m), 2**m - 1).astype(int)
    p = np.bincount(q, minlength=2**m) / w.size
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def test_adaptive_picks_n_equal_h_plus_c_per_tensor_and_huffman_is_within_one_bit() -> None:
    """Seed 004 section 3.4: N = H + c per layer (H from an M-bit preliminary quantization),
    whole bits here: ceil(H) + c. Huffman coding of the N-bit symbols costs an average length L
    with H_N <= L < H_N + 1, H_N the entropy of the symbols actually coded."""
    g = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    layers_ = [
        torch.randn(40_000, generator=g),  # Gaussian: H 2.95
        torch.distributions.StudentT(3.0).sample((40_000,)),  # heavy tails: H 0.81
        (torch.rand(40_000, generator=g) * 2 - 1) ** 3,  # peaked, no tails: H 3.34
    ]
    x, sizes = torch.cat(layers_), [t.numel() for t in layers_]
    c, m = 6, 4
    codec = from_spec(
        {"name": "adaptive", "sample_fraction": 1.0, "probe_bits": m, "floor_bits": c}
    )
    payload = codec.encode(x, pieces=sizes)
    for t, n_bits, part in zip(layers_, widths(payload), payload.parts, strict=True):
        h = _paper_entropy(t.double().numpy(), m)
        assert abs(h - round(h)) > 0.05, h  # a sample cannot move ceil(H) across an integer
        assert n_bits == min(max(math.ceil(h) + c, c), c + m), (h, n_bits)
        top = (1 << (n_bits - 1)) - 1
        decoded = codec.decode(part).double()
        symbols = torch.round(decoded / (float(part.buffers["scale"]) / top)).long() + top
        p = torch.bincount(symbols).double() / symbols.numel()
        p = p[p > 0]
        entropy = float(-(p * torch.log2(p)).sum())
        length = int(part.buffers["block_bits"].long().sum()) / t.numel()
        assert entropy <= length < entropy + 1, (entropy, length)


def test_adaptive_entropy_grid_is_the_papers_on_peaked_data() -> None:
    """On Student-t(3) data the paper's grid over [min, max] gives H = 0.35, N = 7; bins over
    [-max |x|, max |x|] put an edge at zero, H = 1.02 and N = 8."""
    x = torch.distributions.StudentT(3.0).sample((100_000,))
    h = _paper_entropy(x.double().numpy(), 4)
    assert math.ceil(h) + 6 == 7
    paper = from_spec({"name": "adaptive", "sample_fraction": 1.0})
    symmetric = from_spec({"name": "adaptive", "sample_fraction": 1.0, "entropy_grid": "symmetric"})
    assert widths(paper.encode(x)) == [7] and widths(symmetric.encode(x)) == [8]


# -- Choco-SGD and DeepSqueeze (gossip), push-sum ------------------------------------------------
K, N = 4, 200
W_RING = np.array([[1, 1, 0, 1], [1, 1, 1, 0], [0, 1, 1, 1], [1, 0, 1, 1]]) / 3  # Metropolis


def _q(v: np.ndarray, ratio: float = 0.1) -> np.ndarray:
    """The compression operator of the references: top-k, the ceil(ratio n) largest |v_i|."""
    k = math.ceil(ratio * v.size)
    out = np.zeros_like(v)
    keep = np.argsort(-np.abs(v), kind="stable")[:k]
    out[keep] = v[keep]
    return out


def _grad(rank: int, step: int) -> np.ndarray:
    return np.random.default_rng(100 * step + rank).standard_normal(N)


def _gossip_ranks(algorithm: str, steps: int, gamma: float, lr: float) -> np.ndarray:
    spec = {"name": "topk", "ratio": 0.1, "error_feedback": False}

    def rank_main(cm: ThreadComm) -> np.ndarray:
        params = {"topology": "ring", "algorithm": algorithm, "gamma": gamma}
        agg = aggregate.build("gossip", cm, from_spec(spec), N, 0, params)
        timer = PhaseTimer(torch.device("cpu"))
        x = torch.from_numpy(np.random.default_rng(cm.rank).standard_normal(N)).float()
        for step in range(steps):
            timer.start()
            x -= lr * torch.from_numpy(_grad(cm.rank, step)).float()  # the optimizer's step
            agg.after_step(x, step, timer)
        return x.double().numpy()

    return np.stack(run_ranks(K, rank_main))


def _x0() -> np.ndarray:
    return np.stack([np.random.default_rng(i).standard_normal(N) for i in range(K)])


def test_choco_sgd_step_is_koloskovas() -> None:
    """Koloskova et al. (ICML 2019), Algorithm 1: x^(t+1/2) = x - eta g; q_i = Q(x_i^(t+1/2) -
    x^_i); x^_j += q_j for every j; x_i^(t+1) = x_i^(t+1/2) + gamma sum_j w_ij (x^_j - x^_i)."""
    steps, gamma, lr = 5, 0.4, 0.1
    x, x_hat = _x0(), np.zeros((K, N))
    for step in range(steps):
        x = x - lr * np.stack([_grad(i, step) for i in range(K)])
        q = np.stack([_q(x[i] - x_hat[i]) for i in range(K)])
        x_hat = x_hat + q
        x = x + gamma * (W_RING @ x_hat - x_hat)  # sum_j w_ij (x^_j - x^_i), rows sum to 1
    got = _gossip_ranks("choco", steps, gamma, lr)
    np.testing.assert_allclose(got, x, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got.mean(0), x.mean(0), atol=1e-5)  # the average is conserved


def test_deepsqueeze_step_is_tangs() -> None:
    """Tang et al. (2019), Algorithm 1: x^(t+1/2) = x - eta g; v_i = x_i^(t+1/2) + delta_i;
    delta_i = v_i - C(v_i); x_i^(t+1) = x_i^(t+1/2) + gamma sum_j (W_ij - I_ij) C(v_j)."""
    steps, gamma, lr = 5, 0.3, 0.1
    x, delta = _x0(), np.zeros((K, N))
    for step in range(steps):
        x = x - lr * np.stack([_grad(i, step) for i in range(K)])
        v = x + delta
        c = np.stack([_q(v[i]) for i in range(K)])
        delta = v - c
        x = x + gamma * ((W_RING - np.eye(K)) @ c)
    got = _gossip_ranks("deepsqueeze", steps, gamma, lr)
    np.testing.assert_allclose(got, x, rtol=0, atol=1e-5)


# rank i keeps P_ii and pushes P_(i+1)i to i + 1: columns sum to 1, rows do not (0.9, 0.7, 1.4)
KEEP = {0: 0.5, 1: 0.2, 2: 0.6}


def _column_stochastic() -> np.ndarray:
    p = np.zeros((3, 3))
    for i, keep in KEEP.items():
        p[i, i], p[(i + 1) % 3, i] = keep, 1 - keep
    return p


def test_push_sum_debiases_a_column_stochastic_matrix() -> None:
    """Kempe et al. (2003) push-sum, as SGP (Assran et al. 2019) uses it: x(t+1) = P x(t),
    w(t+1) = P w(t) with P column-stochastic; z = x / w converges to the average of x(0) even
    though P is not row-stochastic (x alone converges elsewhere)."""
    p = _column_stochastic()
    assert np.allclose(p.sum(0), 1) and not np.allclose(p.sum(1), 1)
    steps, n = 60, 50
    x0 = np.stack([np.random.default_rng(10 + i).standard_normal(n) for i in range(3)])

    def rank_main(cm: ThreadComm) -> np.ndarray:
        agg: Any = aggregate.build(
            "push-sum", cm, from_spec("none"), n, 0, {"topology": "directed-ring"}
        )
        i = cm.rank
        agg.schedule = [
            Mixing(
                keep=KEEP[i],
                out={(i + 1) % 3: 1 - KEEP[i]},
                inn={(i - 1) % 3: 1 - KEEP[(i - 1) % 3]},
            )
        ]
        z = torch.from_numpy(x0[i]).float()
        timer = PhaseTimer(torch.device("cpu"))
        for step in range(steps):
            timer.start()
            agg.after_step(z, step, timer)  # no gradient step: pure mixing
        return z.double().numpy()

    got = np.stack(run_ranks(3, rank_main))
    x, w = x0.copy(), np.ones(3)
    for _ in range(steps):
        x, w = p @ x, p @ w
    np.testing.assert_allclose(got, x / w[:, None], rtol=0, atol=1e-5)
    np.testing.assert_allclose(got, np.broadcast_to(x0.mean(0), got.shape), atol=1e-4)
    assert np.abs(x - x0.mean(0)).max() > 0.1  # without the weights: not the average


# -- Range-EvoNorm as the authors compute it -------------------------------------------------
def _authors_range_evonorm(
    x: np.ndarray, v: np.ndarray, w: np.ndarray, b: np.ndarray, groups: int = 8, chunks: int = 16
) -> np.ndarray:
    """Transcribed from aparna-aketi/Low_Precision_DL, quantized_training/evonorm.py
    RangeEN_full.forward with the hard sigmoid of quantize.py RangeEN (eps 1e-5)."""
    bsz = x.shape[0]
    hs = np.clip(x * v / 6 + 0.5, 0, 1)
    n = x * hs
    y = x.reshape(bsz, groups, chunks, -1)
    mean_max = y.max(-1).mean(-1)
    mean_min = y.min(-1).mean(-1)
    scale_fix = (
        (0.5 * 0.35) * (1 + (math.pi * math.log(4)) ** 0.5) / ((2 * math.log(y.shape[-1])) ** 0.5)
    )
    scale = 1 / ((mean_max - mean_min) * scale_fix + 1e-5)
    out = n.reshape(bsz, groups, -1) * scale[:, :, None]
    return out.reshape(x.shape) * w + b


@pytest.mark.parametrize(("channels", "hw"), [(16, 32), (32, 16), (64, 8)])
def test_range_evonorm_is_the_authors(channels: int, hw: int) -> None:
    """gamma, v and beta drawn here and set on both, so the layer's use of each is checked
    against the reference's; a fresh layer starts as the authors' ``RangeEN`` (v 1, beta 0,
    gamma uniform in [0, 1): ``reset_params``)."""
    layer = evonorm.RangeEvoNorm(channels)
    assert torch.equal(layer.v, torch.ones(1, channels, 1, 1))
    assert torch.equal(layer.beta, torch.zeros(1, channels, 1, 1))
    g0 = layer.gamma.detach()
    assert float(g0.min()) >= 0.0 and float(g0.max()) < 1.0
    assert abs(float(g0.mean()) - 0.5) < 4 * math.sqrt(1 / 12 / channels)  # 4 standard errors
    rng = np.random.default_rng(channels)
    shape = (1, channels, 1, 1)
    v, w, b = rng.uniform(0.5, 1.5, shape), rng.uniform(-2, 2, shape), rng.normal(0, 1, shape)
    with torch.no_grad():
        for param, value in ((layer.v, v), (layer.gamma, w), (layer.beta, b)):
            param.copy_(torch.from_numpy(value))
    x = rng.normal(0.5, 3, (4, channels, hw, hw))
    got = layer(torch.from_numpy(x).float()).detach().double().numpy()
    np.testing.assert_allclose(got, _authors_range_evonorm(x, v, w, b), rtol=1e-4, atol=1e-5)


def test_range_evonorm_on_a_hand_computed_example() -> None:
    """8 channels, 8 groups of one channel, 1 x 32 positions: 16 chunks of 2 values. Channel
    values 0, 1, ..., 31: each chunk (2j, 2j + 1) has max - min = 1, so the range is 1 and the
    scale 1 / C(2), C(2) = 0.175 (1 + sqrt(pi ln 4)) / sqrt(2 ln 2)."""
    layer = evonorm.RangeEvoNorm(8, eps=0.0)
    with torch.no_grad():
        layer.gamma.fill_(1.0)
    x = torch.arange(32.0).repeat(1, 8, 1).reshape(1, 8, 1, 32)
    c = 0.175 * (1 + math.sqrt(math.pi * math.log(4))) / math.sqrt(2 * math.log(2))
    gate = torch.clamp((x + 3) / 6, 0, 1)
    torch.testing.assert_close(layer(x), x * gate / c)


# -- the authors' Range-EvoNorm ResNet-20 -------------------------------------------------------
def _authors_resnet20(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Transcribed from aparna-aketi/Low_Precision_DL, quantized_training/resnet_quantized.py:
    ResNet_cifar10q(depth=20).forward with BasicBlockq, in float64 without the 8-bit parts, each
    RangeEN as ``_authors_range_evonorm``. ``p`` holds the parameters under the authors' names.
    No ReLU anywhere: conv1, bn1, (maxpool is the identity), three layers of three blocks
    (conv1 bn1 conv2 bn2; the shortcut a 1x1 conv and a RangeEN where the shape changes;
    Qsum adds the two), AvgPool2d(8), fc."""

    def norm(y: torch.Tensor, name: str) -> torch.Tensor:
        v, w, b = (p[f"{name}.{k}"].numpy() for k in ("v", "weight", "bias"))
        return torch.from_numpy(_authors_range_evonorm(y.numpy(), v, w, b))

    conv = torch.nn.functional.conv2d
    y = norm(conv(x, p["conv1.weight"], padding=1), "bn1")
    for layer, stride in ((1, 1), (2, 2), (3, 2)):
        for block in range(3):
            pre, s = f"layer{layer}.{block}.", stride if block == 0 else 1
            out = norm(conv(y, p[pre + "conv1.weight"], None, s, 1), pre + "bn1")
            out = norm(conv(out, p[pre + "conv2.weight"], None, 1, 1), pre + "bn2")
            residual = y
            if layer > 1 and block == 0:  # stride 2 and twice the channels: the downsample
                residual = norm(
                    conv(y, p[pre + "downsample.0.weight"], None, s), pre + "downsample.1"
                )
            y = residual + out
    y = torch.nn.functional.avg_pool2d(y, 8).flatten(1)
    return torch.nn.functional.linear(y, p["fc.weight"], p["fc.bias"])


def _authors_name(name: str) -> str:
    """qbench's parameter name -> the authors' (stem -> conv1 / bn1, layers.i -> layer(i // 3
    + 1).(i % 3), short -> downsample, gamma / beta -> weight / bias)."""
    name = name.replace("stem.0.", "conv1.").replace("stem.1.", "bn1.")
    if name.startswith("layers."):
        _, i, rest = name.split(".", 2)
        name = f"layer{int(i) // 3 + 1}.{int(i) % 3}.{rest}"
    name = name.replace("short.", "downsample.")
    return name.replace(".gamma", ".weight").replace(".beta", ".bias")


def test_range_evonorm_resnet20_is_the_authors_network() -> None:
    """Same weights in, same logits out. Every norm's gamma, v and beta are drawn here (the
    initial gamma 0 of each block's second norm would hide its branch), so an activation left
    anywhere, a missing shortcut norm or a norm in the wrong place changes the logits."""
    torch.manual_seed(0)
    model = evonorm.use_range_evonorm(models.build("resnet20"), "range-evonorm").double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith((".gamma", ".v")):
                param.copy_(torch.rand(param.shape, generator=g, dtype=torch.float64) + 0.5)
            elif name.endswith(".beta"):
                param.copy_(torch.randn(param.shape, generator=g, dtype=torch.float64) * 0.2)
    p = {_authors_name(n): t.detach() for n, t in model.named_parameters()}
    assert len(p) == 1 + 3 + 9 * 2 * 4 + 2 * 4 + 2  # stem conv + norm, blocks, shortcuts, fc
    x = torch.randn(2, 3, 32, 32, generator=g, dtype=torch.float64)
    want = _authors_resnet20(x, p)
    got = model(x).detach()
    scale = float(want.abs().max())
    assert scale > 0.1  # not a degenerate comparison
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9 * scale)


@pytest.mark.parametrize("norm", ["range-evonorm", "range-evonorm-gs2"])
def test_range_evonorm_resnet20_starts_as_the_authors_init_modelq(norm: str) -> None:
    """init_modelq (resnet_quantized.py): every norm gamma 1, beta 0 (v 1 from RangeEN), each
    block's bn2 gamma 0; convs normal(0, sqrt(2 / (k k out_channels))); fc weight normal(0,
    0.01), bias 0. Spreads within 5 standard errors of a Gaussian's sample standard deviation
    (relative se 1 / sqrt(2 n)); the pooled standardized conv weights have a Gaussian's
    kurtosis 3 (se sqrt(24 / n), about 0.01; a uniform's is 1.8)."""
    torch.manual_seed(0)
    model = evonorm.use_range_evonorm(models.build("resnet20"), norm)
    norms = {n: m for n, m in model.named_modules() if hasattr(m, "gamma")}
    assert len(norms) == 1 + 9 * 2 + 2
    for name, m in norms.items():
        second = name.startswith("layers.") and name.endswith(".bn2")
        ones = torch.ones(1, m.gamma.shape[1], 1, 1)
        assert torch.equal(m.gamma, ones * (0.0 if second else 1.0)), name
        assert torch.equal(m.beta, ones * 0.0) and torch.equal(m.v, ones), name
    standardized = []
    convs = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 1 + 9 * 2 + 2
    for name, conv in convs:
        k, out = conv.kernel_size
        sd = math.sqrt(2 / (k * out * conv.out_channels))
        w = conv.weight.detach().double().flatten()
        assert abs(float(w.std()) / sd - 1) < 5 / math.sqrt(2 * w.numel()), name
        assert abs(float(w.mean())) < 5 * sd / math.sqrt(w.numel()), name
        standardized.append(w / sd)
    z = torch.cat(standardized)
    assert abs(float((z**4).mean() / (z**2).mean() ** 2) - 3) < 0.1
    fc = model.fc.weight.detach().double()
    assert abs(float(fc.std()) / 0.01 - 1) < 5 / math.sqrt(2 * fc.numel())
    assert torch.equal(model.fc.bias, torch.zeros(10))


def test_batchnorm_resnet20_keeps_its_relus_and_range_evonorm_has_none() -> None:
    """The block outputs (after the residual add) and the stem: never negative with batch norm
    (a ReLU ends each); with Range-EvoNorm nothing clips them (random gamma and beta so the
    blocks' branches count)."""
    outputs: list[torch.Tensor] = []

    def negative_share(model: torch.nn.Module) -> float:
        outputs.clear()
        for m in [model.stem, *model.layers]:
            m.register_forward_hook(lambda _m, _i, out: outputs.append(out.detach()))
        model(torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2)))
        return float(torch.cat([o.flatten() for o in outputs]).lt(0).double().mean())

    torch.manual_seed(0)
    assert negative_share(models.build("resnet20")) == 0.0
    evo = evonorm.use_range_evonorm(models.build("resnet20"), "range-evonorm")
    with torch.no_grad():
        for name, param in evo.named_parameters():
            if name.endswith(".gamma"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".beta"):
                param.normal_(0, 0.2)
    assert negative_share(evo) > 0.2
