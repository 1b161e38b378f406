"""The course's in-memory loaders over JPEG bytes in RAM (on files: ``tools.bench.recipes``).
The **common recipe** many tutorials paste: ``torch.set_num_threads(1)``,
``OMP/MKL/OPENBLAS_NUM_THREADS=1``, ``num_workers=4``, per-sample float32, pinned memory. The **tuned CPU pipeline** applies lessons
01-03: uint8 until the device, one thread per worker pool, workers from the usable CPUs, batched
fetching into one preallocated uint8 batch."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .checks import check_int
from .data import CommonRecipeTransform, JpegDataset
from .machine import usable_cpus
from .threads import make_worker_init

RECIPE_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class TransformedDataset(Dataset):
    """``base[i]`` with ``transform`` applied to the image; shares the base's JPEG buffer."""

    def __init__(self, base: Dataset, transform: Callable[[Any], Any]) -> None:
        if not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}.")
        self.base, self.transform = base, transform

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image, label = self.base[index]
        return self.transform(image), label


def keep_batch(batch: Any) -> Any:
    """A ``collate_fn`` that returns what the dataset's ``__getitems__`` made, unchanged (lesson
    03 shows it)."""
    return batch


@contextlib.contextmanager
def recipe_process_settings() -> Iterator[None]:
    """The process-wide lines the common and seed recipes paste at the top of a script
    (``torch.set_num_threads(1)``, the thread environment variables at "1"), undone on exit."""
    threads, env = torch.get_num_threads(), {k: os.environ.get(k) for k in RECIPE_ENV_VARS}
    torch.set_num_threads(1)
    os.environ.update(dict.fromkeys(RECIPE_ENV_VARS, "1"))
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class BatchedDecode(Dataset):
    """Whole uint8 batches decoded in place: ``__getitems__`` (with ``collate_fn=keep_batch``)
    fills an NxCxSxS channels_last batch. A subclass sets ``size`` and defines ``_decode_into``
    (one RGB sample into an SxSx3 view) and ``_labels``; it may override ``new_batch`` and
    ``finish_batch`` to change where the batch's memory comes from."""

    size: int

    def _decode_into(self, index: int, out: np.ndarray) -> None:
        raise NotImplementedError

    def _labels(self, indices: list[int]) -> torch.Tensor:
        raise NotImplementedError

    def new_batch(self, n: int) -> tuple[torch.Tensor, np.ndarray, Any]:
        """An empty (n, size, size, 3) uint8 batch, its NumPy view to fill, and a token for
        ``finish_batch`` (here None). Plain memory: a worker's batch is copied into shared
        memory when sent (``bench``'s loaders reuse shared segments: ``tools.batch_buffers``)."""
        images = torch.empty((n, self.size, self.size, 3), dtype=torch.uint8)
        return images, images.numpy(), None

    def finish_batch(self, items: tuple, token: Any) -> tuple:
        """The ``(images, labels)`` tuple ``__getitems__`` returns."""
        return tuple(items)

    def _fill(self, indices: list[int], images: torch.Tensor, view: np.ndarray) -> tuple:
        for row, index in enumerate(indices):
            self._decode_into(index, view[row])
        return images.permute(0, 3, 1, 2), self._labels(indices)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        images, view, token = self.new_batch(len(indices))
        return self.finish_batch(self._fill(indices, images, view), token)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        images, labels = self._fill([index], *BatchedDecode.new_batch(self, 1)[:2])
        return images[0].contiguous(), int(labels[0])


class BatchedJpegDataset(BatchedDecode):
    """The tuned pipeline's dataset: whole uint8 batches from a :class:`JpegDataset`'s bytes.

    ``__getitems__`` (with ``collate_fn=keep_batch``) fills an NxCxSxS batch in channels_last
    memory in place: decode, resize, then the colour swap on the small image (it commutes with
    the resize). Values equal ``ToTensorUint8(size)(base[i][0])``.
    """

    def __init__(self, base: JpegDataset, size: int = 224) -> None:
        if not hasattr(base, "encoded"):
            raise TypeError(f"base must be a JpegDataset (it needs .encoded(i)), got "
                            f"{type(base).__name__}.")
        self.base = base
        self.size = check_int("size", size, 1, "BatchedJpegDataset", " It is a size in pixels.")

    def __len__(self) -> int:
        return len(self.base)

    def _decode_into(self, index: int, out: np.ndarray) -> None:
        bgr = cv2.imdecode(self.base.encoded(index), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f"sample {index} is not a decodable JPEG.")
        small = cv2.resize(bgr, (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        cv2.cvtColor(small, cv2.COLOR_BGR2RGB, dst=out)

    def _labels(self, indices: list[int]) -> torch.Tensor:
        return torch.as_tensor([int(self.base.labels[i]) for i in indices], dtype=torch.int64)


def common_recipe_loader(base: Dataset, *, batch_size: int = 64, size: int = 224) -> DataLoader:
    """The common recipe's DataLoader over ``base`` (images as HxWx3 uint8 arrays)."""
    return DataLoader(TransformedDataset(base, CommonRecipeTransform(size)),
                      batch_size=check_int("batch_size", batch_size, 1), shuffle=True, num_workers=4,
                      pin_memory=True)


def tuned_loader(base: Dataset, *, batch_size: int = 64, size: int = 224,
                 num_workers: int | None = None) -> DataLoader:
    """The tuned CPU pipeline's DataLoader over a :class:`JpegDataset`: uint8 channels_last
    batches, limited worker pools, ``num_workers`` defaulting to the usable CPUs."""
    workers = usable_cpus() if num_workers is None else check_int(
        "num_workers", num_workers, 0, "tuned_loader", " Or None for the usable CPUs.")
    return DataLoader(BatchedJpegDataset(base, size), collate_fn=keep_batch,
                      batch_size=check_int("batch_size", batch_size, 1), shuffle=True,
                      num_workers=workers, pin_memory=torch.cuda.is_available(),
                      worker_init_fn=make_worker_init(1) if workers else None)
