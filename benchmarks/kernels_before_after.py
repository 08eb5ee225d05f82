"""Two trees' kernels side by side from `bench kernels --json` files (issue 48): per codec, op
and size, the seconds and x floor of the trees' runs, taking turns in one call of
benchmarks/gpu_check.sh (BEFORE=tree), and the after tree's x of torch's casts.

    python benchmarks/kernels_before_after.py DIR     # DIR holds before-rN.json, after-rN.json

Prints a markdown table: the median over rounds, with the rounds' range in brackets when there
is more than one. "x floor" is the row's own roofline (bytes it must move at the copy speed
measured beside it); speed-up is before seconds over after seconds.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

Key = tuple[str, str, int]  # compressor, op, numel


def _runs(folder: Path, tree: str) -> list[dict[Key, dict]]:
    docs = sorted(folder.glob(f"{tree}-r*.json"))
    if not docs:
        raise SystemExit(f"no {tree}-r*.json in {folder}; run benchmarks/gpu_check.sh BEFORE=...")
    return [
        {(r["compressor"], r["op"], r["numel"]): r for r in json.loads(p.read_text())["rows"]}
        for p in docs
    ]


def _spread(values: list[float], fmt: str) -> str:
    mid = format(statistics.median(values), fmt)
    if len(values) < 2:
        return mid
    return f"{mid} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def _us(rows: list[dict]) -> list[float]:
    return [1e6 * r["seconds"] for r in rows]


def table(folder: Path) -> str:
    before, after = _runs(folder, "before"), _runs(folder, "after")
    keys = [k for k in after[0] if all(k in run for run in before + after)]
    lines = [
        "| codec | op | values | before µs | after µs | speed-up | before x floor "
        "| after x floor | after x fp8 cast | implementation |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        b, a = [run[key] for run in before], [run[key] for run in after]
        speedup = statistics.median(_us(b)) / statistics.median(_us(a))
        x_casts = [r["seconds"] / r["peer_seconds"]["fp8 cast"] for r in a if r.get("peer_seconds")]
        x_cast = _spread(x_casts, ".2f") if x_casts else "-"
        impl = a[0]["implementation"]
        if b[0]["implementation"] != impl:
            impl = f"{b[0]['implementation']} -> {impl}"
        lines.append(
            f"| {key[0]} | {key[1]} | 2^{key[2].bit_length() - 1} | {_spread(_us(b), '.0f')} "
            f"| {_spread(_us(a), '.0f')} | {speedup:.2f}x "
            f"| {_spread([r['roofline']['floor_ratio'] for r in b], '.2f')} "
            f"| {_spread([r['roofline']['floor_ratio'] for r in a], '.2f')} | {x_cast} | {impl} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else "results/gpu-check")))
