"""A training script that waits for data: the common mistakes (``num_workers=0``, a per-sample
decode, blur and float32 conversion) in front of a model that takes a millisecond, with a
validation loader beside the training one. Run it as it is, or let ``diagnose`` run it::

    python -m course_utils diagnose course_utils/tools/examples/data_bound.py --epochs 50
"""
from __future__ import annotations

import argparse

import cv2
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from course_utils.config import pick
from course_utils.data import JpegDataset


class BlurredFloatImages(Dataset):
    """Course JPEGs decoded, blurred and resized per sample, returned as float32 CHW tensors."""

    def __init__(self, n: int, size: int = 96, seed: int = 0) -> None:
        self.base, self.size = JpegDataset(n, seed=seed, progress=False), size

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = self.base[i]
        image = cv2.GaussianBlur(image, (7, 7), 0)
        image = cv2.resize(image, (self.size, self.size)).astype(np.float32) / 255
        return torch.from_numpy(image).permute(2, 0, 1), label


def make_model(device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 96 * 96, 10)).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple,
               device: torch.device) -> float:
    images, labels = (t.to(device, non_blocking=True) for t in batch)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--images", type=int, default=pick(full=512, quick=192))
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train = DataLoader(BlurredFloatImages(args.images), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(BlurredFloatImages(max(16, args.images // 8), seed=1),
                     batch_size=args.batch_size)
    model, optimizer = make_model(device)
    for epoch in range(args.epochs):
        model.train()
        losses = [train_step(model, optimizer, batch, device) for batch in train]
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(x.to(device)).argmax(1).cpu() == y).sum()) for x, y in val)
        print(f"epoch {epoch}: loss {np.mean(losses):.3f}, validation accuracy "
              f"{correct / len(val.dataset):.0%}")


if __name__ == "__main__":
    main()
