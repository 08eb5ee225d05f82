"""qbench bench kernels: the rows it measures, its JSON document and its command line."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from rich.console import Console

import qbench.bench
from qbench import compress
from qbench.bench import kernels, render
from qbench.bench.kernels import KernelResult, KernelRow
from qbench.cli import cli
from qbench.errors import UserError
from tests import compiled


@pytest.fixture(scope="module")
def tiny() -> KernelResult:
    return kernels.measure(sizes=[10], repeats=1)


# The labels of kernels.DEFAULT_SPECS, written out: none, fp16, bf16, qsgd bits/bucket 2/128,
# 4/512, 8/512, 16/8192, onebit bucket 64, fixedpoint 8 bits, topk 1 %, adaptive defaults (the
# last three per tensor: one tensor here, so the same work as per call; adaptive's probe bins
# over [min, max] as the paper's).
DEFAULT_LABELS = (
    "fp32", "fp16", "bf16", "qsgd-2b-b128", "qsgd-4b-b512", "qsgd-8b-b512", "qsgd-16b-b8192",
    "1bit-b64", "fixed-8b-layer", "topk-1%-layer", "adaptive-c6-m4-f3%-layer-minmax",
)  # fmt: skip


def test_rows_cover_every_default_and_op(tiny: KernelResult) -> None:
    expected = {(label, op) for label in DEFAULT_LABELS for op in ("encode", "decode")}
    assert {(r.compressor, r.op) for r in tiny.rows} == expected
    assert len(tiny.rows) == len(expected) == 22
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
    return KernelRow(
        compressor=label, spec={}, op=op, numel=2**24, device="cpu", implementation="torch",
        seconds=ratio, gbps=1.0, copy_seconds=1.0, ratio=ratio, wire_bytes=1, bits_per_value=1.0,
    )  # fmt: skip


def test_target_lines_say_pass_or_miss() -> None:
    rows = [_row("qsgd-4b-b512", "encode", 1.2), _row("qsgd-4b-b512", "decode", 2.0)]
    (t,) = KernelResult(rows, [], "cpu", 1, 1, (24,)).targets()
    line = render.target_line(t)
    assert line.startswith("target: qsgd-4b-b512 at 2^24 encode <= 1.5x copy, decode <= 1.5x copy")
    assert "encode 1.20x PASS" in line and "decode 2.00x MISS" in line
    assert not KernelResult(rows[:1], [], "cpu", 1, 1, (24,)).targets()  # needs both ops


def test_json_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.json"
    qbench.bench.kernels_command(["none", "qsgd"], [8], 1, 5.0, "cpu", 1, "auto", path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == kernels.SCHEMA == "qbench.bench.kernels/1"
    assert {"machine", "versions", "git_commit", "threads", "rows"} <= set(doc)
    assert len(doc["rows"]) == 4 and doc["rows"][0]["numel"] == 256
    assert "qsgd-4b-b512" in capsys.readouterr().out


def test_list_options_take_several_values(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(qbench.bench, "kernels_command", lambda *a: seen.update(args=a))
    argv = ["bench", "kernels", "--sizes", "10", "12", "--compressor", "none", "qsgd:bits=8"]
    res = CliRunner().invoke(cli, [*argv, "--repeats", "2", "--sizes=14", "16", "--max-time=3"])
    assert res.exit_code == 0, res.output
    want = (("none", "qsgd:bits=8"), (10, 12, 14, 16), 2, 3.0, "cpu", 1, "auto", None)
    assert seen["args"] == want


def _qbench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qbench.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_writes_json(tmp_path: Path) -> None:
    path = tmp_path / "out" / "kernels.json"
    proc = _qbench("bench", "kernels", "--sizes", "10", "--repeats", "1", "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    assert path.is_file() and json.loads(path.read_text())["schema"] == kernels.SCHEMA


def test_cli_bad_size_is_one_line_exit_2() -> None:
    proc = _qbench("bench", "kernels", "--sizes", "40")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "40" in proc.stderr
    assert "Traceback" not in proc.stderr
