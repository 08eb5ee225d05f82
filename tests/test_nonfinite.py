"""Non-finite gradients: one policy for every compressor and scheme (scenario key `nonfinite`).

The rules, from docs/failures.md#non-finite-gradients: a NaN or inf in a rank's gradient fails
the run with one line naming the iteration, the first tensor holding one (in the model's flat
order) and the rank, unless the scenario says `nonfinite: skip`; then every rank skips that
step (no update: parameters unchanged) and the records count it. A codec's ``encode`` given a
NaN or inf raises a ValueError naming it, instead of substituting a value (QSGD and 1bitSGD,
whose check would cost 2 % of an encode, carry it on instead, never a finite substitute). The
expected
messages are written out here from those rules, never produced by the code under test.
"""

from __future__ import annotations

import json
import math
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from qbench.compress import build, native
from qbench.errors import UserError
from qbench.records.schema import RunRecord, iterations_frame
from qbench.records.store import ResultStore
from qbench.report import stats
from qbench.run import nonfinite
from qbench.run.precision import LossScaler
from qbench.run.training import Training
from qbench.run.worker import Run
from qbench.spec import scenario
from qbench.spec.matrix import RunSpec, expand
from qbench.timing import PhaseTimer
from tests.threadcomm import run_ranks

NAN, INF = float("nan"), float("inf")
HINT = "set `nonfinite: skip` to skip such steps"
CODEC_RULE = (
    "the codecs take finite values only (qbench's run loop fails or skips such a step: "
    "scenario key `nonfinite`)"
)


def _spec(extra: str = "", world: int = 1, scheme: str = "auto", comp: str = "none") -> Any:
    text = (
        f"name: t\nmodel: mlp\nworld_size: {world}\nscheme: {scheme}\ncompressor: {comp}\n"
        f"warmup: 0\niterations: 5\nbatch_size: 4\n{extra}"
    )
    return expand(scenario.loads(text)).runs[0]


def _poison(
    run: Training, tensor: str, value: float, rank: int, at: set[int], index: int = 7
) -> None:
    """Test-only injection: backward pass k (0-based) on ``rank`` puts ``value`` into element
    ``index`` of ``tensor``'s gradient when k is in ``at``."""
    calls = [0]

    def hook(g: torch.Tensor) -> torch.Tensor:
        k, calls[0] = calls[0], calls[0] + 1
        if run.comm.rank != rank or k not in at:
            return g
        g = g.clone()
        g.view(-1)[index] = value
        return g

    run.named[tensor].register_hook(hook)


def _params(run: Training) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in run.named.values()]).clone()


def _train(run: Training, iterations: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each iteration's parameters before and after it."""
    timer, out = PhaseTimer(run.device), []
    for it in range(iterations):
        before = _params(run)
        run.iteration(it, timer)
        out.append((before, _params(run)))
    return out


_BUILDING = threading.Lock()


def _built(spec: Any, cm: Any) -> Run:
    """A rank's Run, built one rank at a time: the ranks are threads, and each seeds torch's
    one global generator to draw the same initial model."""
    with _BUILDING:
        return Run(spec, cm)


def _one_rank(spec: Any, make: Callable[[Any, Any], Training] = Run) -> Callable[..., Any]:
    def go(fn: Callable[[Training], Any]) -> Any:
        return run_ranks(1, lambda cm: fn(make(spec, cm)))[0]

    return go


# -- fail (the default): one line naming the iteration, the tensor and the rank ----------------
@pytest.mark.parametrize(
    ("value", "kind"), [(NAN, "NaN"), (INF, "inf"), (-INF, "inf")], ids=["nan", "inf", "-inf"]
)
@pytest.mark.parametrize("comp", ["none", "{name: qsgd, bits: 4}", "{name: fixedpoint, bits: 8}"])
def test_a_nan_or_inf_fails_the_run_naming_iteration_tensor_and_rank(
    value: float, kind: str, comp: str
) -> None:
    def go(run: Training) -> None:
        _poison(run, "2.weight", value, rank=0, at={2})
        _train(run, 5)

    with pytest.raises(nonfinite.NonFiniteGradient) as e:
        _one_rank(_spec(comp=comp))(go)
    assert str(e.value) == f"iteration 2: gradient of 2.weight has {kind} (rank 0); {HINT}"


@pytest.mark.parametrize(
    ("poisons", "named"),
    [([("4.weight", NAN, 7), ("0.bias", INF, 7)], "0.bias has inf"),  # flat order, not NaN first
     ([("2.bias", INF, 3), ("2.bias", NAN, 9), ("4.bias", NAN, 0)], "2.bias has NaN")],
)  # fmt: skip
def test_the_first_tensor_in_flat_order_is_named_and_nan_before_inf(
    poisons: list[tuple[str, float, int]], named: str
) -> None:
    def go(run: Training) -> None:
        for tensor, value, index in poisons:
            _poison(run, tensor, value, rank=0, at={1}, index=index)
        _train(run, 3)

    with pytest.raises(nonfinite.NonFiniteGradient) as e:
        _one_rank(_spec())(go)
    assert str(e.value) == f"iteration 1: gradient of {named} (rank 0); {HINT}"


# -- skip: every rank skips the same step, parameters unchanged, counted -------------------------
@pytest.mark.parametrize(
    ("scheme", "comp"),
    [("allreduce", "none"), ("reduce-broadcast", "{name: qsgd, bits: 4}"),
     ("reduce-broadcast", "{name: onebit}"), ("allgather", "{name: topk, ratio: 0.1}"),
     ("{name: gossip, algorithm: choco}", "{name: qsgd, bits: 4}"),
     ("push-sum", "{name: qsgd, bits: 4}")],
    ids=["allreduce-fp32", "rb-qsgd", "rb-onebit", "allgather-topk", "choco-qsgd", "push-sum"],
)  # fmt: skip
def test_skip_makes_every_rank_skip_the_step_and_keep_its_parameters(
    scheme: str, comp: str
) -> None:
    spec = _spec("nonfinite: skip\n", world=2, scheme=scheme, comp=comp)

    def rank(cm: Any) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], pd.DataFrame, int]:
        run = _built(spec, cm)
        _poison(run, "2.weight", NAN, rank=1, at={2})  # rank 1 only
        steps = _train(run, 5)
        return steps, run.frame(), run.guard.skipped

    results = run_ranks(2, rank)
    for steps, frame, skipped in results:
        assert list(frame["skipped"]) == [0.0, 0.0, 1.0, 0.0, 0.0]
        assert skipped == 1
        assert frame.loc[2, "payload_bytes"] == 0  # nothing encoded
        for it, (before, after) in enumerate(steps):
            assert torch.equal(before, after) == (it == 2), it
    if "gossip" not in scheme and scheme != "push-sum":  # decentralized: a model per rank
        assert torch.equal(results[0][0][-1][1], results[1][0][-1][1])


def test_skip_with_no_nonfinite_gradient_changes_nothing() -> None:
    """The same run under fail and skip: the same parameters, no step skipped."""

    def rank(extra: str) -> Callable[[Any], tuple[torch.Tensor, pd.DataFrame]]:
        def go(cm: Any) -> tuple[torch.Tensor, pd.DataFrame]:
            run = _built(_spec(extra, world=2), cm)
            _train(run, 3)
            return _params(run), run.frame()

        return go

    fail, skip = run_ranks(2, rank("")), run_ranks(2, rank("nonfinite: skip\n"))
    for (p_fail, f_fail), (p_skip, f_skip) in zip(fail, skip, strict=True):
        assert torch.equal(p_fail, p_skip)
        assert list(f_skip["skipped"]) == [0.0] * 3 == list(f_fail["skipped"])


# -- DDP: the bucket is checked inside the hook, before the hook it wraps sees it --------------
@pytest.fixture
def process_group(tmp_path: Path) -> Any:
    import torch.distributed as dist

    from qbench.comm.torchdist import TorchDistComm

    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    try:
        yield TorchDistComm.attach()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("comp", ["none", "{name: qsgd, bits: 4}"], ids=["torch-hook", "qsgd"])
def test_ddp_fails_or_skips_a_nonfinite_bucket(comp: str, process_group: Any) -> None:
    from qbench.run.ddp_loop import DDPRun

    run = DDPRun(_spec(scheme="ddp", comp=comp), process_group)
    _poison(run, "2.weight", INF, rank=0, at={1})
    with pytest.raises(nonfinite.NonFiniteGradient) as e:
        _train(run, 3)
    assert str(e.value) == f"iteration 1: gradient of 2.weight has inf (rank 0); {HINT}"
    run.close()

    run = DDPRun(_spec("nonfinite: skip\n", scheme="ddp", comp=comp), process_group)
    _poison(run, "2.weight", NAN, rank=0, at={1})
    steps = _train(run, 3)  # the qsgd codec raises if a NaN reaches it
    run.close()
    assert [torch.equal(b, a) for b, a in steps] == [False, True, False]
    assert list(run.frame()["skipped"]) == [0.0, 1.0, 0.0]
    assert all(bool(torch.isfinite(a).all()) for _, a in steps)


# -- async-ps: a worker drops its push; the server applies no update for it ---------------------
def test_an_async_worker_drops_a_nonfinite_gradient_and_the_run_goes_on() -> None:
    from qbench.run import async_ps
    from qbench.run.worker import async_parts
    from tests.test_async_ps import Threads
    from tests.test_async_ps import _spec as async_spec

    spec = async_spec(
        "{name: async-ps, staleness: 3, down: {name: qsgd, bits: 8}}",
        world=3, extra="iterations: 10\nnonfinite: skip\n",
    )  # fmt: skip
    boxes: list[queue.Queue[Any]] = [queue.Queue() for _ in range(3)]
    ranks = []
    for rank in range(3):
        t = Training(spec, Threads(rank, 3, boxes), shard=async_ps.shard(rank, 3))
        _poison(t, "weight", NAN, rank=2, at={3, 4})  # worker 2's 4th and 5th gradients
        ranks.append((t, async_parts(t)))
    errors: list[BaseException] = []

    def go(parts: Any) -> None:
        try:
            async_ps.run(parts)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(parts,)) for _, parts in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    frame = pd.concat([t.frame() for t, _ in ranks], ignore_index=True)
    server, workers = frame[frame["rank"] == 0], frame[frame["rank"] > 0]
    dropped = workers[workers["skipped"] == 1.0]
    assert list(zip(dropped["rank"], dropped["iteration"], strict=True)) == [(2, 3), (2, 4)]
    assert (dropped["payload_bytes"] == 0).all()
    assert list(server["server_version"]) == list(range(1, 21))  # 2 workers x 10: all applied
    assert len(workers) == 22 and (workers["skipped"] == 0.0).sum() == 20


def test_a_push_says_whether_it_was_skipped() -> None:
    from qbench.run.async_ps.protocol import Push

    p = Push(worker=1, version=5, loss=NAN, sizes=(0, 0), skipped=True)
    got = Push.from_tensor(p.to_tensor())
    assert (got.worker, got.version, got.sizes, got.skipped) == (1, 5, (0, 0), True)
    assert math.isnan(got.loss) and len(p.to_tensor()) == Push.header_len(2) == 6


# -- fp16's loss scaler first; the policy where halving cannot help ----------------------------
def test_fp16_overflow_is_the_scalers_until_the_smallest_scale() -> None:
    scaler = LossScaler(enabled=True)
    grad = torch.tensor([1.0, INF, 2.0])
    nonfinite.unscale(scaler, grad)  # scale 4096: an overflow the scaler absorbs
    assert grad.tolist() == [0.0, 0.0, 0.0] and scaler.scale == 2048.0
    scaler.scale = 1.0
    grad = torch.tensor([1.0, NAN, 2.0])
    nonfinite.unscale(scaler, grad)  # scale 1: left for the policy
    assert grad[0] == 1.0 and math.isnan(grad[1]) and grad[2] == 2.0
    plain = torch.tensor([NAN])
    nonfinite.unscale(LossScaler(enabled=False), plain)  # fp32: nothing happens
    assert math.isnan(plain[0])


# -- codecs called directly: a ValueError naming the value, never a substitute ------------------
CODECS = [
    ("fixedpoint", {"bits": 8}), ("fixedpoint", {"bits": 8, "delta": 0.01}),
    ("topk", {"ratio": 0.1}), ("topk", {"ratio": 0.1, "error_feedback": False}),
    ("adaptive", {}),
]  # fmt: skip


@pytest.fixture(params=["native", "torch"])
def backend(request: pytest.FixtureRequest) -> Any:
    """The compiled kernels and the torch reference (qsgd and onebit have both)."""
    if request.param == "native" and native.why_unavailable():
        pytest.skip(f"C kernels unavailable: {native.why_unavailable()}")
    with native.backend(request.param):
        yield request.param


@pytest.mark.parametrize(("name", "params"), CODECS, ids=lambda v: str(v))
@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_a_codec_refuses_a_nonfinite_value_naming_it(
    name: str, params: dict[str, Any], value: float
) -> None:
    c = build(name, **params)
    x = torch.linspace(-1.0, 1.0, 100)
    x[37] = value
    with pytest.raises(ValueError) as e:
        c.encode(x, name="g")
    assert str(e.value) == f"{name}: value 37 is {value}; {CODEC_RULE}"
    with pytest.raises(ValueError) as e:  # a piece of a per-tensor encode counts from offset
        c.encode(x[30:], offset=30, name="h")
    assert str(e.value) == f"{name}: value 37 is {value}; {CODEC_RULE}"


def test_topk_refuses_before_its_residual_changes() -> None:
    x = torch.linspace(-1.0, 1.0, 64)
    bad = x.clone()
    bad[3] = NAN
    topk = build("topk", ratio=0.1)
    topk.encode(x, name="g")
    kept = topk.state["g"].clone()
    with pytest.raises(ValueError):
        topk.encode(bad, name="g")
    assert torch.equal(topk.state["g"], kept)


@pytest.mark.parametrize(
    ("name", "params", "bucket"),
    [("qsgd", {"bits": 4, "bucket_size": 8}, slice(32, 40)),
     ("qsgd", {"bits": 4, "bucket_size": 8, "norm": "l2", "layout": "sign"}, slice(32, 40)),
     ("onebit", {"bucket_size": 16}, slice(32, 48))],
    ids=["qsgd-max", "qsgd-l2-sign", "onebit"],
)  # fmt: skip
@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_qsgd_and_onebit_carry_a_nonfinite_value_never_a_finite_substitute(
    name: str, params: dict[str, Any], bucket: slice, value: float, backend: str
) -> None:
    """Their check would cost 2 % of an encode (docs/failures.md): the API expects finite
    values and the run loop guarantees them; a NaN or inf given anyway makes the decoded value
    at its place non-finite (its bucket's scale or mean is), and the other buckets exact."""
    x = torch.linspace(-1.0, 1.0, 64)
    x[37] = value
    c = build(name, **params)
    got = c.decode(c.encode(x, name="g"))
    assert not bool(torch.isfinite(got[37]))
    outside = torch.ones(64, dtype=torch.bool)
    outside[bucket] = False
    assert bool(torch.isfinite(got[outside]).all())


def test_casts_and_none_carry_a_nonfinite_value_unchanged() -> None:
    """No substitution to refuse: the NaN or inf arrives where it was, the rest as sent."""
    x = torch.linspace(-1.0, 1.0, 10)
    x[4], x[6] = NAN, -INF
    for name in ("none", "fp16", "bf16"):
        c = build(name)
        got = c.decode(c.encode(x))
        assert math.isnan(got[4]) and got[6] == -INF, name
        assert bool(torch.isfinite(got[[0, 1, 2, 3, 5, 7, 8, 9]]).all()), name


def test_values_whose_sum_overflows_are_still_finite() -> None:
    """Two values of 3e38 sum to inf in float32; they are finite, so nothing is refused."""
    from qbench.compress.base import all_finite

    x = torch.full((1024,), 3e38)
    assert all_finite(x)
    build("topk", ratio=0.5).encode(x)
    build("fixedpoint", bits=8, delta=1e36).encode(x)


# -- the scenario key, the run id, the records and the report ------------------------------------
def test_the_key_is_fail_or_skip_and_the_default_keeps_run_ids() -> None:
    default, skip = _spec(), _spec("nonfinite: skip\n")
    assert (default.nonfinite, skip.nonfinite) == ("fail", "skip")
    assert _spec("nonfinite: fail\n").run_id == default.run_id
    assert skip.run_id != default.run_id
    # the id of a spec without the field, as every run before it was hashed
    without = {k: v for k, v in default.to_dict().items() if k != "nonfinite"}
    assert RunSpec.from_dict(without).run_id == default.run_id
    for bad, message in [
        ("ignore", "<embedded>: nonfinite 'ignore' is not one of fail, skip; e.g. "
         "`nonfinite: fail`"),
        ("1", "<embedded>: nonfinite must be str, got 1 (int)"),
    ]:  # fmt: skip
        with pytest.raises(UserError) as e:
            _spec(f"nonfinite: {bad}\n")
        assert str(e.value) in (message, message.removeprefix("<embedded>: "))


def _rows(run_id: str, ranks: int, skipped: list[float]) -> list[dict[str, Any]]:
    return [
        {"run_id": run_id, "rank": r, "iteration": i, "warmup": i < 1, "t_iteration": 0.1,
         "t_compute": 0.1, "bytes_sent": 4, "payload_bytes": 4, "grad_bytes": 4, "skipped": s}
        for r in range(ranks) for i, s in enumerate(skipped)
    ]  # fmt: skip


def test_the_summary_counts_skipped_steps_warmup_included(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    lab = {
        "model": "mlp", "dataset": "synthetic", "backend": "gloo", "network": "unshaped",
        "compressor": "fp32", "compressor_name": "none", "bits": 32.0, "world_size": 2,
        "batch_size": 4, "global_batch": 8, "simulated": False, "seed": 0, "repeat": 0,
    }  # fmt: skip
    runs = {
        "sync": ("allreduce", _rows("sync", 2, [1.0, 0.0, 1.0, 1.0, 0.0])),  # 3 steps, 2 ranks
        "async": ("async-ps", _rows("async", 1, [math.nan] * 3)  # the server: no such column
                  + [{**r, "rank": 1} for r in _rows("async", 1, [0.0, 1.0, 0.0])]
                  + [{**r, "rank": 2} for r in _rows("async", 1, [1.0, 1.0, 0.0])]),
        "old": ("allreduce", _rows("old", 2, [math.nan] * 3)),  # written before the column
    }  # fmt: skip
    for run_id, (scheme, rows) in runs.items():
        store.write_record(RunRecord(run_id, "ok", {**lab, "scheme": scheme}, {}))
        store.write_iterations(run_id, iterations_frame(rows))
    summary = stats.summarize(stats.load(tmp_path)).set_index("run_id")
    assert summary.loc["sync", "skipped_steps"] == 3
    assert summary.loc["async", "skipped_steps"] == 3  # 1 + 2 pushes dropped
    assert math.isnan(summary.loc["old", "skipped_steps"])


# -- end to end: two gloo ranks through the command line -------------------------------------------
FACTORY = '''
"""A small MLP whose ``tensor`` gradient gets ``value`` at backward passes ``at`` of ``rank``
(the RANK the launcher sets): a test-only NaN injection through a user's model factory."""
import os

import torch
from torch import nn


def build(rank=1, at=(3,), value="nan", tensor="2.weight"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    mine = int(os.environ.get("RANK", "-1")) == rank
    calls = [0]

    def poison(g):
        k, calls[0] = calls[0], calls[0] + 1
        if mine and k in at:
            g = g.clone()
            g.view(-1)[5] = float(value)
        return g

    dict(model.named_parameters())[tensor].register_hook(poison)
    return model
'''


def _sweep(tmp_path: Path, name: str, extra: str) -> Path:
    (tmp_path / "nanfactory.py").write_text(FACTORY)
    (tmp_path / f"{name}.yaml").write_text(
        f"name: {name}\nmodel: {{factory: 'nanfactory:build', params: {{rank: 1, at: [3]}}, "
        "input_shape: [8], num_classes: 3}\nworld_size: 2\nbackend: gloo\nwarmup: 1\n"
        f"iterations: 4\nbatch_size: 8\ntimeout: 240\n{extra}"
    )
    subprocess.run(
        [sys.executable, "-m", "qbench.cli", "sweep", f"{name}.yaml", "--out", name],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    return tmp_path / name


@pytest.mark.slow
def test_two_gloo_ranks_fail_or_skip_the_same_step_through_the_cli(tmp_path: Path) -> None:
    out = _sweep(tmp_path, "fail", "scheme: allreduce\n")
    (record,) = [json.loads(p.read_text()) for p in out.glob("*/run.json")]
    assert record["status"] == "failed"
    assert record["error"] == (
        "rank 1 of 2 exited with code 1: NonFiniteGradient: iteration 3: gradient of 2.weight "
        f"has NaN (rank 1); {HINT}"
    )
    out = _sweep(tmp_path, "skip", "scheme: [allreduce, ddp]\nnonfinite: skip\n")
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*/run.json"))]
    assert [r["status"] for r in records] == ["ok", "ok"]
    for run_dir in sorted(p.parent for p in out.glob("*/run.json")):
        frame = pd.read_parquet(run_dir / "iterations.parquet").sort_values(["rank", "iteration"])
        for rank in (0, 1):
            mine = frame[frame["rank"] == rank]
            assert list(mine["skipped"]) == [0.0, 0.0, 0.0, 1.0, 0.0], (run_dir.name, rank)
            if "allreduce" in run_dir.name:  # 8*16 + 16 + 16*3 + 3 values, 2 ranks' bus bytes
                # 2 (K-1)/K * 4 * 195 = 780 for the gradient, plus 4 for the ranks' one flag
                assert list(mine["bytes_sent"]) == [784] * 3 + [4, 784], rank
    summary = stats.summarize(stats.load(out))
    assert list(summary["skipped_steps"]) == [1, 1]
