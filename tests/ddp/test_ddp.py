"""DDP runs: torch's hooks and qbench's as DDP communication hooks (``qbench.ddp``).

The slow tests run every case of tests/dist_ddp_prog.py in ONE launch of two gloo ranks and
check: DDP's fp32 gradient equals the exact mean of the ranks' local gradients; each qbench hook
is unbiased on a known bucket (z-test over the steps' keys) and puts the flat scheme's bytes on
the wire for that bucket; training through each hook ends where the flat scheme with the same
compressor ends. The fast tests cover the overlap arithmetic, the planner's spelling and
exclusions, and user errors.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import qbench.ddp
from qbench.catalog.schemes import spelling
from qbench.ddp.scheme_hook import segments
from qbench.ddp.timeline import BucketTimeline, overlap_fraction, union_length
from qbench.errors import UserError
from qbench.spec import matrix, scenario
from tests import invoke
from tests.dist_ddp_prog import NUMEL, STEPS, TRAIN, UNBIASED, known_gradient
from tests.distributed import here, launch


# -- overlap arithmetic -------------------------------------------------------------------------
def test_union_length_counts_overlaps_once() -> None:
    assert union_length([]) == 0.0
    assert union_length([(0.0, 1.0), (2.0, 3.0)]) == 2.0
    assert union_length([(0.0, 2.0), (1.0, 3.0)]) == 3.0  # 0..3
    assert union_length([(1.0, 3.0), (0.0, 4.0), (5.0, 5.5)]) == 4.5  # nested, then apart


def test_overlap_fraction_is_the_hidden_share() -> None:
    assert overlap_fraction(exposed=0.25, total=1.0) == 0.75
    assert overlap_fraction(exposed=1.0, total=1.0) == 0.0
    assert overlap_fraction(exposed=2.0, total=1.0) == 0.0  # exposed includes DDP's own tail
    assert math.isnan(overlap_fraction(exposed=0.0, total=0.0))


def test_timeline_measures_from_hand_over_to_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([1.0, 1.5, 2.0, 4.0])
    monkeypatch.setattr("qbench.ddp.timeline.time.perf_counter", lambda: next(clock))
    t = BucketTimeline()
    t.hand_over(0)  # 1.0
    t.hand_over(1)  # 1.5
    t.done(0)  # 2.0
    t.done(1)  # 4.0
    assert t.last_hand_over() == 1.5
    assert t.comm_total() == 3.0  # [1, 2] and [1.5, 4] cover 1..4


# -- segments of a bucket ----------------------------------------------------------------------
def test_segments_group_a_buckets_tensors_by_compressor() -> None:
    q, f = {"name": "qsgd", "bits": 4}, {"name": "none"}
    params = [torch.zeros(5), torch.zeros(2), torch.zeros(7), torch.zeros(3)]
    specs = {id(params[0]): q, id(params[1]): f, id(params[2]): q, id(params[3]): f}
    segs = segments(params, lambda p: specs[id(p)])
    assert [(s.spec, s.ranges) for s in segs] == [
        (q, ((0, 5), (7, 14))),  # weights of two layers, with a bias between them
        (f, ((5, 7), (14, 17))),
    ]
    buffer = torch.arange(17.0)
    gathered = segs[0].gather(buffer)
    assert gathered.tolist() == [0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13]
    segs[0].scatter(-gathered, buffer)
    assert buffer.tolist() == [0, -1, -2, -3, -4, 5, 6, -7, -8, -9, -10, -11, -12, -13, 14, 15, 16]


# -- the planner: one spelling per configuration, exclusions with reasons ------------------------
def _expand(text: str) -> matrix.Matrix:
    return matrix.expand(scenario.loads("name: t\nmodel: mlp\nworld_size: 2\n" + text))


def test_ddp_with_a_qbench_compressor_is_reduce_broadcast_per_bucket() -> None:
    m = _expand(
        "scheme: [ddp, {name: reduce-broadcast, backward: true}]\n"
        "compressor: [none, fp16, {name: qsgd, bits: 4}, {name: powersgd, rank: 2}]\n"
    )
    labels = sorted((r.method.scheme_label, r.compressor_label) for r in m.runs)
    assert labels == [
        ("ddp", "fp16"), ("ddp", "fp32"), ("ddp", "powersgd-r2"),
        ("reduce-broadcast+backward", "fp16"), ("reduce-broadcast+backward", "fp32"),
        ("reduce-broadcast+backward", "qsgd-4b-b512"),  # ddp + qsgd: the same run, once
    ]  # fmt: skip
    assert {r.labels()["overlap"] for r in m.runs} == {"backward"}
    assert [e.reason for e in m.excluded if "powersgd" in e.description] == [
        "powersgd is torch's DDP communication hook, not a codec the reduce-broadcast scheme "
        "can call; use `scheme: ddp`"
    ]


def test_allreduce_per_bucket_is_ddp_and_flat_runs_are_labelled_none() -> None:
    m = _expand("scheme: [allreduce, {name: allreduce, backward: true, bucket_cap_mb: 5}]\n")
    got = {
        (r.method.scheme.name, tuple(r.method.scheme_params.items()), r.labels()["overlap"])
        for r in m.runs
    }
    assert got == {("allreduce", (), "none"), ("ddp", (("bucket_cap_mb", 5),), "backward")}


def test_powersgd_alone_resolves_to_ddp() -> None:
    m = _expand("compressor: [{name: powersgd}]\n")
    assert [r.method.scheme.name for r in m.runs] == ["ddp"]


def test_ddp_on_mpi_is_excluded_with_the_reason() -> None:
    m = _expand("backend: [gloo, mpi]\nscheme: [ddp]\n")
    assert [r.placement.backend for r in m.runs] == ["gloo"]
    assert "torch's MPI backend is not built, so mpi has no DDP" in m.excluded[0].reason


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("scheme: [{name: ddp, bucket_cap_mb: -1}]", "bucket_cap_mb must be a size in MB > 0"),
        ("scheme: [{name: ddp, exchange: x}]", "scheme ddp: unknown parameter 'exchange'"),
        ("scheme: [{name: gossip, backward: true}]", "gossip: unknown parameter 'backward'"),
        ("scheme: [{name: allgather, backward: 1}]", "backward must be true or false"),
        ("scheme: [{name: allgather, bucket_cap_mb: 4}]", "need `backward: true`"),
        ("compressor: [{name: powersgd, rank: 0}]", "rank must be an integer >= 1"),
        ("compressor: [{name: powersgd, start_iter: 1}]", "start_iter must be an integer >= 2"),
    ],
)
def test_bad_ddp_input_is_one_line(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("[", r"\[")):
        _expand(text + "\n")


def test_cli_refuses_ddp_on_mpi_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: t\nmodel: mlp\nworld_size: 2\nbackend: mpi\nscheme: ddp\n")
    proc = invoke.run(
        [sys.executable, "-m", "qbench.cli", "sweep", str(path), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "no runnable combination" in proc.stderr


def test_comm_hook_names_a_bad_parameter_and_a_bad_exchange() -> None:
    fake: Any = SimpleNamespace(backend="gloo", rank=0, world_size=2, bytes_sent=0)
    with pytest.raises(UserError, match="qsgd: unknown parameter 'bitz'"):
        qbench.ddp.comm_hook("qsgd", comm=fake, bitz=4)
    with pytest.raises(UserError, match="exchange 'gossip' is not a per-bucket exchange"):
        qbench.ddp.comm_hook("qsgd", comm=fake, exchange="gossip")
    with pytest.raises(UserError, match="integer-allreduce sums codes on shared scales"):
        qbench.ddp.comm_hook("onebit", comm=fake, exchange="integer-allreduce")


def test_one_spelling_per_ddp_configuration() -> None:
    assert spelling.canonical("ddp", {}, "onebit") == ("reduce-broadcast", {"backward": True})
    assert spelling.canonical("ddp", {}, "fp16") == ("ddp", {})
    assert spelling.canonical("allreduce", {"backward": True}, "none") == ("ddp", {})
    assert spelling.canonical("allgather", {"backward": False}, "qsgd") == ("allgather", {})
    assert spelling.overlap("allgather", {"backward": True}) == "backward"
    assert spelling.overlap("allgather", {}) == "none"


# -- two GPU ranks (nccl): written for a GPU machine; skips here with the reason -------------------
_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(_GPUS < 2, reason=f"needs 2 CUDA GPUs for nccl DDP, found {_GPUS}")
def test_hooks_on_nccl_give_the_exact_mean_and_train(tmp_path: Path) -> None:
    launch("nccl", 2, [here("dist_ddp_prog.py"), str(tmp_path), "nccl"], timeout=600)
    got = [torch.load(tmp_path / f"rank-{r}.pt") for r in range(2)]
    exact = (got[0]["mean"]["local"] + got[1]["mean"]["local"]) / 2
    torch.testing.assert_close(got[0]["mean"]["ddp"], exact, rtol=0, atol=1e-5)
    for case in UNBIASED:
        assert torch.equal(
            got[0][f"unbiased/{case}"]["results"], got[1][f"unbiased/{case}"]["results"]
        )
    for case in TRAIN:
        losses = got[0][f"train/{case}"]
        assert losses["hook"] == pytest.approx(
            losses["flat"], rel=0.25 if "powersgd" in case else 0.02
        )


# -- two gloo ranks -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ddp")
    launch("gloo", 2, [here("dist_ddp_prog.py"), str(out)], timeout=300)
    return [torch.load(out / f"rank-{r}.pt") for r in range(2)]


Ranks = list[dict[str, Any]]


@pytest.mark.slow
def test_ddp_fp32_is_the_exact_mean_over_several_buckets(ranks: Ranks) -> None:
    exact = (ranks[0]["mean"]["local"] + ranks[1]["mean"]["local"]) / 2
    assert ranks[0]["mean"]["buckets"] >= 2
    for r in ranks:
        torch.testing.assert_close(r["mean"]["ddp"], exact, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_powersgd_over_many_buckets_keeps_the_ranks_in_step(ranks: Ranks) -> None:
    # Finishing at all is the first check (torch's hook alone hangs gloo here); then every rank
    # applied the same compressed mean each step, so the parameters agree bit for bit.
    assert ranks[0]["powersgd"]["buckets"] >= 6
    assert torch.equal(ranks[0]["powersgd"]["params"], ranks[1]["powersgd"]["params"])


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(UNBIASED))
def test_qbench_hook_is_unbiased_with_the_flat_schemes_bytes(ranks: Ranks, case: str) -> None:
    got = [r[f"unbiased/{case}"] for r in ranks]
    assert torch.equal(got[0]["results"], got[1]["results"])  # every rank applies the same mean
    samples = got[0]["results"].double()
    exact = ((known_gradient(0) + known_gradient(1)) / 2).double()
    sd = samples.std(0)
    z = (samples.mean(0) - exact)[sd > 0] / (sd[sd > 0] / math.sqrt(STEPS))
    assert z.numel() > NUMEL // 2
    assert z.pow(2).mean().sqrt() < 1.3  # about 1 when unbiased
    for g in got:
        assert set(g["payload_bytes"]) == {g["flat_payload_bytes"]}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(TRAIN))
def test_training_through_the_hook_ends_where_the_flat_scheme_does(ranks: Ranks, case: str) -> None:
    losses = ranks[0][f"train/{case}"]
    start = 1.0  # the loss at w = 0 is about E|y|^2 / 8 = 32 / 8 = 4: both fell far below it
    assert losses["hook"] < start and losses["flat"] < start
    tolerance = 0.25 if case == "torch-powersgd" else 0.02  # powersgd against fp32
    assert losses["hook"] == pytest.approx(losses["flat"], rel=tolerance)


def _sweep(tmp_path: Path, text: str) -> Callable[[], Any]:
    from qbench.report import stats

    path = tmp_path / "s.yaml"
    path.write_text(text)
    invoke.run(
        [sys.executable, "-m", "qbench.cli", "sweep", str(path), "--out", str(tmp_path / "o")],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return lambda: stats.load(tmp_path / "o")


@pytest.mark.slow
def test_a_sweep_records_overlapped_iterations(tmp_path: Path) -> None:
    results = _sweep(
        tmp_path,
        "name: t\nmodel: cnn\nworld_size: 2\nwarmup: 1\niterations: 3\n"
        "scheme: [ddp, {name: reduce-broadcast, backward: true, bucket_cap_mb: 0.5}]\n"
        "compressor: [none, {name: qsgd, bits: 4}]\n",
    )()
    assert sorted(results.runs["status"]) == ["ok"] * 4  # ddp+qsgd is reduce-broadcast per bucket
    assert set(results.runs["overlap"]) == {"backward"}
    it = results.iterations[~results.iterations["warmup"]]
    assert it[["t_forward", "t_compute", "t_comm", "t_comm_total", "t_step"]].notna().all().all()
    assert it["t_encode"].isna().all()  # the codec runs interleaved with backward
    parts = it["t_compute"] + it["t_comm"] + it["t_step"]
    assert (parts <= it["t_iteration"] * 1.001).all()
    assert ((it["overlap_fraction"] >= 0) & (it["overlap_fraction"] <= 1)).all()
