"""Push-sum scheme: directed graphs and their column-stochastic matrices, parameter checks, the
algorithms on in-process ranks (threads) against matrix references, and on gloo / MPI ranks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from qbench import aggregate, catalog
from qbench.aggregate import directed
from qbench.aggregate.directed import Mixing
from qbench.aggregate.gossip import consensus_distance
from qbench.aggregate.push_sum import PushSum
from qbench.catalog.schemes import qgm_beta
from qbench.compress import from_spec
from qbench.errors import UserError
from qbench.spec.rules import incompatibility
from qbench.timing import PhaseTimer
from tests.aggregate.test_gossip import LocalComm, on_threads
from tests.rank_codec import Parts, rank_codec

SIZES = range(2, 10)
QSGD8 = {"name": "qsgd", "bits": 8, "bucket_size": 128}
NONE = {"name": "none"}


# -- graphs and mixing matrices ----------------------------------------------------------------
@pytest.mark.parametrize("topo", directed.TOPOLOGIES)
@pytest.mark.parametrize("k", SIZES)
def test_every_step_is_column_stochastic(topo: str, k: int) -> None:
    for step in range(2 * directed.period(topo, k) + 1):
        p = directed.matrix(topo, k, step)
        assert (p >= 0).all()
        torch.testing.assert_close(p.sum(0), torch.ones(k, dtype=torch.float64), rtol=0, atol=0)
        torch.testing.assert_close(p.diagonal(), torch.full((k,), 0.5, dtype=torch.float64))
        for i in range(k):
            keep, out = directed.weights(topo, i, k, step)
            assert keep + sum(out.values()) == 1.0 and len(out) == 1 and i not in out
            # What i receives is row i of P, off the diagonal; the schedule holds the same.
            row = {j: float(p[i, j]) for j in range(k) if j != i and p[i, j]}
            assert directed.in_weights(topo, i, k, step) == row
            assert directed.schedule(topo, i, k)[step % directed.period(topo, k)] == Mixing(
                keep, out, row
            )


def test_directed_ring_peers() -> None:
    assert [directed.out_peers("directed-ring", i, 5, 7) for i in range(5)] == [
        (1,), (2,), (3,), (4,), (0,)
    ]  # fmt: skip
    assert directed.in_weights("directed-ring", 0, 5, 0) == {4: 0.5}
    assert directed.period("directed-ring", 5) == 1


@pytest.mark.parametrize(
    ("k", "hops"),
    [(1, ()), (2, (1,)), (3, (1, 2)), (4, (1, 2)), (5, (1, 2, 4)), (6, (1, 2, 4)),
     (8, (1, 2, 4)), (9, (1, 2, 4, 8)), (16, (1, 2, 4, 8))],
)  # fmt: skip
def test_exponential_hops(k: int, hops: tuple[int, ...]) -> None:
    assert directed.hops("exponential", k) == hops
    assert directed.period("exponential", k) == max(1, len(hops))


def test_exponential_peers_cycle_through_powers_of_two() -> None:
    assert [directed.out_peers("exponential", 3, 8, t) for t in range(5)] == [
        (4,), (5,), (7,), (4,), (5,)
    ]  # fmt: skip
    assert directed.in_weights("exponential", 3, 8, 2) == {7: 0.5}  # 7 + 4 = 3 (mod 8)
    assert directed.out_peers("exponential", 0, 1, 3) == ()
    assert directed.schedule("exponential", 0, 1) == (Mixing(1.0, {}, {}),)


@pytest.mark.parametrize("k", [2, 4, 8, 16, 32])
def test_one_exponential_period_averages_exactly(k: int) -> None:
    product = torch.eye(k, dtype=torch.float64)
    for step in range(directed.period("exponential", k)):
        product = directed.matrix("exponential", k, step) @ product
    torch.testing.assert_close(
        product, torch.full((k, k), 1 / k, dtype=torch.float64), rtol=0, atol=0
    )


@pytest.mark.parametrize("k", [3, 5, 6, 7])
def test_exponential_periods_approach_the_average(k: int) -> None:
    # Not exact for other sizes, but every period mixes everyone: the product contracts to J/K.
    product = torch.eye(k, dtype=torch.float64)
    for step in range(20 * directed.period("exponential", k)):
        product = directed.matrix("exponential", k, step) @ product
    torch.testing.assert_close(
        product, torch.full((k, k), 1 / k, dtype=torch.float64), atol=1e-6, rtol=0
    )


def test_unknown_topology() -> None:
    with pytest.raises(UserError, match="valid: directed-ring, exponential"):
        directed.hops("ring", 4)


# -- parameters ---------------------------------------------------------------------------------
def test_check_params_defaults() -> None:
    got = aggregate.check_params("push-sum", {})
    assert got == {"topology": "directed-ring", "algorithm": "auto", "gamma": 1.0, "qgm": False}
    got = aggregate.check_params("push-sum", {"topology": "exponential", "gamma": 1, "qgm": True})
    assert got == {"topology": "exponential", "algorithm": "auto", "gamma": 1.0, "qgm": True}
    assert aggregate.check_params("push-sum", {"qgm": 0.5})["qgm"] == 0.5
    assert qgm_beta(True) == 0.9 and qgm_beta(False) == 0.0 and qgm_beta(0.5) == 0.5


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"topolgy": "ring"},
            "unknown parameter 'topolgy' .*; valid: topology, algorithm, gamma, qgm",
        ),
        ({"topology": "ring"}, "topology must be one of directed-ring, exponential, got 'ring'"),
        ({"topology": ["exponential"]}, r"topology must be a string \(one of directed-ring, exp"),
        ({"algorithm": "quant-sgp"}, "algorithm must be one of auto, sgp, choco, got 'quant-sgp'"),
        ({"gamma": 0}, r"gamma must be a number in \(0, 1\], got 0"),
        ({"gamma": 1.5}, r"gamma must be a number in \(0, 1\], got 1.5"),
        ({"gamma": "0.5"}, "gamma must be a number"),
        ({"algorithm": "sgp", "gamma": 0.5}, "gamma is the consensus step size of choco"),
        ({"qgm": "yes"}, r"qgm must be true, false or a momentum in \[0, 1\), got 'yes'"),
        ({"qgm": 1}, r"qgm must be true, false or a momentum in \[0, 1\), got 1"),
    ],
)
def test_check_params_errors(params: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message) as e:
        aggregate.check_params("push-sum", params)
    assert "\n" not in str(e.value)


def test_auto_algorithm_follows_the_compressor() -> None:
    comm = LocalComm(0, 4)
    for comp, gamma, algorithm in (
        (NONE, 1.0, "sgp"),
        (NONE, 0.5, "choco"),  # only choco damps the consensus step
        (QSGD8, 1.0, "choco"),
        ({"name": "fp16"}, 1.0, "choco"),
    ):
        agg = aggregate.build("push-sum", comm, from_spec(comp), 8, params={"gamma": gamma})
        assert isinstance(agg, PushSum) and agg.algorithm == algorithm
    agg = aggregate.build("push-sum", comm, from_spec(QSGD8), 8, params={"algorithm": "sgp"})
    assert isinstance(agg, PushSum) and agg.algorithm == "sgp"


@pytest.mark.parametrize("comp", [{"name": "topk"}, {"name": "onebit"}])
def test_compressor_error_feedback_is_refused(comp: dict[str, Any]) -> None:
    assert "set `error_feedback: false`" in str(
        incompatibility("gloo", "push-sum", catalog.compressor(comp))
    )
    assert (
        incompatibility("gloo", "push-sum", catalog.compressor({**comp, "error_feedback": False}))
        is None
    )


# -- the algorithms on ranks that are threads of this process -------------------------------------
N = 301


def start(rank: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(rank))


def centre(rank: int) -> torch.Tensor:
    return 3.0 * torch.randn(N, generator=torch.Generator().manual_seed(100 + rank))


def skewed(rank: int, k: int) -> tuple[Mixing, ...]:
    """A directed ring whose ranks keep different shares (0.2 .. 0.8): column- but not
    row-stochastic, so the push-sum weights move away from 1 and de-biasing matters."""
    keep = [0.2 + 0.6 * i / (k - 1) for i in range(k)]
    prev = (rank - 1) % k
    return (Mixing(keep[rank], {(rank + 1) % k: 1 - keep[rank]}, {prev: 1 - keep[prev]}),)


def skewed_matrix(k: int) -> torch.Tensor:
    p = torch.zeros(k, k, dtype=torch.float64)
    for i in range(k):
        (m,) = skewed(i, k)
        p[i, i] = m.keep
        p[(i + 1) % k, i] = 1 - m.keep
    return p


def train(
    k: int,
    comp: dict[str, Any],
    steps: int,
    *,
    lr: float = 0.0,
    grad_steps: int | None = None,
    skew: bool = False,
    **params: Any,
) -> list[dict[str, Any]]:
    """``steps`` of push-sum, the first ``grad_steps`` (all by default) after a local gradient
    step on ||z - centre(rank)||^2; per rank and step: z, weight, bytes, payload, distance."""

    def fn(cm: LocalComm) -> dict[str, Any]:
        z, c = start(cm.rank), centre(cm.rank)
        agg = aggregate.build("push-sum", cm, from_spec(comp), N, offset=3, params=params)
        assert isinstance(agg, PushSum)
        if skew:
            agg.schedule = skewed(cm.rank, k)
        timer = PhaseTimer(torch.device("cpu"))
        out: dict[str, Any] = {"weight": [], "bytes": [], "payload": [], "distance": [], "z": []}
        for step in range(steps):
            timer.start()
            grad = 2 * (z - c)
            assert agg.aggregate(grad, step, timer) is grad
            if grad_steps is None or step < grad_steps:
                z -= lr * grad
            before = cm.bytes_sent
            agg.after_step(z, step, timer)
            out["bytes"].append(cm.bytes_sent - before)
            out["weight"].append(agg.weight)
            out["payload"].append(agg.payload_bytes)
            out["z"].append(z.clone())
            sq = agg.metrics()["consensus_sq"]
            out["distance"].append(consensus_distance(cm, [sq], torch.device("cpu")))
        out["phases"] = dict(timer.totals)
        return out

    return on_threads(k, fn)


def _initial(k: int) -> torch.Tensor:
    return torch.stack([start(r) for r in range(k)]).double()


def _z(results: list[dict[str, Any]], step: int = -1) -> torch.Tensor:
    return torch.stack([r["z"][step] for r in results]).double()


@pytest.mark.parametrize(("topo", "k"), [("directed-ring", 2), ("directed-ring", 5),
                                         ("exponential", 4), ("exponential", 6)])  # fmt: skip
@pytest.mark.parametrize("algorithm", ["sgp", "choco"])
def test_exact_steps_are_p_times_x(topo: str, k: int, algorithm: str) -> None:
    # Compressor none, gamma 1: both algorithms are exact push-sum, x <- P(t) x, step by step.
    got = train(k, NONE, 3, topology=topo, algorithm=algorithm)
    x = _initial(k)
    for step in range(3):
        x = directed.matrix(topo, k, step) @ x
        torch.testing.assert_close(_z(got, step), x, rtol=0, atol=1e-6)
    assert all(r["weight"] == [1.0] * 3 for r in got)  # these graphs are doubly stochastic
    assert all(r["bytes"] == [4 * N + 4] * 3 for r in got)  # one peer: model + fp32 weight
    assert got[0]["phases"]["comm"] > 0 and got[0]["phases"]["decode"] > 0


def test_one_exponential_period_reaches_the_average() -> None:
    got = train(8, NONE, 3, topology="exponential")
    torch.testing.assert_close(_z(got), _initial(8).mean(0).expand(8, -1), rtol=0, atol=1e-6)
    assert got[0]["distance"][-1] < 1e-5


def test_one_rank_is_a_no_op() -> None:
    (got,) = train(1, QSGD8, 3, topology="exponential")
    torch.testing.assert_close(got["z"][-1], start(0), rtol=0, atol=0)
    assert got["bytes"] == [0, 0, 0] and got["weight"] == [1.0] * 3


@pytest.mark.parametrize("algorithm", ["sgp", "choco"])
def test_sgd_on_a_skewed_graph_matches_the_push_sum_reference(algorithm: str) -> None:
    # x <- A (x - lr grad(z)), w <- A w, z = x / w with A = (1 - gamma) I + gamma P.
    k, lr, steps, gamma = 5, 0.05, 30, 0.5 if algorithm == "choco" else 1.0
    params = {"gamma": gamma} if algorithm == "choco" else {}
    got = train(k, NONE, steps, lr=lr, skew=True, algorithm=algorithm, **params)
    a = (1 - gamma) * torch.eye(k, dtype=torch.float64) + gamma * skewed_matrix(k)
    c = torch.stack([centre(r) for r in range(k)]).double()
    x, w = _initial(k), torch.ones(k, 1, dtype=torch.float64)
    for step in range(steps):
        x, w = a @ (x - lr * 2 * (x / w - c)), a @ w
        torch.testing.assert_close(_z(got, step), x / w, rtol=1e-5, atol=1e-5)
    weights = torch.tensor([r["weight"] for r in got], dtype=torch.float64)
    torch.testing.assert_close(weights[:, -1:], w, rtol=1e-6, atol=1e-6)
    assert (weights - 1).abs().max() > 0.2  # the de-biasing is really exercised


@pytest.mark.parametrize(
    ("algorithm", "comp", "gamma", "tol"),
    [("sgp", NONE, 1.0, 1e-5), ("choco", QSGD8, 1.0, 1e-3), ("choco", QSGD8, 0.6, 1e-3)],
)
def test_skewed_mixing_conserves_mass_and_debiases(
    algorithm: str, comp: dict[str, Any], gamma: float, tol: float
) -> None:
    k = 5
    params: dict[str, Any] = {"algorithm": algorithm} | ({"gamma": gamma} if gamma < 1 else {})
    got = train(k, comp, 150, skew=True, **params)
    weights = torch.tensor([r["weight"] for r in got], dtype=torch.float64)
    assert (weights > 0).all()
    torch.testing.assert_close(
        weights.sum(0), torch.full((150,), float(k), dtype=torch.float64), rtol=0, atol=1e-5
    )
    # sum_i w_i z_i = sum_i x_i is conserved, and the de-biased z_i reach its mean.
    x0 = _initial(k)
    for step in (0, 10, 149):
        mass = (weights[:, step : step + 1] * _z(got, step)).sum(0)
        torch.testing.assert_close(mass, x0.sum(0), rtol=0, atol=1e-4)
    assert (_z(got) - x0.mean(0)).abs().max() < tol
    assert got[0]["distance"][-1] < 1e-3 * got[0]["distance"][0]


@pytest.mark.parametrize(
    ("topo", "comp", "params"),
    [("directed-ring", NONE, {}), ("exponential", NONE, {}),
     ("exponential", QSGD8, {}), ("directed-ring", QSGD8, {"gamma": 0.8})],
)  # fmt: skip
def test_quadratic_reaches_the_mean_of_the_centres(
    topo: str, comp: dict[str, Any], params: dict[str, Any]
) -> None:
    # 60 gradient steps move the average to mean(c) (these P are doubly stochastic, so the
    # average of z follows the mean gradient), then 60 steps of pure mixing reach consensus.
    k = 4
    got = train(k, comp, 120, lr=0.1, grad_steps=60, topology=topo, **params)
    c_bar = torch.stack([centre(r) for r in range(k)]).double().mean(0)
    assert (_z(got, 59) - _z(got, 59).mean(0)).abs().max() > 0.01  # local models still differ
    assert (_z(got) - c_bar).abs().max() < 1e-3
    assert got[0]["distance"][-1] < 1e-3 * max(got[0]["distance"])


# Lossy compressors: a reference in matrix form with the scheme's encoders and keys. Rank i
# encodes with its own key (qbench.compress.base.Key: step, rank i, stream 3 for push-sum, and
# the global index where the slice starts, ``train``'s offset 3 here), so a bug that made every
# rank draw the same numbers fails.
PUSH_SUM_STREAM = 3
QSGD4 = {"name": "qsgd", "bits": 4, "bucket_size": 128}


def _c(comp: dict[str, Any], t: torch.Tensor, step: int, rank: int, parts: Parts) -> torch.Tensor:
    return rank_codec(comp, t, step, rank, parts, PUSH_SUM_STREAM)


def push_sum_reference(
    algorithm: str, comp: dict[str, Any], p: torch.Tensor, x0: torch.Tensor, centres: torch.Tensor,
    steps: int, lr: float, gamma: float, parts: Parts | None = None, key_rank: Any = None,
) -> list[torch.Tensor]:  # fmt: skip
    """z = x / w after each step, from push_sum.py's definitions with P fixed (column i: what
    rank i keeps and pushes): a gradient step x_i -= lr 2 (z_i - centre_i), then
    sgp:   x_i <- P_ii x_i + sum_j P_ij C_j(x_j),  w <- P w;
    choco (Quant-SGP): per directed edge j -> i a public copy x_hat_ji, moved by
           q = C_j(x_j - x_hat_ji) on both ends, then
           x_i += gamma (sum_j P_ij x_hat_ji - sum_k P_ki x_hat_ik), w += gamma (P w - w).
    ``parts``: ``train``'s one slice at offset 3 by default; ``key_rank(i)``: the rank whose key
    rank i encodes with (its own by default)."""
    k = p.shape[0]
    x, w = x0.clone(), torch.ones(k, 1, dtype=torch.float64)
    parts = parts or [(slice(0, x0.shape[1]), 3)]
    copies: dict[tuple[int, int], torch.Tensor] = {}  # (sender, receiver) -> x_hat
    rank_of = key_rank or (lambda i: i)
    edges = [(j, i) for i in range(k) for j in range(k) if i != j and p[i, j] > 0]
    out = []
    for step in range(steps):
        x = x - lr * 2 * (x / w - centres)
        if algorithm == "sgp":
            sent = torch.stack([_c(comp, x[j], step, rank_of(j), parts) for j in range(k)])
            off = p - torch.diag(p.diagonal())
            x, w = p.diagonal().unsqueeze(1) * x + off @ sent, p @ w
        else:
            for j, i in edges:
                hat = copies.setdefault((j, i), torch.zeros_like(x[0]))
                hat += _c(comp, x[j] - hat, step, rank_of(j), parts)
            delta = torch.zeros_like(x)
            for j, i in edges:
                delta[i] += p[i, j] * copies[j, i]
                delta[j] -= p[i, j] * copies[j, i]
            x, w = x + gamma * delta, w + gamma * (p @ w - w)
        out.append(x / w)
    return out


@pytest.mark.parametrize("comp", [QSGD4, {"name": "fixedpoint", "bits": 6}],
                         ids=["qsgd4", "fixedpoint6"])  # fmt: skip
@pytest.mark.parametrize(("algorithm", "gamma"), [("choco", 0.6), ("choco", 1.0), ("sgp", 1.0)])
def test_quantized_push_sum_matches_the_reference_with_each_ranks_own_draws(
    algorithm: str, gamma: float, comp: dict[str, Any]
) -> None:
    # The skewed ring: weights leave 1, so de-biasing by the exchanged fp32 weights matters.
    k, steps, lr = 5, 6, 0.05
    params: dict[str, Any] = {"algorithm": algorithm} | ({"gamma": gamma} if gamma < 1 else {})
    got = train(k, comp, steps, lr=lr, skew=True, **params)
    p, x0 = skewed_matrix(k), _initial(k)
    c = torch.stack([centre(r) for r in range(k)]).double()
    reference = push_sum_reference(algorithm, comp, p, x0, c, steps, lr, gamma)
    for step in range(steps):
        torch.testing.assert_close(_z(got, step), reference[step], rtol=0, atol=2e-5)
    # The draws matter: with rank 0's key on every rank z differs 50x beyond atol.
    shared = push_sum_reference(algorithm, comp, p, x0, c, steps, lr, gamma, key_rank=lambda i: 0)
    assert (shared[-1] - reference[-1]).abs().max() > 1e-3


def test_bytes_are_payload_plus_weight_to_the_out_peer() -> None:
    got = train(5, QSGD8, 2, topology="exponential")
    payload = from_spec(QSGD8).wire_nbytes(N)
    assert all(r["payload"] == [payload] * 2 and r["bytes"] == [payload + 4] * 2 for r in got)
    got = train(5, {"name": "adaptive"}, 2, algorithm="sgp")  # data-dependent: 8 bytes of size
    assert all(r["bytes"] == [p + 4 + 8 for p in r["payload"]] for r in got)


# -- quasi-global momentum ------------------------------------------------------------------------
def qgm_mean(k: int, lr: float, beta: float, steps: int) -> list[torch.Tensor]:
    """The mean model under QG-DSGDm in displacement form: mixing keeps the mean, the gradient
    of the quadratics is linear, so the mean follows the single-model recurrence."""
    z = _initial(k).mean(0)
    c = torch.stack([centre(r) for r in range(k)]).double().mean(0)
    u, means = torch.zeros_like(z), []
    for step in range(steps):
        new = z - lr * 2 * (z - c) - beta * u
        if step > 0:  # the scheme never sees the first step's displacement
            u = beta * u + (1 - beta) * (z - new)
        z = new
        means.append(z)
    return means


@pytest.mark.parametrize(
    ("topo", "comp", "params"),
    [("exponential", NONE, {}), ("directed-ring", QSGD8, {"gamma": 0.8})],
)
def test_qgm_mean_follows_quasi_global_momentum(
    topo: str, comp: dict[str, Any], params: dict[str, Any]
) -> None:
    k, lr, steps = 4, 0.02, 80
    got = train(k, comp, steps, lr=lr, topology=topo, qgm=True, **params)
    reference = qgm_mean(k, lr, 0.9, steps)
    for step in range(steps):
        torch.testing.assert_close(_z(got, step).mean(0), reference[step], rtol=0, atol=2e-4)
    c_bar = torch.stack([centre(r) for r in range(k)]).double().mean(0)
    assert (reference[-1] - c_bar).abs().max() < 0.05 * (reference[0] - c_bar).abs().max()


def test_qgm_on_one_rank_is_the_recurrence() -> None:
    (got,) = train(1, NONE, 20, lr=0.05, qgm=0.5)
    torch.testing.assert_close(
        got["z"][-1].double(), qgm_mean(1, 0.05, 0.5, 20)[-1], rtol=0, atol=1e-5
    )


# -- gloo and MPI ranks ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_push_sum_on_four_ranks(backend: str, tmp_path: Path) -> None:
    from tests import dist_push_sum_prog as prog
    from tests.distributed import here, launch

    k = 4
    launch(backend, k, [here("dist_push_sum_prog.py"), backend, str(tmp_path)])
    ranks = [torch.load(tmp_path / f"rank-{r}.pt") for r in range(k)]
    x0 = torch.stack([prog.initial(r) for r in range(k)]).double()
    c_bar = torch.stack([prog.target(r) for r in range(k)]).double().mean(0)

    def final(case: str) -> torch.Tensor:
        return torch.stack([r[case]["x"] for r in ranks]).double()

    p = directed.matrix("exponential", k, 0)
    torch.testing.assert_close(final("sgp-exponential-once"), p @ x0, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        final("sgp-exponential-period"), x0.mean(0).expand(k, -1), rtol=0, atol=1e-6
    )
    for case in ("sgp-ring-quadratic", "choco-qsgd8-exponential-quadratic",
                 "choco-qsgd8-ring-quadratic"):  # fmt: skip
        assert (final(case) - c_bar).abs().max() < 1e-3, case
    assert (final("choco-qsgd8-skewed-mix") - x0.mean(0)).abs().max() < 1e-3
    # Stochastic rounding with each rank's own draws, slice by slice at the slices' offsets.
    parts = [(part, part.start) for part in prog.SLICES]
    centres = torch.stack([prog.target(r) for r in range(k)]).double()
    for case in ("choco-qsgd4-skewed-draws", "sgp-fixed6-skewed-draws"):
        c = prog.CASES[case]
        expected = push_sum_reference(
            c.get("algorithm", "choco"), c["comp"], skewed_matrix(k), x0, centres, c["steps"],
            c["lr"], c.get("gamma", 1.0), parts,
        )[-1]  # fmt: skip
        torch.testing.assert_close(final(case), expected, rtol=0, atol=2e-5, msg=case)
    for case in prog.CASES:
        weights = torch.tensor([r[case]["weight"] for r in ranks], dtype=torch.float64)
        assert (weights > 0).all(), case
        torch.testing.assert_close(
            weights.sum(0), torch.full_like(weights[0], k), rtol=0, atol=1e-5
        )
        d = ranks[0][case]["distance"]
        assert all(r[case]["distance"] == d for r in ranks), case
        x = final(case)
        reference = (x - x.mean(0)).norm(dim=1).mean().item()
        assert math.isclose(d[-1], reference, rel_tol=1e-3, abs_tol=1e-5), case
        size_exchange = 0 if from_spec(prog.CASES[case]["comp"]).fixed_size else 2 * 8
        for r in ranks:  # one out-peer per step, two slices: payload + 4 bytes of weight each
            assert r[case]["bytes"] == [p + 2 * 4 + size_exchange for p in r[case]["payload"]]
    skew = torch.tensor([r["choco-qsgd8-skewed-mix"]["weight"][-1] for r in ranks])
    assert (skew - 1).abs().max() > 0.2
