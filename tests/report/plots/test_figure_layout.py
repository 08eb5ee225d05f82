"""Every figure type, rendered from fixture results, keeps its text legible: no two text boxes
overlap, none leaves the figure, text drawn in a panel stays inside it, no legend sits on the
data, and labels are names for people, not machine labels (issue 23 items 4 and 5).

Extents come from matplotlib's renderer (``Text.get_window_extent``), in display pixels of the
figure as saved, so the test sees what a reader sees.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from qbench import catalog
from qbench.records.view import RunSpecs
from qbench.report import names, plots, stats
from qbench.report.plots import accuracy as plots_accuracy
from qbench.report.plots import study as plots_study
from qbench.report.plots import utility as plots_utility
from qbench.report.plots import utilization as plots_utilization
from qbench.spec.network import Link
from tests.report import test_report, test_report_study
from tests.report.plots import test_utility

VOCABULARY = names.Vocabulary()
"""What this file's hand-made labels stand for, as ``stats.load`` learns a results directory's."""


@pytest.fixture(autouse=True)
def _named_by_this_files_vocabulary() -> Iterator[None]:
    with names.using(VOCABULARY):
        yield


TOLERANCE = 1.0  # pixels: boxes that merely touch are fine


def _render(fig: Figure) -> object:
    with matplotlib.rc_context(plots.STYLE):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        return canvas.get_renderer()


def _texts(fig: Figure) -> list[Text]:
    undrawn = {id(t) for ax in fig.axes for t in _undrawn_tick_labels(ax)}
    found = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return [t for t in found if _shown(t) and id(t) not in undrawn]


def _undrawn_tick_labels(ax: Axes) -> list[Text]:
    """Labels of ticks outside the view: matplotlib keeps them but does not draw them."""
    out = []
    for axis in (ax.xaxis, ax.yaxis):
        low, high = sorted(axis.get_view_interval())
        span = (high - low) * 1e-9
        for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
            if not low - span <= tick.get_loc() <= high + span:
                out += [tick.label1, tick.label2]
    return out


def _shown(artist: Text) -> bool:
    """Visible all the way up (a hidden axes' tick labels are not drawn)."""
    node: object = artist
    while node is not None:
        if hasattr(node, "get_visible") and not node.get_visible():
            return False
        node = getattr(node, "axes", None) if node is not getattr(node, "axes", None) else None
    return artist.axes is None or artist.axes.get_visible()


def _legends(fig: Figure) -> list[Legend]:
    return [lg for lg in fig.findobj(Legend) if lg.get_visible()]


def _overlap(a: Bbox, b: Bbox) -> bool:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return width > TOLERANCE and height > TOLERANCE


def _inside(inner: Bbox, outer: Bbox) -> bool:
    return (inner.x0 >= outer.x0 - TOLERANCE and inner.y0 >= outer.y0 - TOLERANCE
            and inner.x1 <= outer.x1 + TOLERANCE and inner.y1 <= outer.y1 + TOLERANCE)  # fmt: skip


def _data_points(ax: Axes) -> np.ndarray:
    """Display coordinates of every marker and line vertex drawn in ``ax``."""
    points = [np.empty((0, 2))]
    for line in ax.get_lines():
        xy = line.get_xydata()
        if len(xy) and line.get_visible():
            points.append(ax.transData.transform(np.asarray(xy, dtype=float)))
    for collection in ax.collections:
        offsets = collection.get_offsets()
        if len(offsets) and collection.get_visible():
            points.append(collection.get_offset_transform().transform(offsets))
    stacked = np.concatenate(points)
    return stacked[np.isfinite(stacked).all(axis=1)]


def layout_problems(fig: Figure) -> list[str]:
    """Every legibility problem of ``fig``, in words (empty: none)."""
    renderer = _render(fig)
    texts = _texts(fig)
    box = {id(t): t.get_window_extent(renderer) for t in texts}
    legends = _legends(fig)
    in_legend = {id(t) for lg in legends for t in [*lg.get_texts(), lg.get_title()]}
    problems = []
    for t in texts:
        if not _inside(box[id(t)], fig.bbox):
            problems.append(f"{t.get_text()!r} leaves the figure")
        if t.axes is not None and t in t.axes.texts and not _inside(box[id(t)], t.axes.bbox):
            problems.append(f"{t.get_text()!r} leaves its panel")
    for a, b in itertools.combinations(texts, 2):
        if _overlap(box[id(a)], box[id(b)]):
            problems.append(f"{a.get_text()!r} overlaps {b.get_text()!r}")
    for lg in legends:
        frame = lg.get_window_extent(renderer)
        for t in texts:
            if id(t) not in in_legend and _overlap(frame, box[id(t)]):
                problems.append(f"the legend covers {t.get_text()!r}")
        axes = [lg.axes] if lg.axes is not None and lg.parent is lg.axes else fig.axes
        for ax in axes:
            if not ax.get_visible():
                continue
            pts = _data_points(ax)
            hit = (pts[:, 0] > frame.x0) & (pts[:, 0] < frame.x1) & (pts[:, 1] > frame.y0) & (
                pts[:, 1] < frame.y1)  # fmt: skip
            if hit.any():
                problems.append(f"a legend covers {int(hit.sum())} data points")
    return problems


def machine_labels(fig: Figure) -> list[str]:
    """Texts that still show catalog labels (qsgd-4b-b512, reduce-broadcast+backward)."""
    pattern = r"qsgd-\d+b|1bit-b|\+backward|\+topology|\+algorithm|fixed-\d+b|topk-"
    return [t.get_text() for t in _texts(fig) if pd.Series([t.get_text()]).str.contains(
        pattern).iloc[0]]  # fmt: skip


# -- fixtures -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def speed(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    root = tmp_path_factory.mktemp("speed")
    test_report.build(root)
    return stats.summarize(_learned(stats.load(root)))


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, pd.DataFrame]:
    root = tmp_path_factory.mktemp("study")
    test_report_study.build(root)
    results = _learned(stats.load(root))
    return stats.summarize(results), results.epochs


def _utility_summary() -> pd.DataFrame:
    """test_utility's summary, with what its labels stand for (learned in its file's
    vocabulary) added to this file's."""
    summary = test_utility._summary()
    for mine, theirs in ((VOCABULARY.compressors, test_utility.VOCABULARY.compressors),
                         (VOCABULARY.schemes, test_utility.VOCABULARY.schemes),
                         (VOCABULARY.links, test_utility.VOCABULARY.links)):  # fmt: skip
        mine.update(theirs)
    return summary


def _learned(results: stats.Results) -> stats.Results:
    """``results`` with what their labels stand for added to this file's vocabulary."""
    VOCABULARY.compressors.update(results.names.compressors)
    VOCABULARY.schemes.update(results.names.schemes)
    VOCABULARY.links.update(results.names.links)
    return results


def crowded_accuracy() -> tuple[pd.DataFrame, pd.DataFrame]:
    """seed 002's Pareto panel as it went wrong: eight configurations, two schemes, one
    compressor under both, close bits and times, one that never reaches the target."""
    configs = [  # scheme, compressor, name, bits sent, time to target (nan: never), top-1
        ("reduce-broadcast", "qsgd-2b-b512", "qsgd", 2.06, 31.0, 0.84),
        ("reduce-broadcast", "qsgd-4b-b512", "qsgd", 4.06, 30.0, 0.86),
        ("reduce-broadcast", "qsgd-8b-b512", "qsgd", 8.06, 29.0, 0.87),
        ("allreduce", "fp32", "none", 32.0, 28.0, 0.88),
        ("gossip+algorithmchoco+topologyring", "qsgd-2b-b512", "qsgd", 2.07, math.nan, 0.70),
        ("gossip+algorithmchoco+topologyring", "qsgd-4b-b512", "qsgd", 4.07, 33.0, 0.83),
        ("gossip+algorithmchoco+topologyring", "qsgd-8b-b512", "qsgd", 8.07, 32.5, 0.85),
        ("gossip+algorithmchoco+topologyring", "fp32", "none", 32.0, 32.0, 0.86),
    ]
    rows, epochs = [], []
    for i, (scheme, comp, name, bits, time, top1) in enumerate(configs):
        # a summary made by hand: its labels learned as stats.load learns recorded specs
        specs = RunSpecs(catalog.from_label(comp), catalog.scheme_from_label(scheme), Link())
        VOCABULARY.learn({"scheme": scheme, "compressor": comp}, specs)
        for seed in (0, 1):
            run_id = f"r{i}-s{seed}"
            rows.append({
                "run_id": run_id, "status": "ok", "model": "resnet20", "dataset": "cifar10",
                "backend": "gloo", "scheme": scheme, "compressor": comp, "compressor_name": name,
                "world_size": 8, "skew": 0.0, "precision": "fp32", "bits_per_value": bits,
                "final_top1": top1 - 0.005 * seed, "time_to_target_s": time + seed,
                "simulated": False, "target_accuracy": 0.8,
            })  # fmt: skip
            for epoch in range(1, 6):
                epochs.append({"run_id": run_id, "epoch": epoch,
                               "top1": top1 * (1 - 0.5 ** epoch) - 0.005 * seed})  # fmt: skip
    return pd.DataFrame(rows), pd.DataFrame(epochs)


def _utilization() -> Figure | None:
    """Compute utilization of DDP and DiLoCo's family, whose names run past a panel's width
    (a one-column legend of them was cut at both edges of the figure)."""
    methods = [
        ("ddp", "fp32"), ("ddp", "bf16"),
        ("diloco+H50+exchangereduce-broadcast", "qsgd-2b-b128-ef"),
        ("streaming-diloco+H50+alpha0.5+delay1+exchangereduce-broadcast+fragments2", "mxfp4"),
    ]  # fmt: skip
    panel = {"model": "gpt", "backend": "gloo", "world_size": 4, "precision": "replay"}
    summary, points = [], []
    for i, (scheme, comp) in enumerate(methods):
        specs = RunSpecs(catalog.from_label(comp), catalog.scheme_from_label(scheme), Link())
        VOCABULARY.learn({"scheme": scheme, "compressor": comp}, specs)
        summary.append({**panel, "run_id": f"u{i}", "status": "ok", "scheme": scheme,
                        "compressor": comp, "compressor_name": specs.compressor.name})  # fmt: skip
        for bps, u in ((1e7, 0.1 + 0.2 * i), (1e8, 0.3 + 0.15 * i), (1e9, 0.8), (math.nan, 0.9)):
            points.append({**panel, "scheme": scheme, "compressor": comp, "bps": bps,
                           "utilization": u, "low": u - 0.02, "high": u + 0.02})  # fmt: skip
    return plots_utilization.figure(pd.DataFrame(points), pd.DataFrame(summary))


FIGURES: dict[str, Callable[..., Figure | None]] = {
    "breakdown": lambda speed, study: plots.breakdown_figure(speed),
    "scalability": lambda speed, study: plots.scalability_figure(speed),
    "speedup_ratio": lambda speed, study: plots_study.speedup_ratio_figure(study[0]),
    "pareto": lambda speed, study: plots_study.pareto_figure(study[0]),
    "pareto (crowded)": lambda speed, study: plots_study.pareto_figure(crowded_accuracy()[0]),
    "accuracy": lambda speed, study: plots_accuracy.accuracy_figure(*study),
    "accuracy (crowded)": lambda speed, study: plots_accuracy.accuracy_figure(
        *crowded_accuracy()),
    "utility": lambda speed, study: plots_utility.utility_figure(_utility_summary()),
    "utilization": lambda speed, study: _utilization(),
}  # fmt: skip


@pytest.mark.parametrize("name", FIGURES)
def test_figure_text_is_legible(
    name: str, speed: pd.DataFrame, study: tuple[pd.DataFrame, pd.DataFrame]
) -> None:
    with matplotlib.rc_context(plots.STYLE):
        fig = FIGURES[name](speed, study)
    assert fig is not None, f"{name}: the fixture should draw this figure"
    assert layout_problems(fig) == []
    assert machine_labels(fig) == []


def test_the_checker_sees_collisions() -> None:
    """The checks fail on a figure made to break them: overlapping labels, a label outside its
    panel, a legend on the data."""
    fig = Figure(figsize=(4, 3))
    ax = fig.subplots()
    ax.plot([0, 1, 2], [0, 1, 2], "o", label="points")
    ax.text(1, 1, "first label")
    ax.text(1, 1, "second label")
    ax.text(2.5, 1, "outside", clip_on=False)
    ax.set_xlim(0, 2)
    ax.legend(loc="center")
    problems = layout_problems(fig)
    assert any("overlaps" in p for p in problems)
    assert any("'outside' leaves its panel" in p for p in problems)
    assert any("legend covers" in p and "data points" in p for p in problems)
    fig2 = Figure()
    fig2.subplots().set_title("qsgd-4b-b512 / reduce-broadcast+backward")
    assert machine_labels(fig2) == ["qsgd-4b-b512 / reduce-broadcast+backward"]


def test_a_wrapped_name_keeps_its_spaces_and_breaks_after_commas_and_dots() -> None:
    name = "DiLoCo, H 50, outer lr 0.7 · MXFP4"
    assert plots.wrap_label(name, 20) == "DiLoCo, H 50,\nouter lr 0.7 · MXFP4"
    assert plots.wrap_label(name, 40) == name
