"""VGG-16/19, Simonyan & Zisserman, "Very Deep Convolutional Networks for Large-Scale
Image Recognition", ICLR 2015: configurations D and E without batch norm, 224x224 input,
classifier 4096-4096-classes with dropout 0.5.  PyTorch default initialisation."""

from __future__ import annotations

import torch
from torch import nn

# Output channels of each 3x3 convolution; "M" is a 2x2/2 max pool.
VGG_CONFIGS: dict[int, tuple[int | str, ...]] = {
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    19: (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
         512, 512, 512, 512, "M"),
}


class VGG(nn.Module):
    """VGG for 224x224 inputs (7x7x512 feature map before the classifier)."""

    def __init__(self, depth: int, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in VGG_CONFIGS[depth]:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, int(v), 3, padding=1), nn.ReLU(inplace=True)]
                cin = int(v)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))
