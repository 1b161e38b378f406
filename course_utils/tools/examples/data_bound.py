"""A loop that waits for data: the common mistakes (``num_workers=0``, a per-sample decode, blur
and float32 conversion) in front of a model that takes a millisecond. ``diagnose`` should call
it data-bound and measure what more workers give."""
from __future__ import annotations

import cv2
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from course_utils.config import pick
from course_utils.data import JpegDataset


class BlurredFloatImages(Dataset):
    """Course JPEGs decoded, blurred and resized per sample, returned as float32 CHW tensors."""

    def __init__(self, n: int, size: int = 96) -> None:
        self.base, self.size = JpegDataset(n, progress=False), size

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = self.base[i]
        image = cv2.GaussianBlur(image, (7, 7), 0)
        image = cv2.resize(image, (self.size, self.size)).astype(np.float32) / 255
        return torch.from_numpy(image).permute(2, 0, 1), label


def make_loop() -> tuple[DataLoader, object]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(BlurredFloatImages(pick(full=512, quick=192)), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 96 * 96, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        images, labels = (t.to(device, non_blocking=True) for t in batch)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()

    return loader, step
