"""Local SGD and DiLoCo (qbench.aggregate.diloco) on ranks that are threads, against hand-made
references: DDP step for step, parameter averaging, torch's own outer SGD, error feedback's
telescoping sum, and ranks agreeing on the global model. Each test names the bug it catches."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from qbench import aggregate, catalog
from qbench.aggregate.diloco import fragment_bounds
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
    world_size: int = K, momentum: float = 0.9, tensors: list[int] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Per rank: its parameters after every step, the bytes each step sent, the phases."""

    def fn(cm: LocalComm) -> dict[str, Any]:
        theta = THETA0.clone()
        codec = from_spec(comp or {"name": "none"})
        agg = aggregate.build(scheme, cm, codec, N, params=params, tensors=tensors)
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


# -- Streaming DiLoCo ----------------------------------------------------------------------------
TENSORS = [10, 5, 8, 14]  # 37 values: fragments of 2 are [0, 23) and [23, 37)
OUTER = {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}


def test_one_fragment_merged_at_once_is_diloco_bit_for_bit() -> None:
    streaming = {"H": 3, "fragments": 1, "delay": 0, "alpha": 0.0, **OUTER}
    got = _train("streaming-diloco", streaming, 9, tensors=TENSORS)
    want = _train("diloco", {"H": 3, **OUTER}, 9, tensors=TENSORS)
    for r in range(K):
        assert all(map(torch.equal, got[r]["theta"], want[r]["theta"]))


def test_each_fragment_syncs_every_h_steps_at_its_own_offset() -> None:
    """H 4, 2 fragments: the first after steps 4, 8, 12 (1-based), the second 2 steps later;
    fp32 deltas, so a step's bytes say which fragments went (23 and 14 values)."""
    params = {"H": 4, "fragments": 2, "delay": 1, "alpha": 0.5, **OUTER}
    got = _train("streaming-diloco", params, 13, tensors=TENSORS)
    first, second = 23, 14  # fragment sizes
    bus = 2 * (K - 1) / K * 4  # bytes a value costs in a ring allreduce (allreduce_bus_bytes)
    want = {4: first, 6: second, 8: first, 10: second, 12: first}
    for r in range(K):
        sent = {s + 1: round(b / bus) for s, b in enumerate(got[r]["bytes"]) if b}
        assert sent == want


def _streaming_reference(h: int, delay: int, alpha: float, steps: int) -> list[list[torch.Tensor]]:
    """The algorithm written out: per rank its parameters after each step (0-based steps)."""
    bounds = [(0, 23), (23, 37)]
    local = [THETA0.clone() for _ in range(K)]
    inner = [torch.optim.SGD([t], lr=0.05, momentum=0.9) for t in local]
    glob = THETA0.clone()
    outer = [torch.optim.SGD([p], **{"lr": 0.7, "momentum": 0.9, "nesterov": True})
             for p in (glob[a:b].clone() for a, b in bounds)]  # fmt: skip
    pending: dict[int, list[tuple[int, torch.Tensor]]] = {}
    out: list[list[torch.Tensor]] = [[] for _ in range(K)]
    for step in range(steps):
        for r in range(K):
            local[r].grad = _grad(r, local[r])
            inner[r].step()
        for f, (a, b) in enumerate(bounds):
            shifted = step + 1 - f * h // 2
            if shifted >= h and shifted % h == 0:
                (p,) = outer[f].param_groups[0]["params"]
                p.grad = torch.stack([p.detach() - t.detach()[a:b] for t in local]).mean(0)
                outer[f].step()
                pending.setdefault(step + delay, []).append((f, p.detach().clone()))
        for f, value in pending.pop(step, []):
            a, b = bounds[f]
            for t in local:
                t.data[a:b] = alpha * t.data[a:b] + (1 - alpha) * value
        for r in range(K):
            out[r].append(local[r].detach().clone())
    return out


@pytest.mark.parametrize(("delay", "alpha"), [(0, 0.0), (1, 0.5), (2, 0.25)])
def test_fragments_merge_delay_steps_later_with_alpha(delay: int, alpha: float) -> None:
    """Against the algorithm written out with torch's optimizers: fails when the merge lands at
    the exchange's step instead of `delay` later, when alpha weighs the global side, or when
    the fragments share one outer momentum buffer."""
    params = {"H": 4, "fragments": 2, "delay": delay, "alpha": alpha, **OUTER}
    got = _train("streaming-diloco", params, 14, tensors=TENSORS)
    want = _streaming_reference(4, delay, alpha, 14)
    for r in range(K):
        for step in range(14):
            torch.testing.assert_close(got[r]["theta"][step], want[r][step], atol=3e-6, rtol=0)


def test_fragments_are_runs_of_whole_tensors_cut_near_equal_sizes() -> None:
    assert fragment_bounds([10, 5, 8, 14], 2) == [(0, 23), (23, 37)]  # 23 first reaches 18.5
    assert fragment_bounds([10, 5, 8, 14], 4) == [(0, 10), (10, 15), (15, 23), (23, 37)]
    assert fragment_bounds([100, 1, 1], 3) == [(0, 100), (100, 101), (101, 102)]
    assert fragment_bounds([1, 1, 100], 2) == [(0, 2), (2, 102)]
    with pytest.raises(UserError, match=r"5 fragments, .* holds 4 tensor\(s\).* fragments <= 4"):
        fragment_bounds([10, 5, 8, 14], 5)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"H": 4, "delay": 4}, "delay 4 must be below H 4"),
        ({"fragments": 0}, "fragments must be an integer >= 1, got 0"),
        ({"alpha": 1.5}, "alpha must be a number in [0, 1], got 1.5"),
        ({"delay": -1}, "delay must be an integer >= 0, got -1"),
    ],
)
def test_streaming_refuses_bad_parameters_in_one_line(params: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError) as e:
        catalog.scheme({"name": "streaming-diloco", **params})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_codecs_that_cannot_carry_outer_gradients_are_refused_in_one_line() -> None:
    """torch's PowerSGD hook is no codec a scheme can call; integer-allreduce sums levels on
    shared scales, which 1bitSGD's signs are not."""
    powersgd = catalog.compressor({"name": "powersgd"})
    why = incompatibility("gloo", "diloco", powersgd) or ""
    assert why.startswith("powersgd is torch's DDP communication hook") and "\n" not in why
    onebit = catalog.compressor({"name": "onebit"})
    params = {"exchange": "integer-allreduce"}
    why = incompatibility("gloo", "streaming-diloco", onebit, params=params) or ""
    assert why.startswith("streaming-diloco exchanges through integer-allreduce, and ")
    assert "cannot sum onebit" in why
    qsgd = catalog.compressor({"name": "qsgd", "bits": 4})
    assert incompatibility("gloo", "local-sgd", qsgd, params=params) is None


@pytest.mark.parametrize(
    "comp",
    [
        {"name": "mx", "error_feedback": True},
        {"name": "fp8", "block_size": 128, "error_feedback": True},
    ],
)
def test_integer_allreduce_refuses_error_feedback_it_would_ignore(comp: dict[str, Any]) -> None:
    """Its kernels quantize on shared scales and keep no residual: an `-ef` label on a run that
    carried none would be wrong (found while building DiLoCo's exchanges)."""
    spec = catalog.compressor(comp)
    why = incompatibility("gloo", "integer-allreduce", spec) or ""
    assert "carries no residual" in why and "`error_feedback: false`" in why
    plain = catalog.compressor({**comp, "error_feedback": False})
    assert incompatibility("gloo", "integer-allreduce", plain) is None
    assert "carries no residual" in (
        incompatibility("gloo", "diloco", spec, params={"exchange": "integer-allreduce"}) or ""
    )


# -- data parallel inside a node, DiLoCo between nodes -------------------------------------------
def _train_nodes(
    monkeypatch: pytest.MonkeyPatch, params: dict[str, Any], steps: int, k: int = 4, g: int = 2
) -> list[dict[str, Any]]:
    """``_train`` on ThreadComm ranks in nodes of ``g`` (LOCAL_WORLD_SIZE), within_node on."""
    from tests.threadcomm import ThreadComm, run_ranks

    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(g))

    def fn(cm: ThreadComm) -> dict[str, Any]:
        theta = THETA0.clone()
        agg = aggregate.build(
            "diloco", cm, from_spec({"name": "none"}), N,
            params={**params, "within_node": "allreduce"},
        )  # fmt: skip
        agg.begin(theta)
        opt = torch.optim.SGD([theta], lr=0.05, momentum=0.9)
        timer = PhaseTimer(torch.device("cpu"))
        out: dict[str, Any] = {"theta": [], "payload": []}
        for step in range(steps):
            timer.start()
            theta.grad = agg.aggregate(_grad(cm.rank % K, theta), step, timer).clone()
            opt.step()
            agg.after_step(theta.data, step, timer)
            out["theta"].append(theta.detach().clone())
            out["payload"].append(agg.payload_bytes)
        return out

    return run_ranks(k, fn)


def test_within_node_allreduce_with_plain_outer_sgd_every_step_is_ddp_over_every_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two nodes of two ranks, H = 1, outer lr 1, no momentum: the mean over the nodes of each
    node's mean gradient is the mean over all four ranks, so every rank follows DDP over four
    (ranks 0-3 on problems 0, 1, 2, 0). Fails when the node mean or the leaders' hand-over to
    their node is left out."""
    params = {"H": 1, "outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}
    got = _train_nodes(monkeypatch, params, 6)
    theta = THETA0.clone()
    opt = torch.optim.SGD([theta], lr=0.05, momentum=0.9)
    for step in range(6):
        theta.grad = torch.stack([_grad(r % K, theta) for r in range(4)]).mean(0)
        opt.step()
        for r in range(4):
            torch.testing.assert_close(got[r]["theta"][step], theta.detach(), atol=2e-6, rtol=0)


def test_within_node_a_nodes_ranks_keep_one_model_and_only_leaders_exchange(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got = _train_nodes(monkeypatch, {"H": 3}, 9)
    for step in range(9):
        for a, b in ((0, 1), (2, 3)):  # the two nodes
            assert torch.equal(got[a]["theta"][step], got[b]["theta"][step]), step
        synced = all(torch.equal(got[0]["theta"][step], got[r]["theta"][step]) for r in (2, 3))
        assert synced == ((step + 1) % 3 == 0), step
    # the leaders sent the pseudo-gradient between nodes on the exchange steps, the others not
    assert [p > 0 for p in got[0]["payload"]] == [(s + 1) % 3 == 0 for s in range(9)]
    assert got[1]["payload"] == [0] * 9 and got[3]["payload"] == [0] * 9


def test_within_node_refuses_a_hierarchical_exchange() -> None:
    with pytest.raises(UserError, match="use a flat exchange"):
        catalog.scheme({"name": "diloco", "within_node": "allreduce", "exchange": "hierarchical"})


def test_the_schemes_hand_their_slice_and_fixed_outer_step_to_the_exchange() -> None:
    """The exchange works on the slice's offset (its draws) and tensors; local SGD's outer step
    is lr 1 without momentum, DiLoCo merges at once, and no rank is in a node by default."""
    (agg,) = on_threads(1, lambda cm: aggregate.build(
        "local-sgd", cm, from_spec({"name": "none"}), 37, offset=5, tensors=[10, 27],
        params={"H": 2}))  # fmt: skip
    (inner,) = agg.inners
    assert (inner.offset, inner.tensors, inner.numel) == (5, (10, 27), 37)
    assert (agg.outer_lr, agg.outer_momentum, agg.nesterov, agg.alpha, agg.delay) == (
        1.0, 0.0, False, 0.0, 0)  # fmt: skip
    assert agg.node is None and agg.leads
    (dl,) = on_threads(1, lambda cm: aggregate.build(
        "diloco", cm, from_spec({"name": "none"}), 37, offset=5, tensors=[10, 27]))  # fmt: skip
    assert (dl.inners[0].offset, dl.inners[0].tensors, dl.alpha, dl.node) == (
        5,
        (10, 27),
        0.0,
        None,
    )
