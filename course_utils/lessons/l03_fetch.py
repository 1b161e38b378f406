"""Lesson 03's batched fetching: a dataset with ``__getitems__`` and a batch-sampler path (one
gather per batch, :class:`BatchedArrayDataset`), its per-sample view (:class:`PerSampleView`)
and the raw gather it is compared with (:func:`gather_batch`). Nothing happens at import time.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..data import ArrayDataset


__all__ = [
    "gather_batch",
    "BatchedArrayDataset",
    "PerSampleView",
]



# --------------------------------------------------------------------------------------------
# batched fetching
# --------------------------------------------------------------------------------------------

def gather_batch(data: np.ndarray, labels: np.ndarray,
                 indices: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch by fancy indexing:
    ``(torch.from_numpy(data[idx]), torch.from_numpy(labels[idx]))``.

    A single gather copies the rows into one new contiguous array: the least work any loader
    can do to make this batch from memory (the raw-gather baseline).
    """
    idx = np.asarray(indices, dtype=np.int64)
    return torch.from_numpy(data[idx]), torch.from_numpy(labels[idx])


class BatchedArrayDataset(ArrayDataset):
    """An :class:`~course_utils.data.ArrayDataset` that can also fetch a whole batch at once.

    Three ways to read it:

    * ``ds[i]`` -> ``(tensor, label)``: one sample, as ArrayDataset (per-sample path; use
      :class:`PerSampleView` so the DataLoader does not find ``__getitems__``);
    * ``ds[[i, j, ...]]`` -> ``(images, labels)`` batch tensors from ONE gather: used with
      ``DataLoader(ds, batch_size=None, sampler=BatchSampler(...))`` (the batch-sampler path);
    * ``ds.__getitems__([i, j, ...])`` -> the same batch. ``DataLoader`` calls it (torch >= 2.1)
      instead of one ``ds[i]`` per index whenever it batches automatically (``batch_size=k``),
      then passes the result to ``collate_fn``, so use ``collate_fn=keep_batch``: the default
      collate would treat the (images, labels) pair as two samples.
    """

    def __getitem__(self, i: Any) -> tuple[Any, Any]:
        if isinstance(i, (list, tuple)) or getattr(i, "ndim", 0) >= 1:
            return self.__getitems__(i)  # a batch of indices (batch-sampler path)
        return super().__getitem__(i)

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1:
            raise ValueError(f"BatchedArrayDataset: a batch of indices must be 1-D, got shape "
                             f"{idx.shape}.")
        if idx.size and (idx.min() < -self.n or idx.max() >= self.n):
            raise IndexError(f"BatchedArrayDataset: indices out of range for {self.n} samples.")
        if self.transform is not None:
            raise ValueError("BatchedArrayDataset: batched fetching does not apply a per-sample "
                             "transform; transform the batch after loading, or use "
                             "PerSampleView(ds) for the per-sample path.")
        return gather_batch(self.data, self.labels, idx)


class PerSampleView(Dataset):
    """A dataset's per-sample interface only (``__len__`` and ``__getitem__``), so a DataLoader
    fetches it one index at a time and collates, even when the dataset has ``__getitems__``.
    Shares the dataset's memory."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[int(i)]
