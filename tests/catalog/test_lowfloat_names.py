"""The display names of the low-precision float compressors (qbench.catalog.compressors: fp8,
mx, nvfp4), written out from ``_named``'s rule: the name, then each detail whose flag is set,
joined by ", "; rounding and error feedback are details of all three."""

from __future__ import annotations

import pytest

from qbench import catalog

NAMES = [
    ({"name": "fp8"}, False, "FP8 E4M3, per tensor"),
    ({"name": "fp8"}, True, "FP8 E4M3"),
    ({"name": "fp8", "rounding": "stochastic"}, False, "FP8 E4M3, per tensor, stochastic rounding"),
    ({"name": "fp8", "format": "e5m2", "block_size": 128, "rounding": "stochastic",
      "error_feedback": True}, True, "FP8 E5M2, block 128, stochastic rounding, error feedback"),
    ({"name": "fp8", "error_feedback": True}, True, "FP8 E4M3, error feedback"),
    ({"name": "mx"}, False, "MXFP4"),
    ({"name": "mx", "element": "e4m3", "error_feedback": True}, False,
     "MXFP8 E4M3, error feedback"),
    ({"name": "mx", "element": "e3m2", "rounding": "stochastic"}, True,
     "MXFP6 E3M2, stochastic rounding"),
    ({"name": "nvfp4"}, False, "NVFP4"),
    ({"name": "nvfp4", "scope": "global", "rounding": "stochastic", "error_feedback": True},
     False, "NVFP4, global tensor scale, stochastic rounding, error feedback"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "brief", "name"), NAMES)
def test_a_low_float_compressors_display_name(
    spec: dict[str, object], brief: bool, name: str
) -> None:
    assert catalog.compressor(spec).display(brief) == name
