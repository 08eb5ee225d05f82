"""What qbench knows: compressors, schemes, models (no torch).

Each compressor and scheme has one entry (``compressors.py``, ``schemes/``): parameters
(typed, documented, validated), label, wire bytes, capabilities, each scheme's traffic
(``schemes/traffic.py``); one spelling per DDP configuration (``schemes/spelling.py``).
Which combinations can run is ``qbench.spec.rules``, each rule with its reason. The planner
(scenario, matrix), the aggregators, the codecs, ``bench``, the cost model and the reports
read these; none re-derives them.

    spec = catalog.compressor({"name": "qsgd", "bits": 4})   # or "qsgd:bits=4", or "qsgd"
    spec.label, spec.params, spec.wire_bytes(1000), spec.entry.unbiased(spec.params)
    catalog.scheme({"name": "reduce-broadcast", "overlap": 4}).params
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import yaml

from qbench.catalog import plugins, registry, specs
from qbench.catalog.compressors import COMPRESSORS, GRANULARITIES, CompressorEntry
from qbench.catalog.params import validate
from qbench.catalog.schemes import CODEC_PARAMS, SCHEMES, SchemeEntry
from qbench.errors import UserError, choice_error

__all__ = [
    "COMPRESSORS", "FP32", "GRANULARITIES", "SCHEMES", "CompressorSpec", "SchemeSpec", "codecs",
    "compressor", "compressor_label", "from_label", "register_compressor", "register_scheme",
    "scheme", "scheme_from_label", "scheme_label",
]  # fmt: skip


@dataclass(frozen=True)
class CompressorSpec:
    """A compressor with validated parameters (``params``: complete, defaults filled in)."""

    entry: CompressorEntry
    params: dict[str, Any]
    given: dict[str, Any] = field(default_factory=dict)
    """The mapping as written (``name`` included): what run ids hash."""

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def label(self) -> str:
        return self.entry.label(self.params)

    @property
    def nominal_bits(self) -> float | None:
        return self.entry.nominal_bits(self.params)

    @property
    def error_feedback(self) -> bool:
        return self.entry.error_feedback(self.params)

    @property
    def granularity(self) -> str:
        """What one scale, width or budget covers (compressors.GRANULARITIES)."""
        return self.entry.granularity(self.params)

    def wire_bytes(self, numel: int, pieces: Sequence[int] | None = None) -> int | None:
        """Payload bytes of ``numel`` values made of tensors (or tensor parts) of sizes
        ``pieces``; the pieces count only for per-tensor compressors."""
        return self.entry.wire_bytes(self.params, numel, pieces)

    def display(self, brief: bool = False) -> str:
        """Its name for people ("QSGD 4-bit, bucket 512"; brief: "QSGD 4-bit")."""
        show = self.entry.display
        return self.label if show is None else show(self.params, brief)


@dataclass(frozen=True)
class SchemeSpec:
    entry: SchemeEntry
    params: dict[str, Any]
    given: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.entry.name

    def display(self) -> str:
        """Its name for people ("Choco-SGD, ring"); a ``down`` compressor by its brief name."""
        if self.entry.display is None:
            return self.entry.name
        params = dict(self.params)
        for key, codec in self.codecs.items():
            params[key] = codec.display(brief=True)
        return self.entry.display(params)

    @property
    def codecs(self) -> dict[str, CompressorSpec]:
        """The compressors the scheme takes as parameters (``down``, ``all_gather``), set ones
        only: validated when the scheme was, so this cannot fail."""
        return codecs(self.params)

    @property
    def is_default(self) -> bool:
        """Whether every parameter is the scheme's default."""
        return self.params == _default_params(self.name)


@cache
def _default_params(name: str) -> dict[str, Any]:
    """A scheme's parameters when none is given (names are never re-registered: cached)."""
    return scheme({"name": name}).params


def codecs(params: Mapping[str, Any]) -> dict[str, CompressorSpec]:
    """A scheme's codec parameters among ``params`` (validated mappings), as specs."""
    return {k: compressor(params[k]) for k in CODEC_PARAMS if params.get(k)}


def register_compressor(entry: CompressorEntry) -> None:
    """Add a compressor to the catalog (a plug-in's or a test's); its codec registers with
    ``qbench.compress.register``. A name already taken is refused."""
    registry.add(COMPRESSORS, entry, "compressor")


def register_scheme(entry: SchemeEntry) -> None:
    """Add a scheme to the catalog; its aggregator registers with ``qbench.aggregate.register``."""
    registry.add(SCHEMES, entry, "scheme")


def compressor(raw: Any) -> CompressorSpec:
    """Validate a compressor spec (a name, ``qsgd:bits=4`` or a mapping); UserError naming the
    bad value, the rule and a fix."""
    spec = specs.mapping(raw, "compressor")
    name = spec["name"]
    if not isinstance(name, str) or name not in COMPRESSORS:  # a YAML list or mapping, too
        raise _unknown("compressor", name, list(COMPRESSORS))
    entry = COMPRESSORS[name]
    given = {k: v for k, v in spec.items() if k != "name"}
    if "seed" in given:
        raise UserError(
            f"{name}: seed is the run's (scenario key `seed`, which also keys the stochastic "
            "rounding); remove `seed` from the compressor"
        )
    params = validate(name, entry.params, given)
    problem = entry.cross_check(params)
    if problem:
        raise UserError(f"{name}: {problem}")
    return CompressorSpec(entry, params, spec)


def _unknown(what: str, name: Any, valid: list[str]) -> UserError:
    """An unknown name, listing the valid ones and any plug-in that failed to load."""
    return UserError(f"{choice_error(what, name, valid)}{plugins.failures()}")


def compressor_label(raw: Any) -> str:
    return compressor(raw).label


def from_label(label: str) -> CompressorSpec:
    """The compressor a label stands for (``qsgd-4b-b512``), for files that name compressors
    by label (bench results, tables); UserError for a label no entry makes."""
    for entry in COMPRESSORS.values():
        params = entry.unlabel(label)
        if params is not None:
            return compressor({"name": entry.name, **params})
    raise UserError(f"no compressor has the label {label!r}")


def scheme(raw: Any) -> SchemeSpec:
    """Validate a scheme spec; nested compressor specs (``down``) are validated too."""
    spec = specs.mapping(raw, "scheme")
    name = spec["name"]
    if not isinstance(name, str) or name not in SCHEMES:
        raise _unknown("scheme", name, ["auto", *SCHEMES])
    entry = SCHEMES[name]
    given = {k: v for k, v in spec.items() if k != "name"}
    owner = f"scheme {name}"
    params = validate(owner, entry.params, given)
    for key in CODEC_PARAMS:
        if params.get(key) is not None:
            params[key] = _codec_param(name, key, params[key])
    problem = entry.cross_check(given, params)
    if problem:
        raise UserError(f"{owner}: {problem}")
    return SchemeSpec(entry, params, spec)


def _codec_param(scheme_name: str, key: str, raw: Any) -> dict[str, Any]:
    """A compressor a scheme takes as a parameter (``down``, ``all_gather``), as its
    validated mapping."""
    try:
        down = compressor(raw)
    except UserError as e:
        raise UserError(f"scheme {scheme_name}: {key}: {e}") from None
    if scheme_name == "async-ps" and (down.entry.stateful or down.error_feedback):
        raise UserError(
            f"scheme async-ps: down quantizes the model itself and cannot be {down.name} (it "
            "keeps error-feedback state); use qsgd, fixedpoint, fp16, bf16, adaptive or none"
        )
    return down.given


def scheme_label(name: str, params: Mapping[str, Any]) -> str:
    """``reduce-broadcast+overlap4``, ``reduce-broadcast+backward``: part of run ids, so the
    spelling of existing parameters never changes."""
    extra = "".join(
        f"+{k}" if k == "backward" else f"+{k}{_short(v)}" for k, v in sorted(params.items())
    )
    return f"{name}{extra}"


def scheme_from_label(label: str) -> SchemeSpec:
    """The scheme a label stands for (``gossip+algorithmchoco+topologyring``), the inverse of
    :func:`scheme_label` for files that name schemes by label; UserError when no entry makes
    it. The longest scheme name that prefixes the label wins; each ``+piece`` is a parameter
    name followed by its value (read as YAML; ``down`` as a compressor label)."""
    name = max((n for n in SCHEMES if label == n or label.startswith(n + "+")), key=len,
               default=None)  # fmt: skip
    if name is None:
        raise UserError(f"no scheme has the label {label!r}")
    entry, given = SCHEMES[name], {}
    for piece in filter(None, label[len(name) :].split("+")):
        key = max((p.name for p in entry.params if piece.startswith(p.name)), key=len,
                  default=None)  # fmt: skip
        if key is None:
            raise UserError(f"no scheme has the label {label!r} ({piece!r})")
        given[key] = _unshort(key, piece[len(key) :])
    return scheme({"name": name, **given})


def _unshort(key: str, text: str) -> Any:
    if key == "backward" and not text:
        return True
    if key in CODEC_PARAMS:
        return from_label(text).given
    value = yaml.safe_load(text)  # "True", "6", "0.1", "choco"
    return text if value is None else value


def _short(v: Any) -> str:
    if isinstance(v, dict):
        return compressor_label(v) if "name" in v else "-".join(map(str, v.values()))
    return str(v)


FP32 = compressor("none")
"""The uncompressed compressor (label ``fp32``): full-precision values on the wire, every
report's and the cost model's baseline."""
