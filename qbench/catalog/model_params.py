"""Model parameters from scenarios: parsers that normalise a value or say what is wrong with it.

A parser takes the raw value (from YAML: int, float or string) and returns the normalised value,
or raises ``ValueError`` whose message completes "``<key>`` must be ..." (e.g. "a positive count
like 25M"). ``qbench.models.check_params`` turns that into a one-line ``UserError``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}
_COUNT = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)\s*([kmgb]?)\s*$", re.I)


@dataclass(frozen=True)
class Param:
    """One model parameter: its default and a parser (raw value -> normalised value)."""

    default: Any
    parse: Callable[[Any], Any]
    help: str


def count(minimum: int = 1, maximum: int | None = None) -> Callable[[Any], int]:
    """A whole number written as 25000000, 25e6, "25M", "2.5k" or "25_000_000"."""
    hint = f"a count >= {minimum:,} like 25M" if minimum > 1 else "a positive count like 25M"
    if maximum is not None:
        hint = f"a count in [{minimum:,}, {maximum:,}] like 25M"

    def parse(value: Any) -> int:
        n = _to_count(value)
        if n is None or n < minimum or (maximum is not None and n > maximum):
            raise ValueError(hint)
        return n

    return parse


def _to_count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value == int(value) else None
    if not isinstance(value, str):
        return None
    m = _COUNT.match(value)
    if not m:
        return None
    x = float(m.group(1).replace("_", "").replace(",", "")) * _SUFFIX[m.group(2).lower()]
    return round(x) if math.isfinite(x) and abs(x - round(x)) < 1e-6 * max(1.0, x) else None


def number(minimum: float, maximum: float | None = None) -> Callable[[Any], float]:
    """A real number greater than ``minimum`` (and below ``maximum`` if given)."""
    hint = f"a number > {minimum:g}"
    if maximum is not None:
        hint = f"a number in ({minimum:g}, {maximum:g})"

    def parse(value: Any) -> float:
        x = _to_float(value)
        if x is None or x <= minimum or (maximum is not None and x >= maximum):
            raise ValueError(hint)
        return x

    return parse


def fraction(value: Any) -> float:
    """A probability in [0, 1), e.g. a dropout rate."""
    x = _to_float(value)
    if x is None or not 0 <= x < 1:
        raise ValueError("a number in [0, 1)")
    return x


def _to_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        x = float(value)
    elif isinstance(value, str):
        try:
            x = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return x if math.isfinite(x) else None


def human(n: float) -> str:
    """25557032 -> '25.6M', 10_000_000 -> '10.0M', 7850 -> '7.85k' (for tables, descriptions)."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")):
        if abs(n) >= div or div == 1:
            return f"{significant(n / div)}{suffix}"
    raise AssertionError("unreachable")


def significant(x: float) -> str:
    """Three significant digits, one decimal from 100 up: 0.0314, 6.62, 40.0, 553.4, 1,024.0."""
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:#.3g}"
