"""DenseNet-BC, Huang et al., "Densely Connected Convolutional Networks", CVPR 2017:
DenseNet-121 (growth 32, blocks 6-12-24-16, bottleneck width 4*growth, compression 0.5),
224x224 input.  Each layer concatenates all earlier feature maps afresh (the standard,
memory-hungry implementation, not the shared-storage variant of Pleiss et al. 2017).
PyTorch default initialisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 conv (bn_size*growth) - BN-ReLU-3x3 conv (growth) on the concatenated inputs."""

    def __init__(self, cin: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(cin), nn.ReLU(inplace=True), nn.Conv2d(cin, bn_size * growth, 1, bias=False),
            nn.BatchNorm2d(bn_size * growth), nn.ReLU(inplace=True),
            nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False),
        )

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        return self.body(torch.cat(features, dim=1))


class DenseBlock(nn.Module):
    """``n`` dense layers; outputs the concatenation of the input and every layer's output."""

    def __init__(self, n: int, cin: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(cin + i * growth, growth, bn_size) for i in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, dim=1)


class DenseNet(nn.Module):
    """ImageNet DenseNet-BC: 7x7/2 stem, 3x3/2 max pool, dense blocks joined by transitions."""

    def __init__(
        self,
        blocks: tuple[int, ...] = (6, 12, 24, 16),
        growth: int = 32,
        init_features: int = 64,
        bn_size: int = 4,
        compression: float = 0.5,
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, init_features, 7, 2, 3, bias=False), nn.BatchNorm2d(init_features),
            nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
        ]
        c = init_features
        for i, n in enumerate(blocks):
            layers.append(DenseBlock(n, c, growth, bn_size))
            c += n * growth
            if i < len(blocks) - 1:
                cout = int(c * compression)
                layers += [
                    nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, cout, 1, bias=False), nn.AvgPool2d(2, 2)
                ]
                c = cout
        layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))
