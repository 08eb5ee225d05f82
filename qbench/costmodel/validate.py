"""Predicted against measured: bench comm rows and sweep runs, with the error.

``error = predicted / measured - 1``. Runs that differ only in seed or repeat are one row, the
median over them (``runs``). Rows whose measurement the fit used are marked ``in_fit``; the
summary covers only the others (the target: |error| <= 15 %). DDP runs (``ddp``, ``+backward``)
are predicted by ``qbench.costmodel.overlap``; their comm, measured and predicted, is the part
exposed after backward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from qbench.costmodel.config import Config, Prediction
from qbench.costmodel.fit.points import run_config
from qbench.costmodel.inputs import (
    bench_compressor,
    bench_key,
    bench_link,
    bench_scheme,
    comm_rows,
    float_or_nan,
    load_input,
    row_bits,
    run_key,
    run_table,
)
from qbench.costmodel.model import CostModel
from qbench.costmodel.predict import predict
from qbench.errors import UserError

TARGET_ERROR = 0.15


VALIDATION_COLUMNS = (
    *("source", "kind", "backend", "network", "world_size", "scheme", "compressor", "numel"),
    *("workload", "measured_s", "predicted_s", "error", "measured_comm_s", "predicted_comm_s"),
    *("runs", "in_fit", "notes"),
)


def validate_comm(model: CostModel, doc: Any, source: str) -> pd.DataFrame:
    """Predicted vs measured time of every bench comm row the model can predict (one aggregation,
    no compute): error = predicted / measured - 1. All ranks of a bench launch share the host
    its ``machine.cores`` describes, so codec times scale by max(1, K / cores)."""
    used = set(model.used)
    machine = doc.get("machine") if isinstance(doc.get("machine"), dict) else None
    cores = machine.get("cores") if machine else None
    out = []
    for r in comm_rows(doc, source):
        try:
            cfg = Config(
                scheme=bench_scheme(r), compressor=bench_compressor(r), bits_per_value=row_bits(r),
                backend=r["backend"], network=bench_link(r), world_size=int(r["world_size"]),
                numel=int(r["bytes"]) // 4, compute_s=0.0, step_s=0.0,
                host_cores=cores if isinstance(cores, int) and cores > 0 else None,
            )  # fmt: skip
            p = predict(model, cfg)
        except UserError as e:
            model_note = str(e)
            out.append(_vrow(source, "bench", r, None, float(r["time_s"]), None, model_note,
                             bench_key(r) in used))  # fmt: skip
            continue
        out.append(_vrow(source, "bench", r, p, float(r["time_s"]), float_or_nan(r.get("t_comm_s")),
                         "; ".join(p.notes), bench_key(r) in used))  # fmt: skip
    return pd.DataFrame(out, columns=list(VALIDATION_COLUMNS))


def validate_runs(model: CostModel, root: Path | str) -> pd.DataFrame:
    """Predicted vs measured median iteration time of every configuration of a results
    directory: runs that differ only in seed or repeat are one row, measured = the median over
    them (``runs``), so that run-to-run noise on a shared machine averages out."""
    rows = _validate_each_run(model, root)
    if not rows:
        return pd.DataFrame(columns=list(VALIDATION_COLUMNS))
    groups: dict[Any, list[dict[str, Any]]] = {}
    for key, row in rows:
        groups.setdefault(key, []).append(row)
    out = []
    for members in groups.values():
        first = dict(members[0])
        measured = float(np.median([m["measured_s"] for m in members]))
        comm = float(np.median([m["measured_comm_s"] for m in members]))
        pred = first["predicted_s"]
        first.update(
            measured_s=measured, measured_comm_s=comm, runs=len(members),
            error=pred / measured - 1 if measured > 0 else math.nan,
            in_fit=any(m["in_fit"] for m in members),
        )  # fmt: skip
        out.append(first)
    return pd.DataFrame(out, columns=list(VALIDATION_COLUMNS))


def _validate_each_run(model: CostModel, root: Path | str) -> list[tuple[Any, dict[str, Any]]]:
    """(configuration key, validation row) per ok run."""
    table = run_table(root)
    used = set(model.used)
    out: list[tuple[Any, dict[str, Any]]] = []
    for r in table.itertuples(index=False):
        labels = {
            "backend": r.backend, "network": r.network, "world_size": int(r.world_size),
            "scheme": r.scheme, "compressor": r.compressor, "bytes": 4 * int(r.grad_bytes // 4),
            "workload": r.workload,
        }  # fmt: skip
        got = run_config(r, model)
        in_fit = run_key(str(r.run_id)) in used
        key = (tuple(labels.values()), _config_key(got[1]) if got is not None else str(r.run_id))
        if got is None:
            out.append((key, _vrow(str(root), "run", labels, None, float(r.t_iteration), None,
                                   f"no model for scheme {r.scheme}", in_fit)))  # fmt: skip
            continue
        try:
            p = predict(model, got[1])
        except UserError as e:
            out.append((key, _vrow(str(root), "run", labels, None, float(r.t_iteration), None,
                                   str(e), in_fit)))  # fmt: skip
            continue
        out.append((key, _vrow(str(root), "run", labels, p, float(r.t_iteration),
                               float(r.t_comm), "; ".join(p.notes), in_fit)))  # fmt: skip
    return out


def _config_key(cfg: Config) -> tuple[Any, ...]:
    """A configuration as a dict key: its fields but the compressor spec (unhashable; its
    label is among the run's labels the key also has)."""
    return tuple(getattr(cfg, f.name) for f in fields(cfg) if f.name != "compressor")


def _vrow(
    source: str, kind: str, r: dict[str, Any], p: Prediction | None, measured: float,
    measured_comm: float | None, notes: str, in_fit: bool,
) -> dict[str, Any]:  # fmt: skip
    pred = p.total_s if p is not None else math.nan
    return {
        "source": source, "kind": kind, "backend": r["backend"], "network": r["network"],
        "world_size": int(r["world_size"]), "scheme": r["scheme"], "compressor": r["compressor"],
        "numel": int(r["bytes"]) // 4, "workload": r.get("workload") or "",
        "measured_s": measured, "predicted_s": pred,
        "error": pred / measured - 1 if measured > 0 else math.nan,
        "measured_comm_s": math.nan if measured_comm is None else measured_comm,
        "predicted_comm_s": p.comm_s if p is not None else math.nan,
        "runs": 1, "in_fit": in_fit, "notes": notes,
    }  # fmt: skip


def validate(model: CostModel, paths: Sequence[Path | str]) -> pd.DataFrame:
    """Validation table over bench comm JSON files and results directories."""
    frames = []
    for path in paths:
        kind, obj = load_input(path)
        if kind == "comm":
            frames.append(validate_comm(model, obj, str(path)))
        elif kind == "runs":
            frames.append(validate_runs(model, obj))
        else:
            raise UserError(f"{path}: kernel timings have no iteration time to validate against")
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=list(VALIDATION_COLUMNS))
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class ValidationSummary:
    points: int
    """Held-out rows with a prediction."""
    median_abs_error: float
    max_abs_error: float
    within_target: int
    target: float = TARGET_ERROR

    @property
    def passed(self) -> bool:
        return self.points > 0 and self.within_target == self.points


def summarize_validation(table: pd.DataFrame, target: float = TARGET_ERROR) -> ValidationSummary:
    """Errors over the rows NOT used for fitting (the target: |error| <= 15 %)."""
    held = table[~table["in_fit"].astype(bool) & table["error"].notna()]
    err = held["error"].abs().to_numpy(dtype=float)
    if err.size == 0:
        return ValidationSummary(0, math.nan, math.nan, 0, target)
    return ValidationSummary(
        int(err.size), float(np.median(err)), float(err.max()), int((err <= target).sum()), target
    )
