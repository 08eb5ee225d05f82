"""Predicted against measured: every cell of a published table that the study covers, each
marked ``calibration`` (the cluster's host values were fitted on it) or ``predicted`` (never
used to fit anything), with its error; the summary the issue's targets are stated in; and the
error band a projection carries (:func:`band`), taken from the predicted cells only."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from qbench import catalog
from qbench.cluster import calibrate, project
from qbench.cluster import cells as cells_mod
from qbench.cluster.declared import Cluster, Host
from qbench.cluster.study import Study
from qbench.errors import UserError

WITHIN = 0.15
BAND_QUANTILES = (0.1, 0.9)


def table(cluster: Cluster, study: Study, published: str | Path, host: Host | None) -> pd.DataFrame:
    """One row per published cell the study covers: its measured and predicted samples/s,
    the breakdown, the signed error (predicted - measured) / measured and its role."""
    cells = cells_mod.read(published, "--against")
    names = {w.name: w for w in study.workloads}
    labels = {m.label: m for m in study.methods}
    covered = cells[cells["network"].isin(names) & cells["method"].isin(labels)
                    & cells["gpus"].isin(study.gpus)]  # fmt: skip
    if covered.empty:
        raise UserError(
            f"--against: no cell of {published} has a workload, method and GPU count of the "
            "study; check the CSV's network, method and gpus columns"
        )
    covered = covered.assign(fitted=calibrate.fitted_on(cluster, covered, published))
    kernels = project.kernels_of(cluster)
    out = []
    for r in covered.itertuples():
        k = int(r.gpus)
        b = project.predict(cluster, names[r.network], labels[r.method], k, host, kernels)
        measured = float(r.samples_per_s)
        role = "calibration" if r.fitted else ("baseline" if k == 1 else "predicted")
        out.append({"workload": r.network, "gpus": k, "method": r.method, "measured": measured,
                    "predicted": b.samples_per_s, "error": (b.samples_per_s - measured) / measured,
                    "role": role, "compute_s": b.compute_s, "codec_s": b.codec_s,
                    "comm_s": b.comm_s})  # fmt: skip
    return pd.DataFrame(out)


@dataclass(frozen=True)
class Summary:
    group: str
    cells: int
    median_abs: float
    within: int
    worst: float

    def line(self) -> str:
        return (
            f"{self.group}: {self.cells} predicted cells, median |error| "
            f"{self.median_abs:.1%}, {self.within} within {WITHIN:.0%}, worst {self.worst:.0%}"
        )


def summaries(rows: pd.DataFrame) -> list[Summary]:
    """Over the predicted cells: each compressor family apart (qsgd, onebit, ...), then all."""
    pred = rows[rows["role"] == "predicted"]
    if pred.empty:
        return []
    family = pred["method"].map(lambda m: catalog.from_label(m).name)
    groups = [(name, pred[family == name]) for name in sorted(set(family))] + [("all", pred)]
    out = []
    for name, part in groups:
        errs = part["error"].abs().tolist()
        out.append(Summary(group=name, cells=len(errs), median_abs=statistics.median(errs),
                           within=sum(e <= WITHIN for e in errs), worst=max(errs)))  # fmt: skip
    return out


def band(rows: pd.DataFrame, source: str) -> dict[str, Any]:
    """The error band of the predicted cells: the 10th and 90th percentiles of the signed error.
    A projection's measured value then lies, for 8 in 10 such cells, in
    ``[predicted / (1 + high), predicted / (1 + low)]``."""
    pred = rows[rows["role"] == "predicted"]["error"]
    low, high = (float(pred.quantile(q)) for q in BAND_QUANTILES)
    return {"schema": "qbench.project.band/1", "source": source, "cells": len(pred),
            "quantiles": list(BAND_QUANTILES), "low": low, "high": high,
            "median_abs": float(pred.abs().median())}  # fmt: skip


def write_band(doc: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


@dataclass(frozen=True)
class Band:
    low: float
    high: float
    cells: int
    source: str

    def range(self, predicted: float) -> tuple[float, float]:
        return predicted / (1 + self.high), predicted / (1 + self.low)


def read_band(path: str) -> Band:
    try:
        doc = json.loads(Path(path).read_text())
        return Band(low=float(doc["low"]), high=float(doc["high"]), cells=int(doc["cells"]),
                    source=str(doc["source"]))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"band: {path} is not a band file; write one with `qbench project "
                        "CLUSTER STUDY --against CELLS.csv --band-out FILE`") from None  # fmt: skip
