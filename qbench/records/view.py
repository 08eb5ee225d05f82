"""A run's compressor and scheme as the catalog's typed values, read from its run.json.

Reports and the cost model read parameters (bits, bucket size, overlap, ...) from here, never
from labels. ``run.json``'s ``spec`` holds what the run was given (``compressor``: a mapping,
``scheme`` and ``scheme_params``); the catalog validates it again, so defaults are filled in the
same way the run filled them. Records of schema versions 1 and 2 both carry ``spec``. Two kinds
of record fall back to their labels, through :func:`_from_labels`, the only place a run's labels
are parsed back: one without a spec (a hand-written or truncated file), and one whose spec no
longer makes the label it recorded, because a default changed since it ran (``fixedpoint``'s
``scope`` became ``layer``; its older runs were ``global``, and their label says so).
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
    spec, labels = record.get("spec") or {}, record.get("labels") or {}
    if "compressor" not in spec or "scheme" not in spec:
        return _from_labels(labels)
    params = spec.get("scheme_params") or {}
    made = RunSpecs(catalog.compressor(spec["compressor"]),
                    catalog.scheme({"name": spec["scheme"], **params}))  # fmt: skip
    made_labels = (made.compressor.label, catalog.scheme_label(made.scheme.name, params))
    recorded = (labels.get("compressor", made_labels[0]), labels.get("scheme", made_labels[1]))
    return made if recorded == made_labels else _from_labels(labels)


def _from_labels(labels: Mapping[str, Any]) -> RunSpecs:
    """A record without a spec, or whose spec no longer makes its labels: the labels say what
    ran."""
    return RunSpecs(
        catalog.from_label(str(labels["compressor"])),
        catalog.scheme_from_label(str(labels["scheme"])),
    )
