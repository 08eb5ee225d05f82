"""The H100 compute a replayed scenario stands in for, from FLOPs (issue 44 item 5): what
``qbench timeline --tflops`` needs, with every input counted or stated.

* FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` on the scenario's model at its batch size,
  one forward and one forward + backward of the run's loss (2 per multiply-add; elementwise ops
  not counted), beside the per-sample count that ``qbench timeline`` uses, and the backward /
  forward ratio it assumes to be 2.
* Peak: an H100 SXM5's float32 rate, 67 TFLOP/s (NVIDIA H100 datasheet; qbench trains in fp32
  and leaves TF32 off, torch's default, so tensor-core rates do not apply).
* An anchor for the sustained fraction of it: the one small model that this project timed on
  an H100 (docs/results/gpu.md, 2026-11-27: resnet20 DDP fp32 on 2 gloo ranks sharing the GPU,
  batch 64 each, 16.1 ms an iteration of which 3.3 ms allreduce).

    .venv/bin/python benchmarks/h100_compute.py benchmarks/replay-codec.yaml 4 15 50

prints the counts, the anchor and, per utilization (% of the peak), the ``--tflops`` to pass and
docs/results/replay.md's measured H100-codec iterations recomputed with that compute in place of
the 242 ms of this CPU's that they hold (computed, not run: the flat loop computes, then
exchanges, so the exchange's time is the iteration less the compute).
"""

from __future__ import annotations

import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

from qbench import models
from qbench.run import workload
from qbench.spec import matrix, scenario

H100_FP32_TFLOPS = 67.0  # NVIDIA H100 SXM5 datasheet, FP32 (non-tensor)
# docs/results/gpu.md's resnet20 run: 2 ranks x batch 64, 16.1 ms an iteration, 3.3 ms allreduce
ANCHOR_MODEL, ANCHOR_SAMPLES, ANCHOR_ITER_S, ANCHOR_ALLREDUCE_S = "resnet20", 128, 16.1e-3, 3.3e-3
# docs/results/replay.md, "A GPU's codec times", the H100 rows: iteration ms (quiet machine,
# 2026-11-26), each holding CPU_COMPUTE_MS of this CPU's replayed forward + backward
MEASURED_MS = {"fp32 allreduce": 276.6, "QSGD 4-bit": 266.7, "1-bit SGD": 265.7}
CPU_COMPUTE_MS = 242.0


def counted(spec: matrix.RunSpec) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs of one batch of ``spec``'s model and loss."""
    info, net = workload.model(spec)
    x = torch.randn(spec.workload.batch_size, *info.input_shape)
    y = torch.randint(0, info.num_classes, (spec.workload.batch_size,))
    with FlopCounterMode(display=False) as fwd:
        net(x)
    with FlopCounterMode(display=False) as both:
        workload.loss(spec)(net(x), y).backward()
    return float(fwd.get_total_flops()), float(both.get_total_flops())


def main(path: str, utilizations: list[float]) -> None:
    spec = matrix.expand(scenario.load(path)).runs[0]
    forward, both = counted(spec)
    per_sample = workload.model_stats(spec)["gflops_per_sample"] * 1e9
    print(f"{spec.workload.model} {spec.workload.model_params} batch {spec.workload.batch_size}: forward "
          f"{forward / 1e9:.4g} GFLOP (FlopCounterMode), per-sample count x batch "
          f"{per_sample * spec.workload.batch_size / 1e9:.4g}; backward / forward "
          f"{(both - forward) / forward:.3f} (qbench timeline assumes 2)")  # fmt: skip
    work = 3 * models.flops_per_sample(ANCHOR_MODEL) * ANCHOR_SAMPLES  # backward 2x forward
    spans = {"whole iteration": ANCHOR_ITER_S,
             "iteration less allreduce": ANCHOR_ITER_S - ANCHOR_ALLREDUCE_S}  # fmt: skip
    for label, secs in spans.items():
        rate = work / secs / 1e12
        print(f"anchor {ANCHOR_MODEL} on an H100, {label}: {rate:.3g} TFLOP/s = "
              f"{100 * rate / H100_FP32_TFLOPS:.2g} % of {H100_FP32_TFLOPS:g}")  # fmt: skip
    for u in utilizations:
        tflops = H100_FP32_TFLOPS * u / 100
        ms = (forward * 3 / (tflops * 1e12)) * 1e3  # backward 2x forward, as derived
        print(f"{u:g} % of {H100_FP32_TFLOPS:g}: --tflops {tflops:.4g} "
              f"(forward + backward {ms:.3g} ms)")  # fmt: skip
        its = {k: v - CPU_COMPUTE_MS + ms for k, v in MEASURED_MS.items()}
        base = its["fp32 allreduce"]
        print("  computed iteration ms: " + ", ".join(
            f"{k} {v:.1f} ({base / v:.2f}x fp32)" for k, v in its.items()))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], [float(u) for u in sys.argv[2:]] or [4, 15, 50])
