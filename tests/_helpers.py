"""Small datasets shared by several test modules (module level, so DataLoader workers can use them)."""
from __future__ import annotations

import torch
from torch.utils.data import Dataset


class TinyDataset(Dataset):
    """n instant items: ``(tensor of shape (3,) filled with i, i)``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((3,), float(i)), i
