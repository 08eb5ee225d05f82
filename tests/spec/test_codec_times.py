"""Reading a ``qbench bench kernels --json`` document (qbench.spec.codec_times): its rows, the
device named, the times at any size and the payload of a data-dependent codec, each value
written out by hand (the mutation run of issue 44 found these paths untested)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qbench.errors import UserError
from qbench.spec.codec_times import SCHEMA, CodecTimes, bench_rows, device_name, rows

QSGD = "qsgd-4b-b512"
ADAPTIVE = "adaptive-c6-m4-f3%-layer-minmax"  # its payload depends on the data


def _row(label: str, op: str, numel: int, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"compressor": label, "op": op, "numel": numel, "seconds": seconds,
            "copy_seconds": seconds / 4, **extra}  # fmt: skip


def _read(tmp_path: Path, rows_: list[dict[str, Any]], **doc: Any) -> CodecTimes:
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"schema": SCHEMA, "rows": rows_, **doc}))
    return CodecTimes.read(path)


def test_rows_name_the_file_the_command_and_what_is_wrong() -> None:
    good = {"schema": SCHEMA, "rows": [_row(QSGD, "encode", 8, 1.0)]}
    assert rows(good, "f.json") == good["rows"]
    cases = [
        ([], f"f.json: not a `qbench bench kernels --json` file (schema {SCHEMA!r})"),
        ({"schema": "other", "rows": []}, "f.json: not a `qbench bench kernels --json` file"),
        ({"schema": SCHEMA}, "f.json: has no rows list"),
        ({"schema": SCHEMA, "rows": {}}, "f.json: has no rows list"),
        ({"schema": SCHEMA, "rows": [{"op": "encode", "numel": 8}]},
         "f.json: a row lacks compressor, seconds, copy_seconds"),
        ({"schema": SCHEMA, "rows": ["encode"]},
         "f.json: a row lacks compressor, op, numel, seconds, copy_seconds"),
    ]  # fmt: skip
    for doc, message in cases:
        with pytest.raises(UserError) as e:
            rows(doc, "f.json")
        assert str(e.value).startswith(message), (doc, str(e.value))


def test_bench_rows_checks_the_schema_and_keys_it_is_given() -> None:
    doc = {"schema": "s/1", "rows": [{"a": 1}]}
    assert bench_rows(doc, "x", "s/1", "qbench bench comm", ("a",)) == [{"a": 1}]
    with pytest.raises(UserError, match=r"^x: a row lacks b$"):
        bench_rows(doc, "x", "s/1", "qbench bench comm", ("a", "b"))
    with pytest.raises(
        UserError, match=r"^x: not a `qbench bench comm --json` file \(schema 's/2'\)$"
    ):
        bench_rows(doc, "x", "s/2", "qbench bench comm", ("a",))


def test_the_device_is_the_gpu_or_the_cpu_and_its_threads() -> None:
    gpus = {"gpus": {"devices": [{"name": "H200"}, {"name": "other"}]}}
    assert device_name({"device": "cuda", "machine": gpus}) == "H200"
    assert device_name({"device": "cuda", "machine": {"gpus": {"devices": [{}]}}}) == "a CUDA GPU"
    assert device_name({"device": "cuda", "machine": {"gpus": {}}}) == "a CUDA GPU"
    assert device_name({"device": "cuda"}) == "a CUDA GPU"
    assert device_name({"device": "cpu", "machine": {"cpu": "EPYC"}, "threads": 2}) == (
        "EPYC, 2 thread(s)"
    )
    assert device_name({"machine": {**gpus, "cpu": "EPYC"}}) == "EPYC, 1 thread(s)"  # not cuda
    assert device_name({}) == "a CPU, 1 thread(s)"


def test_an_unreadable_file_names_its_key_the_error_and_the_fix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError) as e:
        CodecTimes.read(bad, "--codec-time")
    assert str(e.value) == (
        f"--codec-time: {bad} cannot be read (JSONDecodeError); give a "
        "`qbench bench kernels --json` file"
    )
    with pytest.raises(UserError, match=r"^codec_time: .*missing\.json cannot be read "
                       r"\(FileNotFoundError\)"):  # fmt: skip
        CodecTimes.read(tmp_path / "missing.json")


def test_times_at_the_edges_of_the_measured_sizes(tmp_path: Path) -> None:
    times = _read(tmp_path, [_row(QSGD, op, n, s) for op in ("encode", "decode")
                             for n, s in ((100, 1.0), (200, 5.0), (400, 6.0))])  # fmt: skip
    at = lambda n: times.seconds(QSGD, "decode", n)  # noqa: E731
    assert [at(n) for n in (1, 100, 150, 200, 300, 400, 800)] == [
        1.0,
        1.0,
        3.0,
        5.0,
        5.5,
        6.0,
        12.0,
    ]
    assert times.has(QSGD) and times.labels() == [QSGD]


def test_a_label_with_only_one_op_is_not_offered(tmp_path: Path) -> None:
    times = _read(tmp_path, [_row(QSGD, "encode", 8, 1.0), _row("fp16", "encode", 8, 1.0),
                             _row("fp16", "decode", 8, 1.0)])  # fmt: skip
    assert not times.has(QSGD) and times.labels() == ["fp16"]


def test_a_data_dependent_payload_is_the_one_measured_nearest_in_ratio(tmp_path: Path) -> None:
    """Measured at 1,000 values (300 B) and 100,000 (10,000 B): 9,000 values are nearer 1,000
    in ratio (9x) than 100,000 (11.1x), so 300 B scaled by 9 = 2,700 B; 12,000 values are
    nearer 100,000 (8.3x against 12x): 1,200 B. Rows without a usable wire_bytes are skipped."""
    measured = [(1000, 300), (100_000, 10_000)]
    rows_ = [_row(ADAPTIVE, op, n, 1e-3, wire_bytes=w) for op in ("encode", "decode")
             for n, w in measured]  # fmt: skip
    rows_ += [_row(ADAPTIVE, "encode", 50, 1e-3, wire_bytes=0),
              _row(ADAPTIVE, "encode", 60, 1e-3, wire_bytes=7.5),
              _row(ADAPTIVE, "encode", 70, 1e-3)]  # fmt: skip
    times = _read(tmp_path, rows_)
    assert times.wires == {ADAPTIVE: ((1000, 300), (100_000, 10_000))}
    assert times.wire_bytes(ADAPTIVE, 9000) == 2700
    assert times.wire_bytes(ADAPTIVE, 12_000) == 1200
    assert times.wire_bytes(ADAPTIVE, 1000) == 300
    assert times.wire_bytes(ADAPTIVE, 1001) == 300  # 300.3 rounds to nearest
    assert times.wire_bytes(ADAPTIVE, 1002) == 301  # 300.6
    assert times.wire_bytes(ADAPTIVE, 1) == 1  # never 0 bytes
    assert times.wire_bytes(QSGD, 1024) == 512 + 8  # the catalog's count, whatever was measured
    # B* of 9,000 values: encode + decode 2 ms (the smallest size's time), r = 36000 / 2700.
    ratio = 36_000 / 2700
    expected = (1 - 1 / ratio) * 36_000 / 2e-3 * 8 / 1e9
    assert times.breakeven(ADAPTIVE, 9000) == pytest.approx(expected, rel=1e-12)
    assert times.breakeven(ADAPTIVE, 9000, 0.5) == pytest.approx(2 * expected, rel=1e-12)


def test_a_data_dependent_payload_never_measured_has_no_breakeven(tmp_path: Path) -> None:
    times = _read(tmp_path, [_row(ADAPTIVE, op, 1000, 1e-3) for op in ("encode", "decode")])
    assert times.wires == {}
    assert times.wire_bytes(ADAPTIVE, 1000) is None
    assert times.breakeven(ADAPTIVE, 1000) is None


def test_a_read_names_its_file_and_keeps_a_one_byte_payload(tmp_path: Path) -> None:
    times = _read(
        tmp_path, [_row(ADAPTIVE, op, 1000, 1e-3, wire_bytes=1) for op in ("encode", "decode")]
    )
    assert times.source == str(tmp_path / "k.json")
    assert times.wires == {ADAPTIVE: ((1000, 1),)}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": SCHEMA}))
    with pytest.raises(UserError) as e:
        CodecTimes.read(bad, "--codec-time")
    assert str(e.value) == f"--codec-time: {bad}: has no rows list"
