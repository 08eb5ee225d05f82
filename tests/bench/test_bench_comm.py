"""qbench bench comm: bandwidth formulas, crossover and targets on hand numbers; one real run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from qbench import catalog
from qbench.bench import comm
from qbench.bench.comm import CommResult, CommRow, render, worker
from qbench.errors import UserError
from tests.invoke import qbench

MIB = 2**20


def row(scheme: str, compressor: str, nbytes: int, t: float, **kw: Any) -> CommRow:
    fields: dict[str, Any] = {
        "backend": "gloo", "world_size": 2, "network": "1gbit", "scheme": scheme,
        "compressor": compressor, "bytes": nbytes, "time_s": t, "algbw_GBps": 0.0,
        "busbw_GBps": 0.0, "wire_bytes": nbytes, "wire_busbw_GBps": 0.0,
        "payload_bytes": nbytes, "bits_per_value": 32.0, "rel_error": 0.0,
        "t_encode_s": 0.0, "t_comm_s": t, "t_decode_s": 0.0, "simulated": False,
    }  # fmt: skip
    fields.update(kw)
    return CommRow(**fields)


# -- formulas ------------------------------------------------------------------------------------
def test_algbw_and_busbw_follow_nccl_tests() -> None:
    assert comm.algbw(2e9, 2.0) == pytest.approx(1.0)
    # allreduce factor 2 (K-1) / K: 1 at K=2, 1.5 at K=4, 1.75 at K=8
    assert comm.busbw(1e9, 1.0, 2) == pytest.approx(1.0)
    assert comm.busbw(1e9, 1.0, 4) == pytest.approx(1.5)
    assert comm.busbw(4e9, 2.0, 8) == pytest.approx(3.5)


def test_ideal_speedup_of_qsgd_4bit_bucket_512() -> None:
    assert comm.ideal_speedup(4 + 32 / 512) == pytest.approx(32 / 4.0625)
    assert comm.ideal_speedup(4 + 32 / 512) == pytest.approx(7.877, abs=1e-3)
    assert comm.ideal_speedup(32) == 1.0


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        ([(8, 0.5), (32, 1.2), (128, 0.9), (512, 1.5), (2048, 2.0)], 512),
        ([(2048, 3.0), (8, 1.1), (32, 1.2)], 8),  # pays everywhere: the smallest size
        ([(8, 2.0), (32, 1.5), (128, 0.99)], None),  # loses at the largest size: never
        ([(8, 0.5), (32, 1.0), (128, 1.01)], 128),  # exactly 1 does not pay
        ([], None),
    ],
)
def test_crossover(points: list[tuple[int, float]], expected: int | None) -> None:
    assert comm.crossover(points) == expected


def test_summarize_takes_max_over_ranks_then_median_after_warmup() -> None:
    raw = {
        "backend": "gloo", "world_size": 2, "scheme": "reduce-broadcast",
        "compressor": "qsgd-4b-b512", "bytes": 4096, "warmup": 1, "payload_bytes": 520,
        "overlapped": False, "rel_error": 0.2,
        # calls: warm-up, then 3 timed; per call max over ranks = 9, 3, 5, 4 -> median 4
        "rank_samples": [[9.0, 3.0, 2.0, 4.0], [1.0, 1.0, 5.0, 3.0]],
        "rank_phases": {p: [[0.1, 0.1, 0.2, 0.3], [0.2, 0.1, 0.1, 0.1]]
                        for p in ("encode", "comm", "decode")},
        "rank_bytes": [[520.0, 520.0, 520.0, 520.0], [0.0, 500.0, 500.0, 530.0]],
    }  # fmt: skip
    r = comm.summarize(raw, "unshaped")
    assert r.samples == [3.0, 5.0, 4.0] and r.warmup_samples == [9.0]
    assert r.time_s == 4.0
    assert r.algbw_GBps == pytest.approx(4096 / 4.0 / 1e9)
    assert r.busbw_GBps == pytest.approx(r.algbw_GBps)  # K = 2: factor 1
    assert r.wire_bytes == 520  # per call max 520, 520, 530 -> median 520
    assert r.wire_busbw_GBps == pytest.approx(520 / 4.0 / 1e9)
    assert r.bits_per_value == pytest.approx(8 * 520 / 1024)
    assert r.t_comm_s == pytest.approx(0.2)
    assert not r.simulated


def test_speedups_crossover_and_targets_from_rows() -> None:
    rows = [
        row("allreduce", "fp32", 16 * MIB, 0.14), row("allreduce", "fp32", 64 * MIB, 0.56),
        row("reduce-broadcast", "qsgd-4b-b512", 16 * MIB, 0.03, bits_per_value=4.0625),
        row("reduce-broadcast", "qsgd-4b-b512", 64 * MIB, 0.07, bits_per_value=4.0625,
            wire_bytes=8 * MIB),
        row("integer-allreduce", "qsgd-4b-b512", 16 * MIB, 0.2, bits_per_value=8.0625),
        row("integer-allreduce", "qsgd-4b-b512", 64 * MIB, 0.2, bits_per_value=8.0625,
            wire_bytes=16 * MIB),
    ]  # fmt: skip
    ups = {(u.scheme, u.bytes): u.speedup for u in comm.speedups(rows)}
    assert ups[("reduce-broadcast", 64 * MIB)] == pytest.approx(8.0)
    assert ups[("integer-allreduce", 16 * MIB)] == pytest.approx(0.7)
    cross = {k[3]: v for k, v in comm.crossovers(comm.speedups(rows)).items()}
    assert cross == {"reduce-broadcast": 16 * MIB, "integer-allreduce": 64 * MIB}
    found = {t.target.scheme: t for t in comm.targets(rows)}
    rb, ia = found["reduce-broadcast"], found["integer-allreduce"]
    assert rb.ideal == pytest.approx(7.877, abs=1e-3)
    assert rb.fraction == pytest.approx(8.0 / 7.877, abs=1e-3) and rb.passed  # >= 95 %
    assert ia.ideal == pytest.approx(32 / 8.0625)
    assert ia.measured == pytest.approx(2.8) and not ia.passed  # 2.8 / 3.97 = 71 %
    assert "PASS" in render.target_line(rb) and "MISS" in render.target_line(ia)
    # The link: the fp32 allreduce put 64 MiB on the wire in 0.56 s; 16 MiB take 0.14 s of 0.2.
    assert ia.link_GBps == pytest.approx(64 * MIB / 0.56 / 1e9)
    assert ia.link_s == pytest.approx(0.14) and ia.link_fraction == pytest.approx(0.7)
    assert "carries its 16 MiB in 140 ms, 70% of its 200 ms" in render.target_line(ia)


def test_a_target_needs_95_percent_of_ideal() -> None:
    base = row("allreduce", "fp32", 64 * MIB, 0.56)
    for share, passed in ((0.94, False), (0.96, True)):
        t = 0.56 / (32 / 8.0625 * share)
        ia = row("integer-allreduce", "qsgd-4b-b512", 64 * MIB, t, bits_per_value=8.0625)
        (found,) = comm.targets([base, ia])
        assert found.fraction == pytest.approx(share) and found.passed is passed


def test_targets_need_the_shaped_link_and_two_ranks() -> None:
    rows = [
        row("allreduce", "fp32", 64 * MIB, 0.56, network="unshaped"),
        row("reduce-broadcast", "qsgd-4b-b512", 64 * MIB, 0.08, network="unshaped"),
    ]
    assert comm.targets(rows) == []
    assert comm.speedups(rows)[0].speedup == pytest.approx(7.0)


def test_show_prints_tables_and_targets(capsys: pytest.CaptureFixture[str]) -> None:
    s = comm.settings(backends=["gloo"], world_sizes=[2], schemes=[], compressors=[],
                      min_bytes="8", max_bytes="64M", step_factor=4, repeats=5, warmup=2,
                      bandwidth="1gbit")  # fmt: skip
    rows = [
        row("allreduce", "fp32", 64 * MIB, 0.56),
        row("reduce-broadcast", "qsgd-4b-b512", 64 * MIB, 0.08, bits_per_value=4.0625),
        row("reduce-broadcast+overlap4", "qsgd-4b-b512", 64 * MIB, 0.07, bits_per_value=4.0625),
    ]
    render.show(CommResult(s, rows, ["a note"], []))
    text = capsys.readouterr().out
    assert "speedup over fp32 allreduce" in text and "7.00" in text
    assert "target: reduce-broadcast qsgd-4b-b512" in text and "PASS" in text
    assert "gloo reduce-broadcast+overlap4: ideal" in text


# -- settings ------------------------------------------------------------------------------------
def test_sizes_sweep_like_nccl_tests_and_always_reach_the_max() -> None:
    assert comm.sweep_sizes(8, 32, 2) == [8, 16, 32]
    sizes = comm.sweep_sizes(8, 64 * MIB, 4)
    assert sizes[:3] == [8, 32, 128] and sizes[-2:] == [32 * MIB, 64 * MIB]
    assert len(sizes) == 13
    with pytest.raises(UserError, match="step-factor"):
        comm.sweep_sizes(8, 64, 1)
    with pytest.raises(UserError, match="below"):
        comm.sweep_sizes(64, 8, 2)


@pytest.mark.parametrize(("text", "value"), [("8", 8), ("64K", 65536), ("256M", 256 * MIB),
                                             ("1g", 2**30), ("64KiB", 65536)])  # fmt: skip
def test_parse_bytes(text: str, value: int) -> None:
    assert comm.parse_bytes(text, "--max-bytes") == value


@pytest.mark.parametrize("text", ["6", "0", "12X", "-8", "1.5M"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(UserError, match="--max-bytes"):
        comm.parse_bytes(text, "--max-bytes")


def test_settings_defaults_and_errors() -> None:
    base: dict[str, Any] = {"backends": [], "world_sizes": [], "schemes": [], "compressors": [],
                            "min_bytes": "8", "max_bytes": "1K", "step_factor": 4, "repeats": 5,
                            "warmup": 2, "bandwidth": None}  # fmt: skip
    s = comm.settings(**base)
    assert s.backends == ("gloo",) and s.world_sizes == (2,) and s.network == "unshaped"
    assert {x["name"] for x in s.schemes} == set(catalog.SCHEMES)  # gossip: skipped by plan
    assert {"name": "qsgd", "bits": 4, "bucket_size": 512} in s.compressors
    bad_values: list[tuple[dict[str, Any], str]] = [
        ({"world_sizes": [1]}, "world sizes"), ({"repeats": 0}, "repeats"),
        ({"schemes": ["nope"]}, "unknown scheme"), ({"compressors": ["qsgd:bits=12"]}, "bits"),
        ({"bandwidth": "fast"}, "bandwidth"), ({"sync": "lazy"}, "--sync"),
        ({"gap_ms": -1.0}, "--gap-ms"), ({"gap_ms": float("nan")}, "--gap-ms"),
    ]  # fmt: skip
    for bad, match in bad_values:
        with pytest.raises(UserError, match=match):
            comm.settings(**{**base, **bad})


class _Comm:
    """Enough of a Comm for ``worker._calls``: logs barriers and calls in order."""

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.log: list[str] = []

    def barrier(self) -> None:
        self.log.append("barrier")


class _Agg:
    def __init__(self, cm: _Comm) -> None:
        self.cm = cm

    def aggregate(self, grad: torch.Tensor, step: int, timer: Any) -> torch.Tensor:
        self.cm.log.append(f"call{step}")
        self.cm.bytes_sent += 8
        return grad


@pytest.mark.parametrize(
    ("sync", "expected"),
    [("barrier", ["barrier", "call0", "barrier", "call1", "barrier", "call2", "barrier", "call3"]),
     ("stream", ["barrier", "call0", "call1", "barrier", "call2", "call3"])],
)  # fmt: skip
def test_stream_mode_runs_calls_back_to_back(sync: str, expected: list[str]) -> None:
    """barrier: every call starts aligned; stream: one barrier before the warm-up and one before
    the timed calls (2 warm-up + 2 timed here), as in a training loop."""
    cm = _Comm()
    sched = worker.barrier_schedule(sync, 2)
    agg: Any = _Agg(cm)
    rec = worker._calls(cm, agg, torch.zeros(4), 4, lambda: None, sched)  # type: ignore[arg-type]
    assert cm.log == expected
    assert rec.shape == (4, 5) and rec[:, 4].tolist() == [8.0] * 4


def test_gap_keeps_ranks_busy_before_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(worker, "_spin", slept.append)
    cm = _Comm()
    worker._calls(cm, _Agg(cm), torch.zeros(4), 3, lambda: None,  # type: ignore[arg-type]
                  worker.barrier_schedule("stream", 1), 0.01)  # fmt: skip
    assert slept == [0.01] * 3


def test_plan_skips_with_reasons_and_adds_the_baseline() -> None:
    schemes = [{"name": "reduce-broadcast"}, {"name": "allreduce"}, {"name": "gossip"}]
    comps = [{"name": "qsgd", "bits": 4, "bucket_size": 512}]
    combos, notes = comm.plan("gloo", schemes, comps)
    assert combos == [
        {"scheme": {"name": "allreduce"}, "compressor": {"name": "none"}},
        {"scheme": {"name": "reduce-broadcast"}, "compressor": comps[0]},
    ]
    assert any("allreduce qsgd-4b-b512" in n and "cannot sum" in n for n in notes)
    assert any("gossip" in n and "no mean" in n for n in notes)
    assert any("baseline" in n for n in notes)


def test_bench_worker_replaces_the_training_worker_in_torchrun_argv() -> None:
    argv = comm._local_argv("gloo", Path("/tmp/c.json"), 4)
    assert argv[-3:] == ["-m", comm.WORKER_MODULE, "/tmp/c.json"]
    assert "qbench.run.worker" not in argv and "4" in argv


def test_document_is_strict_json_with_schema(tmp_path: Path) -> None:
    s = comm.settings(backends=["gloo"], world_sizes=[2], schemes=[], compressors=[],
                      min_bytes="8", max_bytes="64M", step_factor=4, repeats=5, warmup=2,
                      bandwidth="1gbit")  # fmt: skip
    rows = [
        row("allreduce", "fp32", 64 * MIB, 0.56),
        row("reduce-broadcast+overlap4", "qsgd-4b-b512", 64 * MIB, 0.07, t_comm_s=math.nan),
    ]
    doc = comm.to_document(CommResult(s, rows, [], []))
    text = json.dumps(doc, allow_nan=False)  # NaN phases of overlapped schemes become null
    assert doc["schema"] == "qbench.bench.comm/1"
    assert doc["settings"]["network"] == "1gbit" and doc["settings"]["sizes"][-1] == 64 * MIB
    assert doc["rows"][1]["t_comm_s"] is None and doc["targets"][0]["comm_only"] is None
    assert doc["targets"][0]["scheme"] == "reduce-broadcast+overlap4" and "null" in text


def test_partial_last_line_is_not_read_yet(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"b": ')
    assert comm._read_rows(path) == [{"a": 1}]
    assert comm._read_rows(tmp_path / "missing.jsonl") == []


def test_failed_launch_reports_its_exit_code(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"]
    assert comm._run_local(argv, tmp_path, lambda: None) == ("failed", 3)
    assert (tmp_path / "stderr.log").read_text().strip() == "boom"


# -- command line --------------------------------------------------------------------------------
def process(*args: str) -> subprocess.CompletedProcess[str]:
    """``qbench ARGS`` as a process of its own, for the benchmarks that launch ranks."""
    cmd = [sys.executable, "-c", "from qbench.cli import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "args",
    [("--max-bytes", "12X"), ("--world-size", "1"), ("--backend", "tcp"),
     ("--compressor", "qsgd:bits=12"), ("--bandwidth", "fast"), ("--sync", "lazy"),
     ("--gap-ms", "-1")],
)  # fmt: skip
def test_bad_option_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    proc = qbench("bench", "comm", *args)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("qbench: error:") and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_end_to_end_gloo_and_mpi(tmp_path: Path) -> None:
    out = tmp_path / "comm.json"
    proc = process("bench", "comm", "--backend", "gloo", "mpi", "--world-size", "2",
                   "--max-bytes", "64K", "--repeats", "2", "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "qbench.bench.comm/1"
    assert doc["failures"] == [] and "torch" in doc["versions"]
    rows = {(r["backend"], r["scheme"], r["compressor"], r["bytes"]): r for r in doc["rows"]}
    assert {k[0] for k in rows} == {"gloo", "mpi"}
    assert {k[3] for k in rows} == {8, 32, 128, 512, 2048, 8192, 32768, 65536}
    for backend in ("gloo", "mpi"):
        fp32 = rows[(backend, "allreduce", "fp32", 65536)]
        assert 0 <= fp32["rel_error"] < 1e-6
        assert fp32["wire_bytes"] == 65536  # 2 (K-1) / K * S at K = 2
        assert fp32["busbw_GBps"] == pytest.approx(fp32["algbw_GBps"])
        assert len(fp32["samples"]) == 2 and len(fp32["warmup_samples"]) == 2
        assert [len(r) for r in fp32["rank_samples"]] == [4, 4]
        for scheme in ("reduce-broadcast", "integer-allreduce"):
            q = rows[(backend, scheme, "qsgd-4b-b512", 65536)]
            assert 1e-3 < q["rel_error"] < 0.5, q["rel_error"]
            assert math.isfinite(q["time_s"]) and q["time_s"] > 0
        rb = rows[(backend, "reduce-broadcast", "qsgd-4b-b512", 65536)]
        assert rb["bits_per_value"] == pytest.approx(4 + 32 / 512)
    assert {s["scheme"] for s in doc["speedups"]} >= {"reduce-broadcast", "integer-allreduce"}
    assert any("gossip" in n and "no mean" in n for n in doc["notes"])
    assert "speedup over fp32 allreduce: mpi, 2 ranks, unshaped" in proc.stdout


@pytest.mark.slow
def test_stream_mode_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "comm.json"
    proc = process("bench", "comm", "--backend", "gloo", "--max-bytes", "1K", "--scheme",
                   "allreduce", "--compressor", "none", "--repeats", "3", "--sync", "stream",
                   "--gap-ms", "2", "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["settings"]["sync"] == "stream" and doc["settings"]["gap_ms"] == 2.0
    assert all(len(r["samples"]) == 3 for r in doc["rows"])
    assert "calls back to back, 2 ms busy before each" in proc.stdout
