"""ImageNet-sized networks (3x224x224, 1000 classes): the seed 002 workloads.

AlexNet, VGG-16/19, ResNet-50/152 and GoogLeNet come from torchvision, always with
``weights=None`` (random initialisation; nothing is ever downloaded). BN-Inception (Ioffe & Szegedy
2015, the "Inception with batch normalization" network of seed 002, ~11M parameters) is not in
torchvision, so it is written out here from the paper's Table 1.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn
from torch.nn import functional as F


def torchvision() -> ModuleType:
    """torchvision, imported when a model or dataset of it is first built (``qbench.data.real``
    reads CIFAR-10 and ImageNet with it)."""
    import torchvision as tv  # slow import (~1 s): only for the models and datasets that use it

    return tv


def torchvision_model(name: str, **kwargs: object) -> nn.Module:
    """``torchvision.models.<name>(weights=None, num_classes=1000, **kwargs)``."""
    builder = getattr(torchvision().models, name)
    model: nn.Module = builder(weights=None, num_classes=1000, **kwargs)
    return model


def alexnet() -> nn.Module:
    return torchvision_model("alexnet")


def vgg16() -> nn.Module:
    return torchvision_model("vgg16")


def vgg19() -> nn.Module:
    return torchvision_model("vgg19")


def resnet50() -> nn.Module:
    return torchvision_model("resnet50")


def resnet152() -> nn.Module:
    return torchvision_model("resnet152")


def googlenet() -> nn.Module:
    return torchvision_model("googlenet", aux_logits=False, init_weights=True)


def _conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)
    )


class _Inception(nn.Module):
    """One BN-Inception module: 1x1 | 1x1-3x3 | 1x1-3x3-3x3 | pool(-1x1 projection).

    ``stride=2`` modules (3c, 4e) have no 1x1 branch and pass the max-pooled input through.
    """

    def __init__(
        self, cin: int, n1: int, r3: int, n3: int, rd: int, nd: int, pool: str, proj: int,
        stride: int = 1,
    ) -> None:  # fmt: skip
        super().__init__()
        self.b1 = _conv(cin, n1, 1) if n1 else None
        self.b3 = nn.Sequential(_conv(cin, r3, 1), _conv(r3, n3, 3, stride))
        self.bd = nn.Sequential(_conv(cin, rd, 1), _conv(rd, nd, 3), _conv(nd, nd, 3, stride))
        self.pool = pool
        self.stride = stride
        self.proj = _conv(cin, proj, 1) if proj else None
        self.out_channels = n1 + n3 + nd + (proj or cin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = F.max_pool2d if self.pool == "max" else F.avg_pool2d
        p = pool(x, 3, self.stride, 1)
        ys = [self.b3(x), self.bd(x), self.proj(p) if self.proj is not None else p]
        if self.b1 is not None:
            ys.insert(0, self.b1(x))
        return torch.cat(ys, 1)


# (1x1, 3x3 reduce, 3x3, double-3x3 reduce, double-3x3, pool, projection, stride): Table 1 of
# Ioffe & Szegedy, "Batch Normalization", 2015.
_BN_INCEPTION = (
    (64, 64, 64, 64, 96, "avg", 32, 1),  # 3a
    (64, 64, 96, 64, 96, "avg", 64, 1),  # 3b
    (0, 128, 160, 64, 96, "max", 0, 2),  # 3c
    (224, 64, 96, 96, 128, "avg", 128, 1),  # 4a
    (192, 96, 128, 96, 128, "avg", 128, 1),  # 4b
    (160, 128, 160, 128, 160, "avg", 128, 1),  # 4c
    (96, 128, 192, 160, 192, "avg", 128, 1),  # 4d
    (0, 128, 192, 192, 256, "max", 0, 2),  # 4e
    (352, 192, 320, 160, 224, "avg", 128, 1),  # 5a
    (352, 192, 320, 192, 224, "max", 128, 1),  # 5b
)


class BNInception(nn.Module):
    """BN-Inception (Inception v2 of the batch-norm paper) for 224x224 input, 1000 classes."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            _conv(3, 64, 7, 2), nn.MaxPool2d(3, 2, ceil_mode=True),
            _conv(64, 64, 1), _conv(64, 192, 3), nn.MaxPool2d(3, 2, ceil_mode=True),
        )  # fmt: skip
        blocks: list[nn.Module] = []
        cin = 192
        for n1, r3, n3, rd, nd, pool, proj, stride in _BN_INCEPTION:
            block = _Inception(cin, n1, r3, n3, rd, nd, pool, proj, stride)
            blocks.append(block)
            cin = block.out_channels
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


def bninception() -> nn.Module:
    return BNInception()
