"""Per-layer telemetry: error, residual and bits per value of what each layer would send."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from qbench import timing
from qbench.compress import from_spec
from qbench.run.telemetry import TELEMETRY_COLUMNS, Telemetry
from qbench.timing import PhaseTimer


def make(spec: dict) -> object:
    return from_spec(spec)


def test_rows_per_layer_and_values() -> None:
    layers = [
        ("w", slice(0, 4096), {"name": "qsgd", "bits": 4, "bucket_size": 512}),
        ("b", slice(4096, 4106), {"name": "none"}),
        ("v", slice(4106, 6154), {"name": "onebit", "bucket_size": 64}),
    ]
    tel = Telemetry(layers, from_spec, "r", rank=0)
    grads = [torch.randn(6154, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    for it, g in enumerate(grads):
        tel.observe(it, g)
    frame = tel.frame()
    assert list(frame.columns) == list(TELEMETRY_COLUMNS)
    assert len(frame) == 3 * 3
    last = frame[frame.iteration == 2].set_index("layer")
    assert last.loc["b", "rel_error"] == 0 and last.loc["b", "bits_per_value"] == 32
    assert last.loc["w", "bits_per_value"] == (4096 * 4 / 8 + 8 * 4) * 8 / 4096
    assert 0.05 < last.loc["w", "rel_error"] < 0.5  # 4-bit max-norm buckets of Gaussians
    assert math.isnan(last.loc["w", "residual_norm"])  # qsgd keeps no residual
    assert last.loc["v", "residual_norm"] > 0
    assert last.loc["v", "bits_per_value"] == 2.0  # 1 bit + 2 fp32 means per 64 values


class FakeClock:
    """perf_counter that returns the given readings in turn (binary fractions: sums are exact)."""

    def __init__(self, *readings: float) -> None:
        self.readings = list(readings)

    def __call__(self) -> float:
        return self.readings.pop(0)


def test_timer_skip_excludes_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(10.0, 10.5, 12.5, 12.75, 13.0, 16.0, 16.125)
    # qbench.timing's own view of the time module only: pytest and the rest keep the real clock
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=clock))
    timer = PhaseTimer(torch.device("cpu"))
    timer.start()  # 10.0
    timer.mark("compute")  # 10.5: 0.5 s of compute
    timer.skip()  # 12.5: 2 s of telemetry, charged to nothing
    timer.mark("step")  # 12.75: 0.25 s of step, not 2.25
    timer.mark("comm")  # 13.0: 0.25 s of comm
    timer.skip()  # 16.0: 3 s more left out
    timer.mark("step")  # 16.125: another 0.125 s of step
    assert timer.totals == {"compute": 0.5, "encode": 0.0, "comm": 0.25, "decode": 0.0,
                            "step": 0.375}  # fmt: skip
    assert timer.elapsed() == 1.125  # 6.125 s of wall time less the 5 skipped
    assert clock.readings == []  # one clock reading per call, no more


def test_timer_start_forgets_the_previous_iteration(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(0.0, 1.0, 5.0, 8.0, 8.5)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=clock))
    timer = PhaseTimer(torch.device("cpu"))
    timer.start()  # 0
    timer.skip()  # 1: 1 s skipped
    timer.mark("encode")  # 5
    timer.start()  # 8: a new iteration; totals and skipped time reset
    timer.mark("decode")  # 8.5
    assert timer.totals == {"compute": 0.0, "encode": 0.0, "comm": 0.0, "decode": 0.5,
                            "step": 0.0}  # fmt: skip
    assert timer.elapsed() == 0.5


def test_a_new_timer_reads_zero_everywhere() -> None:
    timer = PhaseTimer(torch.device("cpu"))
    assert timer.totals == dict.fromkeys(("compute", "encode", "comm", "decode", "step"), 0.0)
    assert timer.elapsed() == 0.0


def test_cuda_timers_wait_for_the_device_before_each_clock_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The policy of qbench/timing.py: on CUDA, synchronize, then read the clock, at every phase
    # boundary; on CPU, no device wait. torch.device("cuda") needs no GPU to exist.
    events: list[str] = []
    readings = iter([0.0, 0.25, 1.0, 1.5])

    def clock() -> float:
        events.append("clock")
        return next(readings)

    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=clock))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    timer = PhaseTimer(torch.device("cuda", 0))
    timer.start()
    timer.mark("compute")
    timer.skip()
    timer.mark("comm")
    assert events == ["sync", "clock"] * 4
    assert timer.totals["compute"] == 0.25 and timer.totals["comm"] == 0.5
    events.clear()
    cpu = PhaseTimer(torch.device("cpu"))
    readings = iter([0.0, 1.0])
    cpu.start()
    cpu.mark("step")
    assert events == ["clock", "clock"]
