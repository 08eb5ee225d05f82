"""Every series of every figure can be told apart (issue 31 item 10): over the figures of each
shipped scenario, on synthetic results of exactly the runs its matrix expands to
(``tests/shipped_results.py``), no two legend entries share a look (colour, marker, line
style), no two marked series of one panel share one either, and each of those series has its
legend entry. Titles that promise a band or error bars say when there was only one seed.

A look is read back from the matplotlib artists the figure functions built, so the test sees
what a reader sees, whatever code chose it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from matplotlib.artist import Artist
from matplotlib.colors import to_hex
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from qbench.report import plots, stats
from qbench.report.plots import accuracy as plots_accuracy
from qbench.report.plots import study as plots_study
from qbench.report.plots import utility as plots_utility
from tests import shipped_results

SCENARIOS = [*shipped_results.SHIPPED, shipped_results.DEFAULT]
FIGURES: dict[str, Callable[[pd.DataFrame, pd.DataFrame], Figure | None]] = {
    "breakdown": lambda summary, epochs: plots.breakdown_figure(summary),
    "scalability": lambda summary, epochs: plots.scalability_figure(summary),
    "speedup_ratio": lambda summary, epochs: plots_study.speedup_ratio_figure(summary),
    "pareto": lambda summary, epochs: plots_study.pareto_figure(summary),
    "accuracy": plots_accuracy.accuracy_figure,
    "utility": lambda summary, epochs: plots_utility.utility_figure(summary),
}
SPREAD = ("accuracy", "pareto")
"""Figures whose title promises a spread over seeds (a band, error bars)."""

Look = tuple[str, str, str]


def look(artist: Artist) -> Look:
    """(colour, marker, line style) of a legend handle or a drawn line; a patch has no marker."""
    if isinstance(artist, Line2D):
        return (to_hex(artist.get_color()), str(artist.get_marker()), artist.get_linestyle())
    assert isinstance(artist, Patch), f"unexpected legend handle {artist!r}"
    return (to_hex(artist.get_facecolor()), "patch", "patch")


def figures(root: Path) -> dict[str, Figure]:
    results = stats.load(root)
    summary = stats.summarize(results)
    with matplotlib.rc_context(plots.STYLE):
        built = {name: build(summary, results.epochs) for name, build in FIGURES.items()}
    return {name: fig for name, fig in built.items() if fig is not None}


def shared_looks(fig: Figure) -> list[str]:
    """Every pair of legend entries, or of marked series in one panel, that look alike, and
    every marked series without a legend entry of its look (empty: none)."""
    problems = []
    legend: dict[Look, list[str]] = {}
    for lg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
        for handle, text in zip(lg.legend_handles, lg.get_texts(), strict=True):
            assert handle is not None
            legend.setdefault(look(handle), []).append(text.get_text())
    problems += [f"legend entries {labels} share {key}" for key, labels in legend.items()
                 if len(labels) > 1]  # fmt: skip
    for ax in fig.axes:
        caps = {id(c) for ct in ax.containers if isinstance(ct, ErrorbarContainer) for c in ct[1]}
        series = [ln for ln in ax.get_lines() if id(ln) not in caps]
        marked = [look(ln) for ln in series if ln.get_marker() not in ("None", "", " ")]
        problems += [f"{n} series of {ax.get_title()!r} share {key}"
                     for key, n in Counter(marked).items() if n > 1]  # fmt: skip
        problems += [f"a series of {ax.get_title()!r} drawn as {key} has no legend entry"
                     for key in set(marked) - set(legend)]  # fmt: skip
    return problems


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_series_of_shipped_scenarios_can_be_told_apart(path: Path, tmp_path: Path) -> None:
    """As `make figures` runs them (seed 0): every figure's series have looks of their own, and
    a title that would promise a spread says there was one seed."""
    root = shipped_results.write(tmp_path, shipped_results.runs(path, ("seed=0",)))
    drawn = figures(root)
    assert "breakdown" in drawn  # every scenario measures iterations
    problems = {name: shared_looks(fig) for name, fig in drawn.items()}
    assert problems == {name: [] for name in drawn}
    for name in SPREAD:
        if name in drawn:
            title = drawn[name].get_suptitle()
            assert "one seed" in title and "std" not in title, title


@pytest.fixture(scope="module")
def seed002(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Figure]:
    """seed 002's accuracy scenario at its 3 seeds."""
    path = shipped_results.REPO / "scenarios" / "paper" / "seed002-cnn-qsgd.yaml"
    specs = shipped_results.runs(path, ("seed=[0, 1, 2]",))
    return figures(shipped_results.write(tmp_path_factory.mktemp("seed002"), specs))


def test_titles_count_the_seeds(seed002: dict[str, Figure]) -> None:
    for name in SPREAD:
        title = seed002[name].get_suptitle()
        assert "mean over 3 seeds" in title and "+/- 1 std" in title, title


def test_spread_note_counts_runs_per_configuration() -> None:
    """Configurations of 1 and 3 runs; runs that differ by repeat are not called seeds."""
    runs = pd.DataFrame({"run_id": ["a0", "b0", "b1", "b2"], "config": ["a", "b", "b", "b"],
                         "repeat": [0, 0, 0, 0]})  # fmt: skip
    note = plots.spread_note(runs, ["config"], "point", "bars")
    assert note == "mean over 1-3 seeds, bars: +/- 1 std where 2 or more"
    assert plots.spread_note(runs[runs["config"] == "b"], ["config"], "point", "bars") == (
        "mean over 3 seeds, bars: +/- 1 std")  # fmt: skip
    assert plots.spread_note(runs.iloc[:1], ["config"], "line", "band") == (
        "one seed per line, so no band")  # fmt: skip
    repeated = runs.assign(repeat=[0, 0, 1, 2])
    assert plots.spread_note(repeated, ["config"], "point", "bars").startswith("mean over 1-3 runs")


def test_a_configuration_looks_the_same_in_every_figure(seed002: dict[str, Figure]) -> None:
    """The accuracy and Pareto figures name configurations alike; each keeps its look."""
    looks = []
    for name in SPREAD:
        (legend,) = seed002[name].legends
        texts = [t.get_text().split(" (never reached")[0] for t in legend.get_texts()]
        looks.append({t: look(h)[:2] for t, h in zip(texts, legend.legend_handles, strict=True)
                      if h is not None})  # fmt: skip
    accuracy, pareto = looks
    assert len(accuracy) > 1 and accuracy.keys() <= pareto.keys()  # one line per configuration
    assert accuracy == {t: pareto[t] for t in accuracy}


def test_the_checker_sees_shared_looks() -> None:
    """Two legend entries drawn alike, and a panel whose two series look alike, are found."""
    fig = Figure()
    ax = fig.subplots()
    ax.plot([1, 2], [1, 2], "o-", color="#1f77b4", label="a")
    ax.plot([1, 2], [2, 3], "o-", color="#1f77b4", label="b")
    ax.plot([1, 2], [3, 4], "s-", color="#1f77b4")  # drawn, no legend entry
    fig.legend(handles=ax.get_lines()[:2])
    problems = shared_looks(fig)
    assert any("legend entries ['a', 'b'] share" in p for p in problems)
    assert any("2 series of '' share" in p for p in problems)
    assert any("has no legend entry" in p for p in problems)
