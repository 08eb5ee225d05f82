"""The hierarchical scheme: its parameters and label (planner), and on 4 ranks grouped into
2 nodes x 2, 1 x 4 and 4 x 1 (LOCAL_WORLD_SIZE): the exact mean without compression, QSGD's
mean unbiased, and the bytes sent on each level as the sizes say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from qbench import catalog
from qbench.comm.env import ranks_per_node
from qbench.errors import UserError
from tests.dist_prog import int_gradient
from tests.distributed import here, launch

NUMEL = 1001  # odd: uneven parts inside and between nodes
STEPS = 2
QSGD_STEPS = 150
WORLD = 4
INTERS = ("reduce-scatter", "reduce-broadcast", "allgather")
QSGD = {"name": "qsgd", "bits": 2, "bucket_size": 128}


# -- planner ------------------------------------------------------------------------------------
def test_params_default_and_label_round_trip() -> None:
    spec = catalog.scheme("hierarchical")
    assert (spec.params["intra"], spec.params["inter"]) == ("none", "reduce-scatter")
    given = {"intra": "bf16", "inter": "allgather"}
    label = catalog.scheme_label("hierarchical", given)
    assert label == "hierarchical+interallgather+intrabf16"
    assert catalog.scheme_from_label(label).given == {"name": "hierarchical", **given}
    assert catalog.scheme_label("hierarchical", {}) == "hierarchical"  # defaults left out


@pytest.mark.parametrize(
    ("bad", "named"),
    [({"intra": "qsgd"}, "'qsgd'"), ({"intra": 8}, "8 (int)"), ({"inter": "ring"}, "'ring'")],
)
def test_bad_params_are_one_line_user_errors(bad: dict, named: str) -> None:
    with pytest.raises(UserError) as e:
        catalog.scheme({"name": "hierarchical", **bad})
    text = str(e.value)
    assert "\n" not in text and named in text and "e.g." in text
    assert ("none, fp16, bf16" if "intra" in bad else "reduce-scatter") in text


@pytest.mark.parametrize("value", ["3", "0", "two"])
def test_ranks_per_node_must_divide_world(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", value)
    with pytest.raises(UserError, match=f"LOCAL_WORLD_SIZE={value} must .* divides"):
        ranks_per_node(4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert ranks_per_node(4) == 2
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert ranks_per_node(4) == 4


# -- 2 nodes x 2 ranks in one process (tests/threadcomm.py) --------------------------------------
# Issue 44 item 9: against fp64 numpy references, on values that bf16 cannot hold, and with
# stochastic draws; each test fails on a bug the integer-valued launches above let through.
def _threads(
    monkeypatch: pytest.MonkeyPatch, comp: object, grads: list[torch.Tensor], steps: int = 1,
    **params: str,
) -> list[list[torch.Tensor]]:  # fmt: skip
    """Every rank's result at each step, 2 nodes of 2 ranks, rank r aggregating grads[r]."""
    from qbench import aggregate
    from qbench.compress import from_spec
    from qbench.timing import PhaseTimer
    from tests.threadcomm import ThreadComm, run_ranks

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    n = grads[0].numel()

    def rank_main(comm: ThreadComm) -> list[torch.Tensor]:
        agg = aggregate.build("hierarchical", comm, from_spec(comp, seed=9), n, params=params)
        timer = PhaseTimer(torch.device("cpu"))
        timer.start()
        return [agg.aggregate(grads[comm.rank].clone(), t, timer).clone() for t in range(steps)]

    return run_ranks(WORLD, rank_main)


def _grads(n: int) -> list[torch.Tensor]:
    """Values that bf16 rounds (24-bit mantissas), of other magnitudes on every rank."""
    return [torch.randn(n, generator=torch.Generator().manual_seed(40 + r)) * (1 + r) / 3
            for r in range(WORLD)]  # fmt: skip


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (round to nearest, ties to even) -> float64, by the bits."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def test_the_fp32_mean_matches_an_fp64_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    grads = _grads(NUMEL)
    out = _threads(monkeypatch, "none", grads)
    xs = np.stack([g.numpy().astype(np.float64) for g in grads])
    # two fp32 additions of two terms (inside, then between nodes), halvings exact: each
    # rounding at most 2^-24 of its sum, every sum at most the mean of |x| times K
    bound = 2 * WORLD * 2.0**-24 * np.abs(xs).mean(0)
    for r in out:
        assert np.all(np.abs(r[0].numpy() - xs.mean(0)) <= bound)


def test_a_bf16_node_sum_rounds_every_part_once_and_all_ranks_agree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """intra bf16: every rank's values go to their owner as bf16 and the node's mean comes back
    as bf16, owner included: every rank ends with bf16(mean of bf16(x)), bit for bit the same."""
    grads = _grads(NUMEL)
    out = _threads(monkeypatch, "none", grads, intra="bf16")
    mean = np.stack([_bf16(g.numpy()) for g in grads]).mean(0)  # exact in fp64
    want = _bf16(mean)
    # fp32 sums of the bf16 inputs are exact but for rare far-apart exponents: where the mean
    # is within fp32 rounding of a bf16 tie, either neighbour is right
    step = np.abs(want) * 2.0**-7
    near = np.abs(np.abs(mean - want) - step / 2) <= np.abs(mean) * 2.0**-22
    for r in out:
        got = r[0].numpy().astype(np.float64)
        assert np.array_equal(got[~near], want[~near])
        assert np.all(np.abs(got - mean) <= step)
    for r in out[1:]:
        assert torch.equal(r[0], out[0][0])


def test_every_lane_draws_its_own_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both halves of every gradient alike: lane 0 carries the first between nodes, lane 1 the
    second. Lanes keyed by their global offsets round them differently; lanes reusing lane
    0's draws would send the same codes twice, correlating the rounding errors of values n/G
    apart."""
    half = 512  # lanes are whole buckets (QSGD's 128 values): 2 lanes of 512
    grads = [torch.cat([g[:half], g[:half]]) for g in _grads(half)]
    out = _threads(monkeypatch, QSGD, grads)
    for r in out:
        assert not torch.equal(r[0][:half], r[0][half:])
        assert torch.equal(r[0], out[0][0])


def test_stochastic_rounding_between_nodes_is_unbiased_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """QSGD 2-bit between nodes (|x| <= 1 here, so one level delta <= 1): the node means are
    rounded to a level, then the owner's mean again, so each step's error is within 2 delta.
    Two independent unbiased draws of variance <= delta^2 / 4 each: the mean error over S
    steps has a mean square <= delta^2 / (2 S) per value; a rounding to nearest would keep a
    mean square near delta^2 / 12 however many steps, and a biased draw a part of it."""
    steps, n = 100, 64
    grads = [g[:n].clamp(-1, 1) for g in _grads(n)]
    out = _threads(monkeypatch, QSGD, grads, steps=steps)
    exact = np.stack([g.numpy().astype(np.float64) for g in grads]).mean(0)
    errs = np.stack([t.numpy() for t in out[0]]) - exact
    assert np.abs(errs).max() <= 2 + 1e-6 and np.abs(errs).max() > 0
    assert float((errs.mean(0) ** 2).mean()) < 1.5 / (2 * steps)


# -- 4 ranks ------------------------------------------------------------------------------------
def _case(g: int, comp: dict, **params: str) -> dict:
    steps = QSGD_STEPS if comp["name"] == "qsgd" else STEPS
    return {"scheme": "hierarchical", "compressor": comp, "params": params, "ints": True,
            "local_world_size": g, "steps": steps}  # fmt: skip


CASES = {
    **{f"fp32-{g}-{i}": _case(g, {"name": "none"}, inter=i) for g in (2, 4, 1) for i in INTERS},
    "bf16-2-reduce-scatter": _case(2, {"name": "none"}, intra="bf16"),
    **{f"qsgd-2-{i}": _case(2, QSGD, inter=i) for i in INTERS},
}


@pytest.fixture(scope="module", params=["gloo", "mpi"])
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every case on one launch of 4 ranks per backend: each rank's saved results."""
    tmp = tmp_path_factory.mktemp(f"hier-{request.param}")
    argv = [here("dist_prog.py"), request.param, json.dumps(CASES), str(NUMEL), str(STEPS),
            str(tmp)]  # fmt: skip
    launch(request.param, WORLD, argv, timeout=300)
    return {n: [torch.load(tmp / n / f"rank-{r}.pt") for r in range(WORLD)] for n in CASES}


def _exact(step: int) -> torch.Tensor:
    return torch.stack([int_gradient(r, step, NUMEL) for r in range(WORLD)]).sum(0) / WORLD


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("qsgd")])
def test_mean_is_exact_without_compression(ranks: dict, name: str) -> None:
    for step in range(STEPS):
        for r in ranks[name]:
            assert torch.equal(r["results"][step], _exact(step)), (name, step)


@pytest.mark.slow
@pytest.mark.parametrize("inter", INTERS)
def test_qsgd_mean_is_unbiased(ranks: dict, inter: str) -> None:
    """Integers in [-8, 8]: every bucket scale is at most 8, so one 2-bit QSGD draw (3 intervals
    of [-s, s], stochastic rounding) has variance <= delta^2 / 4 per value, delta = 16 / 3
    (seed 002 section 2.3; QSGD, Alistarh et al., Lemma 3.1). reduce-scatter and
    reduce-broadcast draw twice (each node's part, then the owner's mean): <= delta^2 / 2;
    allgather once. The error averaged over S steps of independent draws has variance <= that
    / S per value if the mean is unbiased; a bias (e.g. rounding to nearest, delta^2 / 12 per
    value) would not shrink with S. Sharper, for a bias shared by all values: the error's
    projection on the exact mean (a scale bias) and its plain mean (an offset) each have
    standard deviation <= sqrt(var / sum of weights^2); both must stay within 5 of them."""
    out = ranks[f"qsgd-2-{inter}"]
    steps = len(out[0]["results"])
    errs = [out[0]["results"][t] - _exact(t) for t in range(steps)]
    var = (16 / 3) ** 2 / 2  # delta^2 / 2 per value and draw, delta = 16 / 3
    avg = sum(errs) / steps
    assert float((avg**2).mean()) < 1.5 * var / steps
    exact_sq = sum(float((_exact(t) ** 2).sum()) for t in range(steps))
    scale = sum(float((e * _exact(t)).sum()) for t, e in enumerate(errs)) / exact_sq
    assert abs(scale) < 5 * (var / exact_sq) ** 0.5
    assert abs(float(avg.mean())) < 5 * (var / (steps * NUMEL)) ** 0.5
    assert not torch.equal(out[0]["results"][0], _exact(0))  # it did quantize
    for r in out[1:]:  # every rank the same vector
        assert all(torch.equal(a, b) for a, b in zip(r["results"], out[0]["results"], strict=True))


def _bounds(n: int, parts: int) -> list[int]:
    """Part lengths of n values split evenly (the first parts shorter by at most one)."""
    return [n * (i + 1) // parts - n * i // parts for i in range(parts)]


def _expected_bytes(rank: int, g: int, inter: str, intra_bytes: int = 4) -> tuple[int, int]:
    """(intra, inter) bytes rank sends per step with compressor none, from the sizes alone."""
    nodes, local, node = WORLD // g, rank % g, rank // g
    if inter == "reduce-scatter":
        own = _bounds(NUMEL, g)[local]
        # to the other owners (phase 1), own part to the G-1 others (phase 3)
        intra = intra_bytes * (NUMEL - own) + intra_bytes * own * (g - 1) if g > 1 else 0
        piece = _bounds(own, nodes)[node]  # reduce-broadcast of the part between nodes
        between = 4 * (own - piece) + 4 * piece * (nodes - 1) if nodes > 1 else 0
        return intra, between
    leader = local == 0
    intra = 4 * NUMEL * (g - 1) if leader else 4 * NUMEL
    if not leader or nodes == 1:
        return intra, 0
    piece = _bounds(NUMEL, nodes)[node]
    if inter == "allgather":
        return intra, 4 * NUMEL * (nodes - 1)
    return intra, 4 * (NUMEL - piece) + 4 * piece * (nodes - 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("qsgd")])
def test_bytes_per_level(ranks: dict, name: str) -> None:
    _, g, inter = name.split("-", 2)
    intra_bytes = 2 if name.startswith("bf16") else 4
    for rank, r in enumerate(ranks[name]):
        want = _expected_bytes(rank, int(g), inter, intra_bytes)
        for m in r["metrics"]:
            assert (m["bytes_intra"], m["bytes_inter"]) == want, (name, rank)
        assert r["bytes_sent"] == STEPS * sum(want)  # the run's total counts both levels


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("qsgd")])
def test_payload_averages_to_the_whole_encoded_gradient(ranks: dict, name: str) -> None:
    """Reports divide the gradient's bytes by the mean payload over ranks (compression ratio,
    bits per value): whether a rank encodes 1/G of its node's gradient or all or none of it,
    that mean is the whole gradient as the compressor encodes it, 4 bytes a value in fp32."""
    assert sum(r["payload_bytes"] for r in ranks[name]) / WORLD == 4 * NUMEL, name


SWEEP = """name: hier
model: mlp
world_size: 2
backend: gloo
iterations: 2
warmup: 1
scheme:
  - {name: hierarchical, intra: bf16}
  - {name: hierarchical, inter: allgather, backward: true}
  - allreduce
compressor: none
"""


@pytest.mark.slow
def test_run_loops_record_bytes_per_level(tmp_path: Path) -> None:
    """The flat loop and the DDP hook loop write bytes_intra + bytes_inter = bytes_sent (one
    node of 2 here: all of it inside); other schemes leave them NaN (not split)."""
    (tmp_path / "s.yaml").write_text(SWEEP)
    cli = "from qbench.cli import main; main()"
    cmd = [sys.executable, "-c", cli, "sweep", str(tmp_path / "s.yaml"), "--out",
           str(tmp_path / "res")]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    frames = {p.parent.name: pd.read_parquet(p) for p in (tmp_path / "res").glob("*/*.parquet")}
    frames = {k: v for k, v in frames.items() if "bytes_sent" in v}
    assert len(frames) == 3
    for run, d in frames.items():
        if "hierarchical" in run:
            assert (d["bytes_intra"] + d["bytes_inter"] == d["bytes_sent"]).all(), run
            assert (d["bytes_intra"] > 0).all(), run
        else:
            assert d["bytes_intra"].isna().all() and d["bytes_inter"].isna().all(), run
