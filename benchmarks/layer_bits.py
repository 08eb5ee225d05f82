"""Bits per value per layer, from a results directory swept with ``telemetry: true`` (seed 004
reports bits per parameter of its adaptive widths: 3.55-3.78 with Huffman coding). Per run and
layer: the elements, the compressor, the mean wire bits per value over the measured iterations
and ranks, and the mean relative error ||Q(g) - g|| / ||g||; then the total over the
compressed layers (bits weighted by element count) and over the whole model.

    .venv/bin/python benchmarks/layer_bits.py results/seed004-mlp-adaptive-telemetry
"""

from __future__ import annotations

import sys

import pandas as pd

from qbench.records.store import ResultStore


def main(root: str) -> None:
    store = ResultStore(root)
    for run_id in store.run_ids():
        path, record = store.merged_path(run_id, "telemetry"), store.read_record(run_id)
        if not path.exists() or record is None:
            continue  # swept without telemetry
        labels, warmup = record.labels, int(record.spec.get("warmup", 0))
        t = pd.read_parquet(path)
        t = t[t["iteration"] >= warmup]
        per = t.groupby(["layer", "compressor"], sort=False).agg(
            numel=("numel", "first"), bits=("bits_per_value", "mean"), err=("rel_error", "mean")
        )
        print(f"\n{labels['scheme']} {labels['compressor']} ({run_id})\n")
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
