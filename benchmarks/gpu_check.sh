#!/usr/bin/env bash
# GPU checks for one machine with a CUDA GPU, from the repository root:
#   benchmarks/gpu_check.sh [OUTDIR]          on the GPU machine (about 4 minutes on an H100
#                                             before issue 48 added tests at 2^26 values: the
#                                             QSGD device tests alone took over 200 s on an H200)
#   CPU=1 benchmarks/gpu_check.sh [OUTDIR]    the same flow here, without a GPU: the CUDA
#                                             kernels under the emulator, the sweep on gloo/CPU
# Runs the GPU tests (CuPy kernels byte for byte against the CPU reference: QSGD, 1bitSGD, FP8,
# MX, NVFP4), the kernel benchmark with the codec roofline on the GPU (encode/decode vs a device
# copy, x floor, break-even link rate, 2^16..2^26 elements), and a one-GPU training sweep whose
# runs put every scheme's collectives, DDP's hooks and FSDP through NCCL, and DDP over gloo with
# 2 ranks sharing the GPU. BEFORE=TREE (a checkout of an earlier commit, e.g. `git archive REV
# qbench kernels | tar -x -C build/before`) first times issue 48's codecs in that tree and this
# one, taking turns for ROUNDS rounds (default 2), and prints them side by side
# (benchmarks/kernels_before_after.py). Uses the python3 on
# PATH (set PYTHON to choose another); qbench is taken from this checkout. Everything it writes
# goes under OUTDIR (default $OUT or results/gpu-check).
set -u -o pipefail
out=${1:-${OUT:-results/gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
qb() { "$py" -m qbench.cli "$@"; }
status=0
# A failed step is reported and the check goes on; it exits 1 at the end. A step piped into tee
# runs in a subshell, where status=1 is lost: its pipeline's own exit status (pipefail) counts.
step() { echo "== $*"; "$@" || { rc=$?; echo "!! failed ($rc): $*"; status=1; return "$rc"; }; }

if [ "${CPU:-0}" = 1 ]; then
  device=cpu; sizes="16 20"; sizes48=${sizes48:-16}
  tests="tests/compress/kernels/cuda/test_cuda_emulate.py tests/compress/kernels/cuda/test_cuda_nvrtc.py
    tests/compress/kernels/test_lowfloat_kernels.py"
  sweep_set=(--set backend=gloo --set device=cpu --set iterations=5 --set warmup=2)
else
  device=cuda; sizes="16 20 24 26"; tests=tests/compress/kernels/cuda/test_cuda.py; sweep_set=()
  step nvidia-smi -L
  step "$py" -c "import torch, cupy; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'cupy', cupy.__version__, torch.cuda.get_device_name(0))"
fi
step qb info
if [ -n "${BEFORE:-}" ]; then
  before=$(cd "$BEFORE" && pwd)
  codecs=(qsgd:bits=2,bucket_size=128 qsgd:bits=4,bucket_size=512 qsgd:bits=8,bucket_size=512
    onebit:bucket_size=64 fp8:block_size=128 mx:element=e4m3 mx:element=e3m2 mx nvfp4)
  # shellcheck disable=SC2046
  bench48() {  # TREE TAG: that tree's qbench and kernels/, this check's python
    PYTHONPATH=$1 "$py" -m qbench.cli bench kernels --device "$device" \
      --sizes ${sizes48:-24 26} --repeats 20 --max-time 2 \
      $(printf -- '--compressor %s ' "${codecs[@]}") --json "$out/$2.json" > "$out/$2.log" 2>&1
  }
  for r in $(seq 1 "${ROUNDS:-2}"); do
    step bench48 "$before" "before-r$r"
    step bench48 "$PWD" "after-r$r"
  done
  step "$py" benchmarks/kernels_before_after.py "$out" | tee "$out/before_after.md" || status=1
fi
# shellcheck disable=SC2086
step "$py" -m pytest -q -rs --durations=10 -p no:cacheprovider $tests -o addopts="" \
  -W ignore::DeprecationWarning \
  2>&1 | tee "$out/tests.log" || status=1
# --max-time: a torch-only codec (adaptive: a Python loop per bucket) takes seconds a call on a
# GPU; on an H100 it took most of the 8 minutes before the limit existed (docs/results/gpu.md).
# shellcheck disable=SC2086
step qb bench kernels --device "$device" --sizes $sizes --repeats 20 --max-time 2 \
  --json "$out/kernels_$device.json"
# One GPU holds one NCCL rank and one rank sends nothing (`bench comm` refuses world size 1):
# the one-GPU sweep below runs every scheme's collectives through NCCL instead.
step qb sweep scenarios/smoke-1gpu.yaml --out "$out/sweep" "${sweep_set[@]}"
step qb report "$out/sweep" --format md
# DDP with gloo over CUDA tensors, 2 ranks sharing the GPU (torch's hooks only).
step qb sweep scenarios/smoke-1gpu-gloo.yaml --out "$out/sweep-gloo" "${sweep_set[@]}"
step qb report "$out/sweep-gloo" --format md
exit $status
