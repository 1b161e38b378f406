"""Lesson 05's small CNN, kept in the package because lesson 08 trains it too.

Lesson 05 writes its training loop, the three pipelines and the data-wait comparison itself
(``%%writefile lesson05_training.py`` in notebooks/05_gpu_augmentation.ipynb, which
``course_authoring.gpu_lesson05`` imports for the GPU check). Nothing happens at import time.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..checks import check_int

__all__ = ["SmallCNN"]


class SmallCNN(nn.Module):
    """A small real CNN: 4 stages of (3x3 conv stride 2 + 3x3 conv), BatchNorm, ReLU; global
    average pooling; a linear classifier. Channels: width, 2 width, 4 width, 8 width.

    Forward cost: about 0.6 GFLOP per 224x224 image at width 16; it grows with width**2 and
    with the number of pixels (width 32: about 2.3 GFLOP; 64x64 images: 1/12 of that).
    """

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
