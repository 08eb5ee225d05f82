"""Measured cells: a CSV of a real machine's samples per second, one row per workload
(``network``), GPU count (``gpus``) and method (``method``: a compressor label such as
``qsgd-4b-b512``; empty for a method qbench does not model), as transcribed from a paper in
scenarios/paper/published/. Other columns are kept as they are."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from qbench.errors import UserError

NEED = ("network", "gpus", "method", "samples_per_s")


def read(path: str | Path, what: str) -> pd.DataFrame:
    try:
        cells = pd.read_csv(path, keep_default_na=False, dtype={"method": str})
    except (OSError, ValueError) as e:
        raise UserError(f"{what}: {path} cannot be read as CSV ({type(e).__name__}); give a "
                        f"CSV with columns {', '.join(NEED)}") from None  # fmt: skip
    missing = [c for c in NEED if c not in cells.columns]
    if missing:
        raise UserError(f"{what}: {path} lacks the column(s) {', '.join(missing)}; it needs "
                        f"{', '.join(NEED)}")  # fmt: skip
    return cells


def matching(cells: pd.DataFrame, use: Mapping[str, Any], what: str) -> pd.Series:
    """The rows whose columns equal every value of ``use`` (``{method: fp32}``)."""
    mask = pd.Series(True, index=cells.index)
    for column, value in use.items():
        if column not in cells.columns:
            raise UserError(f"{what}: no column {column!r}; the cells have "
                            f"{', '.join(map(str, cells.columns))}")  # fmt: skip
        mask &= cells[column].astype(str) == str(value)
    return mask
