"""Profiler traces (``profile: true`` / ``qbench sweep --profile``, qbench.run.profile): one
Chrome trace per rank with the phases as named ranges; profiled runs get their own run ids and
stay out of speed comparisons."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from qbench.compress import build
from qbench.compress.base import Compressor
from qbench.compress.qsgd import QSGD
from qbench.spec import matrix, scenario
from tests import invoke

RANGES = ("forward", "backward", "encode", "comm", "decode", "step")


class _Comm:
    """Enough of a communicator for one process: the allreduce leaves the tensor as it is."""

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        return None

    def barrier(self) -> None:
        return None


def _ranges(trace: Path) -> Counter[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return Counter(e["name"] for e in events if e.get("cat") == "user_annotation")


def test_trace_has_the_phases_of_the_traced_iterations(tmp_path: Path) -> None:
    """2 warm-up + 5 measured iterations: the profiler warms up on the first measured one and
    traces the next 3, so every phase appears exactly 3 times."""
    from qbench.run import profile

    comm, codec = _Comm(), build("qsgd", bits=4, bucket_size=64)
    model = torch.nn.Linear(50, 4)
    path = tmp_path / "profile" / "rank-0.pt.trace.json"
    tracer = profile.Tracer(path, 2, 5, torch.device("cpu"), comm)  # type: ignore[arg-type]
    for it in range(7):
        profile.phase("forward")
        loss = model(torch.randn(8, 50)).sum()
        profile.phase("backward")
        loss.backward()
        profile.phase(None)
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        comm.allreduce_(grad)
        codec.decode(codec.encode(grad, step=it))
        profile.phase("step")
        profile.phase(None)
        tracer.step()
    tracer.close()
    counts = _ranges(path)
    assert {name: counts[name] for name in RANGES} == dict.fromkeys(RANGES, 3)
    assert not list(path.parent.glob(".*.tmp"))  # written whole, then renamed


def test_no_trace_no_instrumentation(tmp_path: Path) -> None:
    """Without a path nothing is wrapped; after close the codecs and collectives are the
    originals again (a grouped worker may run unprofiled configurations next)."""
    from qbench.run import profile

    before = (Compressor.encode, QSGD.decode, _Comm.allreduce_)
    idle = profile.Tracer(None, 2, 5, torch.device("cpu"), _Comm())  # type: ignore[arg-type]
    assert (Compressor.encode, QSGD.decode, _Comm.allreduce_) == before
    idle.step()
    idle.close()
    tracer = profile.Tracer(tmp_path / "t.json", 0, 3, torch.device("cpu"), _Comm())  # type: ignore[arg-type]
    assert QSGD.decode is not before[1]
    tracer.close()
    assert (Compressor.encode, QSGD.decode, _Comm.allreduce_) == before
    assert not profile._on  # phase() is a no-op again


def test_profile_key_and_run_ids() -> None:
    """Existing run ids do not change (literal ids from before the key existed); a profiled
    run is another run, so it never overwrites or resumes a plain one."""
    text = "name: t\nmodel: mlp\nworld_size: 2\ncompressor: [none, {name: qsgd, bits: 4}]\n"
    plain = [r.run_id for r in matrix.expand(scenario.loads(text)).runs]
    assert plain == [
        "mlp-gloo-allreduce-fp32-w2-12749962ca",
        "mlp-gloo-reduce-broadcast-qsgd-4b-b512-w2-8f4aaf6259",
    ]
    profiled = matrix.expand(scenario.loads(text + "profile: true\n")).runs
    assert all(r.measurement.profile for r in profiled)
    assert not {r.run_id for r in profiled} & set(plain)
    with pytest.raises(Exception, match="profile must be bool"):
        scenario.loads(text + "profile: 3\n")


def test_async_ps_is_excluded_with_the_reason() -> None:
    text = (
        "name: t\nmodel: mlp\nworld_size: 3\nprofile: true\n"
        "scheme: [allreduce, {name: async-ps, staleness: 2}]\n"
    )
    m = matrix.expand(scenario.loads(text))
    assert [r.method.scheme.name for r in m.runs] == ["allreduce"]
    assert "profile traces the lock-step loops" in m.excluded[0].reason


def test_cli_profile_flag_sets_the_key(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: t\nmodel: mlp\nworld_size: 2\n")
    run = [sys.executable, "-m", "qbench.cli", "sweep", str(path), "--dry-run"]
    plain = subprocess.run(run, capture_output=True, text=True, timeout=120)
    traced = subprocess.run([*run, "--profile"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == traced.returncode == 0, traced.stderr
    ids = [line.split()[1] for line in traced.stdout.splitlines() if "mlp-gloo" in line]
    assert ids and not any(i in plain.stdout for i in ids)


@pytest.mark.slow
def test_profiled_sweep_writes_a_trace_per_rank(tmp_path: Path) -> None:
    """Two gloo ranks, flat QSGD and QSGD per DDP bucket (its hook encodes on a thread of its
    own): each rank's trace has every phase; the report keeps both runs out of speedups."""
    from qbench.report import stats

    path = tmp_path / "s.yaml"
    path.write_text(
        "name: prof\nmodel: mlp\nworld_size: 2\nbackend: gloo\nwarmup: 2\niterations: 5\n"
        "batch_size: 8\nscheme: [reduce-broadcast, ddp]\n"
        "compressor: [{name: qsgd, bits: 4}]\n"
    )
    out = tmp_path / "out"
    run = [sys.executable, "-m", "qbench.cli", "sweep", str(path), "--out", str(out), "--profile"]
    done = invoke.run(run, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    traces = sorted(out.glob("*/profile/rank-*.pt.trace.json"))
    assert len(traces) == 4  # 2 runs x 2 ranks
    for trace in traces:
        counts = _ranges(trace)
        assert all(counts[name] >= 3 for name in RANGES), (trace, counts)
    summary = stats.summarize(stats.load(out))
    assert set(summary["status"]) == {stats.PROFILED}
    assert summary["speedup_vs_fp32"].isna().all() and summary["samples_per_s"].notna().all()
