"""Replayed codec time (``codec_time:``, qbench.run.replay.codec): each encode and decode of the
flat loop lasts what a ``bench kernels --json`` file says its device took, times the dilation,
while the payloads stay the real codec's; the runs, tables and figures say whose times they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from qbench.compress import from_spec
from qbench.errors import UserError
from qbench.report import names
from qbench.run.replay.codec import ReplayedCodec
from qbench.run.replay.loops import ReplayRun
from qbench.spec import scenario
from qbench.spec.codec_times import SCHEMA, CodecTimes
from qbench.spec.matrix import expand
from qbench.spec.parts import Replay
from qbench.timing import Pacing, PhaseTimer
from tests import fake_clock

QSGD = "qsgd-4b-b512"


def _doc(seconds: dict[int, float], label: str = QSGD, device: str = "cuda") -> dict[str, Any]:
    rows = [
        {"compressor": label, "op": op, "numel": n, "seconds": s, "copy_seconds": s / 4}
        for n, s in seconds.items()
        for op in ("encode", "decode")
    ]
    machine = {"cpu": "Some CPU", "gpus": {"devices": [{"name": "Test GPU 80GB"}]}}
    return {"schema": SCHEMA, "device": device, "threads": 1, "machine": machine, "rows": rows}


def _file(tmp_path: Path, seconds: dict[int, float], **kw: Any) -> Path:
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(_doc(seconds, **kw)))
    return path


def test_times_between_and_beyond_the_measured_sizes(tmp_path: Path) -> None:
    times = CodecTimes.read(_file(tmp_path, {1024: 1e-4, 2048: 3e-4}))
    assert times.device == "Test GPU 80GB" and times.labels() == [QSGD]
    at = lambda n: times.seconds(QSGD, "encode", n)  # noqa: E731
    assert at(1) == at(1024) == 1e-4  # below the smallest size: a call's fixed cost
    assert at(1536) == pytest.approx(2e-4)  # linear in between
    assert at(2048) == 3e-4 and at(4096) == pytest.approx(6e-4)  # proportional above
    cpu = CodecTimes.read(_file(tmp_path, {1024: 1e-4}, device="cpu"))
    assert cpu.device == "Some CPU, 1 thread(s)"


def _scenario(extra: str, scheme: str = "reduce-broadcast", comp: str = "{name: qsgd, bits: 4}"):
    return scenario.loads(
        f"name: t\nmodel: mlp\nworld_size: 1\nscheme: {scheme}\ncompressor: {comp}\n"
        f"warmup: 0\niterations: 4\nbatch_size: 8\n{extra}"
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [("codec_time: {path}\n", "add `compute: replay`"),
     ("compute: replay\ncodec_time: /nonexistent.json\n", "cannot be read"),
     ("compute: replay\ncodec_time: {empty}\n", "not a `qbench bench kernels --json` file")],
)  # fmt: skip
def test_a_bad_codec_time_is_one_line(extra: str, message: str, tmp_path: Path) -> None:
    (tmp_path / "empty.json").write_text("{}")
    path = _file(tmp_path, {1024: 1e-4})
    with pytest.raises(UserError, match=message):
        _scenario(extra.format(path=path, empty=tmp_path / "empty.json"))


@pytest.mark.parametrize(
    ("scheme", "comp", "reason"),
    [("reduce-broadcast", "{name: onebit}", "has no encode and decode rows of 1bit-b64 (it has "
      "qsgd-4b-b512)"),
     ("integer-allreduce", "{name: qsgd, bits: 4}", "integer-allreduce quantizes with kernels"),
     ("ddp", "{name: qsgd, bits: 4}", "DDP's hooks and FSDP's collectives run theirs inside "
      "backward")],
)  # fmt: skip
def test_runs_it_cannot_replay_are_excluded_saying_why(
    scheme: str, comp: str, reason: str, tmp_path: Path
) -> None:
    path = _file(tmp_path, {1024: 1e-4})
    m = expand(_scenario(f"compute: replay\ncodec_time: {path}\n", scheme, f"[none, {comp}]"))
    assert [r.method.compressor.given["name"] for r in m.runs] == [
        "none"
    ]  # fp32 has no codec to replay
    assert len(m.excluded) == 1 and reason in m.excluded[0].reason


def test_the_run_records_whose_codec_times_it_replays(tmp_path: Path) -> None:
    path = _file(tmp_path, {1024: 1e-4})
    run = expand(_scenario(f"compute: replay\ncodec_time: {path}\n")).runs[0]
    assert run.clock.codec_time == str(path) and run.labels()["codec_time"] == "Test GPU 80GB"
    plain = expand(_scenario("compute: replay\n")).runs[0]
    assert plain.run_id != run.run_id and "codec_time" not in plain.labels()


def test_a_call_lasts_the_replayed_time_and_returns_the_real_payload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a virtual clock (the real codec takes no time on it): each call lasts exactly the
    dilation x the device's 20 ms, no more and no less, and paces both calls for the timer."""
    times = CodecTimes.read(_file(tmp_path, {1024: 0.02}))
    inner, ref = (from_spec({"name": "qsgd", "bits": 4}, seed=1) for _ in range(2))
    pacing = Pacing()
    codec = ReplayedCodec(inner, times, Replay(dilation=2.0), pacing=pacing)
    grad = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    clock = fake_clock.install(monkeypatch)
    t0 = clock.now
    payload = codec.encode(grad, step=3)
    assert clock.now - t0 == pytest.approx(2 * 0.02, abs=1e-9)  # dilation x the device's time
    want = ref.encode(grad, step=3)
    assert torch.equal(payload.to_wire(), want.to_wire())
    assert torch.equal(codec.decode(payload), ref.decode(want))
    assert codec.label == QSGD and pacing.overruns == 0  # everything else is the codec's
    assert pacing.paced_s == pytest.approx(2 * 2 * 0.02, abs=1e-9)  # for the timer to skip


def test_a_codec_the_file_lacks_keeps_its_own_time_stretched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compressor the file has no times for: its real call (30 ms on the virtual clock)
    lasts dilation x that, once: 90 ms at dilation 3, all of it paced."""
    times = CodecTimes.read(_file(tmp_path, {1024: 0.02}, label="onebit"))
    clock = fake_clock.install(monkeypatch)
    inner = from_spec({"name": "qsgd", "bits": 4})
    real = inner.encode
    monkeypatch.setattr(inner, "encode", lambda g, **kw: (clock.advance(0.03), real(g, **kw))[1])
    pacing = Pacing()
    t0 = clock.now
    ReplayedCodec(inner, times, Replay(dilation=3.0), pacing=pacing).encode(torch.randn(1000))
    assert clock.now - t0 == pytest.approx(0.09, abs=1e-9)
    assert pacing.paced_s == pytest.approx(0.09, abs=1e-9) and pacing.overruns == 0


def test_a_real_codec_slower_than_the_replayed_time_is_counted(tmp_path: Path) -> None:
    times = CodecTimes.read(_file(tmp_path, {1024: 1e-12}))
    pacing = Pacing()
    codec = ReplayedCodec(from_spec({"name": "qsgd", "bits": 4}), times, Replay(), pacing)
    payload = codec.encode(torch.randn(1000))
    codec.decode(payload)
    assert pacing.overruns == 2


def test_the_timer_stretches_only_what_no_replayed_call_paced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dilation 3 on a virtual clock: a 40 ms phase of which replayed calls paced 35 ms is
    padded by 2 x its unpaced 5 ms: 50 ms exactly (stretched whole: 120 ms; padded 3 x the
    unpaced part: 55 ms); the next phase starts with nothing paced and is stretched whole."""
    clock = fake_clock.install(monkeypatch)
    pacing = Pacing()
    timer = PhaseTimer(torch.device("cpu"), stretch=Replay(dilation=3.0).stretch, pacing=pacing)
    timer.start()
    clock.advance(0.04)
    pacing.paced_s = 0.035
    timer.mark("encode")
    assert timer.totals["encode"] == pytest.approx(0.04 + 2 * 0.005, abs=1e-9)
    assert pacing.paced_s == 0.0
    clock.advance(0.01)
    timer.mark("decode")
    assert timer.totals["decode"] == pytest.approx(0.03, abs=1e-9)  # nothing paced: whole
    pacing.paced_s = 0.02  # paced more than the phase lasted (a call's rounding): no sleep
    clock.advance(0.01)
    timer.mark("encode")
    assert timer.totals["encode"] == pytest.approx(0.06, abs=1e-9)


def test_a_replayed_flat_run_records_overruns_and_replayed_phases(
    tmp_path: Path, process_group: Any
) -> None:
    # 40 ms a call: far above mlp's QSGD encode even on a loaded machine (4 ms was not: a
    # run of the file beside three other jobs saw one overrun in the first iteration)
    path = _file(tmp_path, {1024: 0.04, 2**20: 0.04})
    spec = expand(_scenario(f"compute: replay\ncodec_time: {path}\n")).runs[0]
    parts = tmp_path / "out" / "run" / "parts"
    parts.mkdir(parents=True)
    run = ReplayRun(spec, process_group, parts)
    timer = PhaseTimer(run.device)
    for it in range(3):
        run.iteration(it, timer)
    frame = run.frame()
    calls = len([a for a in run.aggs if a[1].compressor.name != "none"])
    assert calls >= 1 and (frame["t_encode"] >= 0.04 * calls).all()
    assert (frame["codec_overrun"] == 0).all()


def test_a_dilated_replayed_flat_run_paces_each_codec_call_once(
    tmp_path: Path, process_group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dilation 3 through the whole loop on a virtual clock: each encode and decode phase
    lasts exactly 3 x 40 ms per replayed call in it: the calls are paced with the dilation,
    and the timer, which stretches the phase too, leaves what they paced alone."""
    path = _file(tmp_path, {1024: 0.04, 2**20: 0.04})
    spec = expand(_scenario(f"compute: replay\ncodec_time: {path}\ndilation: 3\n")).runs[0]
    parts = tmp_path / "out" / "run" / "parts"
    parts.mkdir(parents=True)
    run = ReplayRun(spec, process_group, parts)
    calls: dict[str, int] = {}
    paced = ReplayedCodec._last

    def counted(self: ReplayedCodec, begun: float, op: str, numel: int) -> None:
        calls[op] = calls.get(op, 0) + 1
        paced(self, begun, op, numel)

    monkeypatch.setattr(ReplayedCodec, "_last", counted)
    fake_clock.install(monkeypatch)
    timer = PhaseTimer(run.device, stretch=spec.clock.stretch, pacing=run.pacing)
    for it in range(2):
        calls.clear()
        run.iteration(it, timer)
        row = run.rows[-1]
        assert calls.get("encode", 0) >= 1, calls  # or the test proves nothing
        for op in ("encode", "decode"):
            want = 3 * 0.04 * calls.get(op, 0)
            assert row[f"t_{op}"] == pytest.approx(want, abs=1e-9), (it, op, calls)


def test_tables_figures_and_pages_name_the_device() -> None:
    from qbench.report import tables

    summary = pd.DataFrame({"precision": ["replay"], "dilation": [1.0],
                            "codec_time": ["NVIDIA H100 80GB HBM3"],
                            "codec_overrun_share": [0.25]})  # fmt: skip
    assert "codec time replayed from NVIDIA H100 80GB HBM3" in names.compute_note(summary)
    assert names.codec_devices(summary.assign(codec_time=[None])) == []
    assert tables.codec_caption(summary) == (
        " · codec time replayed from NVIDIA H100 80GB HBM3 (real codec slower in up to 25% of "
        "rank-iterations)"
    )
