"""A run's compressor and scheme as the catalog's typed values, read from its run.json.

Reports and the cost model read parameters (bits, bucket size, overlap, ...) from here, never
from labels. ``run.json``'s ``spec`` holds what the run was given (``compressor``: a mapping,
``scheme`` and ``scheme_params``); the catalog validates it again, so defaults are filled in the
same way the run filled them. Records of schema versions 1 and 2 both carry ``spec``; a record
that lacks it (a hand-written or truncated file) falls back to its labels, through
:func:`_from_labels`, the only place a run's labels are parsed back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qbench import catalog


@dataclass(frozen=True)
class RunSpecs:
    """What a run compressed with and how it exchanged gradients."""

    compressor: catalog.CompressorSpec
    scheme: catalog.SchemeSpec


def run_specs(record: Mapping[str, Any]) -> RunSpecs:
    """The typed specs of a run.json (its dict, or ``RunRecord.to_dict()``); UserError when the
    record names a compressor or scheme this qbench does not know (a plug-in not loaded)."""
    spec = record.get("spec") or {}
    if "compressor" in spec and "scheme" in spec:
        scheme = {"name": spec["scheme"], **(spec.get("scheme_params") or {})}
        return RunSpecs(catalog.compressor(spec["compressor"]), catalog.scheme(scheme))
    return _from_labels(record.get("labels") or {})


def _from_labels(labels: Mapping[str, Any]) -> RunSpecs:
    """A record without a spec: its labels are all that says what ran."""
    return RunSpecs(
        catalog.from_label(str(labels["compressor"])),
        catalog.scheme_from_label(str(labels["scheme"])),
    )
