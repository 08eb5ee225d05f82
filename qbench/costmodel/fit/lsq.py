"""Least squares for the fits: non-negative, weighted, with the quality of the fit.

Each measured comm phase gives one point (msgs, wire bytes per call, seconds) and alpha,
beta >= 0 come from a least-squares fit of ``t = msgs * alpha + wire * beta`` per (backend,
network, collective); at K = 2 that is ``t = 2 alpha + wire * beta``. On emulated links each
call is charged ``max(0, wire * beta - credit)`` and the credit is fitted with them
(``fit_collective``). Residuals are weighted by 1 / sqrt(t) (``WEIGHT_POWER``: noise variance
taken proportional to the time, between relative errors, which let the latency-bound smallest
sizes decide, and absolute ones, which let the largest decide); R^2 is reported on the
unweighted times. Codec phases are fitted the same way, ``t = c0 + c1 * units``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from qbench.costmodel.formulas import comm_time

_RELATIVE_FLOOR_S = 1e-6


WEIGHT_POWER = 0.5
"""Least-squares rows are weighted by 1 / t ** WEIGHT_POWER (1: relative errors, 0: absolute)."""


@dataclass(frozen=True)
class Quality:
    r2: float
    points: int
    rel_err_median: float
    rel_err_max: float


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns: the best feasible solution over every
    subset of active columns (exact for NNLS; fine for 2 columns)."""
    p = x.shape[1]
    best, best_res = np.zeros(p), float(np.sum(y**2))
    for mask in itertools.product((False, True), repeat=p):
        cols = [i for i in range(p) if mask[i]]
        if not cols:
            continue
        sol = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
        if np.any(sol < 0):
            continue
        coef = np.zeros(p)
        coef[cols] = sol
        res = float(np.sum((x @ coef - y) ** 2))
        if res < best_res - 1e-30:
            best, best_res = coef, res
    return best


def fit_linear(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, Quality]:
    """Coefficients >= 0 of ``t = x @ coef`` by least squares with rows weighted by
    1 / t ** WEIGHT_POWER; R^2 on the unweighted times and the relative errors of the points."""
    x = np.asarray(x, dtype=float)
    t = np.asarray(t, dtype=float)
    w = 1 / np.maximum(t, _RELATIVE_FLOOR_S) ** WEIGHT_POWER
    coef = nnls(x * w[:, None], t * w)
    pred = x @ coef
    ss_res = float(np.sum((pred - t) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-30 else 0.0)
    pos = t > 0
    rel = np.abs(pred[pos] / t[pos] - 1) if pos.any() else np.zeros(1)
    return coef, Quality(r2, len(t), float(np.median(rel)), float(np.max(rel)))


def fit_collective(
    msgs: np.ndarray, calls: Sequence[Sequence[float]], t: np.ndarray, credit_max: float
) -> tuple[float, float, float, Quality]:
    """(alpha, beta, credit) of ``t = msgs alpha + sum_calls max(0, wire beta - credit)``,
    alpha, beta >= 0, 0 <= credit <= credit_max, by weighted least squares (``fit_linear``).

    For a fixed credit the calls that outlast it are linear in alpha and beta: iterate NNLS on
    that active set until it settles; the credit comes from a grid refined around its best."""
    msgs = np.asarray(msgs, dtype=float)
    t = np.asarray(t, dtype=float)
    w = 1 / np.maximum(t, _RELATIVE_FLOOR_S) ** WEIGHT_POWER

    def pred(alpha: float, beta: float, credit: float) -> np.ndarray:
        return np.array(
            [comm_time(alpha, beta, credit, m, c) for m, c in zip(msgs, calls, strict=True)]
        )

    def solve(credit: float) -> tuple[float, float, float, float]:
        beta = math.inf  # every call active first
        best = (math.inf, 0.0, 0.0)
        for _ in range(25):
            active = [[x for x in c if x * beta > credit] for c in calls]
            x = np.array([[m, sum(a)] for m, a in zip(msgs, active, strict=True)])
            y = t + credit * np.array([len(a) for a in active])
            alpha, new_beta = nnls(x * w[:, None], y * w)
            err = float(np.sum(((pred(alpha, new_beta, credit) - t) * w) ** 2))
            if err < best[0]:
                best = (err, float(alpha), float(new_beta))
            if new_beta == beta:
                break
            beta = new_beta
        return best[0], best[1], best[2], credit

    def best(tried: list[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
        # Where every call outlasts the credit, credit and alpha trade off exactly (at one K):
        # among equally good fits the smallest credit wins.
        low = min(f[0] for f in tried)
        return min((f for f in tried if f[0] <= low * (1 + 1e-9) + 1e-24), key=lambda f: f[3])

    if credit_max <= 0:
        found = solve(0.0)
    else:
        found = best([solve(float(c)) for c in np.linspace(0.0, credit_max, 21)])
        step = credit_max / 20
        lo, hi = max(0.0, found[3] - step), min(credit_max, found[3] + step)
        found = best([found, *(solve(float(c)) for c in np.linspace(lo, hi, 21))])
    _, alpha, beta, credit = found
    p = pred(alpha, beta, credit)
    ss_res = float(np.sum((p - t) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-30 else 0.0)
    pos = t > 0
    rel = np.abs(p[pos] / t[pos] - 1) if pos.any() else np.zeros(1)
    return alpha, beta, credit, Quality(r2, len(t), float(np.median(rel)), float(np.max(rel)))
