"""Replayed compute (``compute: replay``, qbench.run.replay): the loops sleep through the model's
work and keep everything else real. One in-process gloo rank: DDP's buckets are the ones the
real DDP forms, torch's and qbench's hooks take the replayed buckets, the bytes are those of
the real loops, and the compute times are the timeline's."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from qbench.errors import UserError
from qbench.run import replay
from qbench.run.replay.loops import GradBucket, ReplayDDPRun, ReplayRun
from qbench.spec import scenario
from qbench.spec.matrix import expand
from qbench.spec.parts import Replay
from qbench.timing import PhaseTimer
from tests import fake_clock


def _spec(scheme: str, comp: str = "none", compute: str = "replay", extra: str = "") -> Any:
    text = (
        f"name: t\nmodel: mlp\nworld_size: 1\nscheme: {scheme}\ncompressor: {comp}\n"
        f"compute: {compute}\nwarmup: 0\niterations: 4\nbatch_size: 8\n{extra}"
    )
    return expand(scenario.loads(text)).runs[0]


def _parts(tmp_path: Path, name: str = "run") -> Path:
    parts = tmp_path / "out" / name / "parts"
    parts.mkdir(parents=True)
    return parts


def _iterate(run: Any, n: int = 4) -> Any:
    timer = PhaseTimer(run.device)
    for it in range(n):
        run.iteration(it, timer)
    return run.frame()


def test_accuracy_mode_refuses_replay() -> None:
    text = "name: t\nmodel: logreg\ndataset: digits\ncompute: [fp32, replay]\nepochs: 2\n"
    with pytest.raises(UserError, match=r"compute: replay .* accuracy mode"):
        scenario.loads(text)


def test_a_replayed_run_says_so_in_its_id() -> None:
    assert "-replay-" in _spec("allreduce").run_id
    assert "replay" not in _spec("allreduce", compute="fp32").run_id


def test_replayed_ddp_buckets_are_the_ones_ddp_forms(tmp_path: Path, process_group: Any) -> None:
    """Small buckets (0.05 MB) so that mlp has two: the real DDP's after its rebuild
    (iteration 1 on) and the replay's, from the timeline's ready order, hold the same tensors."""
    from qbench.run.loops.ddp import DDPRun

    scheme = "{name: ddp, bucket_cap_mb: 0.05}"
    real = DDPRun(_spec(scheme, compute="fp32"), process_group)
    steps: list[list[list[str]]] = []
    inner = real.finite.hook

    def spy(state: Any, bucket: Any) -> Any:
        if bucket.index() == 0:
            steps.append([])
        steps[-1].append([real.finite.names[id(p)] for p in bucket.parameters()])
        return inner(state, bucket)

    real.finite.hook = spy
    _iterate(real, 3)
    rebuilt = steps[-1]  # DDP's first step has one bucket in parameter order, then it rebuilds
    assert len(rebuilt) > 1 and steps[1] == rebuilt, steps  # or the test proves nothing

    replayed = ReplayDDPRun(_spec(scheme), process_group, _parts(tmp_path))
    assert [names for names, _ in replayed.buckets] == rebuilt
    readies = [ready for _, ready in replayed.buckets]
    assert readies == sorted(readies) and readies[-1] <= replayed.timeline.backward_s


@pytest.mark.parametrize(
    ("scheme", "comp"),
    [("ddp", "none"), ("ddp", "{name: powersgd, rank: 2}"),
     ("{name: reduce-broadcast, backward: true}", "{name: qsgd, bits: 4}")],
    ids=["ddp-allreduce", "ddp-powersgd", "qsgd-per-bucket"],
)  # fmt: skip
def test_replayed_ddp_sends_what_the_real_loop_sends(
    scheme: str, comp: str, tmp_path: Path, process_group: Any
) -> None:
    from qbench.run.loops.ddp import DDPRun

    real = _iterate(DDPRun(_spec(scheme, comp, compute="fp32"), process_group))
    run = ReplayDDPRun(_spec(scheme, comp), process_group, _parts(tmp_path))
    frame = _iterate(run)
    run.close()
    assert list(frame["payload_bytes"]) == list(real["payload_bytes"])
    assert (frame["payload_bytes"] > 0).all()
    tl = run.timeline
    assert len(tl.samples) == replay.MEASURE_ITERATIONS  # each iteration draws one of them
    assert (frame["t_forward"] >= min(f for f, _, _ in tl.samples)).all()
    assert (frame["t_step"] >= min(s for _, _, s in tl.samples)).all()
    assert frame["loss"].isna().all()  # a replayed model learns nothing: no loss to show


def test_replayed_flat_run_hands_its_own_gradient_to_the_scheme(
    tmp_path: Path, process_group: Any
) -> None:
    spec = _spec("reduce-broadcast", "{name: qsgd, bits: 4}")
    run = ReplayRun(spec, process_group, _parts(tmp_path))
    grad = run.grad.clone()
    assert grad.abs().sum() > 0
    handed = []
    for _, agg in run.aggs:
        original = agg.aggregate
        agg.aggregate = lambda g, *a, _o=original: (handed.append(g.clone()), _o(g, *a))[1]
    t0 = time.perf_counter()
    frame = _iterate(run, 3)
    least = min(sum(sample) for sample in run.timeline.samples)
    assert time.perf_counter() - t0 >= 3 * least
    assert torch.equal(torch.cat(handed[: len(run.aggs)]), grad)  # every iteration the same
    assert (frame["t_compute"] >= min(f + b for f, b, _ in run.timeline.samples)).all()
    assert (frame["payload_bytes"] > 0).all()


def test_the_timeline_is_measured_once_per_workload_and_kept_with_each_run(
    tmp_path: Path, process_group: Any
) -> None:
    spec = _spec("reduce-broadcast")
    first = ReplayRun(spec, process_group, _parts(tmp_path, "a")).timeline
    cache = tmp_path / "out" / replay.TIMELINES / f"{replay.key(spec)}.json"
    doc = json.loads(cache.read_text())
    doc["forward_s"] = 0.123  # a later run of the sweep replays the sweep's timeline
    cache.write_text(json.dumps(doc))
    second = ReplayRun(spec, process_group, _parts(tmp_path, "b")).timeline
    assert second.forward_s == 0.123 and second.params == first.params
    kept = json.loads((tmp_path / "out" / "b" / "timeline.json").read_text())
    assert kept["forward_s"] == 0.123 and kept["source"].startswith("measured")
    assert {p.name for p in first.params} == set(dict(ReplayRun(
        spec, process_group, _parts(tmp_path, "c")).named))  # fmt: skip


def test_grad_bucket_views_its_buffer() -> None:
    params = [torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))]
    grads = [torch.ones(2, 3), torch.full((4,), 2.0)]
    b = GradBucket(0, True, params, grads)
    assert b.buffer().tolist() == [1.0] * 6 + [2.0] * 4 and b.is_last() and b.index() == 0
    b.buffer().mul_(3)
    assert b.gradients()[1].tolist() == [6.0] * 4 and b.gradients()[0].shape == (2, 3)
    assert grads[0].tolist() == [[1.0] * 3] * 2  # copies: the replayed gradient stays as it was


# -- time dilation ------------------------------------------------------------------------------
def _matrix(extra: str) -> Any:
    text = f"name: t\nmodel: mlp\nworld_size: 2\ncompute: replay\nwarmup: 0\niterations: 2\n{extra}"
    return expand(scenario.loads(text))


def test_dilation_needs_replayed_compute() -> None:
    with pytest.raises(UserError, match="real compute cannot slow down"):
        scenario.loads("name: t\nmodel: mlp\ncompute: [fp32, replay]\ndilation: 10\n")


def test_dilation_runs_only_where_it_can_slow_everything_down() -> None:
    m = _matrix(
        "dilation: 10\nnetwork: [{bandwidth: 1gbit}, {nodes: 1}, {nodes: 2, inter: 1gbit}]\n"
        "scheme: [reduce-broadcast, {name: reduce-broadcast, backward: true}]\n"
        "compressor: [none, {name: qsgd, bits: 4}]\n"
    )
    reasons = {e.reason.split(";")[0] for e in m.excluded}
    assert reasons == {
        "dilation: 10 slows shaped links only, and this network has an unshaped one",
        "dilation: 10 stretches the codecs' time in the flat loop only",
    }
    kept = {(r.link.label, r.method.scheme_label, r.compressor_label) for r in m.runs}
    assert kept == {
        (net, scheme, comp) for net in ("1gbit", "2nodes-1gbit")
        for scheme, comp in (("reduce-broadcast", "fp32"), ("reduce-broadcast", "qsgd-4b-b512"),
                             ("reduce-broadcast+backward", "fp32"))
    }  # fmt: skip
    shaped = {r.link.label: r.shaped_topology for r in m.runs}
    assert shaped["1gbit"].inter.bits_per_s == 1e8 and shaped["1gbit"].inter.label == "1gbit"
    assert all(r.clock.dilation == 10 and r.labels()["dilation"] == 10 for r in m.runs)
    assert "dilation" not in _matrix("").runs[0].labels()  # undilated ids and labels unchanged


def test_a_dilated_timeline_stretches_every_time_it_holds() -> None:
    """The medians, each parameter's ready instant and each measured iteration's forward,
    backward and step: all D times longer (the replayed loops draw from the samples)."""
    samples = ((0.01, 0.02, 0.003), (0.012, 0.025, 0.004))
    tl = replay.Timeline(0.01, 0.02, 0.003, (replay.ParamTime("w", 4, 0.015),), "s", "cpu", 2,
                         samples)  # fmt: skip
    slow = tl.on(Replay(dilation=10))
    assert (slow.forward_s, slow.backward_s, slow.step_s) == pytest.approx((0.1, 0.2, 0.03))
    assert slow.params[0].ready_s == pytest.approx(0.15) and tl.on(Replay()) is tl
    flat = [t for sample in slow.samples for t in sample]
    assert flat == pytest.approx([0.1, 0.2, 0.03, 0.12, 0.25, 0.04])
    assert tl.samples == samples  # the recorded timeline keeps the real times


def test_the_timer_pads_codec_phases_to_exactly_d_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dilation 5 on a virtual clock: an encode of 20 ms lasts 100 ms (not 120: padded by
    (D - 1) x its length, not D x), a decode of 10 ms 50 ms; the link is slowed by shaping,
    not by the timer, so comm keeps its 20 ms; the iteration is their sum."""
    clock = fake_clock.install(monkeypatch)
    timer = PhaseTimer(torch.device("cpu"), stretch=Replay(dilation=5.0).stretch)
    timer.start()
    for phase, took in (("compute", 0.03), ("encode", 0.02), ("comm", 0.02), ("decode", 0.01)):
        clock.advance(took)
        timer.mark(phase)
    want = {"compute": 0.03, "encode": 0.1, "comm": 0.02, "decode": 0.05, "step": 0.0}
    assert timer.totals == pytest.approx(want, abs=1e-9)
    assert timer.elapsed() == pytest.approx(0.2, abs=1e-9)
    plain = PhaseTimer(torch.device("cpu"))  # no dilation: no sleep at all
    plain.start()
    clock.advance(0.02)
    plain.mark("encode")
    assert plain.totals["encode"] == pytest.approx(0.02, abs=1e-9)


def _recorded(parts: Path) -> replay.Timeline:
    """A run's timeline as recorded (undilated), from its run directory."""
    return replay.Timeline.from_dict(json.loads((parts.parent / "timeline.json").read_text()))


DILATION = 10.0


def test_a_dilated_flat_run_sleeps_d_times_each_drawn_iteration(
    tmp_path: Path, process_group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dilation 10 on a virtual clock (the timeline measured for real first): each iteration's
    compute is exactly 10 x the forward + backward it drew from the measured samples, its step
    10 x the step; a backward left undilated would make compute 10 f + b."""
    parts = _parts(tmp_path)
    run = ReplayRun(_spec("reduce-broadcast", extra=f"dilation: {DILATION}\n"),
                    process_group, parts)  # fmt: skip
    recorded = _recorded(parts)
    assert min(b for _, b, _ in recorded.samples) > 0  # else an undilated backward is unseen
    fake_clock.install(monkeypatch)
    frame = _iterate(run, 4)
    drawn = replay.Draws(recorded, run.spec.measurement.seed, 0)
    for it, (f, b, s) in enumerate(drawn.next() for _ in range(4)):
        row = frame[frame["iteration"] == it].iloc[0]
        assert row["t_compute"] == pytest.approx(DILATION * (f + b), rel=1e-9, abs=1e-12), it
        assert row["t_step"] == pytest.approx(DILATION * s, rel=1e-9, abs=1e-12), it


def test_dilated_ddp_buckets_go_out_at_d_times_their_ready_instants(
    tmp_path: Path, process_group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dilation 10, small buckets (mlp has two), a virtual clock: each bucket reaches the hook
    at forward end + 10 x its recorded ready instant x this iteration's backward pace (the
    drawn backward / the median), once: dilated twice it would come 100 x late."""
    parts = _parts(tmp_path)
    spec = _spec("{name: ddp, bucket_cap_mb: 0.05}", extra=f"dilation: {DILATION}\n")
    run = ReplayDDPRun(spec, process_group, parts)
    recorded = _recorded(parts)
    ready = {p.name: p.ready_s for p in recorded.params}
    buckets = [max(ready[n] for n in names) for names in replay.ddp_buckets(recorded, 0.05)]
    assert len(buckets) > 1 and buckets[0] > 0, buckets  # or the test proves little
    clock = fake_clock.install(monkeypatch)
    handed: list[float] = []
    inner = run.finite.hook
    run.finite.hook = lambda state, bucket: (handed.append(clock.now), inner(state, bucket))[1]
    drawn, timer = replay.Draws(recorded, spec.measurement.seed, 0), PhaseTimer(run.device)
    for it in range(3):
        f, b, _ = drawn.next()
        begun, handed[:] = clock.now, []
        run.iteration(it, timer)
        pace = b / recorded.backward_s
        want = [begun + DILATION * (f + r * pace) for r in buckets]
        assert handed == pytest.approx(want, rel=0, abs=1e-9), it
    run.close()


def test_reports_divide_dilated_times() -> None:
    import pandas as pd

    from qbench.records.view import clock
    from qbench.report.stats import _undilated

    frame = pd.DataFrame({"t_iteration": [1.0, 2.0], "t_comm": [0.5, 1.0], "bytes_sent": [8, 8]})
    out = _undilated(frame.copy(), Replay(dilation=10))
    assert list(out["t_iteration"]) == [0.1, 0.2] and list(out["t_comm"]) == [0.05, 0.1]
    assert list(out["bytes_sent"]) == [8, 8]  # bytes are what they are
    assert _undilated(frame.copy(), Replay()).equals(frame)
    # the clock comes from the recorded spec, whatever the label says (issue 45 item 4)
    spec = _matrix("dilation: 4\nnetwork: {bandwidth: 1gbit}\n").runs[0]
    assert clock({"spec": spec.to_dict(), "labels": {"dilation": 9}}).dilation == 4
    assert clock({"spec": {}, "labels": {"dilation": 9}}).dilation == 9  # no spec: the label
    assert clock({"spec": {}, "labels": {}}) == Replay()


def test_each_rank_draws_its_own_measured_iterations() -> None:
    samples = tuple((0.001 * k, 0.002 * k, 0.0001 * k) for k in range(1, 21))
    tl = replay.Timeline(0.01, 0.02, 0.001, (), "s", "cpu", 20, samples)
    first = [replay.Draws(tl, seed=0, rank=0).next() for _ in range(1)]
    rank0 = replay.Draws(tl, seed=0, rank=0)
    rank1 = replay.Draws(tl, seed=0, rank=1)
    a, b = [rank0.next() for _ in range(50)], [rank1.next() for _ in range(50)]
    assert a[:1] == first and set(a) <= set(samples) and set(b) <= set(samples)
    assert a != b and len(set(a)) > 10  # ranks differ, and iterations vary as measured
    medians = replay.Draws(replace_samples(tl), seed=0, rank=0).next()
    assert medians == (0.01, 0.02, 0.001)  # a timeline without samples: its medians


def replace_samples(tl: replay.Timeline) -> replay.Timeline:
    import dataclasses

    return dataclasses.replace(tl, samples=())


def test_speed_figures_and_pages_say_replayed() -> None:
    import pandas as pd

    from qbench.report import names

    both = pd.DataFrame({"replayed": [False, True], "dilation": [1.0, 10.0]})
    note = names.compute_note(both)
    assert "replayed compute" in note and "time-dilated x10" in note
    assert names.compute_note(pd.DataFrame({"replayed": [False, False]})) == ""


def test_a_supplied_timeline_is_replayed_and_labelled(tmp_path: Path, process_group: Any) -> None:
    """`timeline:` (e.g. a replayed GPU run's timeline.json) instead of measuring one."""
    spec = _spec("reduce-broadcast")
    ReplayRun(spec, process_group, _parts(tmp_path, "measured"))
    doc = json.loads((tmp_path / "out" / "measured" / "timeline.json").read_text())
    doc.update(forward_s=0.05, device="cuda:0", samples=[[0.05, 0.1, 0.01]])
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(doc))
    run = ReplayRun(_spec("reduce-broadcast", extra=f"timeline: {gpu}\n"), process_group,
                    _parts(tmp_path, "supplied"))  # fmt: skip
    assert run.timeline.samples == ((0.05, 0.1, 0.01),) and run.timeline.device == "cuda:0"
    kept = json.loads((tmp_path / "out" / "supplied" / "timeline.json").read_text())
    assert kept["source"].startswith(f"supplied: {gpu} (it says: measured")
    doc["params"] = doc["params"][1:]  # a timeline of another model
    gpu.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="does not time this model"):
        ReplayRun(_spec("reduce-broadcast", extra=f"timeline: {gpu}\n"), process_group,
                  _parts(tmp_path, "other"))  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "message"),
    [("compute: fp32\ntimeline: t.json\n", "add `compute: replay`"),
     ("compute: replay\ntimeline: /nonexistent.json\n", "cannot be read as a replay timeline"),
     ("compute: replay\ntimeline: {empty}\n", "has no forward_s, backward_s, step_s, params")],
)  # fmt: skip
def test_a_bad_timeline_is_one_line(extra: str, message: str, tmp_path: Path) -> None:
    (tmp_path / "empty.json").write_text("{}")
    text = "name: t\nmodel: mlp\n" + extra.format(empty=tmp_path / "empty.json")
    with pytest.raises(UserError, match=message):
        scenario.loads(text)


def test_a_timeline_derived_from_flops_says_so_and_fits_the_model(
    tmp_path: Path, process_group: Any
) -> None:
    """`qbench timeline`: forward = FLOPs x batch / stated speed, backward twice it, gradients
    ready in reverse order by parameter count; a replayed run takes it as `timeline:`."""
    from click.testing import CliRunner

    from qbench.cli import cli
    from qbench.run import workload

    (tmp_path / "s.yaml").write_text("name: t\nmodel: mlp\nworld_size: 1\nbatch_size: 8\n")
    out = tmp_path / "derived.json"
    argv = ["timeline", str(tmp_path / "s.yaml"), "--tflops", "2", "--memory-tbps", "0.5",
            "--device", "Test GPU (stated)", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    spec = _spec("reduce-broadcast", extra=f"timeline: {out}\n")
    gflops = workload.model_stats(spec)["gflops_per_sample"]
    assert doc["forward_s"] == pytest.approx(gflops * 1e9 * 8 / 2e12)
    assert doc["backward_s"] == pytest.approx(2 * doc["forward_s"])
    ready = [p["ready_s"] for p in doc["params"]]
    assert ready == sorted(ready) and ready[-1] == pytest.approx(doc["backward_s"])
    assert doc["source"].startswith("derived: ") and doc["device"] == "Test GPU (stated)"
    run = ReplayRun(spec, process_group, _parts(tmp_path))  # names match the model's
    assert run.timeline.forward_s == pytest.approx(doc["forward_s"])
    two = tmp_path / "two.yaml"
    two.write_text("name: t\nmodel: [mlp, cnn]\nworld_size: 1\n")
    res = CliRunner().invoke(cli, [*argv[:1], str(two), *argv[2:]])
    assert res.exit_code != 0 and "2 workloads" in str(res.exception)
