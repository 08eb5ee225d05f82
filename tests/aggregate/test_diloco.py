"""Local SGD and DiLoCo (qbench.aggregate.diloco) on ranks that are threads, against hand-made
references: DDP step for step, parameter averaging, torch's own outer SGD, error feedback's
telescoping sum, and ranks agreeing on the global model. Each test names the bug it catches."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from qbench import aggregate, catalog
from qbench.compress import from_spec
from qbench.errors import UserError
from qbench.spec.rules import incompatibility
from qbench.timing import PhaseTimer
from tests.aggregate.test_gossip import LocalComm, on_threads

N, K = 37, 3


def _problem(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s quadratic: grad(theta) = A theta - b, A symmetric positive definite."""
    g = torch.Generator().manual_seed(100 + rank)
    m = torch.randn(N, N, generator=g, dtype=torch.float64) / N**0.5
    return m @ m.T + 0.5 * torch.eye(N, dtype=torch.float64), torch.randn(N, generator=g).double()


def _grad(rank: int, theta: torch.Tensor) -> torch.Tensor:
    a, b = _problem(rank)
    return (a @ theta.double() - b).float()


THETA0 = torch.randn(N, generator=torch.Generator().manual_seed(7))


def _train(
    scheme: str, params: dict[str, Any], steps: int, comp: dict[str, Any] | None = None,
    world_size: int = K, momentum: float = 0.9,
) -> list[dict[str, Any]]:  # fmt: skip
    """Per rank: its parameters after every step, the bytes each step sent, the phases."""

    def fn(cm: LocalComm) -> dict[str, Any]:
        theta = THETA0.clone()
        agg = aggregate.build(scheme, cm, from_spec(comp or {"name": "none"}), N, params=params)
        agg.begin(theta)
        opt = torch.optim.SGD([theta], lr=0.05, momentum=momentum)
        timer = PhaseTimer(torch.device("cpu"))
        out: dict[str, Any] = {"theta": [], "bytes": [], "agg": agg}
        for step in range(steps):
            timer.start()
            before = cm.bytes_sent
            theta.grad = agg.aggregate(_grad(cm.rank, theta), step, timer)
            opt.step()
            agg.after_step(theta.data, step, timer)
            out["theta"].append(theta.detach().clone())
            out["bytes"].append(cm.bytes_sent - before)
        out["phases"] = dict(timer.totals)
        return out

    return on_threads(world_size, fn)


def _ddp(steps: int, momentum: float = 0.9) -> list[torch.Tensor]:
    """One model stepped on the mean of the ranks' gradients (what DDP computes)."""
    theta = THETA0.clone()
    opt = torch.optim.SGD([theta], lr=0.05, momentum=momentum)
    out = []
    for _ in range(steps):
        theta.grad = torch.stack([_grad(r, theta) for r in range(K)]).mean(0)
        opt.step()
        out.append(theta.detach().clone())
    return out


def test_diloco_every_step_with_plain_outer_sgd_is_ddp_step_for_step() -> None:
    """H = 1, outer lr 1, no momentum: theta_g - mean(theta_g - theta_i) = mean(theta_i), and
    the inner momentum is linear, so the mean of the ranks' buffers is DDP's. Fails on a delta
    of the wrong sign, a mean divided by K twice, or a global model not copied back."""
    params = {"H": 1, "outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}
    got, want = _train("diloco", params, 12), _ddp(12)
    for step in range(12):
        for r in range(K):
            torch.testing.assert_close(got[r]["theta"][step], want[step], rtol=0, atol=2e-6)


def test_local_sgd_averages_the_ranks_models_every_h_steps_and_sends_only_then() -> None:
    """After H local steps every rank holds the mean of the K models each would have trained
    alone from the same start (its own inner momentum kept). Fails when the exchange runs at
    the wrong steps (an off-by-one in H) or sends bytes on inner steps."""
    h, steps = 4, 8
    got = _train("local-sgd", {"H": h}, steps)
    thetas = [THETA0.clone() for _ in range(K)]
    opts = [torch.optim.SGD([t], lr=0.05, momentum=0.9) for t in thetas]
    for step in range(steps):
        for r in range(K):
            thetas[r].grad = _grad(r, thetas[r])
            opts[r].step()
        if (step + 1) % h == 0:
            mean = torch.stack([t.detach() for t in thetas]).mean(0)
            for t in thetas:
                t.data.copy_(mean)
        for r in range(K):
            torch.testing.assert_close(got[r]["theta"][step], thetas[r].detach(), atol=2e-6, rtol=0)
    for r in range(K):
        sent = got[r]["bytes"]
        assert [s > 0 for s in sent] == [(s + 1) % h == 0 for s in range(steps)]
        assert got[r]["agg"].payload_bytes == 4 * N  # the last step was a sync: fp32 deltas


def test_outer_nesterov_is_torch_sgd_on_the_mean_pseudo_gradient() -> None:
    """Rounds of H = 3 with outer lr 0.7, momentum 0.9, Nesterov: the global model equals
    torch.optim.SGD stepping theta_g with grad = mean(theta_g - theta_i). Fails when the
    momentum buffer is reset each round, Nesterov's look-ahead is left out, or lr is applied
    twice."""
    params = {"H": 3, "outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}
    got = _train("diloco", params, 9)
    glob = THETA0.clone()
    outer = torch.optim.SGD([glob], lr=0.7, momentum=0.9, nesterov=True)
    local = [THETA0.clone() for _ in range(K)]
    inner = [torch.optim.SGD([t], lr=0.05, momentum=0.9) for t in local]
    for step in range(9):
        for r in range(K):
            local[r].grad = _grad(r, local[r])
            inner[r].step()
        if (step + 1) % 3 == 0:
            glob.grad = torch.stack([glob.detach() - t.detach() for t in local]).mean(0)
            outer.step()
            for t in local:
                t.data.copy_(glob.detach())
            for r in range(K):
                torch.testing.assert_close(got[r]["theta"][step], glob.detach(), atol=2e-6, rtol=0)


def test_error_feedback_carries_the_outer_residual_into_the_next_round() -> None:
    """One rank, 1bitSGD with error feedback: what the rounds sent adds up to what they had to
    send minus the residual the compressor holds at the end (sum of decoded = sum of deltas -
    e_R). Fails when the residual is dropped between rounds or keyed to another slot."""
    params = {"H": 2, "outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}
    params["exchange"] = "allgather"  # one rank: the mean is its own payload, decoded
    run = _train("diloco", params, 8, {"name": "onebit"}, world_size=1, momentum=0.0)[0]
    agg = run["agg"]
    thetas = run["theta"]
    # theta after each sync is theta_g; the delta of a round is theta_g(before) - theta_local,
    # replayed here from a model stepped with the same gradients from the same start
    glob, sent, wanted = THETA0.clone(), torch.zeros(N), torch.zeros(N)
    local = THETA0.clone()
    for step in range(8):
        local -= 0.05 * _grad(0, local)
        if (step + 1) % 2 == 0:
            delta = glob - local
            wanted += delta
            new_glob = thetas[step]
            sent += glob - new_glob  # outer lr 1: the decoded mean moved the global model
            glob, local = new_glob.clone(), new_glob.clone()
    (residual,) = [v for v in agg.compressor.state.values() if v.numel() == N]
    assert residual.abs().sum() > 0
    torch.testing.assert_close(sent, wanted - residual, atol=1e-5, rtol=0)


def test_ranks_agree_on_the_global_model_after_every_outer_step() -> None:
    """QSGD 4-bit through reduce-broadcast: each owner re-encodes its range's mean and every
    rank, the owner too, decodes the same bytes, so the ranks' models are bit for bit equal
    after each sync and differ between syncs."""
    params = {"H": 2, "exchange": "reduce-broadcast"}
    got = _train("diloco", params, 6, {"name": "qsgd", "bits": 4, "bucket_size": 16})
    for step in range(6):
        same = all(torch.equal(got[0]["theta"][step], got[r]["theta"][step]) for r in range(K))
        assert same == ((step + 1) % 2 == 0), step


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"H": 0}, "H must be an integer >= 1, got 0; e.g. `H: 50`"),
        ({"nesterov": True, "outer_momentum": 0}, "set `outer_momentum: 0.9` or drop `nesterov`"),
        ({"exchange": "gossip"}, "exchange must be one of allreduce, reduce-broadcast"),
        ({"outer_lr": 0}, "outer_lr must be a number > 0"),
        ({"outer_momentum": 1}, "outer_momentum must be a number in [0, 1)"),
    ],
)
def test_bad_parameters_are_one_line_naming_the_value_and_a_fix(
    params: dict[str, Any], message: str
) -> None:
    with pytest.raises(UserError) as e:
        catalog.scheme({"name": "diloco", **params})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_exchange_refuses_what_its_scheme_refuses() -> None:
    qsgd = catalog.compressor({"name": "qsgd", "bits": 4})
    why = incompatibility("gloo", "diloco", qsgd, params={"H": 5})
    assert why is not None and why.startswith("diloco exchanges through allreduce, and allreduce")
    assert incompatibility("gloo", "diloco", qsgd, params={"exchange": "reduce-broadcast"}) is None
    bf16 = catalog.compressor({"name": "bf16"})
    assert "MPI cannot sum bf16" in (incompatibility("mpi", "local-sgd", bf16) or "")
    assert incompatibility("gloo", "local-sgd", bf16) is None


def test_display_names_say_h_the_outer_step_and_the_exchange() -> None:
    name = catalog.scheme({"name": "diloco", "H": 50}).display()
    assert name == "DiLoCo, H 50, outer lr 0.7, momentum 0.9 Nesterov"
    name = catalog.scheme({"name": "local-sgd", "H": 10, "exchange": "reduce-broadcast"}).display()
    assert name == "local SGD, H 10, via reduce-broadcast"
