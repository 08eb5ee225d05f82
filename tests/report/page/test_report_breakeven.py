"""The report page's break-even section (issue 37, item 1): each compressor's B* from a
``bench kernels --json`` file's codec times, beside the link rates the sweep measured.

A hand-written sweep, nothing run (2 ranks, n = 2^20 values, 1 warm-up + 3 iterations):

    network  configuration              t_iter  t_comm     sent/iter  hidden
    1gbit    fp32, allreduce (flat)     100 ms  41.94 ms   4n = 4 MiB  0     -> 0.8 Gbit/s
    1gbit    QSGD 4-bit, flat            50 ms                          0
    30gbit   fp32, allreduce (flat)      10 ms  1.342 ms   4 MiB        0     -> 25 Gbit/s
    30gbit   QSGD 4-bit, flat            20 ms                          0
    30gbit   QSGD 4-bit per DDP bucket   20 ms                          0.5

The kernels file times QSGD 4-bit (bucket 512) at 2^20 values: encode 1 ms, decode 0.5 ms. Its
payload is 2^20 / 2 bytes of levels + 4 bytes a scale per 512 values = 532,480 bytes, so it
saves 4 * 2^20 - 532,480 = 3,661,824 bytes, and

    B* = (1 - 1/r) / (1/C_enc + 1/C_dec) = bytes saved / (t_enc + t_dec)
       = 3,661,824 B * 8 / 1.5 ms = 19.53 Gbit/s;   with half hidden: 39.06 Gbit/s.

So at 0.8 Gbit/s the codec is not the limit; at the 25 Gbit/s measured on 30gbit the flat run's
codec costs more than it saves (f = 0), while the DDP bucket run's pays only with its half hidden
(19.5 < 25 < 39.1).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from qbench.records.schema import RunRecord, iterations_frame
from qbench.records.store import INDEX_MD, ResultStore
from qbench.report import tables as report
from qbench.report.page import breakeven as page_breakeven
from qbench.spec import roofline
from qbench.spec.codec_times import SCHEMA, CodecTimes
from tests.invoke import qbench
from tests.paths import ROOT as REPO

N = 2**20
QSGD = "qsgd-4b-b512"
WIRE = N // 2 + 4 * (N // 512)  # 532,480 bytes
B_STAR = (4 * N - WIRE) * 8 / 1.5e-3 / 1e9  # 19.529728 Gbit/s
TITLE = "## Where does the codec pay for itself?"
FLAT = {"scheme": "allreduce", "overlap": "none"}
FLAT_Q = {"scheme": "reduce-broadcast", "overlap": "none"}
BUCKETS = {"scheme": "reduce-broadcast+backward", "overlap": "backward"}


def _labels(comp: str, network: str, setup: dict[str, str], **extra: Any) -> dict[str, Any]:
    name, bits = ("none", 32.0) if comp == "fp32" else ("qsgd", 4.0)
    return {
        "model": "mlp", "dataset": "synthetic", "numel": N, "backend": "gloo",
        "compressor": comp, "compressor_name": name, "bits": bits, "simulated": False,
        "network": network, "world_size": 2, "batch_size": 32, "global_batch": 64,
        "seed": 0, "repeat": 0, **setup, **extra,
    }  # fmt: skip


def _rows(run_id: str, t_iter: float, t_comm: float, sent: int, hidden: float) -> list[dict]:
    rows = []
    for rank in (0, 1):
        for it in range(4):
            slow = 1 + 0.01 * it  # iterations differ a little, so intervals have a width
            rows.append({
                "run_id": run_id, "rank": rank, "iteration": it, "warmup": it == 0,
                "t_compute": t_iter * slow - t_comm, "t_encode": 0.0, "t_comm": t_comm,
                "t_decode": 0.0, "t_step": 0.0, "t_iteration": t_iter * slow,
                "bytes_sent": sent, "payload_bytes": sent // 2, "grad_bytes": 4 * N,
                "overlap_fraction": hidden,
            })  # fmt: skip
    return rows


def _sweep(root: Path, codec_time: str = "", measured_30: float | None = 25e9) -> Path:
    """The sweep of the module docstring; ``codec_time``: the file its runs replayed;
    ``measured_30``: the rate 30gbit's fp32 run measured (None: no such run)."""
    store = ResultStore(root)
    spec = {"codec_time": codec_time} if codec_time else {}
    replayed = {"codec_time": "NVIDIA H100 80GB HBM3"} if codec_time else {}
    runs = [
        ("fp32-1g", "fp32", "1gbit", FLAT, 0.100, 4 * N * 8 / 0.8e9, 4 * N, 0.0),
        ("q-1g", QSGD, "1gbit", FLAT_Q, 0.050, 0.004, WIRE, 0.0),
        ("fp32-30g", "fp32", "30gbit", FLAT, 0.010, 4 * N * 8 / (measured_30 or 1), 4 * N, 0.0),
        ("q-30g", QSGD, "30gbit", FLAT_Q, 0.020, 0.004, WIRE, 0.0),
        ("qb-30g", QSGD, "30gbit", BUCKETS, 0.020, 0.004, WIRE, 0.5),
    ]
    for run_id, comp, net, setup, t_iter, t_comm, sent, hidden in runs:
        if run_id == "fp32-30g" and measured_30 is None:
            continue
        extra = replayed if comp != "fp32" else {}
        store.write_record(RunRecord(run_id=run_id, status="ok", spec=spec,
                                     labels=_labels(comp, net, setup, **extra)))  # fmt: skip
        store.write_iterations(run_id, iterations_frame(_rows(run_id, t_iter, t_comm, sent,
                                                              hidden)))  # fmt: skip
    return root


def _kernels(path: Path, times: dict[int, tuple[float, float]], roofline_keys: bool = True) -> Path:
    """A ``bench kernels --json`` file of QSGD 4-bit: {numel: (encode s, decode s)}; without
    ``roofline_keys`` as files before the roofline were (no roofline block, no wire bytes)."""
    rows = []
    for numel, pair in times.items():
        for op, seconds in zip(("encode", "decode"), pair, strict=True):
            row = {"compressor": QSGD, "op": op, "numel": numel, "seconds": seconds,
                   "copy_seconds": seconds / 4}  # fmt: skip
            if roofline_keys:
                row |= {"wire_bytes": numel // 2 + 4 * (numel // 512), "roofline": {}}
            rows.append(row)
    gpu = {"gpus": {"devices": [{"name": "Test GPU 9000"}]}}
    doc: dict[str, Any] = {"schema": SCHEMA, "device": "cuda", "rows": rows, "machine": gpu}
    if roofline_keys:
        doc["roofline"] = {"overlap": 0.5, "copy": []}
    path.write_text(json.dumps(doc))
    return path


def _page(root: Path, kernels: Path | None = None) -> str:
    report.write_report(root, fmt=None, kernels=kernels, figures=False)
    return (root / "report" / INDEX_MD).read_text()


def _section(page: str) -> str:
    return page.split(TITLE)[1].split("\n## ")[0]


# -- the numbers ------------------------------------------------------------------------------
def test_breakeven_by_hand(tmp_path: Path) -> None:
    times = CodecTimes.read(_kernels(tmp_path / "k.json", {N: (1e-3, 5e-4)}))
    assert times.wire_bytes(QSGD, N) == WIRE == 532_480
    assert pytest.approx(19.529728) == B_STAR
    assert times.breakeven(QSGD, N) == pytest.approx(19.529728)
    assert times.breakeven(QSGD, N, 0.5) == pytest.approx(39.059456)
    # the same as the roofline's definition, C = 4n / time and r = 4n / wire bytes
    c_enc, c_dec, r = 4 * N / 1e-3, 4 * N / 5e-4, 4 * N / WIRE
    assert times.breakeven(QSGD, N) == pytest.approx(roofline.breakeven_gbit(c_enc, c_dec, r))
    # between measured sizes the times are interpolated: 2^19 and 2^21 give 1 ms and 0.5 ms
    apart = CodecTimes.read(_kernels(tmp_path / "k2.json",
                                     {N // 2: (5e-4, 2.5e-4), 2 * N: (2e-3, 1e-3)}))  # fmt: skip
    assert apart.breakeven(QSGD, N) == pytest.approx(19.529728)


def test_fp32_never_pays(tmp_path: Path) -> None:
    doc = {"schema": SCHEMA, "rows": [
        {"compressor": "fp32", "op": op, "numel": N, "seconds": 1e-4, "copy_seconds": 1e-4}
        for op in ("encode", "decode")]}  # fmt: skip
    (tmp_path / "k.json").write_text(json.dumps(doc))
    assert CodecTimes.read(tmp_path / "k.json").breakeven("fp32", N) is None  # r = 1


@pytest.mark.parametrize("name", ["kernels-h100.json", "kernels-h100-roofline.json"])
def test_both_kernels_formats_read(name: str) -> None:
    """The old file (no roofline) and the new one give B* from the same rows; the new one's
    own ``breakeven_gbit`` (written by ``bench kernels``) is the same number."""
    path = REPO / "docs" / "results" / name
    times = CodecTimes.read(path)
    rows = json.loads(path.read_text())["rows"]
    enc, dec = (next(r for r in rows if r["compressor"] == QSGD and r["op"] == op
                     and r["numel"] == 2**24) for op in ("encode", "decode"))  # fmt: skip
    by_hand = (4 * 2**24 - enc["wire_bytes"]) * 8 / (enc["seconds"] + dec["seconds"]) / 1e9
    assert times.breakeven(QSGD, 2**24) == pytest.approx(by_hand)
    assert times.device.startswith("NVIDIA H100")
    if "roofline" in enc:
        assert enc["roofline"]["breakeven_gbit"] == pytest.approx(by_hand)


# -- the page ---------------------------------------------------------------------------------
def test_section_with_kernels(tmp_path: Path) -> None:
    page = _page(_sweep(tmp_path / "res"), _kernels(tmp_path / "k.json", {N: (1e-3, 5e-4)}))
    assert TITLE in page and page_breakeven.HOW not in page
    section = _section(page)
    assert (
        "On 1gbit (shaped 1 Gbit/s; the flat fp32 runs measured 0.8 Gbit/s), the codec of QSGD "
        "4-bit, bucket 512 pays below 19.5 Gbit/s for mlp's 1,048,576 values: the codec is not "
        "the limit; measured: 2.00x (95 % CI"
    ) in section
    assert "over allreduce · fp32 (reduce-broadcast · QSGD 4-bit, 2 ranks)." in section
    # 30 Gbit/s measured: the flat run's codec costs more than it saves; the bucket run hid half
    assert (
        "On 30gbit (shaped 30 Gbit/s; the flat fp32 runs measured 25 Gbit/s), the codec of QSGD "
        "4-bit, bucket 512 pays below 19.5 Gbit/s for mlp's 1,048,576 values: the codec alone "
        "costs more time than the bytes it saves; with 50% of it hidden, as QSGD 4-bit per DDP "
        "bucket hid of its communication, below 39.1 Gbit/s: pays only with that share hidden;"
    ) in section
    flat, buckets = (
        "| reduce-broadcast · QSGD 4-bit | mlp | 1,048,576 | 2 | 30gbit | 30 | 25 | 19.5 | 0.00 | "
        "19.5 | the codec alone costs more time than the bytes it saves |",
        "| QSGD 4-bit per DDP bucket | mlp | 1,048,576 | 2 | 30gbit | 30 | 25 | 19.5 | 0.50 | 39.1 "
        "| pays only with that share hidden |",
    )
    assert flat in section and buckets in section
    assert "codec times measured on Test GPU 9000 (`--kernels`: " in section
    assert "not measurements" in section


def test_the_measured_rate_decides_before_the_shaped_one(tmp_path: Path) -> None:
    """30gbit measured at 18 Gbit/s: below B* = 19.5, although its shaped 30 is above it;
    without a flat fp32 run there, the shaped rate decides."""
    slow = _section(_page(_sweep(tmp_path / "slow", measured_30=18e9), _kernels(
        tmp_path / "k.json", {N: (1e-3, 5e-4)})))  # fmt: skip
    assert "| 30gbit | 30 | 18 | 19.5 | 0.00 | 19.5 | the codec is not the limit |" in slow
    alone = _section(_page(_sweep(tmp_path / "alone", measured_30=None), tmp_path / "k.json"))
    assert "On 30gbit (shaped 30 Gbit/s, no flat fp32 run measured it)" in alone
    assert ("| 30gbit | 30 | - | 19.5 | 0.00 | 19.5 | the codec alone costs more time than the "
            "bytes it saves |") in alone  # fmt: skip


def test_no_file_no_section_but_one_line(tmp_path: Path) -> None:
    page = _page(_sweep(tmp_path / "res"))
    assert TITLE not in page
    assert page.count(page_breakeven.HOW) == 1
    assert "`qbench bench kernels --json FILE`" in page_breakeven.HOW
    assert "`qbench report DIR --kernels FILE`" in page_breakeven.HOW


def test_old_format_kernels_file_is_accepted(tmp_path: Path) -> None:
    """No roofline block, no wire bytes: the catalog's wire bytes give the same B*."""
    old = _kernels(tmp_path / "old.json", {N: (1e-3, 5e-4)}, roofline_keys=False)
    section = _section(_page(_sweep(tmp_path / "res"), old))
    assert "pays below 19.5 Gbit/s for mlp's 1,048,576 values" in section


def test_the_sweeps_own_codec_time_file(tmp_path: Path) -> None:
    """Runs that replayed a file (``codec_time:``) bring it; once it is gone, one line says so."""
    own = _kernels(tmp_path / "own.json", {N: (1e-3, 5e-4)})
    root = _sweep(tmp_path / "res", codec_time=str(own))
    section = _section(_page(root))
    assert "(the sweep's own `codec_time:` file: " in section
    assert "pays below 19.5 Gbit/s" in section
    own.unlink()
    page = _page(root)
    assert TITLE not in page
    assert f"No break-even link rates: codec_time: {own} cannot be read" in page


def test_a_compressor_the_file_lacks_is_named(tmp_path: Path) -> None:
    doc = json.loads(_kernels(tmp_path / "k.json", {N: (1e-3, 5e-4)}).read_text())
    for row in doc["rows"]:
        row["compressor"] = "qsgd-8b-b512"
    (tmp_path / "k.json").write_text(json.dumps(doc))
    section = _section(_page(_sweep(tmp_path / "res"), tmp_path / "k.json"))
    assert "No break-even rate for QSGD 4-bit, bucket 512:" in section
    assert "(it has qsgd-8b-b512)" in section and "| 19.5 |" not in section


@pytest.mark.parametrize("bad", ["missing.json", "not-json.json"])
def test_bad_kernels_path_is_one_line_and_exit_2(tmp_path: Path, bad: str) -> None:
    root = _sweep(tmp_path / "res")
    (tmp_path / "not-json.json").write_text("{not json")
    done = qbench("report", str(root), "--kernels", str(tmp_path / bad), cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"qbench: error: --kernels: {tmp_path / bad} cannot be read" in done.stderr
    assert not (root / "report" / "summary.csv").exists()  # failed before writing anything


def test_kernels_with_two_directories_is_a_usage_error(tmp_path: Path) -> None:
    root = _sweep(tmp_path / "a")
    shutil.copytree(root, tmp_path / "b")
    done = qbench("report", str(root), str(tmp_path / "b"), "--kernels", "k.json", cwd=REPO)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--kernels adds to one directory's page" in done.stderr
