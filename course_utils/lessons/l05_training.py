"""Lesson 05's small CNN, in the package because lesson 08 trains it too (lesson 05 writes its
training loop and pipelines in its own ``%%writefile lesson05_training.py`` cell)."""
from __future__ import annotations

import torch
import torch.nn as nn

from ..checks import check_int

__all__ = ["SmallCNN"]


class SmallCNN(nn.Module):
    """4 stages of (3x3 conv stride 2 + 3x3 conv), BatchNorm, ReLU, with width, 2, 4 and 8 width
    channels; global average pooling; a linear classifier. Its cost grows with width**2 and pixels."""

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        for name, value in (("width", width), ("num_classes", num_classes)):
            check_int(name, value, 1, "SmallCNN")
        layers: list[nn.Module] = []
        c_in = 3
        for stage in range(4):
            c = int(width) * 2 ** stage
            layers += [nn.Conv2d(c_in, c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                       nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
            c_in = c
        self.width = int(width)
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, int(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))
