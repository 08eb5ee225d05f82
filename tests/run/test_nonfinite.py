"""Non-finite gradients: one policy for every compressor and scheme (scenario key `nonfinite`).

The rules, from docs/failures.md#non-finite-gradients: a NaN or inf in a rank's gradient fails
the run with one line naming the iteration, the first tensor holding one (in the model's flat
order) and the rank, unless the scenario says `nonfinite: skip`; then every rank skips that
step (no update: parameters unchanged) and the records count it. Codecs called directly:
tests/compress/test_nonfinite_codecs.py; the summary's count of skipped steps:
tests/report/test_skipped_steps.py. The expected messages are written out here from those rules,
never produced by the code under test.
"""

from __future__ import annotations

import json
import math
import queue
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from qbench.errors import UserError
from qbench.report import stats
from qbench.run import nonfinite
from qbench.run.loops.flat import Run
from qbench.run.loops.training import Training
from qbench.run.precision import LossScaler
from qbench.spec import scenario
from qbench.spec.matrix import expand
from qbench.spec.runspec import RunSpec
from qbench.timing import PhaseTimer
from tests import invoke
from tests.threadcomm import run_ranks

NAN, INF = float("nan"), float("inf")
HINT = "set `nonfinite: skip` to skip such steps"


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
@pytest.mark.parametrize("comp", ["none", "{name: qsgd, bits: 4}"], ids=["torch-hook", "qsgd"])
def test_ddp_fails_or_skips_a_nonfinite_bucket(comp: str, process_group: Any) -> None:
    from qbench.run.loops.ddp import DDPRun

    run = DDPRun(_spec(scheme="ddp", comp=comp), process_group)
    _poison(run, "2.weight", INF, rank=0, at={1})
    with pytest.raises(nonfinite.NonFiniteGradient) as e:
        _train(run, 3)
    assert str(e.value) == f"iteration 1: gradient of 2.weight has inf (rank 0); {HINT}"
    run.close()

    run = DDPRun(_spec("nonfinite: skip\n", scheme="ddp", comp=comp), process_group)
    _poison(run, "2.weight", NAN, rank=0, at={1})
    handed = _handed_on(run)
    steps = _train(run, 3)
    run.close()
    assert [torch.equal(b, a) for b, a in steps] == [False, True, False]
    assert list(run.frame()["skipped"]) == [0.0, 1.0, 0.0]
    assert all(bool(torch.isfinite(a).all()) for _, a in steps)
    # what the wrapped hook (torch's or QSGD's) was handed: zeros in the NaN's step, never a
    # NaN (QSGD would carry one through: tests/compress/test_nonfinite_codecs.py), real values else
    assert len(handed) == 3
    assert [bool(torch.isfinite(b).all()) for b in handed] == [True] * 3
    assert not handed[1].any() and handed[0].any() and handed[2].any()


def _handed_on(run: Any) -> list[torch.Tensor]:
    """Each step's buckets (concatenated) as the hook that the finite hook wraps saw them."""
    steps: list[torch.Tensor] = []
    pending: list[torch.Tensor] = []
    inner = run.finite.hook

    def spy(state: Any, bucket: Any) -> Any:
        pending.append(bucket.buffer().clone())
        if bucket.is_last():
            steps.append(torch.cat(pending))
            pending.clear()
        return inner(state, bucket)

    run.finite.hook = spy
    return steps


def test_the_ddp_hook_hands_on_zeros_for_a_nonfinite_bucket_and_names_its_tensor() -> None:
    """One bucket of two tensors, the second holding a NaN: the wrapped hook gets zeros in
    the bucket's place, the state names that tensor once; a finite bucket goes on unchanged."""
    from qbench.ddp.finite import FiniteHookState, finite_hook
    from qbench.run.replay.loops import GradBucket

    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    seen: list[tuple[Any, torch.Tensor]] = []

    def inner(state: Any, bucket: Any) -> str:
        seen.append((state, bucket.buffer().clone()))
        return "sent"

    state = FiniteHookState("inner-state", inner, {id(params[1]): "head.bias"})  # type: ignore[arg-type]
    bad = GradBucket(0, True, params, [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([NAN, 5.0])])
    assert finite_hook(state, bad) == "sent"  # type: ignore[arg-type, comparison-overlap]
    assert seen[0][0] == "inner-state" and seen[0][1].tolist() == [0.0] * 5
    assert state.take() == ("head.bias", "NaN") and state.take() is None
    good = GradBucket(1, True, params, [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0])])
    finite_hook(state, good)  # type: ignore[arg-type]
    assert seen[1][1].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0] and state.take() is None


# -- FSDP: each block gradient is checked before its reduce-scatter, plain or compressed -------
class _Group:
    """FSDP's process group as the collectives read it: its size only."""

    def __init__(self, k: int) -> None:
        self.k = k

    def size(self) -> int:
        return self.k


def test_the_compressed_reduce_scatter_never_sends_a_nonfinite_block() -> None:
    """Two ranks, QSGD (which carries a NaN through its bucket): rank 1's block gradient has a
    NaN in the shard rank 0 owns. Rank 1 sends zeros for the whole block and names it; rank 0
    finds nothing; both ranks' reduced shards are finite, rank 0's its own values only."""
    import torch.distributed as dist

    from qbench.compress import from_spec
    from qbench.fsdp import collectives as c

    shard = 64

    def rank(cm: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
        grad = torch.linspace(-1, 1, 2 * shard) * (1 + cm.rank)
        if cm.rank == 1:
            grad[5] = NAN
        codec = from_spec({"name": "qsgd", "bits": 8, "bucket_size": 16}, seed=3)
        rs = c.CompressedReduceScatter(c.CommLog(), cm, codec, block=4)
        rs.log.begin(0)
        out = torch.empty(shard)
        rs(out, grad, _Group(2), dist.ReduceOp.SUM)  # type: ignore[arg-type]
        return out, grad, rs.log.found

    (out0, _, found0), (out1, grad1, found1) = run_ranks(2, rank)
    assert [bool(torch.isfinite(out).all()) for out in (out0, out1)] == [True, True]
    assert (found0, found1) == (None, ("block 4", "NaN"))
    assert not grad1.any()  # zeroed before it was encoded
    rank0 = torch.linspace(-1, 1, 2 * shard)  # rank 1 adds nothing: each shard is rank 0's
    assert torch.allclose(out0, rank0[:shard], atol=0.01)
    assert torch.allclose(out1, rank0[shard:], atol=0.01)


def test_the_plain_reduce_scatter_never_sends_a_nonfinite_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's own reduce-scatter (fp32 or the 16-bit baselines): what it is handed is zeros
    when the block gradient holds an inf, and the log names the block."""
    from qbench.fsdp import collectives as c

    handed: list[torch.Tensor] = []

    class Done:
        def get_future(self) -> None:
            raise RuntimeError("gloo reduce-scatter has no future")

        def wait(self, timeout: object = None) -> bool:
            return True

    def scatter(out: torch.Tensor, inp: torch.Tensor, **kw: Any) -> Done:
        handed.append(inp.clone())
        return Done()

    monkeypatch.setattr(c, "_SCATTER", scatter)
    log = c.CommLog()
    log.begin(0)
    grad = torch.ones(40, dtype=torch.bfloat16)
    grad[33] = -INF
    c.TimedReduceScatter(log, "layers.2")(torch.empty(20), grad, _Group(2), None)  # type: ignore[arg-type]
    assert not handed[0].any() and log.found == ("layers.2", "inf")
    c.TimedReduceScatter(log, "layers.3")(torch.empty(20), torch.ones(40), _Group(2), None)  # type: ignore[arg-type]
    assert handed[1].tolist() == [1.0] * 40 and log.found == ("layers.2", "inf")  # the first


# -- async-ps: a worker drops its push; the server applies no update for it ---------------------
def test_an_async_worker_drops_a_nonfinite_gradient_and_the_run_goes_on() -> None:
    from qbench.run import async_ps
    from qbench.run.loops.flat import async_parts
    from tests.run.async_ps.test_async_ps import Threads
    from tests.run.async_ps.test_async_ps import _spec as async_spec

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


# -- the scenario key, the run id, the records and the report ------------------------------------
def test_the_key_is_fail_or_skip_and_the_default_keeps_run_ids() -> None:
    default, skip = _spec(), _spec("nonfinite: skip\n")
    assert (default.measurement.nonfinite, skip.measurement.nonfinite) == ("fail", "skip")
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
    invoke.run(
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


def test_a_skipped_step_stays_out_of_the_epochs_train_loss() -> None:
    """Accuracy mode: the epoch's train loss is the mean over the steps that trained (two ranks,
    the same step skipped on both), not a NaN taken from the skipped step."""
    spec = _spec("nonfinite: skip\ndataset: digits\nepochs: 1\nsteps_per_epoch: 4\n", world=2)

    def rank(cm: Any) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
        run = _built(spec, cm)
        _poison(run, "2.weight", NAN, rank=0, at={1})
        run.loss_fn = _nan_loss_at(run.loss_fn, run, step=1)  # the skipped step's loss is NaN
        timer = PhaseTimer(run.device)
        for it in range(run.total_iterations):
            run.before(it)
            run.iteration(it, timer)
            run.after(it)
        return run.frame(), run.epoch_rows

    results = run_ranks(2, rank)
    losses = [frame["loss"].tolist() for frame, _ in results]
    assert math.isnan(losses[0][1])  # rank 0's loss at the skipped step
    kept = [v for per_rank in losses for i, v in enumerate(per_rank) if i != 1]
    assert len(kept) == 6 and all(math.isfinite(v) for v in kept)
    for _, epochs in results:
        assert epochs[0]["train_loss"] == pytest.approx(sum(kept) / 6, rel=1e-9)


def _nan_loss_at(loss_fn: Any, run: Training, step: int) -> Any:
    """``loss_fn`` whose value at forward pass ``step`` on rank 0 is NaN (test-only)."""
    calls = [0]

    def fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        k, calls[0] = calls[0], calls[0] + 1
        loss = loss_fn(out, y)
        return loss * NAN if (k == step and run.comm.rank == 0) else loss

    return fn
