"""Fit a ``host: calibrated`` cluster's host values on its named measured cells.

Each calibration cell (a workload at K > 1 GPUs with a measured samples/s) gives one equation
in the four host values, linear in them once compute and codec are subtracted:

    batch / samples_per_s - compute - codec = S/stage + 2 (K-1) S/bus + (K-1) latency + fixed

solved by non-negative least squares on the relative residuals (each row divided by its
measured iteration time, so fast and slow workloads weigh alike). Four values, whatever the
number of cells: fewer free parameters than a fit per GPU count.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from qbench import catalog
from qbench.cluster import cells as cells_mod
from qbench.cluster import project
from qbench.cluster.declared import Cluster, Host
from qbench.cluster.study import Study
from qbench.errors import UserError


@dataclass(frozen=True)
class Fit:
    host: Host
    cells: pd.DataFrame
    """The calibration cells used (network, gpus, method, samples_per_s)."""


def fit(cluster: Cluster, study: Study) -> Fit:
    cal = cluster.calibration
    assert cal is not None, "fit() is for host: calibrated clusters"
    table = cells_mod.read(cal.cells, "calibration.cells")
    names = {w.name: w for w in study.workloads}
    chosen = table[fitted_on(cluster, table, cal.cells) & table["network"].isin(names)]
    if len(chosen) < 4:
        raise UserError(f"calibration: {len(chosen)} cell(s) of {cal.cells} match {dict(cal.use)} "
                        "for the study's workloads at 2 or more GPUs; four host values need at "
                        "least 4")  # fmt: skip
    rows, target = [], []
    kernels = project.kernels_of(cluster)
    for r in chosen.itertuples():
        w, k = names[r.network], int(r.gpus)
        b = project.local_parts(cluster, w, catalog.from_label(r.method), k, kernels)
        measured = b.batch / float(r.samples_per_s)
        s = b.payload_bytes
        rows.append(np.array([s, 2 * (k - 1) * s, k - 1, 1.0]) / measured)
        target.append((measured - b.compute_s - b.codec_s) / measured)
    theta = nnls(np.array(rows), np.array(target))
    stage, bus = (1 / t if t > 0 else math.inf for t in theta[:2])  # 0 s/byte: no cost found
    host = Host(stage=stage, bus=bus, latency=float(theta[2]), fixed=float(theta[3]))
    return Fit(host=host, cells=chosen[["network", "gpus", "method", "samples_per_s"]])


def host_of(cluster: Cluster, study: Study) -> tuple[Host | None, int]:
    """The host values a projection uses and the cells they were fitted on (0: declared, or no
    host for an NCCL cluster): fitted here for ``host: calibrated``."""
    if cluster.collective != "mpi-host" or cluster.host is not None:
        return cluster.host, 0
    result = fit(cluster, study)
    return result.host, len(result.cells)


def fitted_on(cluster: Cluster, cells: pd.DataFrame, source: str | Path) -> pd.Series:
    """Which rows of ``cells`` (read from ``source``) the host values are fitted on: those of
    the calibration file that match ``use``, at 2 or more GPUs. The same rows of any other file
    are an independent check, never marked fitted."""
    cal = cluster.calibration
    if cal is None or Path(cal.cells).resolve() != Path(source).resolve():
        return pd.Series(False, index=cells.index)
    return cells_mod.matching(cells, cal.use, "calibration.use") & (cells["gpus"] > 1)


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: the best of the unconstrained fits on each
    subset of columns whose coefficients are all non-negative (4 columns: 15 subsets)."""
    best, best_res = np.zeros(a.shape[1]), float(np.sum(y**2))
    for size in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), size):
            sub = np.linalg.lstsq(a[:, cols], y, rcond=None)[0]
            if np.any(sub < 0):
                continue
            theta = np.zeros(a.shape[1])
            theta[list(cols)] = sub
            res = float(np.sum((a @ theta - y) ** 2))
            if res < best_res:
                best, best_res = theta, res
    return best
