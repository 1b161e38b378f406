"""A training script whose step is the bottleneck: ready uint8 tensors in (almost free to load),
a small CNN trained on the CPU. ``diagnose`` should call it compute-bound::

    python -m course_utils diagnose course_utils/tools/examples/compute_bound.py --epochs 20"""
from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader

from course_utils.data import ArrayDataset


def make_model(device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple,
               device: torch.device) -> float:
    images, labels = (t.to(device, non_blocking=True) for t in batch)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(images.float().div_(255)), labels.long() % 10)
    loss.backward()
    optimizer.step()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(ArrayDataset(256, shape=(3, 32, 32)), batch_size=32, shuffle=True)
    model, optimizer = make_model(device)
    for epoch in range(args.epochs):
        losses = [train_step(model, optimizer, batch, device) for batch in loader]
        print(f"epoch {epoch}: loss {sum(losses) / len(losses):.3f}")


if __name__ == "__main__":
    main()
