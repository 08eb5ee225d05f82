"""An example qbench plug-in: what qbench's planner reads (no torch here).

The entry points (pyproject.toml) name the two catalog entries below. The planner imports this
module to validate scenarios and expand the run matrix without torch, so it holds only facts;
the torch classes are named by import path (``codec``, ``aggregator``) and imported by qbench
the first time a rank builds them.
"""

from __future__ import annotations

import re

from qbench.catalog.compressors import CompressorEntry
from qbench.catalog.params import Param, at_least
from qbench.catalog.schemes import SchemeEntry
from qbench.catalog.wire import num_buckets

SCALED_SIGN = CompressorEntry(
    "scaledsign",
    "signs, one bit per value, scaled by the mean |x| of each bucket",
    "",
    codec="qbench_plugin_example.codec:ScaledSign",
    params=(
        Param("bucket_size", 256, "values that share one scale", int, "an integer >= 8",
              at_least(8), example=512),
    ),
    label=lambda p: f"scaledsign-b{p['bucket_size']}",
    unlabel=lambda text: (
        {"bucket_size": int(m[1])} if (m := re.fullmatch(r"scaledsign-b(\d+)", text)) else None
    ),
    nominal_bits=lambda p: 1.0,
    wire=lambda p, n: [
        ("signs", "uint8", (n + 7) // 8),
        ("scales", "float32", num_buckets(n, p["bucket_size"])),
    ],
    granularity=lambda p: "bucket",  # one scale per bucket (qbench.catalog.GRANULARITIES)
)  # fmt: skip

DECODED_MEAN = SchemeEntry(
    "decoded-mean",
    "each rank decodes its own payload, then one fp32 allreduce of the decoded values",
    "",
    "qbench_plugin_example.aggregator:DecodedMean",
    per_bucket=True,
)
