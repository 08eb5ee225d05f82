"""Small CPU-friendly models: logistic regression (seeds 000, 003), the MLP of seed 004, the CIFAR
ResNets (He et al. 2016: ResNet-20 of seed 001, ResNet-110 of seed 002) and VGG-16 with batch norm
for 32x32 input (seed 000)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def logreg() -> nn.Module:
    """Multinomial logistic regression on 784 inputs (MNIST-sized), 10 classes: one Linear."""
    return nn.Linear(784, 10)


def mlp() -> nn.Module:
    """784-392-50-10 with tanh, as in seed 004's MNIST experiments."""
    return nn.Sequential(
        nn.Linear(784, 392), nn.Tanh(), nn.Linear(392, 50), nn.Tanh(), nn.Linear(50, 10)
    )


def cnn() -> nn.Module:
    """A small CNN for 1x28x28 input (MNIST-sized): two 5x5 conv + max-pool stages and two
    fully connected layers, ~0.4M parameters; the accuracy scenarios' stand-in for seed 002's
    CNNs at a size two CPU cores train in minutes."""
    return nn.Sequential(
        nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(50 * 4 * 4, 500), nn.ReLU(), nn.Linear(500, 10),
    )  # fmt: skip


class BasicBlock(nn.Module):
    """conv-bn-relu, conv-bn, plus the shortcut (a 1x1 conv and bn where the shape changes),
    then relu. The ReLUs are modules registered right after the batch norm they follow (relu2
    after bn2, though it acts after the residual add) so that a norm swap which drops "the ReLU
    after a batch norm" (qbench.run.evonorm) drops both, as in seed 001's authors' network."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu2 = nn.ReLU()
        self.short: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu1(self.bn1(self.conv1(x)))
        return self.relu2(self.bn2(self.conv2(y)) + self.short(x))


class CifarResNet(nn.Module):
    """ResNet-6n+2 for 32x32 input: three stages of n blocks with 16, 32, 64 channels."""

    def __init__(self, n: int, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        layers: list[nn.Module] = []
        cin = 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(BasicBlock(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


def resnet20() -> nn.Module:
    return CifarResNet(3)


def resnet110() -> nn.Module:
    return CifarResNet(18)


# VGG-16 configuration: channels per conv, "M" = 2x2 max pool.
_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class CifarVGG(nn.Module):
    """VGG-16 with batch norm for 32x32 input (the SWA code of Izmailov et al. 2018 that seed 000
    follows): 13 convs, five pools down to 1x1x512, then a 512-512-classes classifier."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for c in _VGG16:
            if c == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                assert isinstance(c, int)
                layers += [nn.Conv2d(cin, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(True)]
                cin = c
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Dropout(), nn.Linear(512, 512), nn.ReLU(True),
            nn.Dropout(), nn.Linear(512, 512), nn.ReLU(True),
            nn.Linear(512, num_classes),
        )  # fmt: skip
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                assert m.bias is not None
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def vgg16_cifar() -> nn.Module:
    return CifarVGG()
