"""Residual networks.

* :class:`ResNet` -- ImageNet ResNet-18/34/50/101/152, He et al., "Deep Residual
  Learning for Image Recognition", CVPR 2016.  Projection shortcuts (option B)
  where the shape changes; in the bottleneck the stride-2 downsampling sits on
  the first 1x1 convolution as in the paper's original models (torchvision's
  "v1.5" moves it to the 3x3: same parameters, larger 1x1 activations).
* :class:`PreActResNet` -- pre-activation bottleneck ResNet for CIFAR, He et al.,
  "Identity Mappings in Deep Residual Networks", ECCV 2016 (ResNet-1001 and
  Layrub's ResNet-1517).  Stride sits on the 3x3 convolution (as in fb.resnet.torch;
  the paper does not say); projection shortcuts are unnormalised 1x1 convolutions applied to
  the pre-activated input.
* :class:`CifarResNet` -- post-activation basic-block CIFAR ResNet (He et al.
  2016, Sec. 4.2) with optional stochastic depth, Huang et al., "Deep Networks
  with Stochastic Depth", ECCV 2016.  Downsampling shortcuts are 2x2 average
  pooling plus zero channel padding, as in Huang et al.'s code.

All weights use PyTorch's default initialisation: the papers' schemes change
values, not shapes or memory.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import nn


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions (ResNet-18/34)."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *_conv_bn(cin, planes, 3, stride), nn.ReLU(inplace=True), *_conv_bn(planes, planes, 3)
        )
        self.shortcut = (
            nn.Sequential(*_conv_bn(cin, planes, 1, stride))
            if stride != 1 or cin != planes
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4) (ResNet-50/101/152); stride on the first 1x1."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        cout = planes * self.expansion
        self.body = nn.Sequential(
            *_conv_bn(cin, planes, 1, stride),
            nn.ReLU(inplace=True),
            *_conv_bn(planes, planes, 3),
            nn.ReLU(inplace=True),
            *_conv_bn(planes, cout, 1),
        )
        self.shortcut = (
            nn.Sequential(*_conv_bn(cin, cout, 1, stride))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """ImageNet ResNet: 7x7/2 stem, 3x3/2 max pool, four stages, global pool, FC."""

    def __init__(
        self, block: type[BasicBlock | Bottleneck], layers: tuple[int, int, int, int], num_classes: int = 1000
    ) -> None:
        super().__init__()
        stages: list[nn.Module] = []
        cin = 64
        for i, (planes, n) in enumerate(zip((64, 128, 256, 512), layers)):
            for j in range(n):
                stages.append(block(cin, planes, 2 if i > 0 and j == 0 else 1))
                cin = planes * block.expansion
        self.features = nn.Sequential(
            *_conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1), *stages
        )
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


RESNET_LAYERS: dict[int, tuple[type[BasicBlock | Bottleneck], tuple[int, int, int, int]]] = {
    18: (BasicBlock, (2, 2, 2, 2)),
    34: (BasicBlock, (3, 4, 6, 3)),
    50: (Bottleneck, (3, 4, 6, 3)),
    101: (Bottleneck, (3, 4, 23, 3)),
    152: (Bottleneck, (3, 8, 36, 3)),
}


def resnet(depth: int, num_classes: int = 1000) -> ResNet:
    """ImageNet ResNet of the given depth (18, 34, 50, 101 or 152)."""
    block, layers = RESNET_LAYERS[depth]
    return ResNet(block, layers, num_classes)


class PreActBottleneck(nn.Module):
    """BN-ReLU-1x1, BN-ReLU-3x3 (stride), BN-ReLU-1x1 with identity (or 1x1 projection) shortcut."""

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        cout = planes * 4
        self.pre = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(inplace=True))
        self.body = nn.Sequential(
            nn.Conv2d(cin, planes, 1, bias=False),
            nn.BatchNorm2d(planes),
            nn.ReLU(inplace=True),
            nn.Conv2d(planes, planes, 3, stride, 1, bias=False),
            nn.BatchNorm2d(planes),
            nn.ReLU(inplace=True),
            nn.Conv2d(planes, cout, 1, bias=False),
        )
        self.projection = (
            nn.Conv2d(cin, cout, 1, stride, bias=False) if stride != 1 or cin != cout else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.pre(x)
        shortcut = x if self.projection is None else self.projection(out)
        return self.body(out) + shortcut


class PreActResNet(nn.Module):
    """CIFAR pre-activation bottleneck ResNet of depth 9n+2 with widths 16/64, 32/128, 64/256.

    n=111 gives ResNet-1001 (10.3M parameters).  Layrub's "ResNet-1517" has no integral n
    (n=168.33), so the ``resnet1517`` workload uses n=168, i.e. depth 1514.
    """

    def __init__(self, n: int, num_classes: int = 10) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        cin = 16
        for i, planes in enumerate((16, 32, 64)):
            for j in range(n):
                blocks.append(PreActBottleneck(cin, planes, 2 if i > 0 and j == 0 else 1))
                cin = planes * 4
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, 1, 1, bias=False), *blocks, nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
        )
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class StochasticBasicBlock(nn.Module):
    """Post-activation CIFAR basic block that survives with probability ``survival`` in training.

    A dropped block outputs its shortcut directly: the paper's ReLU(shortcut(x)) equals
    shortcut(x) because x is already the output of a ReLU.  In eval mode the residual
    branch is scaled by ``survival`` (Huang et al., Eq. 5).
    """

    def __init__(self, cin: int, cout: int, stride: int, survival: float) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *_conv_bn(cin, cout, 3, stride), nn.ReLU(inplace=True), *_conv_bn(cout, cout, 3)
        )
        self.stride, self.pad, self.survival = stride, cout - cin, survival

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = F.avg_pool2d(x, self.stride)
        return F.pad(x, (0, 0, 0, 0, 0, self.pad)) if self.pad else x

    def forward(self, x: torch.Tensor, active: bool = True) -> torch.Tensor:
        if not active:
            return self.shortcut(x)
        body = self.body(x)
        if not self.training and self.survival != 1.0:
            body = body * self.survival
        return F.relu(body + self.shortcut(x))


class CifarResNet(nn.Module):
    """CIFAR ResNet of depth 6n+2 (basic blocks, widths w, 2w, 4w) with optional stochastic depth.

    Survival probabilities decay linearly from 1.0 (input) to ``last_survival`` (last block):
    p_l = 1 - l/L (1 - p_L).  The Bernoulli draws come from a ``random.Random(seed)`` owned
    by the module, never from tensor data, so they work on the ``meta`` device and the sequence
    of sampled graphs is reproducible from the seed.  ``last_active`` records the decisions of
    the latest forward call.
    """

    def __init__(
        self, n: int, width: int = 16, num_classes: int = 10, last_survival: float = 1.0, seed: int = 0
    ) -> None:
        super().__init__()
        total = 3 * n
        blocks: list[StochasticBasicBlock] = []
        cin = width
        for i in range(3):
            for j in range(n):
                cout = width * 2**i
                survival = 1.0 - (len(blocks) + 1) / total * (1.0 - last_survival)
                blocks.append(StochasticBasicBlock(cin, cout, 2 if i > 0 and j == 0 else 1, survival))
                cin = cout
        self.stem = nn.Sequential(*_conv_bn(3, width, 3), nn.ReLU(inplace=True))
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(cin, num_classes)
        self.rng = random.Random(seed)
        self.last_active: tuple[bool, ...] = (True,) * total

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last_active = tuple(
            not self.training or b.survival == 1.0 or self.rng.random() < b.survival for b in self.blocks
        )
        x = self.stem(x)
        for block, active in zip(self.blocks, self.last_active):
            x = block(x, active)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
