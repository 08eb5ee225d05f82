"""The utility figure (speedup over DDP fp32 against bandwidth) from a hand-made summary."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from qbench import catalog
from qbench.records.view import RunSpecs
from qbench.report import names
from qbench.report.plots import utility as plots_utility
from qbench.spec import network

VOCABULARY = names.Vocabulary()
"""What this file's hand-made labels stand for, as ``stats.load`` learns a results directory's."""


@pytest.fixture(autouse=True)
def _named_by_this_files_vocabulary() -> Iterator[None]:
    with names.using(VOCABULARY):
        yield


# samples/s per (network, scheme, compressor): DDP fp32 is 100 everywhere; QSGD flat is 50 on
# loopback, 100 at 1 Gbit/s and 200 at 100 Mbit/s, so it crosses 1x at exactly 1 Gbit/s.
SPS = {
    ("unshaped", "ddp", "fp32", "none"): 100.0,
    ("1gbit", "ddp", "fp32", "none"): 100.0,
    ("100mbit", "ddp", "fp32", "none"): 100.0,
    ("unshaped", "reduce-broadcast", "qsgd-4b-b512", "qsgd"): 50.0,
    ("1gbit", "reduce-broadcast", "qsgd-4b-b512", "qsgd"): 100.0,
    ("100mbit", "reduce-broadcast", "qsgd-4b-b512", "qsgd"): 200.0,
    ("unshaped", "ddp", "fp16", "fp16"): 90.0,
    ("1gbit", "ddp", "fp16", "fp16"): 110.0,
    ("100mbit", "ddp", "fp16", "fp16"): 150.0,
}


def _summary() -> pd.DataFrame:
    """The summary, its labels learned as ``stats.load`` learns a run's recorded specs."""
    for net, scheme, comp, _ in SPS:
        specs = RunSpecs(catalog.from_label(comp), catalog.scheme_from_label(scheme),
                         network.option(net))  # fmt: skip
        VOCABULARY.learn({"network": net, "scheme": scheme, "compressor": comp}, specs)
    rows = [
        {"model": "vgg16-cifar", "dataset": "synthetic", "backend": "gloo", "world_size": 2,
         "precision": "fp32", "network": net, "scheme": scheme, "compressor": comp,
         "compressor_name": name, "status": "ok", "samples_per_s": sps,
         # the typed columns stats makes from each run's spec (records.view.columns)
         "link_bits_per_s": network.option(net).bits_per_s or math.nan,
         "backward": scheme == "ddp"}
        for (net, scheme, comp, name), sps in SPS.items()
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_speedups_are_over_ddp_fp32_of_the_same_link() -> None:
    rows = plots_utility.utility_rows(_summary())
    got = rows.set_index(["compressor", "bps"], drop=False)["vs_ddp"]
    assert got[("fp16", 1e8)] == pytest.approx(1.5)
    assert got[("qsgd-4b-b512", 1e9)] == pytest.approx(1.0)
    loop = rows[(rows["compressor"] == "qsgd-4b-b512") & rows["bps"].isna()]["vs_ddp"]
    assert list(loop) == [0.5]


def test_crossover_interpolates_in_log_bandwidth() -> None:
    points = pd.DataFrame({"bps": [1e8, 1e9, 1e10], "vs_ddp": [2.0, 1.5, 0.5]})
    # between 1e9 (1.5) and 1e10 (0.5): halfway in log10 -> 10 ** 9.5
    assert plots_utility.crossover(points) == pytest.approx(10**9.5)
    assert plots_utility.crossover(points.assign(vs_ddp=[2.0, 1.5, 1.2])) is None
    with_loopback = pd.DataFrame({"bps": [math.nan, 1e8], "vs_ddp": [0.2, 3.0]})
    assert plots_utility.crossover(with_loopback) is None  # loopback has no rate to cross at


def test_the_figure_is_written(tmp_path: Path) -> None:
    paths = plots_utility.write_utility_figure(_summary(), tmp_path)
    assert sorted(p.name for p in paths) == ["utility.pdf", "utility.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_no_figure_without_two_link_rates() -> None:
    one_link = _summary()[lambda s: s["network"] != "100mbit"]
    assert plots_utility.utility_figure(one_link) is None


def test_lines_the_baseline_and_their_styles_come_from_the_specs() -> None:
    """DDP fp32 is the dashed 1x line, not a series; DDP fp16 is sent per bucket (solid), flat
    QSGD after backward (dashed)."""
    fig = plots_utility.utility_figure(_summary())
    assert fig is not None
    lines = [ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]
    styles = {ln.get_label(): ln.get_linestyle() for ln in lines}  # "_child": 1x, crossovers
    assert styles == {"DDP fp16": "-", "reduce-broadcast · QSGD 4-bit": "--"}
