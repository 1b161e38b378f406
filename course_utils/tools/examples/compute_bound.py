"""A loop whose step is the bottleneck: ready uint8 tensors in (almost free to load), a small
CNN trained on the CPU. ``diagnose`` should call it compute-bound."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader

from course_utils.data import ArrayDataset


def make_loop() -> tuple[DataLoader, object]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(ArrayDataset(256, shape=(3, 64, 64)), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        images, labels = (t.to(device, non_blocking=True) for t in batch)
        optimizer.zero_grad()
        logits = model(images.float().div_(255))
        nn.functional.cross_entropy(logits, labels.long() % 10).backward()
        optimizer.step()

    return loader, step
