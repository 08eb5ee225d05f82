"""Bits per value per layer, from a results directory swept with ``telemetry: true`` (seed 004
reports bits per parameter of its adaptive widths: 3.55-3.78 with Huffman coding). Per run and
layer: the elements, the compressor, the mean wire bits per value over the measured iterations
and ranks, and the mean relative error ||Q(g) - g|| / ||g||; then the total over the
compressed layers (bits weighted by element count) and over the whole model.

    .venv/bin/python benchmarks/layer_bits.py results/seed004-mlp-adaptive-telemetry
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def main(root: str) -> None:
    for run in sorted(p.parent for p in Path(root).glob("*/telemetry.parquet")):
        labels = json.loads((run / "run.json").read_text())["labels"]
        warmup = int(json.loads((run / "spec.json").read_text()).get("warmup", 0))
        t = pd.read_parquet(run / "telemetry.parquet")
        t = t[t["iteration"] >= warmup]
        per = t.groupby(["layer", "compressor"], sort=False).agg(
            numel=("numel", "first"), bits=("bits_per_value", "mean"), err=("rel_error", "mean")
        )
        print(f"\n{labels['scheme']} {labels['compressor']} ({run.name})\n")
        print("| layer | values | compressor | bits/value | rel. error |")
        print("|---|---|---|---|---|")
        for (layer, comp), r in per.iterrows():
            print(f"| {layer} | {r.numel} | {comp} | {r.bits:.2f} | {r.err:.3g} |")
        compressed = per[[c != "fp32" for _, c in per.index]]
        for name, part in (("compressed layers", compressed), ("whole model", per)):
            bits = (part["bits"] * part["numel"]).sum() / part["numel"].sum()
            print(f"| **{name}** | {part['numel'].sum()} | | **{bits:.2f}** | |")


if __name__ == "__main__":
    main(sys.argv[1])
