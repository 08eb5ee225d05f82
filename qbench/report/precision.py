"""A run's numeric precision: the typed settings it ran with, and the ``precision`` label made
of them for people (``fp32``, ``int8``, ``bf16+range-evonorm``, ``fp32+w8``,
``int8+shared-rounding``). Comparisons read the settings, never the label."""

from __future__ import annotations

import pandas as pd

SETTINGS: dict[str, str | int] = dict(
    compute="fp32", norm="batchnorm", weight_bits=0, rounding="per-rank"
)
"""Each setting and what runs recorded before it existed ran with."""


def settings(runs: pd.DataFrame) -> dict[str, pd.Series]:
    """The settings' columns of ``runs``, typed: the default where a run recorded none, or a
    weight width that is not a number (``n/a``: no weight quantization)."""
    out = {}
    for column, default in SETTINGS.items():
        values = runs[column]
        if isinstance(default, int):
            values = pd.to_numeric(values, errors="coerce")
        out[column] = values.fillna(default).astype(type(default))
    return out


def label(runs: pd.DataFrame) -> pd.Series:
    """The settings as one label; defaults are left out (per-rank rounding, batchnorm, w0)."""
    compute, norm, bits, rounding = settings(runs).values()
    labels = [
        c + ("" if n == "batchnorm" else f"+{n}") + (f"+w{b}" if b else "")
        + ("" if r == "per-rank" else f"+{r}-rounding")
        for c, n, b, r in zip(compute, norm, bits, rounding, strict=True)
    ]  # fmt: skip
    return pd.Series(labels, index=runs.index, dtype=object)
