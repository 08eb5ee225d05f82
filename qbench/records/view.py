"""A run's compressor, scheme and link as typed values, read from its run.json.

Reports and the cost model read parameters (bits, bucket size, overlap, ...) from here, never
from labels. ``run.json``'s ``spec`` holds what the run was given (``compressor``: a mapping,
``scheme`` and ``scheme_params``); the catalog validates it again, so defaults are filled in the
same way the run filled them. Records of schema versions 1 and 2 both carry ``spec``. Two kinds
of record fall back to their labels, through :func:`_from_labels`, the only place a run's labels
are parsed back: one without a spec (a hand-written or truncated file), and one whose spec no
longer makes the label it recorded, because a default changed since it ran (``fixedpoint``'s
``scope`` became ``layer``; its older runs were ``global``, and their label says so).
The link is ``spec``'s ``network`` setting, read by ``qbench.spec.network.link``; a record
without one reads its ``network`` label through ``network.option`` (none: unshaped).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from qbench import catalog
from qbench.catalog.schemes import spelling
from qbench.spec import network
from qbench.spec.network import Link
from qbench.spec.parts import REPLAY, Replay
from qbench.spec.runspec import RunSpec

T = TypeVar("T")


@dataclass(frozen=True)
class RunSpecs:
    """What a run compressed with, how it exchanged gradients and over which link."""

    compressor: catalog.CompressorSpec
    scheme: catalog.SchemeSpec
    link: Link
    """The emulated link (``bits_per_s``), or an unshaped one (loopback) when none was set."""


@dataclass(frozen=True)
class RunParts:
    """``RunSpecs`` where each part may be unreadable (None)."""

    compressor: catalog.CompressorSpec | None
    scheme: catalog.SchemeSpec | None
    link: Link | None


def run_specs(record: Mapping[str, Any]) -> RunSpecs:
    """The typed specs of a run.json (its dict, or ``RunRecord.to_dict()``); UserError when the
    record names a compressor or scheme this qbench does not know (a plug-in not loaded)."""
    spec, labels = record.get("spec") or {}, record.get("labels") or {}
    link = _link(spec, labels)
    if "compressor" not in spec or "scheme" not in spec:
        return _from_labels(labels, link)
    params = spec.get("scheme_params") or {}
    made = RunSpecs(catalog.compressor(spec["compressor"]),
                    catalog.scheme({"name": spec["scheme"], **params}), link)  # fmt: skip
    made_labels = (made.compressor.label, catalog.scheme_label(made.scheme.name, params))
    recorded = (labels.get("compressor", made_labels[0]), labels.get("scheme", made_labels[1]))
    return made if recorded == made_labels else _from_labels(labels, link)


def run_specs_each(record: Mapping[str, Any]) -> RunParts:
    """``run_specs`` part by part: a part this qbench cannot read (a plug-in that is not
    loaded, a label that no longer parses) is None and the other parts still read, so that one
    unknown compressor does not hide what the scheme was (an async-ps run is told by it)."""
    try:
        made = run_specs(record)
        return RunParts(made.compressor, made.scheme, made.link)
    except (ValueError, TypeError, KeyError, AttributeError):
        pass
    spec, labels = record.get("spec") or {}, record.get("labels") or {}
    return RunParts(
        _or_none(lambda: catalog.from_label(str(labels["compressor"]))),
        _or_none(lambda: catalog.scheme_from_label(str(labels["scheme"]))),
        _or_none(lambda: _link(spec, labels)),
    )


def columns(record: Mapping[str, Any], parts: RunParts | None = None) -> dict[str, Any]:
    """What reports tell runs apart by, typed and made from the run's specs, never its labels:
    the scheme's catalog name (None: unreadable), whether it sent per DDP bucket during
    backward, the link's rate in bit/s (NaN: unshaped or unreadable) and whether its compute
    was replayed (``compute: replay``). ``parts``: the record's ``run_specs_each``, when read."""
    parts = parts or run_specs_each(record)
    scheme, link = parts.scheme, parts.link
    backward = scheme is not None and spelling.overlap(scheme.name, scheme.params) == "backward"
    rate = link.bits_per_s if link is not None else None
    return {
        "scheme_name": scheme.name if scheme is not None else None,
        "backward": backward,
        "link_bits_per_s": float(rate) if rate is not None else math.nan,
        "replayed": _replayed(record),
    }


def _replayed(record: Mapping[str, Any]) -> bool:
    spec = record.get("spec") or {}
    try:
        return RunSpec.from_dict(spec).compute.replay is not None
    except (ValueError, TypeError, KeyError, AttributeError):  # a spec of a plug-in not loaded
        return spec.get("compute") == REPLAY


def _or_none(read: Callable[[], T]) -> T | None:
    try:
        return read()
    except (ValueError, TypeError, KeyError, AttributeError):  # UserError is a ValueError
        return None


def _from_labels(labels: Mapping[str, Any], link: Link) -> RunSpecs:
    """A record without a spec, or whose spec no longer makes its labels: the labels say what
    ran."""
    return RunSpecs(
        catalog.from_label(str(labels["compressor"])),
        catalog.scheme_from_label(str(labels["scheme"])),
        link,
    )


def _link(spec: Mapping[str, Any], labels: Mapping[str, Any]) -> Link:
    """The recorded network setting (``{}``: unshaped); a record without one (schema 1, a
    hand-written file): its label, ``1gbit`` or ``unshaped`` (none: unshaped)."""
    if isinstance(spec.get("network"), Mapping):
        return network.link(spec["network"])
    shown = labels.get("network")
    return network.option(shown if isinstance(shown, str) else None)


def clock(record: Mapping[str, Any]) -> Replay:
    """The run's clock (``qbench.spec.parts.Replay``): a replayed run's, with its dilation, from
    the recorded spec; the real clock for a measured run. A record whose spec cannot be read
    (none, a plug-in not loaded) falls back to its ``dilation`` label (none: 1)."""
    spec = record.get("spec") or {}
    try:
        return RunSpec.from_dict(spec).clock
    except (ValueError, TypeError, KeyError, AttributeError):  # UserError is a ValueError
        shown = (record.get("labels") or {}).get("dilation")
        return Replay(dilation=float(shown)) if shown not in (None, 1, 1.0) else Replay()
