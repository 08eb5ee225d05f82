"""The hierarchical scheme: its parameters and label (planner), and on 4 ranks grouped into
2 nodes x 2, 1 x 4 and 4 x 1 (LOCAL_WORLD_SIZE): the exact mean without compression, QSGD's
mean unbiased, and the bytes sent on each level as the sizes say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
