"""Typed, documented parameters of catalog entries, and their validation.

A :class:`Param` names its type, default, one line of documentation and the rule its value must
meet; :func:`validate` turns a user mapping (YAML, ``--compressor qsgd:bits=4``, ``--set``) into
the entry's complete parameters or raises one :class:`~qbench.errors.UserError` line that names
the entry, the key, the rule, the bad value and an example (``qsgd: bits must be 1..8 or 16,
got 12; e.g. `bits: 4```). An unknown key suggests the nearest valid one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from qbench.errors import UserError, did_you_mean

Rule = Callable[[Any], bool]


@dataclass(frozen=True)
class Param:
    name: str
    default: Any
    doc: str
    kind: type | tuple[type, ...]
    """Accepted Python types (an int is accepted for a float and converted)."""
    rule: str = ""
    """What a valid value is, completing "<name> must be ..."; empty: any value of ``kind``, or
    one of ``choices``."""
    ok: Rule | None = None
    example: Any = None
    """A good value for the error message; default: ``default``."""
    choices: tuple[Any, ...] = ()
    """The only valid values, when they can be listed."""

    def __post_init__(self) -> None:
        if self.choices and not self.rule:
            listed = ", ".join(map(str, self.choices))
            object.__setattr__(self, "rule", f"one of {listed}")

    def valid(self, value: Any) -> bool:
        if self.choices and value not in self.choices:
            return False
        return self.ok is None or bool(self.ok(value))

    def check(self, owner: str, value: Any) -> Any:
        """The value, converted (int -> float), or UserError naming the rule."""
        converted = _typed(value, self.kind)
        if converted is _BAD:  # the wrong type: say which type (and the rule, when it has one)
            single = not isinstance(self.kind, tuple)
            kind = _kind_name(self.kind) if single or not self.rule else self.rule
            rule = f" ({self.rule})" if single and self.rule else ""
            got = f"{value!r} ({type(value).__name__})"
        elif not self.valid(converted):
            kind, rule, got = self.rule or _kind_name(self.kind), "", repr(value)
        else:
            return converted
        raise UserError(
            f"{owner}: {self.name} must be {kind}{rule}, got {got}; "
            f"e.g. `{self.name}: {_yaml(self.example_value)}`"
        )

    @property
    def example_value(self) -> Any:
        return self.default if self.example is None else self.example


_BAD = object()


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):  # `bits: true` is a mistake, not 1
        return value if bool in kinds else _BAD
    if isinstance(value, kinds):
        return value
    if float in kinds and isinstance(value, int):
        return float(value)
    return _BAD


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def validate(owner: str, specs: tuple[Param, ...], given: Mapping[Any, Any]) -> dict[str, Any]:
    """``given`` checked against ``specs``, defaults filled in, in ``specs`` order."""
    known = {p.name: p for p in specs}
    for key in given:
        if key not in known:
            raise unknown(owner, key, list(known))
    return {p.name: p.check(owner, given[p.name]) if p.name in given else p.default for p in specs}


def unknown(owner: str, key: object, valid: list[str]) -> UserError:
    """The error for a parameter ``owner`` does not take, with the nearest valid name."""
    if not valid:
        return UserError(f"{owner} takes no parameters, got {key!r}")
    hint = did_you_mean(key, valid)
    return UserError(f"{owner}: unknown parameter {key!r}{hint}; valid: {', '.join(valid)}")


# -- rules used by several entries -----------------------------------------------------------
def at_least(low: float) -> Rule:
    return lambda v: v >= low


def between(low: float, high: float) -> Rule:
    return lambda v: low <= v <= high


def fraction(v: float) -> bool:
    """In (0, 1]."""
    return 0 < v <= 1


def positive_finite(v: float) -> bool:
    return 0 < v < math.inf
