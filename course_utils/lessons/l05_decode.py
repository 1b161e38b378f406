"""Lesson 05, section 7: a dataset whose workers send JPEG bytes, for decoding on the device.

DataLoader workers must import these under spawn and forkserver, so they live in the package;
the lesson writes the decode itself (``torchvision.io.decode_jpeg`` on a list, on the device).
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from ..data import JpegDataset


class EncodedJpegs(Dataset):
    """``ds[i]`` = (the JPEG bytes of ``base[i]`` as a 1-D uint8 tensor, label): no decode at all."""

    def __init__(self, base: JpegDataset) -> None:
        if not hasattr(base, "encoded"):
            raise TypeError(f"base must be a JpegDataset (it needs .encoded(i)), got "
                            f"{type(base).__name__}.")
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data = torch.from_numpy(self.base.encoded(index).copy())   # a writable copy of the bytes
        return data, int(self.base.labels[index])


def list_collate(samples: list[tuple[torch.Tensor, int]]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Keep the byte tensors as a list (they differ in length); stack the labels."""
    return [data for data, _ in samples], torch.as_tensor([label for _, label in samples])


def encoded_nbytes(batch: Any) -> int:
    """Bytes of JPEG data in a batch made by :func:`list_collate`."""
    return sum(int(t.numel()) for t in batch[0])
