"""Values as a cluster or study file writes them: mappings, counts, numbers, rates (``400gbit``:
bits/s, the rate parser of ``qbench.spec.network``) and durations (``5us``, ``2ms``, ``0.01``)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from qbench.errors import UserError, type_name
from qbench.spec import network

_SECONDS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(ns|us|ms|s)?\s*$")
_SCALE = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}


def bytes_per_s(rate: Any, key: str) -> float:
    """A positive link rate in bytes per second (``8gbit`` -> 1e9)."""
    bits = network.declared(rate, key).bits_per_s
    assert bits is not None  # a declared rate is always shaped
    return bits / 8.0


def seconds(value: Any, key: str, *, zero: bool = True) -> float:
    """A duration: a number of seconds or ``5us`` / ``2ms`` / ``1s``; negative, or zero where
    ``zero`` is false, is refused in one line."""
    m = _SECONDS.match(str(value).lower()) if not isinstance(value, bool) else None
    s = float(m.group(1)) * _SCALE[m.group(2)] if m else math.nan
    if not (s > 0 or (zero and s == 0)) or math.isinf(s):
        least = "0 or more" if zero else "more than 0"
        raise UserError(f"{key} must be a duration of {least} (e.g. `5us`, `2ms`), got {value!r}")
    return s


def positive(value: Any, key: str, example: str) -> float:
    """A positive finite number (a count per second, FLOPs, ...); ``2e10`` too, which YAML
    reads as a string."""
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not 0 < number < math.inf:
        raise UserError(f"{key} must be a positive number, got {value!r}; e.g. `{example}`")
    return number


def read_yaml(path: Path, what: str, example: str) -> Any:
    """The YAML document at ``path`` (``what``: "cluster file", for the one-line error)."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as e:
        raise UserError(
            f"{what} {path} cannot be read ({e.strerror}); give a YAML file such as {example}"
        ) from None
    except yaml.YAMLError as e:
        raise UserError(f"{what} {path} is not YAML: {str(e).splitlines()[0]}") from None


def mapping(value: Any, key: str, example: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UserError(f"{key} must be a mapping, got {type_name(value)}; e.g. {example}")
    return value


def count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{key} must be a whole number of 1 or more, got {value!r}; "
                        f"e.g. `{key}: 8`")  # fmt: skip
    return value
