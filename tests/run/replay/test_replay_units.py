"""The pieces of replayed compute (qbench.run.replay, replay_codec, replay_loops) one at a time,
on a virtual clock (tests/fake_clock.py) and hand-made timelines, so that every time asserted is
exact and worked out by hand: the workload key, the ranks' draws, measuring a timeline, deriving
one from FLOPs, a supplied one, how the ranks share one, the polling wait, a replayed codec
call's overrun and device wait, DDP's stand-in bucket, and the replayed loops' iterations (a
timeline already in the sweep's cache, so nothing is measured). No real sleep anywhere."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from qbench.errors import UserError
from qbench.run import replay
from qbench.run.nonfinite import NonFiniteGradient
from qbench.run.replay import loops as replay_loops
from qbench.run.replay.codec import ReplayedCodec
from qbench.run.replay.loops import GradBucket, ReplayDDPRun, ReplayRun
from qbench.spec import scenario
from qbench.spec.matrix import expand
from qbench.spec.parts import Replay
from qbench.timing import Pacing, PhaseTimer
from tests import fake_clock


def _spec(scheme: str = "reduce-broadcast", extra: str = "") -> Any:
    text = (
        f"name: t\nmodel: mlp\nworld_size: 1\nscheme: {scheme}\ncompressor: none\n"
        f"compute: replay\nwarmup: 0\niterations: 4\nbatch_size: 8\n{extra}"
    )
    return expand(scenario.loads(text)).runs[0]


# -- the workload key ---------------------------------------------------------------------------
def _sha_key(model: str, batch: int, text: str) -> str:
    """The key's reference: model, batch and the first 10 hex digits of the text's SHA-1."""
    return f"{model}-b{batch}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def test_the_key_hashes_the_workload_in_sorted_json() -> None:
    """mlp, batch 8 on the CPU: the JSON of the workload's facts, keys sorted (written out by
    hand here), is what is hashed; a renamed key, unsorted keys or a longer digest differ."""
    text = (
        '{"batch": 8, "dataset": "synthetic", "device": "cpu", "model": "mlp", '
        '"norm": "batchnorm", "params": {}, "workload": {}}'
    )
    assert replay.key(_spec()) == _sha_key("mlp", 8, text) == "mlp-b8-665f30f05d"


def test_the_key_writes_a_value_json_cannot_as_its_text() -> None:
    """A model parameter JSON has no type for (a path) is hashed as its str, not refused."""
    spec = SimpleNamespace(
        workload=SimpleNamespace(model="m", model_params={"ckpt": PurePosixPath("w/a.pt")},
                                 factory={"k": 1}, dataset="d", batch_size=4),
        placement=SimpleNamespace(device_kind="cuda"), compute=SimpleNamespace(norm="none"),
    )  # fmt: skip
    text = (
        '{"batch": 4, "dataset": "d", "device": "cuda", "model": "m", "norm": "none", '
        '"params": {"ckpt": "w/a.pt"}, "workload": {"k": 1}}'
    )
    assert replay.key(spec) == _sha_key("m", 4, text)  # type: ignore[arg-type]


# -- the ranks' draws and the timeline's file ---------------------------------------------------
def test_a_rank_draws_from_the_stream_of_its_seed_and_rank() -> None:
    """Seed 7, rank 2: the stream is random.Random(7 x 100003 + 2) (a rank of 0 or a seed of 0
    would hide a - for the +, or a / for the x)."""
    samples = tuple((k / 64, 2 * k / 64, k / 128) for k in range(1, 11))
    tl = replay.Timeline(0.1, 0.2, 0.05, (), "s", "cpu", 10, samples)
    ref = random.Random(7 * 100_003 + 2)
    want = [samples[ref.randrange(10)] for _ in range(40)]
    draws = replay.Draws(tl, seed=7, rank=2)
    assert [draws.next() for _ in range(40)] == want


def test_a_timeline_without_samples_reads_as_one_with_none() -> None:
    """An older or hand-written file has no ``samples``: no samples, the medians replayed."""
    doc = {"forward_s": 0.5, "backward_s": 1.0, "step_s": 0.25,
           "params": [{"name": "w", "numel": 3, "ready_s": 0.75}], "source": "s",
           "device": "cpu", "iterations": 0}  # fmt: skip
    tl = replay.Timeline.from_dict(doc)
    assert tl == replay.Timeline(0.5, 1.0, 0.25, (replay.ParamTime("w", 3, 0.75),), "s", "cpu", 0)
    assert tl.samples == () and replay.Draws(tl, 0, 0).next() == (0.5, 1.0, 0.25)


# -- waiting and sleeping on the clock ----------------------------------------------------------
def test_wait_polls_until_the_condition_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timeout 1 s, the condition true at the third look: two polls of 0.05 s, no error."""
    clock = fake_clock.install(monkeypatch)
    looks = iter([False, False, True])
    replay._wait(lambda: next(looks), 1.0)
    assert clock.sleeps == [0.05, 0.05]


def test_wait_gives_up_only_past_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timeout 0: at the deadline itself (not past it) it still polls once more."""
    clock = fake_clock.install(monkeypatch)
    looks = iter([False, True])
    replay._wait(lambda: next(looks), 0.0)
    assert clock.sleeps == [0.05]


def test_wait_times_out_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = fake_clock.install(monkeypatch)
    start = clock.now
    with pytest.raises(TimeoutError) as err:
        replay._wait(lambda: False, 0.25)
    assert str(err.value) == "no replay timeline after 0.25 s"
    # polls of 0.05 s from 1000.0 until past 1000.25: the sixth (1000.3; float sums may
    # land a hair early or late, so five or six)
    assert clock.now - start > 0.25 and len(clock.sleeps) in (5, 6)


def test_sleep_until_now_does_not_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = fake_clock.install(monkeypatch)
    replay.sleep_until(clock.now)
    replay.sleep_until(clock.now - 1)
    assert clock.sleeps == []
    replay.sleep_until(clock.now + 0.5)
    assert clock.sleeps == [0.5]


def test_sync_waits_for_a_cuda_device_only(monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[Any] = []
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    replay._sync(torch.device("cpu"))
    assert synced == []
    replay._sync(torch.device("cuda", 1))
    assert synced == [torch.device("cuda", 1)]


# -- measuring a timeline -----------------------------------------------------------------------
class _Tick(torch.autograd.Function):
    """Identity whose backward takes ``seconds`` on the virtual clock."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: Any, seconds: float) -> torch.Tensor:
        ctx.clock, ctx.seconds = clock, seconds
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.clock.advance(ctx.seconds)
        return g, None, None


class _Net(nn.Module):
    """Call k's forward takes k/64 s; backward takes 0.25 s before b's gradients are ready,
    then 0.125 s more before a's."""

    def __init__(self, clock: Any) -> None:
        super().__init__()
        self.a, self.b, self.clock, self.calls = nn.Linear(2, 2), nn.Linear(2, 1), clock, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(self.calls / 64)
        self.calls += 1
        h = _Tick.apply(self.a(x), self.clock, 0.125)
        return _Tick.apply(self.b(h), self.clock, 0.25)  # type: ignore[no-any-return]


def test_measure_times_each_phase_and_each_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 warm-up and 20 measured iterations on the virtual clock (every time a multiple of
    1/64 s, so exact): forwards 3/64 .. 22/64, median (12 + 13) / 2 / 64 = 0.1953125; backward
    0.25 + 0.125 = 0.375; step 0.0625; b's gradients ready at 0.25, a's at 0.375."""
    clock = fake_clock.install(monkeypatch)
    net = _Net(clock)
    run = SimpleNamespace(
        named=dict(net.named_parameters()), device=torch.device("cpu"), model=net,
        data=SimpleNamespace(batch=lambda it: (torch.ones(1, 2), torch.zeros(1, 1))),
        loss_fn=lambda out, y: (out - y).pow(2).sum(),
        opt=SimpleNamespace(step=lambda: clock.advance(0.0625)),
    )  # fmt: skip
    tl = replay.measure(run)
    assert tl == replay.Timeline(
        forward_s=0.1953125, backward_s=0.375, step_s=0.0625,
        params=(replay.ParamTime("b.weight", 2, 0.25), replay.ParamTime("b.bias", 1, 0.25),
                replay.ParamTime("a.weight", 4, 0.375), replay.ParamTime("a.bias", 2, 0.375)),
        source="measured: one rank alone before the sweep's first replayed run of this workload",
        device="cpu", iterations=20,
        samples=tuple((k / 64, 0.375, 0.0625) for k in range(3, 23)),
    )  # fmt: skip
    assert net.calls == 23
    assert all(p._post_accumulate_grad_hooks in (None, {}) for p in net.parameters())


# -- a timeline derived from FLOPs --------------------------------------------------------------
def _tiny(monkeypatch: pytest.MonkeyPatch, gflops: float) -> None:
    """The workload as ``derived`` sees it: ``gflops`` forward GFLOP per sample, and a model of
    Linear(3, 2) then Linear(2, 1): 6 + 2 + 2 + 1 = 11 parameters."""
    from qbench.run import workload

    monkeypatch.setattr(
        workload, "model_stats", lambda spec: {"numel": 11, "gflops_per_sample": gflops}
    )
    net = lambda spec: (None, nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1)))  # noqa: E731
    monkeypatch.setattr(workload, "model", net)


def test_derived_times_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.5 GFLOP/sample x batch 8 / 2 TFLOP/s = 4e9 / 2e12 = 0.002 s forward (one correctly
    rounded division: exact as written), 0.004 s backward; gradients ready in reverse order
    after their share of the backward: 1.bias 1/11, 1.weight 3/11, 0.bias 5/11, 0.weight
    11/11; the step 20 B x 11 / 0.5 TB/s = 220 / 5e11 = 4.4e-10 s."""
    _tiny(monkeypatch, 0.5)
    tl = replay.derived(_spec(), 2.0, 0.5, "Test GPU (stated)")
    assert (tl.forward_s, tl.backward_s, tl.step_s) == (0.002, 0.004, 4.4e-10)
    assert [(p.name, p.numel) for p in tl.params] == [
        ("1.bias", 1),
        ("1.weight", 2),
        ("0.bias", 2),
        ("0.weight", 6),
    ]
    readies = [p.ready_s for p in tl.params]
    assert readies == pytest.approx([0.004 / 11, 0.012 / 11, 0.02 / 11, 0.004], rel=1e-12)
    assert tl.source == (
        "derived: 0.5 GFLOP/sample forward x batch 8 / 2 TFLOP/s (stated), backward 2x forward, "
        "gradients ready in reverse parameter order by parameter count, step 20 B/param / "
        "0.5 TB/s (stated)"
    )
    assert tl.device == "Test GPU (stated)" and tl.iterations == 0 and tl.samples == ()


@pytest.mark.parametrize("gflops", [0.0, float("nan")])
def test_no_timeline_derives_from_no_flops(monkeypatch: pytest.MonkeyPatch, gflops: float) -> None:
    _tiny(monkeypatch, gflops)
    with pytest.raises(UserError) as err:
        replay.derived(_spec(), 2.0, 0.5, "Test GPU (stated)")
    assert str(err.value) == (
        "mlp: its forward FLOPs cannot be counted on the meta device, so no timeline can be "
        "derived; measure one instead (`compute: replay` without `timeline:`)"
    )


# -- a supplied timeline ------------------------------------------------------------------------
def _doc(names: list[str], **more: Any) -> dict[str, Any]:
    params = [{"name": n, "numel": 1, "ready_s": 0.5} for n in names]
    return {"forward_s": 0.5, "backward_s": 1.0, "step_s": 0.25, "params": params,
            "device": "cuda:0", "iterations": 0, **more}  # fmt: skip


def test_a_supplied_timeline_without_a_source_says_so(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc(["w", "b"])))
    doc = replay.supplied(str(path), {"w": None, "b": None})
    assert doc == {**_doc(["w", "b"]), "source": f"supplied: {path} (it says: no source)"}


def test_a_supplied_timeline_of_another_model_names_three_of_each_difference(
    tmp_path: Path,
) -> None:
    """Four names it has and the model not, four the other way: the first three of each,
    sorted, in the one line."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc(["shared", "x1", "x2", "x3", "x4"], source="s")))
    named = dict.fromkeys(["shared", "m1", "m2", "m3", "m4"])
    with pytest.raises(ValueError) as err:
        replay.supplied(str(path), named)
    assert str(err.value) == (
        f"timeline {path} does not time this model: parameters it has and the model has not: "
        "['x1', 'x2', 'x3'], the model has and it has not: ['m1', 'm2', 'm3']"
    )


# -- sharing one timeline between the ranks -----------------------------------------------------
TL = replay.Timeline(0.25, 0.5, 0.125, (replay.ParamTime("w", 4, 0.375),), "hand", "cpu", 2,
                     ((0.25, 0.5, 0.125), (0.5, 1.0, 0.25)))  # fmt: skip


def _ranks(tmp_path: Path, rank: int, **spec: Any) -> tuple[Any, Path]:
    parts = tmp_path / "out" / "run" / "parts"
    parts.mkdir(parents=True)
    run = SimpleNamespace(comm=SimpleNamespace(rank=rank, world_size=2), named={"w": None},
                          spec=_spec().replaced(**spec))  # fmt: skip
    return run, parts


def test_rank_0_measures_once_every_rank_is_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's cache directory already holds another workload's timeline: rank 0 polls
    until rank 1 is ready (its file written here during the first poll), then measures this
    workload, caches it beside the other, and keeps a copy in the run directory."""
    run, parts = _ranks(tmp_path, 0, timeout=1.0)
    cache = tmp_path / "out" / replay.TIMELINES
    cache.mkdir()
    (cache / "other-workload.json").write_text("{}")
    clock = fake_clock.install(monkeypatch)
    sleep = clock.sleep

    def poll(seconds: float) -> None:
        sleep(seconds)
        (parts / "replay-ready-1.json").write_text('{"rank": 1}')

    monkeypatch.setattr(clock, "sleep", poll)
    measured: list[Any] = []
    monkeypatch.setattr(replay, "measure", lambda r: (measured.append(clock.sleeps[:]), TL)[1])
    assert replay.shared(run, parts) == TL and measured == [[0.05]]
    assert json.loads((parts / "replay-ready-0.json").read_text()) == {"rank": 0}
    assert json.loads((cache / f"{replay.key(run.spec)}.json").read_text()) == json.loads(
        json.dumps(TL.to_dict())
    )
    assert replay.Timeline.from_dict(json.loads((parts.parent / "timeline.json").read_text())) == TL


def test_another_rank_waits_for_rank_0s_copy_and_dilates_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 says it is ready, polls until rank 0's copy is in the run directory (written
    here during its second poll), and replays it dilated x2."""
    run, parts = _ranks(tmp_path, 1, dilation=2.0)
    clock = fake_clock.install(monkeypatch)
    sleep = clock.sleep

    def poll(seconds: float) -> None:
        sleep(seconds)
        if len(clock.sleeps) == 2:
            (parts.parent / "timeline.json").write_text(json.dumps(TL.to_dict()))

    monkeypatch.setattr(clock, "sleep", poll)
    got = replay.shared(run, parts)
    assert clock.sleeps == [0.05, 0.05]
    assert json.loads((parts / "replay-ready-1.json").read_text()) == {"rank": 1}
    assert got == replay.Timeline(
        0.5, 1.0, 0.25, (replay.ParamTime("w", 4, 0.75),), "hand", "cpu", 2,
        ((0.5, 1.0, 0.25), (1.0, 2.0, 0.5)),
    )  # fmt: skip


def test_another_rank_gives_up_after_the_runs_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, parts = _ranks(tmp_path, 1, timeout=0.5)
    clock = fake_clock.install(monkeypatch)
    with pytest.raises(TimeoutError, match=r"^no replay timeline after 0\.5 s$"):
        replay.shared(run, parts)
    assert 0.5 < sum(clock.sleeps) < 0.6


# -- a replayed codec call ----------------------------------------------------------------------
class _Times:
    """A kernels file's times: every call of ``label`` takes 0.25 s."""

    def has(self, label: str) -> bool:
        return label == "c"

    def seconds(self, label: str, op: str, numel: int) -> float:
        return 0.25


class _Inner:
    """A codec whose calls take ``took`` s on the clock and record what they were handed."""

    label = "c"

    def __init__(self, clock: Any, took: float, out: Any) -> None:
        self.clock, self.took, self.out, self.decoded = clock, took, out, []

    def encode(self, grad: Any, **kw: Any) -> Any:
        self.clock.advance(self.took)
        return SimpleNamespace(numel=grad.numel())

    def decode(self, payload: Any, *out: Any) -> Any:
        self.clock.advance(self.took)
        self.decoded.append(out)
        return self.out


def test_a_call_lasting_exactly_its_replayed_time_is_no_overrun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real call takes 0.25 s, the device's: on time, not over (0.25 s is exact from
    1000.0 on the clock); at 0.375 s it overruns."""
    clock = fake_clock.install(monkeypatch)
    pacing = Pacing()
    codec = ReplayedCodec(_Inner(clock, 0.25, torch.zeros(4)), _Times(), Replay(), pacing)  # type: ignore[arg-type]
    codec.encode(torch.zeros(4))
    codec.decode(codec.encode(torch.zeros(4)))
    assert pacing.overruns == 0 and clock.sleeps == [0.25, 0.25, 0.25]
    late = ReplayedCodec(_Inner(clock, 0.375, torch.zeros(4)), _Times(), Replay(), pacing)  # type: ignore[arg-type]
    late.encode(torch.zeros(4))
    assert pacing.overruns == 1


def test_a_decode_writes_where_it_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = fake_clock.install(monkeypatch)
    inner, out = _Inner(clock, 0.0, torch.zeros(4)), torch.empty(4)
    codec = ReplayedCodec(inner, _Times(), Replay(), Pacing())  # type: ignore[arg-type]
    codec.decode(SimpleNamespace(numel=4), out)
    codec.decode(SimpleNamespace(numel=4))
    assert len(inner.decoded) == 2 and inner.decoded[0][0] is out and inner.decoded[1] == (None,)


def test_a_cuda_call_waits_for_its_own_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A (stand-in) tensor on cuda:1: encode and decode wait for that device, not the current."""
    clock = fake_clock.install(monkeypatch)
    synced: list[Any] = []
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    dev = torch.device("cuda", 1)
    on_gpu = SimpleNamespace(is_cuda=True, device=dev, numel=lambda: 4)
    codec = ReplayedCodec(_Inner(clock, 0.0, on_gpu), _Times(), Replay(), Pacing())  # type: ignore[arg-type]
    codec.decode(codec.encode(on_gpu))  # type: ignore[arg-type]
    assert synced == [dev, dev]


# -- DDP's stand-in bucket and the rank's own gradient ------------------------------------------
def test_grad_bucket_views_each_gradient_at_its_offset() -> None:
    params = [
        nn.Parameter(torch.zeros(2)),
        nn.Parameter(torch.zeros(3)),
        nn.Parameter(torch.zeros(2, 2)),
    ]
    grads = [torch.full((2,), 1.0), torch.full((3,), 2.0), torch.full((2, 2), 3.0)]
    b = GradBucket(1, False, params, grads)
    assert [g.tolist() for g in b.gradients()] == [[1.0] * 2, [2.0] * 3, [[3.0] * 2] * 2]
    assert b.index() == 1 and not b.is_last() and b.parameters() == params
    b.set_buffer(torch.arange(9.0))  # a hook's result goes into the buffer, seen by the views
    assert b.buffer().tolist() == list(map(float, range(9)))
    assert [g.tolist() for g in b.gradients()] == [
        [0.0, 1.0],
        [2.0, 3.0, 4.0],
        [[5.0, 6.0], [7.0, 8.0]],
    ]


def test_own_gradient_is_of_the_first_batch() -> None:
    """w = 2, batch 0 is x = 1 (batch 1 is x = 3), y = 0, loss (w x)^2: d/dw = 2 w x^2 = 4."""
    lin = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(2.0)
    asked: list[int] = []
    batches = {0: torch.tensor([[1.0]]), 1: torch.tensor([[3.0]])}

    def batch(it: int) -> tuple[torch.Tensor, torch.Tensor]:
        asked.append(it)
        return batches[it], torch.zeros(1, 1)

    run = SimpleNamespace(
        named=dict(lin.named_parameters()), model=lin, data=SimpleNamespace(batch=batch),
        loss_fn=lambda out, y: (out - y).pow(2).sum(),
    )  # fmt: skip
    replay_loops._own_gradient(run)  # type: ignore[arg-type]
    assert asked == [0] and lin.weight.grad is not None and lin.weight.grad.tolist() == [[4.0]]


# -- the replayed loops on a hand-made timeline -------------------------------------------------
MLP = (("4.bias", 10), ("4.weight", 500), ("2.bias", 50), ("2.weight", 19600),
       ("0.bias", 392), ("0.weight", 307328))  # fmt: skip
"""mlp's parameters (784-392-50-10), in backward's order."""
READY = (0.0625, 0.0625, 0.125, 0.1875, 0.25, 0.375)


def _cached(tmp_path: Path, spec: Any) -> Path:
    """A run directory whose sweep already has this workload's timeline: forward 0.25 s,
    backward 0.5 s, step 0.125 s (no samples: every iteration the same); nothing is measured."""
    params = tuple(replay.ParamTime(n, k, r) for (n, k), r in zip(MLP, READY, strict=True))
    tl = replay.Timeline(0.25, 0.5, 0.125, params, "hand", "cpu", 0)
    cache = tmp_path / "out" / replay.TIMELINES / f"{replay.key(spec)}.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps(tl.to_dict()))
    parts = tmp_path / "out" / "run" / "parts"
    parts.mkdir(parents=True)
    return parts


def test_a_replayed_flat_iteration_by_hand(
    tmp_path: Path, process_group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compute 0.25 + 0.5, step 0.125, the iteration 0.875 s; one rank puts nothing on the
    wire; a step asked for before any iteration drew one takes no time."""
    spec = _spec()
    run = ReplayRun(spec, process_group, _cached(tmp_path, spec))
    clock = fake_clock.install(monkeypatch)
    run._optimizer_step()
    assert clock.sleeps == []
    timer = PhaseTimer(run.device)
    for it in range(2):
        run.iteration(it, timer)
    rows = run.frame()
    assert list(rows["t_compute"]) == [0.75, 0.75] and list(rows["t_step"]) == [0.125, 0.125]
    assert list(rows["t_iteration"]) == [0.875, 0.875] and list(rows["bytes_sent"]) == [0, 0]
    assert list(rows["skipped"]) == [0.0, 0.0]


def test_a_replayed_nan_fails_naming_its_iteration(
    tmp_path: Path, process_group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec()
    run = ReplayRun(spec, process_group, _cached(tmp_path, spec))
    fake_clock.install(monkeypatch)
    run.grad[0] = float("nan")  # the flat gradient's first element: 0.weight's
    with pytest.raises(NonFiniteGradient) as err:
        run.iteration(2, PhaseTimer(run.device))
    assert str(err.value) == (
        "iteration 2: gradient of 0.weight has NaN (rank 0); set `nonfinite: skip` to skip "
        "such steps"
    )


def test_a_replayed_nan_is_skipped_and_recorded_so(
    tmp_path: Path, process_group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``nonfinite: skip`` the step is left out (no step time, no payload) and the row
    says skipped."""
    spec = _spec(extra="nonfinite: skip\n")
    run = ReplayRun(spec, process_group, _cached(tmp_path, spec))
    fake_clock.install(monkeypatch)
    run.grad[0] = float("nan")
    run.iteration(0, PhaseTimer(run.device))
    row = run.frame().iloc[0]
    assert (row["skipped"], row["payload_bytes"], row["t_step"]) == (1.0, 0, 0.0)


def test_a_replayed_ddp_iteration_by_hand(
    tmp_path: Path, process_group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Buckets of 0.05 MB = 52428 B: 4.bias .. 2.weight (40 + 2000 + 200 + 78400 B) close the
    first, ready at 0.1875 s; 0.bias and 0.weight the second, ready at 0.375 s. After the
    0.25 s forward, bucket 0 then bucket 1 reach the hook 0.1875 s and 0.375 s into backward,
    backward ends at 0.5 s (not at the last bucket), then the 0.125 s step: 0.875 s."""
    spec = _spec("{name: ddp, bucket_cap_mb: 0.05}")
    run = ReplayDDPRun(spec, process_group, _cached(tmp_path, spec))
    assert run.buckets == [(["4.bias", "4.weight", "2.bias", "2.weight"], 0.1875),
                           (["0.bias", "0.weight"], 0.375)]  # fmt: skip
    clock = fake_clock.install(monkeypatch)
    run._step()
    assert clock.sleeps == []  # no step drawn yet: none taken
    handed: list[tuple[float, int, bool]] = []
    inner = run.finite.hook

    def spy(state: Any, bucket: Any) -> Any:
        handed.append((clock.now, bucket.index(), bucket.is_last()))
        return inner(state, bucket)

    run.finite.hook = spy
    begun = clock.now
    run.iteration(0, PhaseTimer(run.device))
    run.close()
    assert handed == [(begun + 0.25 + 0.1875, 0, False), (begun + 0.25 + 0.375, 1, True)]
    row = run.frame().iloc[0]
    assert clock.now == begun + 0.875 and row["t_iteration"] == 0.875
    assert (row["t_forward"], row["t_step"], row["bytes_sent"]) == (0.25, 0.125, 0)
