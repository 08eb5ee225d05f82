"""Seed 002's study and a GPT-sized workload projected onto H100 clusters (issue 46, item 5), as
the markdown of docs/results/validation.md's projection section: per cluster and workload, the
fastest method and its speedup over the fastest 16-bit or fp32 exchange, at each GPU count,
with the band measured on seed 002's p2 machine.

    .venv/bin/python benchmarks/h100_projection.py

Each table is `qbench project scenarios/projection/clusters/CLUSTER.yaml
scenarios/projection/studies/h100.yaml` condensed (tests/cluster/test_seed002.py checks that the
page holds this script's output).
"""

from __future__ import annotations

from pathlib import Path

from qbench.cluster import calibrate, declared, study, table

ROOT = Path(__file__).resolve().parents[1]
PROJECTION = ROOT / "scenarios" / "projection"
CLUSTERS = ("h100-nvlink-400g", "h100-nvlink-8x400g", "h100-wan-25g")
SHOWN = (8, 16, 64, 128)


def section(name: str) -> list[str]:
    cluster = declared.load(PROJECTION / "clusters" / f"{name}.yaml")
    plan = study.load(PROJECTION / "studies" / "h100.yaml")
    host, fitted = calibrate.host_of(cluster, plan)
    result = table.projection(cluster, plan, host, fitted)
    frame = result.frame
    out = [f"**{name}** (`{name}.yaml`): fastest compressed method / its speedup over the "
           "fastest uncompressed one (fp32, fp16 or bf16); bold where it pays", "",
           "| workload | " + " | ".join(f"{k} GPUs" for k in SHOWN) + " |",
           "|---|" + "---|" * len(SHOWN)]  # fmt: skip
    for w in plan.workloads:
        cells = []
        for k in SHOWN:
            rows = frame[(frame["workload"] == w.name) & (frame["gpus"] == k)]
            compressed = rows[rows["baseline"] != rows["method"]]
            compressed = compressed[~compressed["method"].isin(["fp32", "fp16", "bf16"])]
            best = compressed.loc[compressed["speedup"].idxmax()]
            text = f"{best['method']} {best['speedup']:.2f}x"
            cells.append(f"**{text}**" if best["speedup"] > 1 else text)
        out.append(f"| {w.name} | " + " | ".join(cells) + " |")
    band = result.band
    if band is not None:
        out += ["", f"Band (`band:`): 8 in 10 of the {band.cells} validated cells on seed 002's p2 "
                f"erred by {band.low:+.0%} to {band.high:+.0%} (predicted / measured - 1)."]  # fmt: skip
    return out


def main() -> None:
    for name in CLUSTERS:
        print("\n".join(section(name)))
        print()


if __name__ == "__main__":
    main()
