"""Parametric networks of the families the corpus generator samples (:mod:`dqn_swap.models.generator`).

Each class is one family's architecture with its sizes as arguments; the zoo's own
networks serve the families they belong to (:class:`~dqn_swap.models.resnet.ResNet` blocks,
:class:`~dqn_swap.models.densenet.DenseNet`, :class:`~dqn_swap.models.unet.UNet`,
:class:`~dqn_swap.models.transformer.GPT`, :class:`~dqn_swap.models.rnn.CharLSTM`).

* :class:`PlainCNN` -- VGG-style stacks of 3x3 convolutions, max pooling between stages
  (Simonyan and Zisserman 2015), optional batch norm.
* :class:`ResidualCNN` -- ResNet stages of basic or bottleneck blocks (He et al. 2016),
  a 3x3 stem for small images; with a widening factor and dropout between the two
  convolutions of a block it is a wide ResNet (Zagoruyko and Komodakis 2016).
* :class:`InvertedResidualCNN` -- MobileNetV2's inverted residuals: 1x1 expansion,
  3x3 depthwise convolution, linear 1x1 projection (Sandler et al. 2018).
* :class:`VisionTransformer` -- ViT: patch embedding, encoder blocks, mean pooling
  (Dosovitskiy et al. 2021; mean pooling instead of a class token).
* :class:`TextEncoder` -- a BERT-shaped encoder trained on every position (Devlin et al.
  2019; no next-sentence head).
* :class:`GRUSeq2Seq` -- GRU encoder and teacher-forced GRU decoder (Cho et al. 2014),
  unrolled op by op as :class:`~dqn_swap.models.rnn.CharLSTM` is.
* :class:`MLPMixer` -- token-mixing and channel-mixing MLPs over patches (Tolstikhin et
  al. 2021).
* :class:`DeepMLP` -- fully connected layers with layer norm and ReLU.

Weights use PyTorch's default initialisation (values, not memory).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .resnet import BasicBlock, Bottleneck
from .transformer import Block, GPTConfig


def _conv_bn_relu(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1,
                  relu: type[nn.Module] | None = nn.ReLU) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if relu is not None:
        layers.append(relu(inplace=True))
    return layers


class _PooledClassifier(nn.Module):
    """``features`` (set by the subclass), global average pooling, then the linear ``fc``."""

    features: nn.Module
    fc: nn.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class PlainCNN(_PooledClassifier):
    """Stages of ``convs`` 3x3 convolutions (widths ``widths``), a 2x2 max pool after each, then a classifier."""

    def __init__(self, widths: tuple[int, ...], convs: int, batch_norm: bool, classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for width in widths:
            for _ in range(convs):
                if batch_norm:
                    layers += _conv_bn_relu(cin, width)
                else:
                    layers += [nn.Conv2d(cin, width, 3, 1, 1), nn.ReLU(inplace=True)]
                cin = width
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)



class _WideBlock(nn.Module):
    """Pre-activation basic block with dropout between its convolutions (wide ResNet)."""

    def __init__(self, cin: int, cout: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.drop = nn.Dropout(dropout)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.shortcut = (nn.Conv2d(cin, cout, 1, stride, bias=False) if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.bn1(x))
        y = self.conv2(F.relu(self.bn2(self.drop(self.conv1(a)))))
        return y + (self.shortcut(a) if self.shortcut is not None else x)


class ResidualCNN(_PooledClassifier):
    """ResNet stages (``blocks[i]`` blocks of width ``width * 2**i``) after a 3x3 stem.

    ``block``: ``"basic"``, ``"bottleneck"`` or ``"wide"`` (pre-activation basic blocks of
    width ``width * widen * 2**i`` with ``dropout`` inside).
    """

    def __init__(self, block: str, blocks: tuple[int, ...], width: int, classes: int, widen: int = 1,
                 dropout: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = _conv_bn_relu(3, width)
        cin = width
        for i, n in enumerate(blocks):
            planes = width * widen * 2**i
            for j in range(n):
                stride = 2 if i > 0 and j == 0 else 1
                if block == "wide":
                    layers.append(_WideBlock(cin, planes, stride, dropout))
                    cin = planes
                else:
                    kind = BasicBlock if block == "basic" else Bottleneck
                    layers.append(kind(cin, planes, stride))
                    cin = planes * kind.expansion
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)



class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers = _conv_bn_relu(cin, hidden, 1, relu=nn.ReLU6) if expand != 1 else []
        layers += _conv_bn_relu(hidden, hidden, 3, stride, groups=hidden, relu=nn.ReLU6)
        layers += _conv_bn_relu(hidden, cout, 1, relu=None)
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class InvertedResidualCNN(_PooledClassifier):
    """MobileNetV2: a strided 3x3 stem, then per stage (width, blocks, stride) inverted residuals."""

    def __init__(self, stages: tuple[tuple[int, int, int], ...], expand: int, stem: int, classes: int) -> None:
        super().__init__()
        layers = _conv_bn_relu(3, stem, 3, 2, relu=nn.ReLU6)
        cin = stem
        for width, n, stride in stages:
            for j in range(n):
                layers.append(_InvertedResidual(cin, width, stride if j == 0 else 1, 1 if cin == stem else expand))
                cin = width
        layers += _conv_bn_relu(cin, 4 * cin, 1, relu=nn.ReLU6)
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(4 * cin, classes)



class VisionTransformer(nn.Module):
    """Patches of ``patch`` pixels embedded to ``d_model``, ``layers`` encoder blocks, mean pooling."""

    def __init__(self, image: int, patch: int, layers: int, d_model: int, heads: int, classes: int) -> None:
        super().__init__()
        tokens = (image // patch) ** 2
        cfg = GPTConfig(layers=layers, d_model=d_model, heads=heads, seq_len=tokens, vocab=1, causal=False)
        self.embed = nn.Conv2d(3, d_model, patch, patch)
        self.pos = nn.Parameter(torch.zeros(1, tokens, d_model))
        self.blocks = nn.Sequential(*(Block(cfg) for _ in range(layers)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


class TextEncoder(nn.Module):
    """Token and position embeddings, ``layers`` unmasked encoder blocks, a head to the vocabulary."""

    def __init__(self, vocab: int, seq_len: int, layers: int, d_model: int, heads: int) -> None:
        super().__init__()
        cfg = GPTConfig(layers=layers, d_model=d_model, heads=heads, seq_len=seq_len, vocab=vocab, causal=False)
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(seq_len, d_model)
        self.blocks = nn.Sequential(*(Block(cfg) for _ in range(layers)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return self.head(self.norm(self.blocks(x)))


class _GRUCell(nn.Module):
    """One GRU step: r, z = sigmoid(...); n = tanh(W_x x + r * (W_h h)); h' = (1 - z) * n + z * h."""

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.x2gates = nn.Linear(input_size, 3 * hidden)
        self.h2gates = nn.Linear(hidden, 3 * hidden)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        xr, xz, xn = self.x2gates(x).chunk(3, dim=1)
        hr, hz, hn = self.h2gates(h).chunk(3, dim=1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        return (1 - z) * n + z * h


class GRUSeq2Seq(nn.Module):
    """Encodes source tokens with ``layers`` GRU layers; decodes target tokens from the final states."""

    def __init__(self, vocab: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.src_embed, self.tgt_embed = nn.Embedding(vocab, hidden), nn.Embedding(vocab, hidden)
        self.encoder = nn.ModuleList(_GRUCell(hidden, hidden) for _ in range(layers))
        self.decoder = nn.ModuleList(_GRUCell(hidden, hidden) for _ in range(layers))
        self.out = nn.Linear(hidden, vocab)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        zeros = source.new_zeros((source.shape[0], self.hidden), dtype=self.src_embed.weight.dtype)
        states = [zeros for _ in self.encoder]
        for x in self.src_embed(source).unbind(1):
            for i, cell in enumerate(self.encoder):
                states[i] = x = cell(x, states[i])
        outputs = []
        for x in self.tgt_embed(target).unbind(1):
            for i, cell in enumerate(self.decoder):
                states[i] = x = cell(x, states[i])
            outputs.append(x)
        return self.out(torch.stack(outputs, dim=1))


class _MixerBlock(nn.Module):
    def __init__(self, tokens: int, channels: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(channels, channel_hidden), nn.GELU(),
                                         nn.Linear(channel_hidden, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    """Patch embedding, ``layers`` mixer blocks, mean pooling, a classifier."""

    def __init__(self, image: int, patch: int, layers: int, channels: int, token_hidden: int, channel_hidden: int,
                 classes: int) -> None:
        super().__init__()
        tokens = (image // patch) ** 2
        self.embed = nn.Conv2d(3, channels, patch, patch)
        self.blocks = nn.Sequential(*(_MixerBlock(tokens, channels, token_hidden, channel_hidden)
                                      for _ in range(layers)))
        self.norm = nn.LayerNorm(channels)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


class DeepMLP(nn.Module):
    """``layers`` hidden layers of ``width`` units (Linear, LayerNorm, ReLU), then a linear output."""

    def __init__(self, inputs: int, width: int, layers: int, outputs: int) -> None:
        super().__init__()
        body: list[nn.Module] = []
        cin = inputs
        for _ in range(layers):
            body += [nn.Linear(cin, width), nn.LayerNorm(width), nn.ReLU()]
            cin = width
        self.body = nn.Sequential(*body, nn.Linear(cin, outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


__all__ = ["DeepMLP", "GRUSeq2Seq", "InvertedResidualCNN", "MLPMixer", "PlainCNN", "ResidualCNN", "TextEncoder",
           "VisionTransformer"]
