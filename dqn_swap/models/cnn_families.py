"""Convolutional networks of the corpus generator's newer families (:mod:`dqn_swap.models.generator`):
the block shapes users bring beyond plain ResNets.

* :class:`SECNN` -- ResNet stages (He et al. 2016) whose blocks carry squeeze-and-excitation
  (Hu et al., "Squeeze-and-Excitation Networks", CVPR 2018: global pooling, a bottleneck
  MLP of reduction ``r``, a sigmoid gate per channel) and stochastic depth with survival
  probabilities decaying linearly from 1 to ``last_survival`` (Huang et al., ECCV 2016,
  Eq. 4).  Departure from Huang et al.: a residual branch is dropped per *sample* (the
  "drop path" of FractalNet/EfficientNet/timm: a Bernoulli mask of shape (batch, 1, 1, 1),
  the kept branches scaled by 1/p), not for the whole batch as
  :class:`~dqn_swap.models.resnet.CifarResNet` does.  The mask is tensor data, so the
  graph of an iteration is the same whatever is drawn: it records on ``meta`` and every
  recording of a seed is the same trace.
* :class:`GroupedCNN` -- ``"resnext"``: bottleneck blocks whose 3x3 convolution is grouped
  (Xie et al., "Aggregated Residual Transformations", CVPR 2017), batch norm;
  ``"convnext"``: a depthwise ``kernel`` x ``kernel`` convolution, layer norm over channels
  and a 4x inverted-bottleneck MLP (Liu et al., "A ConvNet for the 2020s", CVPR 2022;
  departures: a 2x2 stride-2 stem instead of 4x4 stride 4, so that small images keep some
  resolution, and no layer scale).
* :class:`VideoCNN` -- 3D convolutions over clips (batch, 3, frames, H, W): full 3x3x3
  kernels (C3D, Tran et al. ICCV 2015) or factorised (2+1)D ones (a 1x3x3 spatial then a
  3x1x1 temporal convolution, Tran et al. CVPR 2018), residual blocks, strided in space and
  (while frames remain) in time.
* :class:`InceptionCNN` -- inception blocks (Szegedy et al., "Going Deeper with
  Convolutions", CVPR 2015): four branches (1x1; 1x1 then 3x3; 1x1 then two 3x3, the
  factorised 5x5 of Inception-v2; 3x3 max pool then 1x1) concatenated on channels, batch
  norm after every convolution (Ioffe and Szegedy 2015).

Weights use PyTorch's default initialisation (values, not memory).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .families import _PooledClassifier, _conv_bn_relu


def drop_path(x: torch.Tensor, survival: float, training: bool) -> torch.Tensor:
    """``x`` with each sample kept with probability ``survival`` (scaled by 1/survival) in training.

    The mask is drawn with ``torch.rand`` on ``x``'s device: seeded by ``torch.manual_seed``
    on a real device, shape-only on ``meta``."""
    if not training or survival >= 1.0:
        return x
    keep = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device, dtype=x.dtype) < survival
    return x * keep / survival


class SqueezeExcitation(nn.Module):
    """x * sigmoid(W2 relu(W1 avgpool(x))), W1: C -> C/r, W2: C/r -> C (Hu et al. 2018)."""

    def __init__(self, channels: int, reduction: int) -> None:
        super().__init__()
        hidden = max(4, channels // reduction)
        self.fc1, self.fc2 = nn.Conv2d(channels, hidden, 1), nn.Conv2d(hidden, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.fc2(F.relu(self.fc1(s))))


class _SEBlock(nn.Module):
    """relu(shortcut(x) + drop_path(SE(body(x)))): a basic (two 3x3) or bottleneck (1x1, 3x3, 1x1 x4) body."""

    def __init__(self, cin: int, planes: int, stride: int, bottleneck: bool, reduction: int,
                 survival: float) -> None:
        super().__init__()
        if bottleneck:
            cout = 4 * planes
            layers = _conv_bn_relu(cin, planes, 1) + _conv_bn_relu(planes, planes, 3, stride) \
                + _conv_bn_relu(planes, cout, 1, relu=None)
        else:
            cout = planes
            layers = _conv_bn_relu(cin, planes, 3, stride) + _conv_bn_relu(planes, planes, 3, relu=None)
        self.body = nn.Sequential(*layers)
        self.se = SqueezeExcitation(cout, reduction)
        self.shortcut = (nn.Sequential(*_conv_bn_relu(cin, cout, 1, stride, relu=None))
                         if stride != 1 or cin != cout else nn.Identity())
        self.survival, self.cout = survival, cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = drop_path(self.se(self.body(x)), self.survival, self.training)
        return F.relu(self.shortcut(x) + branch)


class SECNN(_PooledClassifier):
    """A 3x3 stem, then stages of ``blocks[i]`` SE blocks of width ``width * 2**i`` (stride 2 from stage 2).

    Block l of L survives with p_l = 1 - l/L (1 - ``last_survival``) (Huang et al. 2016)."""

    def __init__(self, blocks: tuple[int, ...], width: int, bottleneck: bool, reduction: int,
                 last_survival: float, classes: int) -> None:
        super().__init__()
        total = sum(blocks)
        layers: list[nn.Module] = _conv_bn_relu(3, width)
        cin, index = width, 0
        for i, n in enumerate(blocks):
            for j in range(n):
                index += 1
                survival = 1.0 - index / total * (1.0 - last_survival)
                block = _SEBlock(cin, width * 2**i, 2 if i > 0 and j == 0 else 1, bottleneck, reduction, survival)
                layers.append(block)
                cin = block.cout
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)


class _ChannelLayerNorm(nn.Module):
    """Layer norm over the channels of (N, C, H, W), as ConvNeXt's channels-first LayerNorm."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _ResNeXtBlock(nn.Module):
    """1x1 to ``inner``, grouped 3x3 (``groups``, stride), 1x1 to ``cout``; batch norm; projection shortcut."""

    def __init__(self, cin: int, inner: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn_relu(cin, inner, 1), *_conv_bn_relu(inner, inner, 3, stride, groups),
                                  *_conv_bn_relu(inner, cout, 1, relu=None))
        self.shortcut = (nn.Sequential(*_conv_bn_relu(cin, cout, 1, stride, relu=None))
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class _ConvNeXtBlock(nn.Module):
    """x + Linear(GELU(Linear(LN(dwconv_k(x))))), the MLP 4x wide, applied channels-last."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(channels, channels, kernel, padding=kernel // 2, groups=channels)
        self.norm = nn.LayerNorm(channels)
        self.mlp = nn.Sequential(nn.Linear(channels, 4 * channels), nn.GELU(), nn.Linear(4 * channels, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mlp(self.norm(self.dwconv(x).permute(0, 2, 3, 1)))
        return x + y.permute(0, 3, 1, 2)


class GroupedCNN(_PooledClassifier):
    """``style`` ``"resnext"`` (grouped 3x3 bottlenecks, ``groups``) or ``"convnext"`` (depthwise
    ``kernel`` x ``kernel``, layer norm); stage i is ``blocks[i]`` blocks of width ``width * 2**i``."""

    def __init__(self, style: str, blocks: tuple[int, ...], width: int, groups: int, kernel: int,
                 classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if style == "resnext":
            layers += _conv_bn_relu(3, width)
            cin = width
            for i, n in enumerate(blocks):
                inner, cout = width * 2**i, 2 * width * 2**i
                for j in range(n):
                    layers.append(_ResNeXtBlock(cin, inner, cout, 2 if i > 0 and j == 0 else 1, groups))
                    cin = cout
        elif style == "convnext":
            layers += [nn.Conv2d(3, width, 2, 2), _ChannelLayerNorm(width)]
            cin = width
            for i, n in enumerate(blocks):
                cout = width * 2**i
                if i > 0:
                    layers += [_ChannelLayerNorm(cin), nn.Conv2d(cin, cout, 2, 2)]
                layers += [_ConvNeXtBlock(cout, kernel) for _ in range(n)]
                cin = cout
            layers.append(_ChannelLayerNorm(cin))
        else:
            raise ValueError(f"unknown grouped-convolution style {style!r}: 'resnext' or 'convnext'")
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)


def _conv3d_bn_relu(cin: int, cout: int, kernel: tuple[int, int, int], stride: tuple[int, int, int],
                    relu: bool = True) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv3d(cin, cout, kernel, stride, tuple(k // 2 for k in kernel), bias=False),
                               nn.BatchNorm3d(cout)]
    return layers + [nn.ReLU(inplace=True)] if relu else layers


class _VideoBlock(nn.Module):
    """Two 3D convolutions (3x3x3, or (2+1)D: 1x3x3 then 3x1x1 each) and a residual connection."""

    def __init__(self, cin: int, cout: int, stride: tuple[int, int, int], factorised: bool) -> None:
        super().__init__()

        def conv(a: int, b: int, s: tuple[int, int, int], relu: bool) -> list[nn.Module]:
            if not factorised:
                return _conv3d_bn_relu(a, b, (3, 3, 3), s, relu)
            return _conv3d_bn_relu(a, b, (1, 3, 3), (1, s[1], s[2])) + _conv3d_bn_relu(b, b, (3, 1, 1), (s[0], 1, 1),
                                                                                        relu)

        self.body = nn.Sequential(*conv(cin, cout, stride, True), *conv(cout, cout, (1, 1, 1), False))
        self.shortcut = (nn.Sequential(*_conv3d_bn_relu(cin, cout, (1, 1, 1), stride, relu=False))
                         if stride != (1, 1, 1) or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class VideoCNN(nn.Module):
    """Clips (batch, 3, ``frames``, H, W): a 3x3x3 stem, stages of ``blocks[i]`` residual 3D blocks of width
    ``width * 2**i`` (stride 2 in space from stage 2, and in time while more than 2 frames remain),
    global average pooling, a classifier."""

    def __init__(self, frames: int, blocks: tuple[int, ...], width: int, factorised: bool, classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = _conv3d_bn_relu(3, width, (3, 3, 3), (1, 1, 1))
        cin, t = width, frames
        for i, n in enumerate(blocks):
            for j in range(n):
                if i > 0 and j == 0:
                    st = 2 if t > 2 else 1
                    t = (t + st - 1) // st
                    stride = (st, 2, 2)
                else:
                    stride = (1, 1, 1)
                layers.append(_VideoBlock(cin, width * 2**i, stride, factorised))
                cin = width * 2**i
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool3d(self.features(x), 1), 1))


class _InceptionBlock(nn.Module):
    """Concatenation of 1x1 | 1x1-3x3 | 1x1-3x3-3x3 | maxpool3x3-1x1 branches: ``4 * branch`` channels out."""

    def __init__(self, cin: int, branch: int) -> None:
        super().__init__()
        reduce = max(8, branch // 2)
        self.b1 = nn.Sequential(*_conv_bn_relu(cin, branch, 1))
        self.b2 = nn.Sequential(*_conv_bn_relu(cin, reduce, 1), *_conv_bn_relu(reduce, branch, 3))
        self.b3 = nn.Sequential(*_conv_bn_relu(cin, reduce, 1), *_conv_bn_relu(reduce, branch, 3),
                                *_conv_bn_relu(branch, branch, 3))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), *_conv_bn_relu(cin, branch, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], dim=1)


class InceptionCNN(_PooledClassifier):
    """A 3x3 stem of ``width`` channels, stages of ``blocks[i]`` inception blocks (branches of
    ``width * 2**i // 2`` channels), a 3x3 stride-2 max pool between stages."""

    def __init__(self, blocks: tuple[int, ...], width: int, classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = _conv_bn_relu(3, width)
        cin = width
        for i, n in enumerate(blocks):
            if i > 0:
                layers.append(nn.MaxPool2d(3, 2, 1))
            for _ in range(n):
                layers.append(_InceptionBlock(cin, width * 2**i // 2))
                cin = 4 * (width * 2**i // 2)
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)


__all__ = ["GroupedCNN", "InceptionCNN", "SECNN", "SqueezeExcitation", "VideoCNN", "drop_path"]
