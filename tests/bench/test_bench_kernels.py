"""qbench bench kernels: the rows it measures, its JSON document and its command line."""

from __future__ import annotations

import io
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from rich.console import Console

from qbench import compress
from qbench.bench import kernels, render
from qbench.bench.kernels import KernelResult, KernelRow
from qbench.cli import cli
from qbench.errors import UserError
from qbench.spec import roofline
from qbench.spec.codec_times import CodecTimes
from tests import compiled
from tests.invoke import qbench
from tests.paths import ROOT


@pytest.fixture(scope="module")
def tiny() -> KernelResult:
    return kernels.measure(sizes=[10], repeats=1)


# The labels of kernels.DEFAULT_SPECS, written out: none, fp16, bf16, qsgd bits/bucket 2/128,
# 4/512, 8/512, 16/8192, onebit bucket 64, FP8 E4M3 in blocks of 128, MXFP8 E4M3, MXFP4, NVFP4,
# fixedpoint 8 bits, topk 1 %, adaptive defaults (the
# last three per tensor: one tensor here, so the same work as per call; adaptive's probe bins
# over [min, max] as the paper's).
DEFAULT_LABELS = (
    "fp32", "fp16", "bf16", "qsgd-2b-b128", "qsgd-4b-b512", "qsgd-8b-b512", "qsgd-16b-b8192",
    "1bit-b64", "fp8-e4m3-b128", "mxfp8-e4m3", "mxfp4", "nvfp4", "fixed-8b-layer",
    "topk-1%-layer", "adaptive-c6-m4-f3%-layer-minmax",
)  # fmt: skip


def test_rows_cover_every_default_and_op(tiny: KernelResult) -> None:
    expected = {(label, op) for label in DEFAULT_LABELS for op in ("encode", "decode")}
    assert {(r.compressor, r.op) for r in tiny.rows} == expected
    assert len(tiny.rows) == len(expected) == 30
    assert tiny.notes == []  # every default is registered: nothing skipped
    assert {r.numel for r in tiny.rows} == {2**10}
    assert {r.device for r in tiny.rows} == {"cpu"}


def test_row_numbers_are_consistent(tiny: KernelResult) -> None:
    for r in tiny.rows:
        assert math.isfinite(r.ratio) and r.ratio > 0, r
        assert math.isfinite(r.seconds) and r.seconds > 0, r
        assert r.gbps == pytest.approx(4 * r.numel / r.seconds / 1e9, rel=1e-12)
        assert r.ratio == pytest.approx(r.seconds / r.copy_seconds, rel=1e-12)
        assert r.bits_per_value == pytest.approx(8 * r.wire_bytes / r.numel)
        assert len(r.samples) == len(r.copy_samples) == 1
        assert r.implementation


def test_rows_sit_on_the_roofline(tiny: KernelResult) -> None:
    """x floor is x copy times 8 n / the bytes the op must move (a copy moves 8 n), and those
    bytes follow the rule: 4 n in and the payload out, 8 n more with error feedback; decode
    the payload in and 4 n out."""
    n = 1024
    for r in tiny.rows:
        p = r.roofline
        assert p.floor_ratio == pytest.approx(r.ratio * 8 * n / p.moved_bytes, rel=1e-9), r
        assert p.copy_gbps == pytest.approx(8 * n / r.copy_seconds / 1e9, rel=1e-9)
    moved = {(r.compressor, r.op): r.roofline.moved_bytes for r in tiny.rows}
    assert moved["fp32", "encode"] == moved["fp32", "decode"] == 8 * n
    assert moved["qsgd-4b-b512", "encode"] == 4 * n + n // 2 + 4 * 2
    assert moved["qsgd-4b-b512", "decode"] == n // 2 + 4 * 2 + 4 * n
    assert moved["1bit-b64", "encode"] == 12 * n + n // 8 + 8 * 16  # residual in and out
    assert moved["topk-1%-layer", "encode"] == 12 * n + 11 * 8  # k = 11 values + indices
    adaptive = next(r for r in tiny.rows if r.compressor.startswith("adaptive"))
    assert moved[adaptive.compressor, "encode"] == 4 * n + adaptive.wire_bytes  # measured
    ef = {r.compressor for r in tiny.rows if r.roofline.error_feedback}
    assert ef == {"1bit-b64", "topk-1%-layer"}


def test_breakeven_is_one_per_compressor(tiny: KernelResult) -> None:
    """B* from both ops, the same on both rows: (4n - wire) / (t_enc + t_dec) bytes/s; with
    half the codec hidden, twice that; never for fp32."""
    by = {(r.compressor, r.op): r for r in tiny.rows}
    for label in DEFAULT_LABELS:
        enc, dec = by[label, "encode"].roofline, by[label, "decode"].roofline
        assert enc.breakeven_gbit == dec.breakeven_gbit
        assert enc.breakeven_overlap_gbit == dec.breakeven_overlap_gbit
        if label == "fp32":
            assert enc.breakeven_gbit is None and enc.breakeven_overlap_gbit is None
            continue
        assert enc.breakeven_gbit is not None and enc.breakeven_overlap_gbit is not None
        saved = 4 * 1024 - by[label, "encode"].wire_bytes
        codec_s = by[label, "encode"].seconds + by[label, "decode"].seconds
        assert enc.breakeven_gbit == pytest.approx(saved / codec_s * 8 / 1e9, rel=1e-9)
        assert enc.breakeven_overlap_gbit == pytest.approx(2 * enc.breakeven_gbit, rel=1e-9)


def test_rows_take_the_median_sample_not_the_mean() -> None:
    """Skewed samples, one slow outlier each (a busy machine's): copy 1, 2, 9 us (median 2,
    mean 4), encode 2, 4, 18 (median 4), decode 3, 6, 27 (median 6)."""
    n = 1024
    # the order _samples times them in: 7 warm-ups (copy, decode, the 4 torch casts, encode)
    # the rows must not use, then per repeat copy, encode, decode and the casts (5, 7, 50, 70 us:
    # encode to fp8 and bf16, decode from them; the last repeat's are the outliers)
    casts = [[5, 7, 50, 70], [5, 7, 50, 70], [500, 700, 5000, 7000]]
    repeats = [(1, 2, 3), (2, 4, 6), (9, 18, 27)]
    per_repeat = [(*r, *c) for r, c in zip(repeats, casts, strict=True)]
    script = iter([1.0] * 7 + [t * 1e-6 for times in per_repeat for t in times])

    def clock(fn: Any) -> float:
        fn()
        return next(script)

    comp = compress.from_spec("qsgd:bits=4,bucket_size=512")
    rows = {r.op: r for r in kernels._rows(comp, torch.randn(n), 3, 60.0, clock, 0.5)}
    assert next(script, None) is None  # every scripted sample was taken
    enc, dec = rows["encode"], rows["decode"]
    assert enc.copy_seconds == dec.copy_seconds == pytest.approx(2e-6)
    assert (enc.seconds, dec.seconds) == (pytest.approx(4e-6), pytest.approx(6e-6))
    assert (enc.ratio, dec.ratio) == (pytest.approx(2), pytest.approx(3))
    assert enc.roofline.copy_gbps == pytest.approx(8 * n / 2e-6 / 1e9)
    moved = 4 * n + n // 2 + 4 * 2  # the gradient in, 4-bit levels and 2 scales out
    assert enc.roofline.floor_seconds == pytest.approx(moved * 2e-6 / (8 * n))
    assert enc.peer_seconds == {"fp8 cast": pytest.approx(5e-6), "bf16 cast": pytest.approx(7e-6)}
    assert dec.peer_seconds == {"fp8 cast": pytest.approx(5e-5), "bf16 cast": pytest.approx(7e-5)}
    assert dec.peer_ratio("bf16 cast") == pytest.approx(6 / 70)


def test_known_wire_sizes(tiny: KernelResult) -> None:
    by_label = {r.compressor: r for r in tiny.rows}
    assert by_label["fp32"].wire_bytes == 4 * 1024
    assert by_label["qsgd-4b-b512"].wire_bytes == 1024 // 2 + 4 * 2  # levels + 2 scales
    assert by_label["1bit-b64"].wire_bytes == 1024 // 8 + 8 * 16  # signs + (avg+, avg-) x 16


def test_missing_default_is_skipped_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(compress.COMPRESSORS, "onebit")
    built, notes = kernels.resolve(None)
    assert "onebit" not in {c.name for c in built}
    assert any("onebit" in n and "not registered" in n for n in notes)


def test_explicit_specs_must_build() -> None:
    built, notes = kernels.resolve(["qsgd:bits=2,bucket_size=128", "none"])
    assert [c.label for c in built] == ["qsgd-2b-b128", "fp32"] and not notes
    with pytest.raises(UserError, match="unknown compressor 'qsdg'"):
        kernels.resolve(["qsdg"])
    with pytest.raises(UserError, match="not KEY=VALUE"):
        kernels.parse_spec("qsgd:bits")
    assert kernels.parse_spec("topk:ratio=0.01") == {"name": "topk", "ratio": 0.01}


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(UserError, match="log2"):
        kernels.measure(["none"], sizes=[40])
    with pytest.raises(UserError, match="repeats"):
        kernels.measure(["none"], sizes=[4], repeats=0)
    with pytest.raises(UserError, match="max time must be > 0 seconds, got 0"):
        kernels.measure(["none"], sizes=[4], max_time=0)
    with pytest.raises(UserError, match="0 <= F < 1, got 1"):
        kernels.measure(["none"], sizes=[4], overlap=1.0)


def _render(table: Any) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def test_max_time_cuts_repeats_and_the_table_says_so() -> None:
    """A codec slower than the time allowed keeps one sample per op (not zero, not all 50),
    and its row shows how many calls its median rests on."""
    cut = kernels.measure(["qsgd"], sizes=[10], repeats=50, max_time=1e-9)
    assert [len(r.samples) for r in cut.rows] == [1, 1] and cut.max_time == 1e-9
    assert kernels.to_document(cut)["max_time"] == 1e-9
    full = kernels.measure(["qsgd"], sizes=[10], repeats=3, max_time=60)
    assert [len(r.samples) for r in full.rows] == [3, 3]
    text = _render(render.table(cut.rows, "t", cut.repeats))
    assert text.count("(1 call)") == 2
    assert "call" not in _render(render.table(full.rows, "t", full.repeats))


def test_threads_are_restored() -> None:
    before = torch.get_num_threads()
    kernels.measure(["none"], sizes=[4], repeats=1, threads=before + 1)
    assert torch.get_num_threads() == before


def test_backend_switch_names_the_path() -> None:
    ref = kernels.measure(["qsgd", "none"], sizes=[10], repeats=1, backend="torch")
    assert {r.implementation for r in ref.rows} == {"torch"} and ref.backend == "torch"
    compiled.require_c_kernels()  # skips without a C compiler; a broken build fails
    auto = kernels.measure(["qsgd", "none"], sizes=[10], repeats=1, backend="auto")
    impl = {r.compressor: r.implementation for r in auto.rows}
    assert impl == {"qsgd-4b-b512": "native-cpu", "fp32": "torch"}


def _row(label: str, op: str, ratio: float) -> KernelRow:
    placed = roofline.place(
        2**24, {"encode": ratio, "decode": ratio}, 1.0, wire_bytes=1, measured=1,
        error_feedback=False, overlap=0.5,
    )  # fmt: skip
    return KernelRow(
        compressor=label, spec={}, op=op, numel=2**24, device="cpu", implementation="torch",
        seconds=ratio, gbps=1.0, copy_seconds=1.0, ratio=ratio, wire_bytes=1, bits_per_value=1.0,
        roofline=placed[op],
    )  # fmt: skip


def test_target_lines_say_pass_or_miss() -> None:
    rows = [_row("qsgd-4b-b512", "encode", 0.75), _row("qsgd-4b-b512", "decode", 0.9)]
    encode, decode = KernelResult(rows, [], "cpu", 1, 1, (24,)).targets()
    assert render.target_line(encode) == (
        "target: qsgd-4b-b512 at 2^24 encode <= 0.8x copy: measured encode 0.75x PASS"
    )
    assert render.target_line(decode).endswith("decode <= 0.7x copy: measured decode 0.90x MISS")
    (only,) = KernelResult(rows[:1], [], "cpu", 1, 1, (24,)).targets()  # each needs its op
    assert only.target.ops == ("encode",)


def _command(path: Path | None, specs: tuple[str, ...] = ("none", "qsgd"), **kw: Any) -> None:
    settings: dict[str, Any] = dict(
        sizes=[8], repeats=1, max_time=5.0, device="cpu", threads=1, backend="auto", overlap=0.5
    )
    render.command(specs, **{**settings, **kw}, json_path=path)


def test_json_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.json"
    _command(path, overlap=0.25)
    doc = json.loads(path.read_text())
    assert doc["schema"] == kernels.SCHEMA == "qbench.bench.kernels/1"
    assert {"machine", "versions", "git_commit", "threads", "rows"} <= set(doc)
    assert len(doc["rows"]) == 4 and doc["rows"][0]["numel"] == 256
    assert "qsgd-4b-b512" in capsys.readouterr().out
    # The roofline: the overlap used, one copy bandwidth per size from both compressors' copies.
    assert doc["roofline"]["overlap"] == 0.25
    (copy,) = doc["roofline"]["copy"]
    assert copy["numel"] == 256 and copy["samples"] == 2
    assert copy["copy_gbps"] == pytest.approx(8 * 256 / copy["copy_seconds"] / 1e9)


def test_torch_casts_are_timed_beside_every_codec_in_each_direction(monkeypatch) -> None:
    """Each repeat times both peers in both directions next to the copy; the row's ratio to a
    peer is its seconds over the peer's median, and the table prints it."""
    calls: list[tuple[torch.dtype, torch.dtype]] = []
    real_copy = torch.Tensor.copy_

    def spy(self: torch.Tensor, src: torch.Tensor, *a: object) -> torch.Tensor:
        calls.append((src.dtype, self.dtype))
        return real_copy(self, src, *a)

    monkeypatch.setattr(torch.Tensor, "copy_", spy)
    result = kernels.measure(["qsgd"], sizes=[10], repeats=3, max_time=60)
    monkeypatch.undo()
    for dtype in kernels.PEERS.values():  # warm-up + 3 repeats, each way
        assert calls.count((torch.float32, dtype)) == 4
        assert calls.count((dtype, torch.float32)) == 4
    for r in result.rows:
        assert set(r.peer_seconds) == set(kernels.PEERS)
        assert all(len(v) == len(r.copy_samples) == 3 for v in r.peer_samples.values())
        fp8 = r.peer_seconds["fp8 cast"]
        assert fp8 == max(statistics.median(r.peer_samples["fp8 cast"]), 1e-9)
        assert r.peer_ratio("fp8 cast") == pytest.approx(r.seconds / fp8)
    console = Console(width=300, record=True)
    console.print(render.table(result.rows, "t"))
    text = console.export_text()
    assert "x fp8 cast" in text and "x bf16 cast" in text
    encode = next(r for r in result.rows if r.op == "encode")
    assert f"{encode.peer_ratio('bf16 cast'):.3g}" in text


def test_json_round_trip(tmp_path: Path) -> None:
    """Every row keeps the fields it had and gains ``roofline``, which reads back into the
    same Placement; replay and the cost model still read the file."""
    result = kernels.measure(["none", "onebit"], sizes=[8, 10], repeats=2, overlap=0.5)
    path = tmp_path / "k.json"
    path.write_text(json.dumps(kernels.to_document(result)))
    doc = json.loads(path.read_text())
    assert doc["clock"] == "time.perf_counter around the call: wall time of the calling thread"
    old_fields = {
        "compressor", "spec", "op", "numel", "device", "implementation", "seconds", "gbps",
        "copy_seconds", "ratio", "wire_bytes", "bits_per_value", "samples", "copy_samples",
    }  # fmt: skip
    for raw, row in zip(doc["rows"], result.rows, strict=True):
        assert set(raw) == old_fields | {"roofline", "peer_seconds", "peer_samples"}
        assert roofline.Placement(**raw["roofline"]) == row.roofline
    assert [c["numel"] for c in doc["roofline"]["copy"]] == [256, 1024]
    times = CodecTimes.read(path)
    assert times.labels() == ["1bit-b64", "fp32"]
    row = next(
        r for r in result.rows if (r.compressor, r.op, r.numel) == ("1bit-b64", "encode", 1024)
    )
    assert times.seconds("1bit-b64", "encode", 1024) == row.seconds


def test_shipped_old_kernels_file_still_loads_for_replay() -> None:
    """docs/results/kernels-h100.json predates the roofline: no ``roofline`` anywhere, and
    codec replay reads it as before."""
    path = ROOT / "docs" / "results" / "kernels-h100.json"
    doc = json.loads(path.read_text())
    assert "roofline" not in doc and all("roofline" not in r for r in doc["rows"])
    times = CodecTimes.read(path)
    assert "qsgd-4b-b512" in times.labels() and times.device == "NVIDIA H100 80GB HBM3"
    assert times.seconds("qsgd-4b-b512", "encode", 2**24) > 0


def test_list_options_take_several_values(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(render, "command", lambda *a, **kw: seen.update(args=a, kw=kw))
    argv = ["bench", "kernels", "--sizes", "10", "12", "--compressor", "none", "qsgd:bits=8"]
    res = CliRunner().invoke(cli, [*argv, "--repeats", "2", "--sizes=14", "16", "--max-time=3"])
    assert res.exit_code == 0, res.output
    assert seen["args"] == (("none", "qsgd:bits=8"),)
    assert seen["kw"] == {
        "sizes": (10, 12, 14, 16), "repeats": 2, "max_time": 3.0, "device": "cpu", "threads": 1,
        "backend": "auto", "overlap": roofline.DEFAULT_OVERLAP, "json_path": None,
    }  # fmt: skip
    res = CliRunner().invoke(cli, ["bench", "kernels", "--overlap", "0.8", "--json", "k.json"])
    assert res.exit_code == 0, res.output
    assert seen["kw"]["overlap"] == 0.8 and seen["kw"]["json_path"] == Path("k.json")


def test_cli_writes_json(tmp_path: Path) -> None:
    path = tmp_path / "out" / "kernels.json"
    proc = qbench("bench", "kernels", "--sizes", "10", "--repeats", "1", "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    assert path.is_file() and json.loads(path.read_text())["schema"] == kernels.SCHEMA


def test_cli_bad_size_is_one_line_exit_2() -> None:
    proc = qbench("bench", "kernels", "--sizes", "40")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "40" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_bad_overlap_is_one_line_exit_2() -> None:
    """F = 1 (everything hidden) is refused too: compressing would pay on any link."""
    proc = qbench("bench", "kernels", "--sizes", "8", "--overlap", "1")
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.count("\n") == 1 and "got 1;" in proc.stderr
    assert "0 <= F < 1" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""  # refused before timing anything


def test_cli_table_shows_the_roofline_columns() -> None:
    proc = qbench(
        "bench", "kernels", "--sizes", "10", "--repeats", "1", "--compressor", "none",
        "--compressor", "onebit", "--overlap", "0.25",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.split("┡")[0]
    columns = ("GB/s", "x copy", "x floor", "x fp8", "x bf16", "break-even", "Gbit/s f=0 ")
    for column in (*columns, "Gbit/s f=0.25"):
        assert column in header, column
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in proc.stdout.splitlines()]
    rates = {(r[0], r[2]): r[-2:] for r in rows if len(r) == 14}  # (compressor, op): B*s
    assert rates["fp32", "encode"] == ["never", "never"]  # r = 1
    assert rates["fp32", "decode"] == ["", ""]  # one B* per compressor, on its encode row
    f0, f25 = (float(x) for x in rates["1bit-b64", "encode"])
    assert f25 == pytest.approx(f0 / 0.75, rel=0.01)  # 3 significant digits each
    assert "below which compressing pays even when nothing hides the" in proc.stdout


def test_before_after_table_puts_two_trees_side_by_side(tiny: KernelResult, tmp_path: Path) -> None:
    """benchmarks/kernels_before_after.py (gpu_check.sh BEFORE=...): medians over rounds, the
    speed-up as before over after, both trees' x floor and the after tree's x fp8 cast."""
    doc = kernels.to_document(tiny)
    rows = [r for r in doc["rows"] if r["compressor"] == "qsgd-4b-b512"]
    for tag, scale in (("before-r1", 3.0), ("before-r2", 5.0), ("after-r1", 1.0)):
        scaled = [
            {**r, "seconds": r["seconds"] * scale,
             "roofline": {**r["roofline"], "floor_ratio": r["roofline"]["floor_ratio"] * scale}}
            for r in rows
        ]  # fmt: skip
        (tmp_path / f"{tag}.json").write_text(json.dumps({**doc, "rows": scaled}))
    script = ROOT / "benchmarks" / "kernels_before_after.py"
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    enc = next(r for r in rows if r["op"] == "encode")
    line = next(x for x in out.splitlines() if x.startswith("| qsgd-4b-b512 | encode | 2^10 |"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    floor = enc["roofline"]["floor_ratio"]
    assert cells[5] == "4.00x"  # median of 3x and 5x over 1x
    assert cells[6] == f"{4 * floor:.2f} ({3 * floor:.2f}-{5 * floor:.2f})"
    assert cells[7] == f"{floor:.2f}"
    assert cells[8] == f"{enc['seconds'] / enc['peer_seconds']['fp8 cast']:.2f}"
    empty = tmp_path / "none"
    empty.mkdir()
    proc = subprocess.run([sys.executable, str(script), str(empty)], capture_output=True, text=True)
    assert proc.returncode == 1 and "no before-r*.json" in proc.stderr


def test_the_cuda_clock_queues_gpu_work_before_its_start_event(monkeypatch) -> None:
    """The host's launch latency hides behind PRIME_S of queued work: _sleep, then the start
    event, then the call, then the end event (order recorded with fakes: no GPU here)."""
    from qbench.bench import interleave

    order: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            self.name = "start" if not any(o.startswith("event") for o in order) else "end"
            order.append(f"event {self.name}")

        def record(self) -> None:
            order.append(f"record {self.name}")

        def synchronize(self) -> None:
            order.append("wait")

        def elapsed_time(self, other: object) -> float:
            return 2.5  # ms

    class Props:
        clock_rate = 2_000_000  # kHz: 2 GHz

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: order.append("sync"))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: order.append(f"sleep {cycles}"))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    clock = interleave.clock_for(torch.device("cuda", 0))
    assert clock(lambda: order.append("call")) == pytest.approx(2.5e-3)
    assert order[2:] == ["sync", "sleep 400000", "record start", "call", "record end", "wait"]
