"""Gradient compressors, looked up by name: ``build("qsgd", bits=4)``.

To add an algorithm: write one module with a Compressor subclass and add one line to
COMPRESSORS.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any

from qbench.compress.adaptive import Adaptive
from qbench.compress.base import Compressor, Key, Payload, WireField
from qbench.compress.fixedpoint import FixedPoint
from qbench.compress.fp16 import BFloat16, Half
from qbench.compress.none import NoCompression
from qbench.compress.onebit import OneBit
from qbench.compress.powersgd import PowerSGD
from qbench.compress.qsgd import QSGD
from qbench.compress.topk import TopK
from qbench.errors import UserError, choice_error

__all__ = [
    "COMPRESSORS", "HOOK_COMPRESSORS", "Compressor", "Key", "Payload", "WireField", "build",
    "from_spec", "parameters",
]  # fmt: skip

COMPRESSORS: dict[str, type[Compressor]] = {
    NoCompression.name: NoCompression,
    QSGD.name: QSGD,
    OneBit.name: OneBit,
    Half.name: Half,
    BFloat16.name: BFloat16,
    FixedPoint.name: FixedPoint,
    TopK.name: TopK,
    Adaptive.name: Adaptive,
}
# Not codecs but DDP communication hooks (scheme ddp): specified and validated like the codecs,
# never called to encode.
HOOK_COMPRESSORS: dict[str, type[Compressor]] = {PowerSGD.name: PowerSGD}
_ALL = {**COMPRESSORS, **HOOK_COMPRESSORS}

_INTERNAL = frozenset({"state"})  # dataclass fields that are not user parameters


def parameters(cls: type[Compressor]) -> dict[str, dataclasses.Field[Any]]:
    """User-settable parameters of a compressor class, by name."""
    return {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in _INTERNAL}


def build(name: str, **params: Any) -> Compressor:
    """Instantiate the compressor registered as ``name``; bad input raises UserError.

    Names and types are checked here; value ranges in each class's ``__post_init__``.
    """
    if not isinstance(name, str) or name not in _ALL:  # a YAML list or mapping, too
        raise choice_error("compressor", name, list(_ALL))
    cls = _ALL[name]
    valid = parameters(cls)
    hints = _hints(name)
    for param, value in params.items():
        if param not in valid:
            raise _unknown(name, param, valid)
        params[param] = _check_type(name, valid[param], hints[param], value)
    return cls(**params)


def from_spec(spec: Mapping[Any, Any]) -> Compressor:
    """Build from a scenario mapping ``{name: ..., <parameter>: ...}`` as YAML gives it: a
    missing name or a parameter name that is not a string is a UserError too."""
    if "name" not in spec:
        raise UserError(f"compressor {dict(spec)!r} has no name; e.g. `{{name: qsgd, bits: 4}}`")
    name = spec["name"]
    params = {k: v for k, v in spec.items() if k != "name"}
    odd = next((k for k in params if not isinstance(k, str)), None)
    if odd is not None:
        build(name)  # an unknown name first, as for any other spec
        raise _unknown(name, odd, parameters(_ALL[name]))
    return build(name, **params)


def _unknown(name: str, param: object, valid: Mapping[str, object]) -> UserError:
    return UserError(f"{name}: unknown parameter {param!r}; valid: {', '.join(sorted(valid))}")


@functools.cache
def _hints(name: str) -> dict[str, Any]:
    return typing.get_type_hints(_ALL[name])  # slow (evaluates annotations): once each


def _check_type(name: str, field: dataclasses.Field[Any], expected: Any, value: object) -> Any:
    """The value, converted int -> float where a float is expected (YAML `ratio: 1`)."""
    if not isinstance(expected, type):
        return value  # Literal[...] and friends: the class's __post_init__ checks the value
    # bool is a subclass of int, but `bits: true` is a mistake, not 1.
    if isinstance(value, bool) and expected is not bool:
        pass
    elif isinstance(value, expected):
        return value
    elif expected is float and isinstance(value, int):
        return float(value)
    raise UserError(
        f"{name}: {field.name} must be of type {expected.__name__}, got {value!r} "
        f"({type(value).__name__}); e.g. `{field.name}: {_yaml(field.default)}`"
    )


def _yaml(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
