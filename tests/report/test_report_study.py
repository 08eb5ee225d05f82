"""Study figures (speedup vs MB/GFLOP, Pareto front), money columns and the report page, on
hand-written result directories (no ranks launched)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from qbench.records.schema import epochs_frame
from qbench.records.store import EPOCHS, ResultStore, atomic_write_parquet
from qbench.report import names, stats
from qbench.report import page as report_page
from qbench.report import tables as report
from qbench.report.plots import study as plots_study
from tests.paths import ROOT
from tests.report.test_report import add_run, labels, rows_for, sps

GFLOPS = 0.01  # forward GFLOPs per sample of both fixture models
PRICE = 3.6  # dollars per machine hour: 0.001 $/s per machine
TARGET = 0.8
# compressor -> (top-1 after each epoch, cumulative training seconds after each epoch)
CURVES = {
    "fp32": ([0.70, 0.85, 0.90], [10.0, 20.0, 30.0]),
    "qsgd-4b-b512": ([0.65, 0.82, 0.88], [6.0, 12.0, 18.0]),
    "1bit-b64": ([0.60, 0.75, 0.79], [5.0, 10.0, 15.0]),  # never reaches the target
}
HEADINGS = (
    "Does low precision help speed?", "Does it hurt accuracy?", "Is 1-bit worth it?",
    "MPI vs NCCL/Gloo", "How many ranks?", "What does it cost?", "Failed runs",
)  # fmt: skip


def add_epochs(store: ResultStore, run_id: str, top1: list[float], times: list[float]) -> None:
    rows = [
        {"run_id": run_id, "epoch": e + 1, "iteration": 10 * (e + 1), "train_time_s": t,
         "lr": 0.1, "train_loss": 1.0, "test_loss": 1.0, "top1": a, "top5": math.nan,
         "grad_norm": math.nan, "bytes_sent": 0, "consensus_distance": math.nan}
        for e, (a, t) in enumerate(zip(top1, times, strict=True))
    ]  # fmt: skip
    atomic_write_parquet(store.run_dir(run_id) / EPOCHS, epochs_frame(rows))


def iteration_run(store: ResultStore, model: str, comp: str, **extra: Any) -> None:
    run_id = f"{model}-{comp}" + ("-sim" if extra.get("simulated") else "")
    lab = labels(model, comp, 2, gflops_per_sample=GFLOPS, **extra)
    add_run(store, run_id, lab, rows_for(run_id, model, comp, 2, 0.8 if "sim" in run_id else 1))


def build(root: Path) -> ResultStore:
    """mlp (1M values) and cnn (4M values) at equal GFLOPs: two MB/GFLOP ratios; cnn runs on
    2 priced machines; an accuracy study on digits over two seeds; one failed run."""
    store = ResultStore(root)
    for comp in ("fp32", "qsgd-4b-b512"):
        iteration_run(store, "mlp", comp)
        iteration_run(store, "cnn", comp, price_per_hour=PRICE, nodes=2)
    iteration_run(store, "mlp", "qsgd-4b-b512", simulated=True, scheme="simulated-lowprec")
    for comp, (top1, times) in CURVES.items():
        for seed in (0, 1):
            run_id = f"acc-{comp}-s{seed}"
            lab = labels("mlp", comp, 2, dataset="digits", seed=seed, target_accuracy=TARGET,
                         price_per_hour=PRICE)  # fmt: skip
            add_run(store, run_id, lab, rows_for(run_id, "mlp", comp, 2))
            add_epochs(store, run_id, [a - 0.01 * seed for a in top1], times)
    add_run(store, "cnn-failed", labels("cnn", "1bit-b64", 2), None, status="failed",
            error="RuntimeError: boom\nTraceback ...", exit_code=1)  # fmt: skip
    return store


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("study")
    build(path)
    return path


@pytest.fixture(scope="module")
def results(root: Path) -> stats.Results:
    return stats.load(root)


@pytest.fixture(autouse=True)
def _named_by_the_results(root: Path) -> Iterator[None]:
    """Figures drawn by hand, as ``write_report`` draws them: named by what their runs
    recorded."""
    with names.using(stats.load(root).names):
        yield


@pytest.fixture(scope="module")
def summary(results: stats.Results) -> pd.DataFrame:
    return stats.summarize(results).set_index("run_id", drop=False)


@pytest.fixture(scope="module")
def written(root: Path) -> report.ReportPaths:
    return report.write_report(root, fmt=None)


def test_money_columns_by_hand(summary: pd.DataFrame) -> None:
    cnn = summary.loc["cnn-qsgd-4b-b512"]  # 2 machines x 3.6 $/h = 0.002 $/s
    assert cnn["cost_per_iteration"] == pytest.approx(0.002 * cnn["t_iteration_median"])
    assert math.isnan(cnn["cost_per_epoch"]) and math.isnan(cnn["cost_to_target"])
    fp32 = summary.loc["acc-fp32-s0"]  # nodes label missing: 1 machine, 0.001 $/s
    assert fp32["nodes"] == 1
    assert fp32["cost_per_epoch"] == pytest.approx(0.001 * 30.0 / 3)  # last cumulative / epochs
    assert fp32["cost_to_target"] == pytest.approx(0.001 * 20.0)  # 0.85 >= 0.8 after epoch 2
    assert math.isnan(summary.loc["acc-1bit-b64-s0", "cost_to_target"])  # never reached
    unpriced = summary.loc["mlp-fp32"]
    assert all(math.isnan(unpriced[c]) for c in stats.MONEY_COLUMNS)


def test_old_run_json_without_new_labels_loads(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    old = labels("mlp", "fp32", 2)  # no nodes, price_per_hour or gflops_per_sample
    add_run(store, "old", old, rows_for("old", "mlp", "fp32", 2))
    row = stats.summarize(stats.load(tmp_path)).iloc[0]
    assert row["nodes"] == 1 and math.isnan(row["price_per_hour"])
    assert math.isnan(row["gflops_per_sample"]) and math.isnan(row["cost_per_iteration"])


def test_comm_comp_ratio(summary: pd.DataFrame) -> None:
    ratio = plots_study.comm_comp_ratio(summary)
    assert ratio["mlp-fp32"] == pytest.approx(4.0 / (3 * GFLOPS * 32))  # 4 MB / 0.96 GFLOP
    assert ratio["cnn-fp32"] == pytest.approx(4 * ratio["mlp-fp32"])


def test_speedup_ratio_figure(summary: pd.DataFrame) -> None:
    fig = plots_study.speedup_ratio_figure(summary)
    assert fig is not None
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and "MB" in ax.get_xlabel() and "3 x" in ax.get_xlabel()
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(t.endswith("(simulated)") and "QSGD 4-bit" in t for t in texts)
    assert "allreduce · QSGD 4-bit · nccl · 2 ranks" in texts  # schemes vary: named
    assert "1x: fastest fp32 (allreduce)" in texts  # the baseline named
    bound = "QSGD 4-bit, bucket 512: 32/4 bits = 8x"  # far above speedups near 1: listed
    assert any(bound in t.get_text() for t in ax.texts)


def test_speedup_ratio_needs_two_ratios(summary: pd.DataFrame, tmp_path: Path) -> None:
    one_ratio = summary[summary["model"] == "mlp"]
    assert plots_study.speedup_ratio_figure(one_ratio) is None
    paths, notes = plots_study.write_study_figures(one_ratio, tmp_path)
    assert [p.name for p in paths] == ["pareto.png", "pareto.pdf"]
    assert len(notes) == 1 and "same MB/GFLOP ratio" in notes[0]
    no_flops = summary.drop(columns=["gflops_per_sample"])
    assert plots_study.speedup_ratio_figure(no_flops) is None


def test_pareto_front_by_hand() -> None:
    points = pd.DataFrame({"bits": [1.0, 4.0, 4.0, 8.0, 32.0], "time": [9.0, 5.0, 6.0, 7.0, 3.0]})
    front = plots_study.pareto_front(points, "time", lower_is_better=True)
    assert list(front.index) == [0, 1, 4]  # (4, 6) and (8, 7) are beaten by (4, 5)
    top1 = points.rename(columns={"time": "top1"})
    assert list(plots_study.pareto_front(top1, "top1", lower_is_better=False).index) == [0]


def test_pareto_figure_modes(summary: pd.DataFrame) -> None:
    fig = plots_study.pareto_figure(summary)
    assert fig is not None and "time to 80 % top-1" in fig.axes[0].get_ylabel()
    assert fig.axes[0].get_xscale() == "log"
    never = summary.assign(time_to_target_s=math.nan)
    fig = plots_study.pareto_figure(never)
    assert fig is not None and "no run reached its target" in fig.axes[0].get_ylabel()
    unset = never.assign(target_accuracy=math.nan)
    fig = plots_study.pareto_figure(unset)
    assert fig is not None and "no target_accuracy set" in fig.axes[0].get_ylabel()
    assert plots_study.pareto_figure(summary[~summary["run_id"].str.startswith("acc")]) is None
    assert plots_study.pareto_figure(summary.drop(columns=["final_top1"])) is None


def test_report_writes_figures_and_page(written: report.ReportPaths) -> None:
    names = {p.name for p in written.figures}
    assert {"speedup_ratio.png", "speedup_ratio.pdf", "pareto.png", "pareto.pdf"} <= names
    assert all(p.stat().st_size > 1024 for p in written.figures) and not written.notes
    assert written.page is not None and written.page.name == report_page.INDEX_HTML
    md = (written.page.parent / report_page.INDEX_MD).read_text()
    page = written.page.read_text()
    for heading in HEADINGS:
        assert f"## {heading}" in md and f'">{heading}</h2>' in page
        assert f'<a href="#{report_page.slug(heading)}">{heading}</a>' in page  # contents
    for name in ("speedup_ratio.png", "pareto.png", "breakdown.png", "accuracy.png"):
        stem = name.removesuffix(".png")
        assert f"]({name})" in md  # markdown: beside the files
        assert f'alt="figure {stem}"' in page and f'<a href="{stem}.pdf">PDF</a>' in page
    pngs = sum(p.suffix == ".png" for p in written.figures)
    assert page.count('src="data:image/png;base64,') == pngs  # one file: figures embedded
    assert 'src="' not in page.replace('src="data:', "")  # and nothing else loaded
    assert "<style>" in page and "<table" in page and "(simulated)" in md
    assert '<a href="summary.csv">summary.csv</a>' in page
    assert '<a href="../acc-fp32-s0/run.json">acc-fp32-s0</a>' in page
    assert 'id="provenance"' in page and "<dt>versions</dt>" in page
    assert "$/iter" in written.summary_md.read_text()  # a price was set


def test_page_sentences_come_from_the_numbers(written: report.ReportPaths) -> None:
    md = (written.page.parent / report_page.INDEX_MD).read_text()  # type: ignore[union-attr]
    # compressed multi-rank configurations, the simulated one left out: cnn QSGD 1.21x over
    # its fp32; mlp QSGD on synthetic data 0.99x with iterations scattered +-2 %; on digits,
    # two seeds with identical iterations: 1-bit 1.01x, QSGD 0.99x, intervals without width
    gain = sps("cnn", "qsgd-4b-b512", 2) / sps("cnn", "fp32", 2)
    assert (
        "Of 4 compressed multi-rank configurations, 2 are faster than their best uncompressed "
        "baseline beyond the noise (interval above 1), 1 slower beyond it and 1 within it." in md
    )
    assert (
        "the surest gain is allreduce · QSGD 4-bit on cnn / synthetic, nccl, 2 ranks, "
        f"unshaped: {gain:.2f}x (95 % CI " in md
    )
    assert "left out of the verdict too" in md  # the simulated row
    assert "4 of these 4 comparisons rest on fewer than 3 runs per side" in md
    drop = 100 * ((0.79 + 0.78) / 2 - (0.90 + 0.89) / 2)  # 1-bit vs fp32, means over seeds
    assert f"Largest change against fp32: {drop:+.2f} points" in md
    assert "Cheapest run to the target: $0.012 (allreduce · QSGD 4-bit" in md  # 0.001 $/s x 12 s
    assert "Only nccl was measured" in md and "1 of" in md and "RuntimeError: boom" in md


def test_only_failed_runs_still_report(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    add_run(store, "f1", labels("mlp", "fp32", 2), None, status="timeout", exit_code=124)
    paths = report.write_report(tmp_path, fmt=None)
    assert paths.figures == () and len(paths.notes) == 2  # breakdown and scalability notes
    assert paths.page is not None
    md = (paths.page.parent / report_page.INDEX_MD).read_text()
    assert "## Failed runs" in md and "| f1 | timeout | 124 |" in md
    assert "No compressed multi-rank run" in md and "$/iter" not in paths.summary_md.read_text()


def test_readme_accuracy_table_script(root: Path) -> None:
    """benchmarks/accuracy_table.py (the README's accuracy tables): one line per configuration,
    mean +/- std over the two seeds and the difference to fp32, in percent."""
    import importlib.util

    path = ROOT / "benchmarks" / "accuracy_table.py"
    spec = importlib.util.spec_from_file_location("accuracy_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = module.table(str(root)).splitlines()
    rows = {line.split(" | ")[1]: line for line in lines[2:]}
    assert set(rows) == set(CURVES)
    fp32, qsgd = CURVES["fp32"][0][-1], CURVES["qsgd-4b-b512"][0][-1]
    mean = lambda a: 100 * (a - 0.005)  # noqa: E731  (seeds 0 and 1: a and a - 0.01)
    assert f"| {mean(fp32):.2f} ± 0.71 | +0.00 |" in rows["fp32"]
    assert f"| {mean(qsgd):.2f} ± 0.71 | {mean(qsgd) - mean(fp32):+.2f} |" in rows["qsgd-4b-b512"]


def _precision_study(tmp_path: Path, runs: dict[str, tuple[dict[str, Any], float]]) -> pd.Series:
    """Accuracy runs of one workload, recorded with the typed settings ``precision`` is made of
    (run id -> (settings, final top-1)): each configuration's difference to its fp32 baseline,
    by the ``precision`` label the summary makes."""
    from qbench.report import accuracy

    store = ResultStore(tmp_path)
    for run_id, (settings, top1) in runs.items():
        lab = labels("mlp", "fp32", 4, dataset="digits", scheme="parameter-server", **settings)
        add_run(store, run_id, lab, rows_for(run_id, "mlp", "fp32", 4))
        add_epochs(store, run_id, [top1], [1.0])
    table = accuracy.table(stats.summarize(stats.load(tmp_path))).set_index("precision")
    return table["diff_vs_fp32"]


def test_quantized_weights_compare_with_fp32_weights(tmp_path: Path) -> None:
    """seed 000 section 5.4: a `weights: {bits: N}` configuration's difference is to the same
    workload with fp32 communication and fp32 weights, not to itself."""
    runs = {"fp32": ({}, 0.90), "w8": ({"weight_bits": 8}, 0.89), "w6": ({"weight_bits": 6}, 0.70)}
    diff = _precision_study(tmp_path, runs)
    assert diff.to_dict() == pytest.approx({"fp32": 0.0, "fp32+w8": -0.01, "fp32+w6": -0.20})


def test_shared_rounding_runs_compare_with_their_real_fp32_baseline(tmp_path: Path) -> None:
    """Issue 44: ``fp32+w8+shared-rounding`` was its own baseline (a regex stripped ``+w8`` only
    at the end of the label). Its baseline is fp32 with fp32 weights (nothing else rounds, so
    that run records no rounding); int8's rounds, so int8 with shared draws compares with int8
    with shared draws, not with per-rank draws."""
    shared = {"rounding": "shared"}
    runs = {
        "fp32": ({}, 0.90),
        "fp32-w8-shared": ({"weight_bits": 8, **shared}, 0.86),
        "int8": ({"compute": "int8"}, 0.80),
        "int8-shared": ({"compute": "int8", **shared}, 0.84),
        "int8-w8-shared": ({"compute": "int8", "weight_bits": 8, **shared}, 0.83),
    }
    assert _precision_study(tmp_path, runs).to_dict() == pytest.approx({
        "fp32": 0.0, "fp32+w8+shared-rounding": -0.04, "int8": 0.0,
        "int8+shared-rounding": 0.0, "int8+w8+shared-rounding": -0.01,
    })  # fmt: skip


def test_accuracy_figure_keeps_precisions_apart(tmp_path: Path) -> None:
    """Runs that differ by compute precision are separate lines (with the precision in the
    label), never one mean over both."""
    from qbench.report.plots import accuracy as plots_accuracy

    store = ResultStore(tmp_path)
    for compute, top1 in (("fp32", [0.5, 0.9]), ("int8", [0.3, 0.6])):
        run_id = f"cnn-{compute}"
        lab = labels("mlp", "fp32", 2, dataset="digits", compute=compute)
        add_run(store, run_id, lab, rows_for(run_id, "mlp", "fp32", 2))
        add_epochs(store, run_id, top1, [1.0, 2.0])
    results = stats.load(tmp_path)
    fig = plots_accuracy.accuracy_figure(stats.summarize(results), results.epochs)
    assert fig is not None
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in fig.axes[0].get_lines()}
    assert lines == {
        "allreduce · fp32 · fp32": pytest.approx([50.0, 90.0]),
        "allreduce · fp32 · int8": pytest.approx([30.0, 60.0]),
    }


def test_breakdown_keeps_precisions_apart(tmp_path: Path) -> None:
    """The breakdown shows what the compute precision did to compute time: one bar each."""
    from qbench.report import plots

    store = ResultStore(tmp_path)
    for compute, slow in (("fp32", 1.0), ("int8", 2.0)):
        run_id = f"mlp-{compute}"
        add_run(store, run_id, labels("mlp", "fp32", 2, compute=compute),
                rows_for(run_id, "mlp", "fp32", 2, slow))  # fmt: skip
    fig = plots.breakdown_figure(stats.summarize(stats.load(tmp_path)))
    assert fig is not None
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert sorted(ticks) == ["fp32 · fp32", "fp32 · int8"]
