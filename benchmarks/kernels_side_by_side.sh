#!/usr/bin/env bash
# The CPU kernels of two trees side by side (docs/results/kernels.md, issue 37): `bench kernels`
# for QSGD 4-bit and 1bitSGD at 2^24 values, 1 and 2 threads, the trees and thread counts
# taking turns, ROUNDS rounds (default 4). Run from the repository root:
#   git worktree add --detach /tmp/before REV
#   benchmarks/kernels_side_by_side.sh /tmp/before OUTDIR
# Each run's JSON is OUTDIR/{before,after}-{1,2}t-rROUND.json; load averages in OUTDIR/load.txt.
set -euo pipefail
before=$(cd "$1" && pwd); out=$2; rounds=${ROUNDS:-4}
after=$PWD; py=${PYTHON:-$after/.venv/bin/python}
mkdir -p "$out"; out=$(cd "$out" && pwd)
one() {  # tree threads tag
  (cd "$1" && PYTHONPATH=$1 "$py" -m qbench.cli bench kernels \
    --compressor qsgd:bits=4,bucket_size=512 --compressor onebit --sizes 24 --repeats 15 \
    --threads "$2" --json "$out/$3.json" > "$out/$3.log" 2>&1)
}
for r in $(seq 1 "$rounds"); do
  uptime >> "$out/load.txt"
  for t in 1 2; do one "$before" $t before-${t}t-r$r; one "$after" $t after-${t}t-r$r; done
done
uptime >> "$out/load.txt"
echo "wrote $out"
