#!/usr/bin/env bash
# GPU checks for one machine with a CUDA GPU, from the repository root:
#   benchmarks/gpu_check.sh [OUTDIR]
# Runs the GPU tests (CuPy kernels byte for byte against the CPU reference), the kernel
# benchmark on the GPU (encode/decode vs a device copy, 2^16..2^26 elements), and a one-GPU
# training sweep whose runs put every scheme's collectives through NCCL. Uses the python3 on PATH
# (set PYTHON to choose another); qbench is taken from this checkout.
set -u -o pipefail
out=${1:-${OUT:-results/gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
qb() { "$py" -m qbench.cli "$@"; }
status=0
step() { echo "== $*"; "$@" || { echo "!! failed ($?): $*"; status=1; }; }

step nvidia-smi -L
step "$py" -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cupy', cupy.__version__, torch.cuda.get_device_name(0))"
step qb info
step "$py" -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py -o addopts="" 2>&1 | tee "$out/test_cuda.log"
# --max-time: a torch-only codec (adaptive: a Python loop per bucket) takes seconds a call on a
# GPU; on an H100 it took most of the 8 minutes before the limit existed (docs/results/gpu.md).
step qb bench kernels --device cuda --sizes 16 20 24 26 --repeats 20 --max-time 2 \
  --json "$out/kernels_cuda.json"
# One GPU holds one NCCL rank and one rank sends nothing (`bench comm` refuses world size 1):
# the one-GPU sweep below runs every scheme's collectives through NCCL instead.
step qb sweep scenarios/smoke-1gpu.yaml --out "$out/sweep"
step qb report "$out/sweep" --format md
exit $status
