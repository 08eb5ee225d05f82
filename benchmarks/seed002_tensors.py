"""The gradient tensors of seed 002's networks as qbench's model zoo builds them, and the ones
seed 002's implementation quantizes: "not to quantize matrices with small number of elements
... We choose a threshold for small matrices in such way so we always quantize more than 99% of
all parameters" (§3.2.2). Taking tensors largest first until 99 % of the parameters are covered
gives that threshold. The counts go into scenarios/projection/studies/seed002-figure10.yaml (``tensors``,
``coded_tensors``, ``coded_params``).

    .venv/bin/python benchmarks/seed002_tensors.py
"""

from __future__ import annotations

import torch

from qbench.models import build

NETS = {"AlexNet": "alexnet", "BN-Inception": "bninception", "ResNet50": "resnet50",
        "ResNet110": "resnet110", "ResNet152": "resnet152", "VGG19": "vgg19"}  # fmt: skip


def main() -> None:
    print("network       zoo model    params        tensors  coded_tensors  coded_params")
    for name, zoo in NETS.items():
        with torch.device("meta"):
            model = build(zoo)
        sizes = sorted((p.numel() for p in model.parameters() if p.requires_grad), reverse=True)
        total, covered, coded = sum(sizes), 0, 0
        while covered < 0.99 * total:
            covered += sizes[coded]
            coded += 1
        print(f"{name:13} {zoo:12} {total:12,} {len(sizes):8} {coded:14} {covered:13,}")


if __name__ == "__main__":
    main()
