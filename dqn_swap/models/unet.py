"""U-Net, Ronneberger et al., "U-Net: Convolutional Networks for Biomedical Image
Segmentation", MICCAI 2015.

Four 2x2 max-pool downsamplings and four 2x2 up-convolutions, 64 base channels doubling
to 1024, two unnormalised 3x3 conv + ReLU per level, dropout 0.5 at the end of the
contracting path and a final 1x1 convolution to the classes.  Departure: the 3x3
convolutions use padding=1, so the output has the input's height and width and the skip
connections need no cropping (the paper's valid convolutions map 572x572 to 388x388).
PyTorch default initialisation.
"""

from __future__ import annotations

import torch
from torch import nn


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    """U-Net with ``levels`` down/up steps; input height and width must divide 2**levels."""

    def __init__(self, in_channels: int = 3, num_classes: int = 2, base: int = 64, levels: int = 4) -> None:
        super().__init__()
        widths = [base * 2**i for i in range(levels + 1)]
        self.down = nn.ModuleList(
            _double_conv(cin, cout) for cin, cout in zip([in_channels, *widths[:-2]], widths[:-1])
        )
        self.pool = nn.MaxPool2d(2)
        self.bottom = nn.Sequential(_double_conv(widths[-2], widths[-1]), nn.Dropout(0.5))
        self.up = nn.ModuleList(
            nn.ConvTranspose2d(cin, cout, 2, stride=2) for cin, cout in zip(widths[:0:-1], widths[-2::-1])
        )
        self.decode = nn.ModuleList(_double_conv(2 * c, c) for c in widths[-2::-1])
        self.head = nn.Conv2d(base, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips: list[torch.Tensor] = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottom(x)
        for up, decode, skip in zip(self.up, self.decode, reversed(skips)):
            x = decode(torch.cat([skip, up(x)], dim=1))
        return self.head(x)
