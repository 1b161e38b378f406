"""Lesson 05's datasets and call counter, which exercise 05 (its solution and grader), lesson 08
and the GPU check import, and DataLoader workers unpickle under every start method:
:class:`DecodedImages`, :class:`RepeatDataset`, :func:`count_torch_calls`. The lesson writes its
throughput and training loops in its own ``%%writefile`` cells."""
from __future__ import annotations

from typing import Any, Callable, Optional

import cv2
import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils.data import Dataset

from ..checks import check_int, check_transform
from ..config import pick
from ..data import JpegDataset

__all__ = ["DecodedImages", "RepeatDataset", "count_torch_calls"]


class DecodedImages(Dataset):
    """Course photos decoded once and resized to ``side`` squared, in ONE uint8 (n, side, side, 3)
    RGB array ``images``. ``ds[i]`` is ``(transform(image) or a uint8 (3, side, side) tensor,
    i % 10)``; ``length`` (default n) repeats the images (index modulo n)."""

    def __init__(self, n: Optional[int] = None, side: int = 256, *, length: Optional[int] = None,
                 transform: Optional[Callable] = None, seed: int = 0,
                 images: Optional[np.ndarray] = None) -> None:
        where = "DecodedImages"
        if images is None:
            n = check_int("n", pick(full=256, quick=32) if n is None else n, 1, where)
            side = check_int("side", side, 8, where, " It is a size in pixels.")
            source = JpegDataset(n=n, seed=seed, progress=False)
            images = np.empty((n, side, side, 3), dtype=np.uint8)
            for i in range(n):
                images[i] = cv2.resize(source[i][0], (side, side), interpolation=cv2.INTER_AREA)
        elif not (isinstance(images, np.ndarray) and images.ndim == 4 and images.shape[3] == 3
                  and images.dtype == np.uint8 and images.shape[1] == images.shape[2]):
            raise ValueError(f"{where}: images must be a uint8 (n, side, side, 3) array.")
        self.images = images
        self.length = len(images) if length is None else check_int("length", length, 1, where)
        self.transform = check_transform(transform, where)

    @property
    def side(self) -> int:
        return int(self.images.shape[1])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[Any, int]:
        if not -self.length <= i < self.length:
            raise IndexError(f"DecodedImages index {i} out of range for length {self.length}.")
        image = self.images[int(i) % len(self.images)]
        if self.transform is not None:
            return self.transform(image), int(i) % 10
        return torch.from_numpy(image).permute(2, 0, 1).contiguous(), int(i) % 10

    def batch(self, n: int, start: int = 0) -> torch.Tensor:
        """A uint8 (n, 3, side, side) batch of images start, start + 1, ... (modulo n images)."""
        idx = np.arange(start, start + int(n)) % len(self.images)
        return torch.from_numpy(self.images[idx]).permute(0, 3, 1, 2).contiguous()

    def view(self, *, transform: Optional[Callable] = None, length: Optional[int] = None) -> "DecodedImages":
        """The same images (shared, not copied) with another transform / length."""
        return DecodedImages(images=self.images, transform=transform, length=length)

    def describe(self) -> str:
        return (f"DecodedImages: {len(self.images)} course photos decoded to "
                f"{self.side}x{self.side} RGB uint8, {self.images.nbytes / 1e6:.1f} MB in one array")


class RepeatDataset(Dataset):
    """``base`` seen as ``length`` items (index modulo ``len(base)``); with a JpegDataset base it
    offers ``encoded(i)`` and ``labels`` too, so the tuned pipeline's batched fetching reads it."""

    def __init__(self, base: Dataset, length: int) -> None:
        self.base, self.length = base, check_int("length", length, 1, "RepeatDataset")
        if len(base) < 1:  # type: ignore[arg-type]
            raise ValueError("RepeatDataset: base is empty.")
        if hasattr(base, "labels"):
            self.labels = np.asarray(base.labels)[np.arange(self.length) % len(base)]  # type: ignore[arg-type]

    def encoded(self, i: int) -> Any:
        """The base's encoded bytes of item ``i`` (modulo its length); JpegDataset bases only."""
        if not hasattr(self.base, "encoded"):
            raise TypeError(f"RepeatDataset.encoded: the base ({type(self.base).__name__}) has no "
                            f"encoded bytes; use a JpegDataset.")
        return self.base.encoded(int(i) % len(self.base))  # type: ignore[attr-defined,arg-type]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.length:
            raise IndexError(f"RepeatDataset index {i} out of range for length {self.length}.")
        return self.base[i % len(self.base)]  # type: ignore[arg-type]


def count_torch_calls(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """``(fn(*args, **kwargs), the torch calls it made)``: each ``torch.*`` / ``F.*`` function and
    Tensor method or operator called from Python counts once (``TorchFunctionMode``). A batched
    implementation makes as many for any batch size; a loop over samples makes more (on a GPU,
    each call launches at least one kernel)."""
    if not callable(fn):
        raise TypeError(f"count_torch_calls: fn must be callable, got {type(fn).__name__}.")

    class _Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            _Count.calls += 1
            return func(*args, **(kwargs or {}))

    with _Count():
        result = fn(*args, **kwargs)
    return result, int(_Count.calls)
