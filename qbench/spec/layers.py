"""Layer policy: which compressor each parameter tensor's gradient uses.

Seed 002 (section 3.2.2) sends small tensors in full precision, "choosing a threshold for small
matrices in such way so we always quantize more than 99% of all parameters": quantizing a bias of
ten values costs more in kernel time and scales than it saves. Overrides by name pattern
(fnmatch, first match wins) come first, e.g. ``{"fc.*": {name: qsgd, bits: 8}}``.

Tensors sharing a compressor form a group; the flat gradient buffer is laid out group by group so
each group is one contiguous slice aggregated in one go.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from typing import Any

from qbench.errors import UserError

NONE = {"name": "none"}


@dataclass(frozen=True, kw_only=True)
class LayerPolicy:
    full_precision_below: int | str = "auto"
    """Tensors with fewer elements travel in fp32; ``auto`` picks the threshold from
    ``quantized_fraction``; 0 quantizes everything."""
    quantized_fraction: float = 0.99
    """With ``auto``: the share of all parameters that must be quantized."""
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Parameter-name glob -> compressor spec; first match wins."""

    def __post_init__(self) -> None:
        t = self.full_precision_below
        if not (t == "auto" or (isinstance(t, int) and not isinstance(t, bool) and t >= 0)):
            raise UserError(
                f"layers.full_precision_below must be auto or an element count >= 0, got {t!r}; "
                "e.g. `full_precision_below: auto`"
            )
        if not 0.0 < self.quantized_fraction <= 1.0:
            raise UserError(
                f"layers.quantized_fraction must be in (0, 1], got {self.quantized_fraction!r}; "
                "e.g. `quantized_fraction: 0.99`"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "full_precision_below": self.full_precision_below,
            "quantized_fraction": self.quantized_fraction,
            "overrides": self.overrides,
        }


@dataclass(frozen=True)
class Group:
    """Parameters that share a compressor; a contiguous slice of the flat gradient."""

    compressor: dict[str, Any]
    names: tuple[str, ...]
    numel: int
    sizes: tuple[int, ...] = ()
    """Element count of each tensor, in ``names`` order: per-tensor compressors encode each
    on its own (the aggregators' ``tensors``)."""


def threshold(sizes: list[int], fraction: float) -> int:
    """Smallest tensor size t such that tensors of >= t elements hold >= fraction of all."""
    total = sum(sizes)
    covered = 0
    for size in sorted(sizes, reverse=True):
        covered += size
        if covered >= fraction * total:
            return size
    return 0


def plan(
    params: list[tuple[str, int]],
    compressor: dict[str, Any],
    policy: LayerPolicy,
    column_length: dict[str, int] | None = None,
) -> list[Group]:
    """Assign every (name, numel) a compressor; return groups in order of first appearance.

    ``column_length`` (name -> size of the tensor's last dimension) serves compressors asked to
    work per column (``onebit`` with ``columns: true``): their bucket becomes one column.
    """
    cut = _cut(params, policy)
    groups: dict[str, list[tuple[str, int]]] = {}
    specs: dict[str, dict[str, Any]] = {}
    for name, numel in params:
        spec = _per_column(_choose(name, numel, compressor, policy, cut), name, column_length)
        key = json.dumps(spec, sort_keys=True)
        specs[key] = spec
        groups.setdefault(key, []).append((name, numel))
    return [
        Group(specs[k], tuple(n for n, _ in m), sum(s for _, s in m), tuple(s for _, s in m))
        for k, m in groups.items()
    ]


def _per_column(
    spec: dict[str, Any], name: str, column_length: dict[str, int] | None
) -> dict[str, Any]:
    if not spec.get("columns"):
        return spec
    if column_length is None or name not in column_length:
        raise ValueError(f"{spec['name']} per column needs the shape of {name!r}")
    return {**spec, "bucket_size": column_length[name]}


def _cut(params: list[tuple[str, int]], policy: LayerPolicy) -> int:
    if policy.full_precision_below == "auto":
        return threshold([n for _, n in params], policy.quantized_fraction)
    return int(policy.full_precision_below)


def _choose(
    name: str, numel: int, compressor: dict[str, Any], policy: LayerPolicy, cut: int
) -> dict[str, Any]:
    for pattern, spec in policy.overrides.items():
        if fnmatch.fnmatchcase(name, pattern):
            return spec
    if compressor["name"] == "none" or numel < cut:
        return dict(NONE)
    return compressor


def parse(raw: Any) -> LayerPolicy:
    """The scenario's ``layers:`` mapping -> LayerPolicy (strict keys)."""
    if not isinstance(raw, dict):
        raise UserError(
            f"layers must be a mapping, got {raw!r}; e.g. `layers: {{overrides: {{}}}}`"
        )
    valid = ("full_precision_below", "quantized_fraction", "overrides")
    for k in raw:
        if k not in valid:
            shown = k if isinstance(k, str) and k.isprintable() else repr(k)  # one line
            raise UserError(f"unknown key layers.{shown}; valid: {', '.join(valid)}")
    overrides = raw.get("overrides", {}) or {}
    if not isinstance(overrides, dict):
        raise UserError(
            "layers.overrides must map name patterns to compressors; e.g. `'*.bias': none`"
        )
    fraction = raw.get("quantized_fraction", 0.99)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise UserError(f"layers.quantized_fraction must be a number, got {fraction!r}")
    return LayerPolicy(
        full_precision_below=raw.get("full_precision_below", "auto"),
        quantized_fraction=float(fraction),
        overrides={str(p): _override(str(p), s) for p, s in overrides.items()},
    )


def _override(pattern: str, spec: Any) -> dict[str, Any]:
    """One ``overrides`` entry: a compressor name or ``{name: ..., <parameter>: ...}``, checked
    the way the scenario's ``compressor:`` entries are (UserError naming the pattern)."""
    from qbench import catalog

    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or "name" not in spec:
        raise UserError(
            f"layers.overrides[{pattern!r}] must be a compressor name or a mapping with a name, "
            f"got {spec!r}; e.g. `'*.bias': none` or `'fc.*': {{name: qsgd, bits: 8}}`"
        )
    try:
        catalog.compressor(spec)
    except UserError as e:
        raise UserError(f"layers.overrides[{pattern!r}]: {e}") from None
    return dict(spec)
