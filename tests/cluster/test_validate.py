"""Calibration and validation kept apart (issue 46, item 4): host values fitted on the named
cells only, recovered exactly from cells a known host made; the predicted cells never among
them; the summary and the band computed from the predicted cells alone."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench import catalog
from qbench.cluster import calibrate, project, validate
from qbench.cluster.declared import Calibration, Cluster, Codec, Compute, Device, Host
from qbench.cluster.study import Study, Workload
from qbench.errors import UserError
from qbench.spec.codec_times import SCHEMA

TRUE = Host(stage=2e9, bus=6e9, latency=4e-3, fixed=9e-3)
GPUS = (1, 2, 4, 8)
WORKLOADS = (
    Workload(name="big", params=50_000_000, tensors=20, batch={k: 128 for k in GPUS}),
    Workload(name="small", params=2_000_000, tensors=200, batch={k: 32 * k for k in GPUS}),
)
CODEC = Codec(encode=1e9, decode=1e9, launch=5e-6)
QSGD = catalog.compressor({"name": "qsgd", "bits": 4, "bucket_size": 512})
STUDY = Study(name="s", gpus=(1, 2, 4, 8), workloads=WORKLOADS, methods=(catalog.FP32, QSGD))


def _cluster(cells: Path) -> Cluster:
    compute = {"big": Compute(0.5, 128, "stated"), "small": Compute(0.1, 32, "stated")}
    device = Device("d", compute=compute, codec=CODEC)
    return Cluster(name="p", nodes=1, devices_per_node=8, device=device, collective="mpi-host",
                   host=None, calibration=Calibration(str(cells), {"method": "fp32"}))  # fmt: skip


def _cells(tmp_path: Path, host: Host, qsgd_off: float = 0.0) -> Path:
    """Cells a machine with ``host`` measured (QSGD's off by ``qsgd_off``, relative)."""
    return _cells_of(_cluster(tmp_path / "cells.csv"), tmp_path, host, qsgd_off)


def _cells_of(cluster: Cluster, tmp_path: Path, host: Host, qsgd_off: float = 0.0) -> Path:
    rows = []
    for w in WORKLOADS:
        for k in STUDY.gpus:
            for m in STUDY.methods:
                if m is QSGD and k == 1:
                    continue
                sps = project.predict(cluster, w, m, k, host).samples_per_s
                if m is QSGD:
                    sps *= 1 + qsgd_off
                rows.append({"network": w.name, "gpus": k, "method": m.label,
                             "samples_per_s": sps})  # fmt: skip
    path = tmp_path / "cells.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_the_fit_recovers_the_host_that_made_the_cells(tmp_path: Path) -> None:
    cluster = _cluster(_cells(tmp_path, TRUE))
    fit = calibrate.fit(cluster, STUDY)
    got = fit.host
    assert got.stage == pytest.approx(TRUE.stage, rel=1e-6)
    assert got.bus == pytest.approx(TRUE.bus, rel=1e-6)
    assert got.latency == pytest.approx(TRUE.latency, rel=1e-6)
    assert got.fixed == pytest.approx(TRUE.fixed, rel=1e-6)
    # fitted on the fp32 cells at 2 or more GPUs only: 2 workloads x 3 counts
    assert sorted(set(fit.cells["method"])) == ["fp32"] and len(fit.cells) == 6


A = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


def test_the_fit_never_goes_negative() -> None:
    # y = 2 x0 - 1 x1 fits exactly, but the second coefficient must stay >= 0: the best with
    # x1 = 0 is the least-squares x0 of (1, 0, 1) x0 = (2, -1, 1), 1.5
    assert calibrate.nnls(A, np.array([2, -1, 1])) == pytest.approx([1.5, 0.0])
    # here the first column alone goes negative (skipped), the second alone is best, both
    # together go negative too: x = (0, 1.25), residual 5.125 (more than sum(2y) = 1)
    assert calibrate.nnls(A, np.array([-2, 2, 0.5])) == pytest.approx([0.0, 1.25])
    # nothing fits better than zero
    assert calibrate.nnls(A, np.array([-1.0, -1.0, -2.0])) == pytest.approx([0.0, 0.0])


def test_validation_predicts_what_it_did_not_fit_on(tmp_path: Path) -> None:
    cells = _cells(tmp_path, TRUE, qsgd_off=0.10)  # the "real" QSGD is 10 % faster
    cluster = _cluster(cells)
    host = calibrate.fit(cluster, STUDY).host
    rows = validate.table(cluster, STUDY, cells, host)
    roles = rows.groupby("role")["method"].agg(lambda s: sorted(set(s)))
    assert roles.to_dict() == {"baseline": ["fp32"], "calibration": ["fp32"],
                               "predicted": ["qsgd-4b-b512"]}  # fmt: skip
    pred = rows[rows["role"] == "predicted"]
    # predicted / measured - 1 = 1 / 1.1 - 1 in every predicted cell, none in the others
    assert pred["error"].to_numpy() == pytest.approx(1 / 1.1 - 1, rel=1e-6)
    assert rows[rows["role"] != "predicted"]["error"].abs().max() < 1e-9
    (summary_qsgd, summary_all) = validate.summaries(rows)
    assert (summary_qsgd.group, summary_qsgd.cells, summary_qsgd.within) == ("qsgd", 6, 6)
    assert summary_qsgd.median_abs == pytest.approx(1 - 1 / 1.1, rel=1e-6)
    assert summary_all.cells == 6
    band = validate.band(rows, "test")
    assert band["cells"] == 6 and band["low"] == pytest.approx(1 / 1.1 - 1, rel=1e-6)
    # the band turns a prediction into the range the measured value fell in
    b = validate.Band(low=band["low"], high=band["high"], cells=6, source="test")
    assert b.range(100.0) == pytest.approx((110.0, 110.0), rel=1e-6)


def test_a_fit_on_compressed_cells_subtracts_their_codec(tmp_path: Path) -> None:
    cells = _cells(tmp_path, TRUE)
    cluster = dataclasses.replace(_cluster(cells), calibration=Calibration(
        cells=str(cells), use={"method": QSGD.label}))  # fmt: skip
    got = calibrate.fit(cluster, STUDY).host
    assert (got.stage, got.bus) == (pytest.approx(TRUE.stage), pytest.approx(TRUE.bus))
    assert (got.latency, got.fixed) == (pytest.approx(TRUE.latency), pytest.approx(TRUE.fixed))


def test_a_fit_on_cells_coded_by_a_kernels_file(tmp_path: Path) -> None:
    """With the device's codec measured (a kernels file), the fit subtracts those times."""
    rows = [{"compressor": QSGD.label, "op": op, "numel": n, "seconds": n * per,
             "copy_seconds": n * 1e-10} for op, per in (("encode", 1e-9), ("decode", 2e-9))
            for n in (1_000_000, 100_000_000)]  # fmt: skip
    (tmp_path / "k.json").write_text(json.dumps({"schema": SCHEMA, "device": "cpu", "rows": rows}))
    cluster = _cluster(tmp_path / "cells.csv")
    device = dataclasses.replace(cluster.device, codec=Codec(kernels=str(tmp_path / "k.json")))
    cluster = dataclasses.replace(cluster, device=device, calibration=Calibration(
        cells=str(tmp_path / "cells.csv"), use={"method": QSGD.label}))  # fmt: skip
    cells = _cells_of(cluster, tmp_path, TRUE)
    got = calibrate.fit(cluster, STUDY).host
    assert (got.stage, got.bus) == (pytest.approx(TRUE.stage), pytest.approx(TRUE.bus))
    assert (got.latency, got.fixed) == (pytest.approx(TRUE.latency), pytest.approx(TRUE.fixed))
    # and the validation predicts with the same codec times: every cell exact
    rows_ = validate.table(cluster, STUDY, cells, got)
    assert rows_["error"].abs().max() < 1e-6 and (rows_["codec_s"] > 0).any()


def test_calibration_mistakes_are_one_line(tmp_path: Path) -> None:
    missing = _cluster(tmp_path / "nope.csv")
    with pytest.raises(UserError, match=r"^calibration\.cells: .*nope\.csv cannot be read"):
        calibrate.fit(missing, STUDY)
    cells = _cells(tmp_path, TRUE)
    odd = dataclasses.replace(_cluster(cells), calibration=Calibration(str(cells), {"x": 1}))
    with pytest.raises(UserError, match=r"^calibration\.use: no column 'x'; the cells have "):
        calibrate.fit(odd, STUDY)
    other = tmp_path / "other.csv"
    pd.DataFrame([{"network": "z", "gpus": 2, "method": "fp32", "samples_per_s": 1.0}]).to_csv(
        other, index=False)  # fmt: skip
    with pytest.raises(UserError) as e:
        validate.table(_cluster(cells), STUDY, other, TRUE)
    assert str(e.value) == (f"--against: no cell of {other} has a workload, method and GPU "
                            "count of the study; check the CSV's network, method and gpus "
                            "columns")  # fmt: skip


def test_exactly_four_cells_fit(tmp_path: Path) -> None:
    cells = _cells(tmp_path, TRUE)
    four = pd.read_csv(cells)
    four = four[(four["method"] == "fp32") & (four["gpus"] > 1)].iloc[:4]
    four.to_csv(tmp_path / "four.csv", index=False)
    cluster = _cluster(tmp_path / "four.csv")
    assert len(calibrate.fit(cluster, STUDY).cells) == 4


def test_the_validation_table_covers_the_studys_cells_only(tmp_path: Path) -> None:
    cells = _cells(tmp_path, TRUE)
    extra = pd.DataFrame([
        {"network": "other", "gpus": 2, "method": "fp32", "samples_per_s": 1.0},
        {"network": "big", "gpus": 2, "method": "bf16", "samples_per_s": 1.0},
        {"network": "big", "gpus": 16, "method": "fp32", "samples_per_s": 1.0},
    ])  # fmt: skip
    pd.concat([pd.read_csv(cells), extra]).to_csv(tmp_path / "more.csv", index=False)
    rows = validate.table(_cluster(cells), STUDY, tmp_path / "more.csv", TRUE)
    assert list(rows.columns) == ["workload", "gpus", "method", "measured", "predicted", "error",
                                  "role", "compute_s", "codec_s", "comm_s"]  # fmt: skip
    assert len(rows) == 2 * (4 + 3) and set(rows["workload"]) == {"big", "small"}
    with pytest.raises(UserError) as e:
        validate.table(_cluster(cells), STUDY, tmp_path / "none.csv", TRUE)
    assert "--against: " in str(e.value) and "cannot be read as CSV" in str(e.value)


def test_the_summary_counts_a_cell_at_15_percent_as_within() -> None:
    rows = pd.DataFrame({"role": ["predicted"] * 4 + ["calibration"],
                         "method": ["qsgd-4b-b512", "qsgd-2b-b128", "1bit-b64", "1bit-b64", "fp32"],
                         "error": [0.15, -0.15, 0.2, -0.05, 0.9]})  # fmt: skip
    (onebit, qsgd, every) = validate.summaries(rows)
    assert (qsgd.group, qsgd.cells, qsgd.within, qsgd.worst) == ("qsgd", 2, 2, pytest.approx(0.15))
    assert (onebit.group, onebit.within, onebit.worst) == ("onebit", 1, pytest.approx(0.2))
    assert (every.group, every.cells, every.within) == ("all", 4, 3)
    assert every.median_abs == pytest.approx(0.15)
    assert every.line() == "all: 4 predicted cells, median |error| 15.0%, 3 within 15%, worst 20%"


def test_the_band_file_round_trips(tmp_path: Path) -> None:
    rows = pd.DataFrame({"role": ["predicted"] * 11, "method": ["fp32"] * 11,
                         "error": [i / 100 for i in range(-5, 6)]})  # fmt: skip
    doc = validate.band(rows, "src")
    assert doc == {"schema": "qbench.project.band/1", "source": "src", "cells": 11,
                   "quantiles": [0.1, 0.9], "low": pytest.approx(-0.04),
                   "high": pytest.approx(0.04), "median_abs": pytest.approx(0.03)}  # fmt: skip
    validate.write_band(doc, tmp_path / "b.json")
    text = (tmp_path / "b.json").read_text()
    assert text.endswith("}\n") and '\n  "cells": 11,\n' in text
    assert validate.read_band(str(tmp_path / "b.json")) == validate.Band(
        low=doc["low"], high=doc["high"], cells=11, source="src"
    )


def test_cells_of_another_file_are_all_predicted(tmp_path: Path) -> None:
    """Calibration cells are those of the calibration file: the same rows in another file
    (an independent check) are predicted, not marked as fitted."""
    cells = _cells(tmp_path, TRUE)
    cluster = _cluster(cells)
    other = tmp_path / "other.csv"
    other.write_bytes(cells.read_bytes())
    rows = validate.table(cluster, STUDY, other, TRUE)
    assert "calibration" not in set(rows["role"])


def test_too_few_calibration_cells_is_one_line(tmp_path: Path) -> None:
    cells = _cells(tmp_path, TRUE)
    cluster = dataclasses.replace(_cluster(cells), calibration=Calibration(
        cells=str(cells), use={"method": "qsgd-4b-b512", "network": "big"}))  # fmt: skip
    with pytest.raises(Exception, match=r"3 cell\(s\) of .* match .* four host values need"):
        calibrate.fit(cluster, STUDY)
