"""Compute utilization against link rate (qbench.report.utilization, rounds, plots.utilization):
rounds of a periodic run, the ratio of sums and its interval, the rates needed, the figure."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from qbench.report import rounds, utilization
from qbench.report.plots import utilization as plot


def _per_it(run: str, period: int, times: list[float], computes: list[float],
            sent: list[int]) -> pd.DataFrame:  # fmt: skip
    n = len(times)
    frame = pd.DataFrame({
        "run_id": run, "iteration": range(10, 10 + n), "ranks": 2, "t_iteration": times,
        "t_compute": computes, "t_comm": [t - c for t, c in zip(times, computes, strict=True)],
        "bytes_sent": sent, rounds.PERIOD: period,
    })  # fmt: skip
    return frame


def test_a_periodic_run_becomes_its_complete_rounds_with_means_and_the_peak() -> None:
    """H 4 from iteration 10: iterations 10, 11 are the end of round 2 (cut by the warm-up) and
    are dropped; 12-15 and 16-19 are rounds; 20 starts an unfinished one. A run of period 1 is
    left as it is."""
    times = [1.0, 1.0, 1, 1, 1, 5, 2, 2, 2, 6, 9]
    sent = [0, 400, 0, 0, 0, 400, 0, 0, 0, 800, 0]
    periodic = _per_it("d", 4, times, [1.0] * 11, sent)
    flat = _per_it("f", 1, [3.0, 4.0], [1.0, 1.0], [10, 10])
    got = rounds.collapse(
        pd.concat([periodic, flat]), ("t_iteration",), ("t_compute", "bytes_sent")
    )
    d = got[got["run_id"] == "d"].set_index("iteration")
    assert list(d.index) == [12, 16]
    assert list(d["t_iteration"]) == [2.0, 3.0]  # (1+1+1+5)/4, (2+2+2+6)/4
    assert list(d["bytes_sent"]) == [100.0, 200.0] and list(d[rounds.PEAK]) == [400, 800]
    f = got[got["run_id"] == "f"]
    assert list(f["t_iteration"]) == [3.0, 4.0] and list(f[rounds.PEAK]) == [10, 10]
    assert rounds.PERIOD not in got


def test_utilization_is_a_ratio_of_sums_with_a_reproducible_interval() -> None:
    rows = _per_it("r", 1, [2.0, 4.0, 2.0, 4.0], [1.0, 1.0, 1.0, 1.0], [5, 5, 5, 5])
    rows[rounds.PEAK] = rows["bytes_sent"]
    got = utilization.per_run(rows.drop(columns=rounds.PERIOD)).iloc[0]
    assert got["utilization"] == pytest.approx(4 / 12)  # not the mean of ratios, 0.375
    assert got["low"] <= got["utilization"] <= got["high"]
    assert got["low"] >= 0.25 and got["high"] <= 0.5  # the ends of 1/4 and 1/2 per row
    again = utilization.per_run(rows.drop(columns=rounds.PERIOD)).iloc[0]
    assert (again["low"], again["high"]) == (got["low"], got["high"])


def test_the_rate_needed_is_interpolated_in_log_rate_and_its_ends_follow_the_interval() -> None:
    pts = pd.DataFrame({
        "bps": [1e8, 1e9, 1e10, math.nan], "utilization": [0.2, 0.6, 0.95, 0.99],
        "low": [0.1, 0.4, 0.9, 0.98], "high": [0.3, 0.8, 0.97, 1.0],
    })  # fmt: skip
    half = utilization.needed(pts, 0.5)
    assert half.rate == pytest.approx(10 ** (8 + 0.3 / 0.4))  # 0.2 -> 0.6 over one decade
    assert half.low == pytest.approx(10 ** (8 + 0.2 / 0.5))  # the high end reaches it first
    assert half.high == pytest.approx(10 ** (9 + 0.1 / 0.5))
    assert utilization.needed(pts, 0.99).rate is None  # loopback is no rate
    assert utilization.needed(pts, 0.99).text() == "beyond the rates measured"
    assert utilization.needed(pts, 0.1).rate == 1e8  # met at the slowest rate measured
    assert half.text().startswith("0.562 Gbit/s (95 % CI 0.251 Gbit/s to 1.58 Gbit/s)")


def test_the_figure_and_csv_come_with_two_link_rates(tmp_path) -> None:
    runs, per_it = [], []
    for i, (bps, compute) in enumerate([(1e8, 0.2), (1e9, 0.6)]):
        run = f"r{i}"
        rows = _per_it(run, 1, [1.0] * 4, [compute] * 4, [8] * 4).drop(columns=rounds.PERIOD)
        per_it.append(rows.assign(**{rounds.PEAK: rows["bytes_sent"]}))
        runs.append({"run_id": run, "status": "ok", "left_out": False, "model": "mlp",
                     "backend": "gloo", "world_size": 2, "precision": "fp32", "scheme": "ddp",
                     "compressor": "fp32", "link_bits_per_s": bps})  # fmt: skip
    paths = plot.write(pd.DataFrame(runs), pd.concat(per_it), tmp_path)
    assert sorted(p.name for p in paths) == ["utilization.pdf", "utilization.png"]
    table = pd.read_csv(tmp_path / plot.CSV)
    assert list(table["utilization"]) == pytest.approx([0.2, 0.6])
    assert table["bps_50"].iloc[0] == pytest.approx(10 ** (8 + 0.3 / 0.4))
    one_rate = pd.DataFrame(runs[:1])
    assert plot.write(one_rate, per_it[0], tmp_path / "none") == []


def test_the_period_is_h_for_the_schemes_that_exchange_every_h_steps() -> None:
    from qbench import catalog

    assert rounds.period(catalog.scheme({"name": "diloco", "H": 7})) == 7
    assert rounds.period(catalog.scheme({"name": "streaming-diloco", "H": 9})) == 9
    assert rounds.period(catalog.scheme({"name": "local-sgd", "H": 3})) == 3
    assert rounds.period(catalog.scheme({"name": "allreduce"})) == 1
    assert rounds.period(None) == 1  # a scheme this qbench cannot read


def test_per_run_rows_hold_every_column_and_skip_only_runs_without_time() -> None:
    """Runs in order; one with no wall time is skipped and the next still comes; the bytes a
    step sent on average and at peak, and the rows resampled."""
    a = _per_it("a", 1, [2.0, 2.0], [1.0, 1.0], [10, 30]).assign(**{rounds.PEAK: [10, 30]})
    dead = _per_it("b", 1, [0.0], [0.0], [0]).assign(**{rounds.PEAK: [0]})
    c = _per_it("c", 1, [4.0], [1.0], [8]).assign(**{rounds.PEAK: [8]})
    frame = pd.concat([c, dead, a]).drop(columns=rounds.PERIOD)
    got = utilization.per_run(frame)
    assert list(got.columns) == list(utilization.RUN_COLUMNS)
    assert list(got["run_id"]) == ["a", "c"]
    assert got.iloc[0][["n", "bytes_mean", "bytes_peak"]].tolist() == [2, 20.0, 30.0]
    assert got.iloc[1]["utilization"] == 0.25 and got.iloc[1]["low"] == got.iloc[1]["high"]
    assert list(utilization.per_run(frame.iloc[0:0]).columns) == list(utilization.RUN_COLUMNS)


def test_rounds_of_two_collapse_and_the_rows_are_renumbered() -> None:
    """Period 2 is periodic too; the rows come back indexed 0..n-1 with the ranks kept."""
    frame = _per_it("p", 2, [1.0, 3.0, 1.0, 5.0], [1.0] * 4, [0, 8, 0, 8]).assign(ranks=[2] * 4)
    frame.index = [7, 8, 9, 10]
    got = rounds.collapse(frame, ("t_iteration",), ("t_compute", "bytes_sent"))
    assert list(got.index) == [0, 1] and list(got["t_iteration"]) == [2.0, 3.0]
    assert list(got["ranks"]) == [2, 2] and rounds.PERIOD not in got
    flat = _per_it("f", 1, [1.0], [1.0], [4]).set_axis([5])
    assert rounds.PERIOD not in rounds.collapse(flat, ("t_iteration",), ("bytes_sent",))
