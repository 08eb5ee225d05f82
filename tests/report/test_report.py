"""stats / report / plots on synthetic result directories with hand-computable timings."""

from __future__ import annotations

import io
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from qbench.errors import UserError
from qbench.records.schema import RunRecord, iterations_frame
from qbench.records.store import ResultStore
from qbench.report import names, plots, stats
from qbench.report import tables as report
from tests.paths import ROOT as REPO

MODELS = {"mlp": (0.010, 1_000_000), "cnn": (0.040, 4_000_000)}  # compute s, numel
# label -> (compressor_name, bits, payload bytes per parameter)
COMPRESSORS = {"fp32": ("none", 32.0, 4.0), "qsgd-4b-b512": ("qsgd", 4.0, 0.5)}
COMPRESSORS["1bit-b64"] = ("onebit", 1.0, 0.125)
WORLD_SIZES = (1, 2, 4)
MEASURED, WARMUP = 5, 2
BATCH = 32


def parts(model: str, comp: str, ws: int, rank: int, it: int) -> dict[str, float]:
    """Synthetic seconds; later ranks are slower, iterations drift by 1% each."""
    compute, numel = MODELS[model]
    payload = numel * COMPRESSORS[comp][2]
    coded = comp != "fp32"
    return {
        "t_compute": (compute + 0.001 * rank) * (1 + 0.01 * it),
        "t_encode": 0.002 if coded else 0.0,
        "t_comm": payload * 1e-9 * (ws - 1) * (1 + 0.02 * it),
        "t_decode": 0.001 * ws if coded else 0.0,
        "t_step": 0.003,
    }


def rows_for(run_id: str, model: str, comp: str, ws: int, slow: float = 1.0) -> list[dict]:
    numel = MODELS[model][1]
    payload = int(numel * COMPRESSORS[comp][2])
    sizes = {"payload_bytes": payload, "grad_bytes": 4 * numel}
    rows = []
    for rank in range(ws):
        for it in range(WARMUP + MEASURED):
            warm = it < WARMUP
            p = {
                k: 100.0 if warm else v * slow for k, v in parts(model, comp, ws, rank, it).items()
            }
            p["t_iteration"] = 500.0 if warm else sum(p.values()) + 0.002 * rank
            p["loss"] = 1.0 / (it + 1)
            row = {"run_id": run_id, "rank": rank, "iteration": it, "warmup": warm, **p}
            rows.append({**row, **sizes, "bytes_sent": payload * (ws - 1) + rank})
    return rows


def labels(model: str, comp: str, ws: int, **extra: Any) -> dict[str, Any]:
    name, bits, _ = COMPRESSORS[comp]
    workload = {"model": model, "dataset": "synthetic", "numel": MODELS[model][1]}
    compressor = {"compressor": comp, "compressor_name": name, "bits": bits, "simulated": False}
    setup = {"backend": "nccl", "scheme": "allreduce", "network": "unshaped", "world_size": ws}
    batch = {"batch_size": BATCH, "global_batch": BATCH * ws, "seed": 0, "repeat": 0}
    return {**workload, **compressor, **setup, **batch, **extra}


def add_run(store: ResultStore, run_id: str, lab: dict, rows: list | None, **rec: Any) -> None:
    store.write_record(RunRecord(run_id=run_id, status=rec.pop("status", "ok"), labels=lab,
                                 spec={}, **rec))  # fmt: skip
    if rows is not None:
        store.write_iterations(run_id, iterations_frame(rows))


def build(root: Path) -> ResultStore:
    store = ResultStore(root)
    for model in MODELS:
        for comp in COMPRESSORS:
            for ws in WORLD_SIZES:
                run_id = f"{model}-{comp}-w{ws}"
                add_run(store, run_id, labels(model, comp, ws), rows_for(run_id, model, comp, ws))
    # a faster fp32 configuration with another scheme: the baseline of vs fp32 (the fastest),
    # not of vs flat fp32 (allreduce first)
    lab = labels("cnn", "fp32", 4, scheme="reduce-broadcast")
    add_run(store, "cnn-fp32-rb-w4", lab, rows_for("cnn-fp32-rb-w4", "cnn", "fp32", 4, 0.5))
    lab = labels("mlp", "qsgd-4b-b512", 2, simulated=True)
    add_run(store, "mlp-sim-w2", lab, rows_for("mlp-sim-w2", "mlp", "qsgd-4b-b512", 2))
    add_run(store, "mlp-failed", labels("mlp", "1bit-b64", 4), None, status="failed",
            error="RuntimeError: NCCL watchdog timeout\nTraceback ...", exit_code=1)  # fmt: skip
    add_run(store, "mlp-corrupt", labels("mlp", "fp32", 2), None)
    store.iterations_path("mlp-corrupt").write_bytes(b"this is not parquet" * 10)
    for run_id, text in (("bad-json", "{not json"), ("bad-shape", "[1, 2]")):
        store.run_dir(run_id).mkdir()
        (store.run_dir(run_id) / "run.json").write_text(text)
    (root / "report").mkdir()  # an old report and stray files are not runs
    (root / "notes.txt").write_text("ignore me")
    return store


def expected_t_iteration(model: str, comp: str, ws: int, slow: float = 1.0) -> list[float]:
    """Per measured iteration: the slowest rank's total."""
    return [max(slow * sum(parts(model, comp, ws, r, it).values()) + 0.002 * r for r in range(ws))
            for it in range(WARMUP, WARMUP + MEASURED)]  # fmt: skip


def sps(model: str, comp: str, ws: int) -> float:
    return BATCH * ws / statistics.median(expected_t_iteration(model, comp, ws))


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("results")
    build(root)
    return root


@pytest.fixture(scope="module")
def summary(results_dir: Path) -> pd.DataFrame:
    return stats.summarize(stats.load(results_dir)).set_index("run_id", drop=False)


@pytest.fixture(scope="module")
def written(results_dir: Path) -> report.ReportPaths:
    return report.write_report(results_dir, fmt=None)


def test_per_iteration_max_over_ranks_mean_of_parts() -> None:
    frame = iterations_frame(rows_for("r", "mlp", "qsgd-4b-b512", 2))
    frame.loc[(frame["rank"] == 0) & (frame["iteration"] == 3), "t_iteration"] = 9.0
    per = stats.per_iteration(frame).set_index("iteration")
    assert list(per.index) == list(range(WARMUP, WARMUP + MEASURED))  # warm-up dropped
    assert per.loc[3, "t_iteration"] == 9.0  # rank 0 is the slow one here
    assert per.loc[2, "t_iteration"] == pytest.approx(
        expected_t_iteration("mlp", "qsgd-4b-b512", 2)[0]
    )
    compute = [parts("mlp", "qsgd-4b-b512", 2, r, 4)["t_compute"] for r in (0, 1)]
    assert per.loc[4, "t_compute"] == pytest.approx(sum(compute) / 2)
    assert per.loc[4, "bytes_sent"] == pytest.approx(500_000 + 0.5)
    assert set(per["ranks"]) == {2}


def test_the_summary_frame_holds_its_columns_and_a_plain_index(results_dir: Path) -> None:
    """summary.csv's columns, then the typed ones (stats.TYPED_COLUMNS), and nothing else: no
    index column left behind by the sort."""
    frame = stats.summarize(stats.load(results_dir))
    assert list(frame.columns) == [*stats.SUMMARY_COLUMNS, *stats.TYPED_COLUMNS]
    assert list(frame.index) == list(range(len(frame)))


def test_summary_times_ignore_warmup_and_use_slowest_rank(summary: pd.DataFrame) -> None:
    row = summary.loc["cnn-qsgd-4b-b512-w4"]
    expected = expected_t_iteration("cnn", "qsgd-4b-b512", 4)
    assert row["iterations"] == MEASURED
    assert row["t_iteration_median"] == pytest.approx(statistics.median(expected))
    assert row["t_iteration_p95"] == pytest.approx(pd.Series(expected).quantile(0.95))
    assert row["t_iteration_p95"] < 1.0  # the 500 s warm-up iterations are gone
    mean_compute = statistics.mean(0.040 + 0.001 * r for r in range(4)) * 1.04  # median: it 4
    assert row["t_compute"] == pytest.approx(mean_compute)
    assert row["t_encode"] == pytest.approx(0.002) and row["t_decode"] == pytest.approx(0.004)


def test_throughput_speedup_scalability(summary: pd.DataFrame) -> None:
    fast = BATCH * 4 / statistics.median(expected_t_iteration("cnn", "fp32", 4, slow=0.5))
    for model in MODELS:
        for comp in COMPRESSORS:
            for ws in WORLD_SIZES:
                row = summary.loc[f"{model}-{comp}-w{ws}"]
                assert row["samples_per_s"] == pytest.approx(sps(model, comp, ws))
                flat = sps(model, comp, ws) / sps(model, "fp32", ws)
                assert row["speedup_vs_flat_fp32"] == pytest.approx(flat)
                faster_rb = model == "cnn" and ws == 4  # the fastest fp32 is reduce-broadcast
                best = fast if faster_rb else sps(model, "fp32", ws)
                assert row["speedup_vs_fp32"] == pytest.approx(sps(model, comp, ws) / best)
                assert row["baseline"] == ("reduce-broadcast" if faster_rb else "allreduce")
                assert row["scalability"] == pytest.approx(
                    sps(model, comp, ws) / sps(model, comp, 1)
                )
    rb = summary.loc["cnn-fp32-rb-w4"]
    assert rb["speedup_vs_fp32"] == pytest.approx(1.0)  # it is the baseline
    assert rb["speedup_vs_flat_fp32"] == pytest.approx(fast / sps("cnn", "fp32", 4))


def test_bytes_and_compression_ratio(summary: pd.DataFrame) -> None:
    assert summary.loc["cnn-fp32-w2", "compression_ratio"] == pytest.approx(1.0)
    assert summary.loc["cnn-qsgd-4b-b512-w2", "compression_ratio"] == pytest.approx(8.0)
    assert summary.loc["mlp-1bit-b64-w4", "compression_ratio"] == pytest.approx(32.0)
    assert summary.loc["mlp-1bit-b64-w4", "bytes_per_iteration"] == pytest.approx(375_000 + 1.5)


def test_simulated_runs_are_labelled(summary: pd.DataFrame) -> None:
    row = summary.loc["mlp-sim-w2"]
    assert row["compressor"] == "qsgd-4b-b512 (simulated)"
    assert bool(row["simulated"]) and math.isnan(row["scalability"])  # no simulated 1-GPU run


def test_simulated_lines_are_dashed_and_hollow(summary: pd.DataFrame) -> None:
    """Read from the ``simulated`` column: a simulated speedup must never pass for a real one."""
    fig = plots.scalability_figure(summary.reset_index(drop=True))
    assert fig is not None
    lines = [ln for ax in fig.axes for ln in ax.get_lines() if "linear" not in ln.get_label()]
    sim = [ln for ln in lines if ln.get_label().endswith("(simulated)")]
    assert len(sim) == 1 and sim[0].get_linestyle() == "--"
    assert sim[0].get_markerfacecolor() == "white"
    assert len(lines) > 1 and all(ln.get_linestyle() == "-" for ln in lines if ln not in sim)


def test_broken_runs_are_reported_not_fatal(summary: pd.DataFrame) -> None:
    failed = summary.loc["mlp-failed"]
    assert failed["status"] == "failed" and failed["exit_code"] == 1
    assert failed["iterations"] == 0 and math.isnan(failed["samples_per_s"])
    corrupt = summary.loc["mlp-corrupt"]
    assert corrupt["status"] == stats.UNREADABLE and "iterations.parquet" in corrupt["error"]
    for run_id in ("bad-json", "bad-shape"):
        assert summary.loc[run_id, "status"] == stats.UNREADABLE
        assert summary.loc[run_id, "error"].startswith("run.json: ")
    assert "report" not in summary.index and len(summary) == 18 + 6


def test_write_report_files(written: report.ReportPaths) -> None:
    frame = pd.read_csv(written.summary_csv)
    assert list(frame.columns) == list(stats.SUMMARY_COLUMNS)
    md = written.summary_md.read_text()
    assert "## Failed runs" in md and "| mlp-failed | failed | 1 | RuntimeError: NCCL" in md
    assert "Traceback" not in md  # first line of the error only
    assert "QSGD 4-bit, bucket 512 (simulated)" in md  # names for people; CSV keeps labels
    assert "qsgd-4b-b512 (simulated)" in set(frame["compressor"])
    names = sorted(p.name for p in written.figures)
    assert names == ["breakdown.pdf", "breakdown.png", "scalability.pdf", "scalability.png"]
    assert all(p.stat().st_size > 1024 for p in written.figures) and not written.notes


@pytest.mark.parametrize("fmt", report.FORMATS)
def test_render_formats(written: report.ReportPaths, fmt: str) -> None:
    out = io.StringIO()
    with names.using(stats.load(written.summary_csv.parents[1]).names):  # as write_report does
        report.render(written.summary, fmt, out)
    text = out.getvalue()
    label = "QSGD 4-bit, bucket 512" if fmt == "md" else "qsgd-4b-b512"  # csv, json: labels
    assert fmt == "table" or (label in text and "mlp-failed" in text)
    if fmt == "json":
        assert len(json.loads(text)) == len(written.summary)
    if fmt == "table":
        assert "samples/s" in text and "failed" in text


def test_only_failed_runs_skip_figures(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    add_run(store, "f1", labels("mlp", "fp32", 2), None, status="timeout", exit_code=124)
    paths = report.write_report(tmp_path, fmt=None)
    assert paths.figures == () and len(paths.notes) == 2
    assert "| f1 | timeout | 124 |" in paths.summary_md.read_text()


def test_single_run_gets_figures(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    add_run(store, "one", labels("cnn", "1bit-b64", 2), rows_for("one", "cnn", "1bit-b64", 2))
    out = io.StringIO()
    paths = report.write_report(tmp_path, fmt="table", out=out)
    assert len(paths.figures) == 4 and "1-bit SGD, bucket 64" in out.getvalue()


def test_missing_or_empty_dir_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"does not exist.*qbench sweep"):
        report.write_report(tmp_path / "nope")
    (tmp_path / "report").mkdir()
    with pytest.raises(UserError, match=f"no runs found in {tmp_path}"):
        report.write_report(tmp_path)
    with pytest.raises(UserError, match="valid: csv, json, md, table"):
        report.write_report(tmp_path, fmt="html")


def test_report_does_not_import_torch() -> None:
    code = "import qbench.report, sys; assert 'torch' not in sys.modules, 'torch imported'"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_iterations_written_before_later_columns_still_load(tmp_path: Path) -> None:
    from qbench.records.schema import LATER_ITERATION_COLUMNS

    store = ResultStore(tmp_path)
    rows = rows_for("old", "mlp", "fp32", 1)
    add_run(store, "old", labels("mlp", "fp32", 1), None, status="ok")
    old = iterations_frame(rows).drop(columns=list(LATER_ITERATION_COLUMNS))
    store.write_iterations("old", old)
    results = stats.load(tmp_path)
    assert results.runs["status"].tolist() == ["ok"]
    assert results.iterations[list(LATER_ITERATION_COLUMNS)].isna().all().all()


def test_async_ps_rows_are_summarized_as_updates_and_rounds(tmp_path: Path) -> None:
    """async-ps rows are events: the server's updates (rank 0) and each worker's push-pull
    rounds; row i of one rank is unrelated to row i of another, so no max over ranks."""
    store = ResultStore(tmp_path)
    run_id, batch = "async", 16
    rows: list[dict[str, Any]] = []
    base = {"run_id": run_id, "loss": 1.0, "grad_bytes": 4000}
    for u in range(12):  # server: 2 warm-up updates, then 10 of 5 ms, 300 bytes down each
        rows.append({**base, "rank": 0, "iteration": u, "warmup": u < 2, "t_compute": 0.0,
                     "t_encode": 0.001, "t_comm": 0.003, "t_decode": 0.0005, "t_step": 0.0005,
                     "t_iteration": 9.0 if u < 2 else 0.005, "bytes_sent": 300,
                     "payload_bytes": 250})  # fmt: skip
    for w, n in ((1, 7), (2, 4)):  # two workers with different numbers of rounds
        for i in range(n):
            rows.append({**base, "rank": w, "iteration": i, "warmup": i < 1,
                         "t_compute": 0.002 * w, "t_encode": 0.001, "t_comm": 0.010,
                         "t_decode": 0.001, "t_step": 0.0, "t_iteration": 0.014 + 0.002 * w,
                         "bytes_sent": 1000, "payload_bytes": 1000})  # fmt: skip
    lab = labels("mlp", "fp32", 3, scheme="async-ps+staleness4", batch_size=batch,
                 global_batch=batch * 3)  # fmt: skip
    add_run(store, run_id, lab, rows)
    row = stats.summarize(stats.load(tmp_path)).set_index("run_id").loc[run_id]
    assert row["iterations"] == 10  # server updates after warm-up
    assert row["samples_per_s"] == pytest.approx(10 * batch / (10 * 0.005))
    worker_rounds = [0.016] * 6 + [0.018] * 3  # measured rounds of both workers
    assert row["t_iteration_median"] == pytest.approx(statistics.median(worker_rounds))
    # 0.95 quantile of the 9 rounds, linear between order statistics 7 and 8: both 0.018
    assert row["t_iteration_p95"] == pytest.approx(0.018)
    assert row["t_compute"] == pytest.approx(0.002)  # median over the 9 worker rounds
    assert row["bytes_per_iteration"] == pytest.approx(1000 + 300)  # push up + reply down
    assert row["compression_ratio"] == pytest.approx(4.0)  # the pushed gradient's


def test_broken_runs_name_the_file_and_the_error(summary: pd.DataFrame) -> None:
    assert summary.loc["bad-json", "error"] == (
        "run.json: JSONDecodeError: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)"
    )
    assert summary.loc["bad-shape", "error"].startswith("run.json: TypeError: ")
    assert stats._reason(ValueError("  first line\nsecond line")) == "ValueError: first line"
    assert stats._reason(KeyError()) == "KeyError: no message"


def test_iterations_missing_a_column_make_the_run_unreadable(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    add_run(store, "short", labels("mlp", "fp32", 1), None)
    frame = iterations_frame(rows_for("short", "mlp", "fp32", 1)).drop(columns=["t_step", "loss"])
    store.write_iterations("short", frame)
    runs = stats.load(tmp_path).runs.set_index("run_id")
    assert runs.loc["short", "status"] == stats.UNREADABLE
    assert (
        runs.loc["short", "error"] == "iterations.parquet: ValueError: missing columns t_step, loss"
    )


def test_the_directory_names_the_run_whatever_its_rows_say(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    add_run(store, "mine", labels("mlp", "fp32", 1), rows_for("copied", "mlp", "fp32", 1))
    results = stats.load(tmp_path)
    assert set(results.iterations["run_id"]) == {"mine"}
    assert results.iterations["run_id"].dtype == "string"  # the record schema's dtype
    assert stats.summarize(results).set_index("run_id").loc["mine", "iterations"] == MEASURED


def test_throughputs_give_per_iteration_intervals(results_dir: Path, summary: pd.DataFrame) -> None:
    tp = stats.throughputs(stats.load(results_dir), summary.reset_index(drop=True))
    got = tp.ratio(["mlp-fp32-w2"], ["mlp-fp32-w1"])
    assert got is not None and (got.n_num, got.n_base) == (MEASURED, MEASURED)
    # median of global batch / iteration time, over the median of the baseline's
    assert got.ratio == pytest.approx(sps("mlp", "fp32", 2) / sps("mlp", "fp32", 1), rel=1e-12)


def test_profiled_runs_payload_edges_and_older_labels(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    add_run(store, "traced", labels("mlp", "fp32", 1, profiled=True),
            rows_for("traced", "mlp", "fp32", 1))  # fmt: skip
    add_run(store, "traced-failed", labels("mlp", "fp32", 1, profiled=True), None,
            status="failed")  # fmt: skip
    for run_id, payload in (("empty", 0), ("one-byte", 1)):
        rows = [{**r, "payload_bytes": payload} for r in rows_for(run_id, "mlp", "fp32", 1)]
        add_run(store, run_id, labels("mlp", "fp32", 1), rows)
    table = stats.summarize(stats.load(tmp_path)).set_index("run_id")
    # measured but slowed by the profiler: shown, never compared; a failed one stays failed
    assert table.loc["traced", "status"] == stats.PROFILED
    assert table.loc["traced-failed", "status"] == "failed"
    # nothing sent: no ratio (not infinity); one byte: 4 MB of gradient over 1 byte
    assert math.isnan(table.loc["empty", "compression_ratio"])
    assert math.isnan(table.loc["empty", "bits_per_value"])
    assert table.loc["one-byte", "compression_ratio"] == 4 * MODELS["mlp"][1]
    assert table.loc["one-byte", "bits_per_value"] == 32 / (4 * MODELS["mlp"][1])
    # runs recorded before DDP have no overlap label: flat, "none"
    assert set(table["overlap"]) == {"none"}


def _async_rows(run_id: str, server_warm: bool, server_s: float) -> list[dict[str, Any]]:
    """Three server updates and three worker rounds of an async-ps run."""
    base = {"run_id": run_id, "loss": 1.0, "grad_bytes": 4000, "payload_bytes": 1000}
    base.update(dict.fromkeys(("t_compute", "t_encode", "t_comm", "t_decode", "t_step"), 0.0))
    server = [{**base, "rank": 0, "iteration": u, "warmup": server_warm,
               "t_iteration": server_s, "bytes_sent": 300} for u in range(3)]  # fmt: skip
    worker = [{**base, "rank": 1, "iteration": i, "warmup": False, "t_iteration": 0.02,
               "bytes_sent": 1000} for i in range(3)]  # fmt: skip
    return server + worker


def test_async_runs_without_measured_updates_have_no_metrics(tmp_path: Path) -> None:
    def summary_of(*runs: tuple[str, bool, float]) -> pd.DataFrame:
        store = ResultStore(tmp_path / str(len(list(tmp_path.iterdir()))))
        for run_id, warm, seconds in runs:
            lab = labels("mlp", "fp32", 2, scheme="async-ps+staleness4")
            add_run(store, run_id, lab, _async_rows(run_id, warm, seconds))
        return stats.summarize(stats.load(store.root)).set_index("run_id")

    # the server's updates all warm-up: no update was measured, so nothing is
    alone = summary_of(("idle", True, 0.005)).loc["idle"]
    assert alone["iterations"] == 0 and math.isnan(alone["samples_per_s"])
    both = summary_of(("idle", True, 0.005), ("busy", False, 0.005), ("instant", False, 0.0))
    assert math.isnan(both.loc["idle", "t_iteration_median"])  # not the workers' 0.02
    assert both.loc["busy", "samples_per_s"] == pytest.approx(3 * BATCH / (3 * 0.005))
    # updates that took no measurable time give no rate of updates (not an infinite one)
    assert math.isfinite(both.loc["instant", "samples_per_s"])


def test_bytes_per_level_are_medians_of_rank_means_and_nan_when_not_split(tmp_path: Path) -> None:
    """A hierarchical run records what each rank sent inside its node and between nodes; the
    summary's bytes_intra/inter_per_iteration are medians over measured iterations of the
    mean over ranks, like bytes_per_iteration; a run that did not split them has NaN."""
    store = ResultStore(tmp_path)
    rows = rows_for("h", "mlp", "qsgd-4b-b512", 2)
    for row in rows:  # rank 0 sends 100 + it^2 bytes inside, rank 1 300 + it^2; 10x between
        row["bytes_intra"] = 100.0 + 200 * row["rank"] + row["iteration"] ** 2
        row["bytes_inter"] = 10 * row["bytes_intra"]
    add_run(store, "h", labels("mlp", "qsgd-4b-b512", 2, scheme="hierarchical"), rows)
    add_run(store, "flat", labels("mlp", "fp32", 2), rows_for("flat", "mlp", "fp32", 2))
    table = stats.summarize(stats.load(tmp_path)).set_index("run_id")
    # measured iterations 2..6: rank means 200 + it^2 = 204, 209, 216, 225, 236 (mean 218)
    assert table.loc["h", "bytes_intra_per_iteration"] == 216.0
    assert table.loc["h", "bytes_inter_per_iteration"] == 2160.0
    assert math.isnan(table.loc["flat", "bytes_intra_per_iteration"])
    assert math.isnan(table.loc["flat", "bytes_inter_per_iteration"])
