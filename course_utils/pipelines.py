"""The course's in-memory loaders: the common recipe (an emulation) and the tuned CPU pipeline.

They read the course's JPEG bytes from RAM (lessons 00-07 and the tuner use them); the recipes
as learners write them, on files, are in :mod:`course_utils.recipes`, and ``bench``
(:mod:`course_utils.benchmark`) measures both kinds side by side.

The **common recipe** is the setup many tutorials paste: ``torch.set_num_threads(1)`` and
``OMP/MKL/OPENBLAS_NUM_THREADS=1`` in ``os.environ`` after the imports, ``num_workers=4``,
per-sample float32 scaling in ``__getitem__``, ``pin_memory=True``.

The **tuned CPU pipeline** applies what lessons 01–03 measure:

- lesson 01: stay uint8 until the end (4x fewer bytes from the workers, no per-sample float
  conversion); convert and normalise the whole batch later, on the device;
- lesson 02: limit every thread pool inside the workers (``make_worker_init(1)``), leave the
  main process's torch threads alone;
- lesson 03: ``num_workers`` from the usable CPUs, not a fixed 4; ``pin_memory`` only when
  there is a CUDA device to copy to; batched fetching (``__getitems__``): one call per batch
  writes every image straight into one preallocated uint8 batch, so there is no per-sample
  tensor and no collate copy;
- lesson 01 again: per-pixel work after the resize, on the small image (the BGR->RGB swap
  commutes with the resize, so the values are identical to decoding to RGB first).
"""
from __future__ import annotations

from typing import Any, Callable

import os

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

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


def uint8_batch(n: int, size: int) -> tuple[torch.Tensor, np.ndarray]:
    """An empty (n, size, size, 3) uint8 batch: the tensor and a NumPy view to fill in place.

    Inside a DataLoader worker it is allocated in shared memory, as ``default_collate`` does:
    a batch in ordinary memory is copied into shared memory when the worker sends it (about
    0.3 ms per 224 px image on the course machine), one allocated there is sent as it is."""
    if get_worker_info() is not None:
        storage = torch.UntypedStorage._new_shared(n * size * size * 3)
        tensor = torch.empty(0, dtype=torch.uint8).set_(storage).view(n, size, size, 3)
    else:
        tensor = torch.empty((n, size, size, 3), dtype=torch.uint8)
    return tensor, tensor.numpy()


def keep_batch(batch: Any) -> Any:
    """A ``collate_fn`` that returns what the dataset's ``__getitems__`` made, unchanged.

    Use it with a dataset whose ``__getitems__`` already returns a batch (lesson 03's
    ``BatchedArrayDataset``, :class:`BatchedJpegDataset`, the file datasets of
    :mod:`course_utils.recipes`)."""
    return batch


class seed_recipe_process_settings:
    """Context manager: the seed recipe's process-wide lines, undone on exit.

    Inside: ``torch.set_num_threads(1)`` and the thread environment variables set to "1"
    (after import, as the recipe does). On exit the previous values come back.
    """

    def __enter__(self) -> "seed_recipe_process_settings":
        self._threads = torch.get_num_threads()
        self._env = {k: os.environ.get(k) for k in RECIPE_ENV_VARS}
        torch.set_num_threads(1)
        for key in RECIPE_ENV_VARS:
            os.environ[key] = "1"
        return self

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self._threads)
        for key, value in self._env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# The common recipe (in memory) sets the same process-wide lines as the seed recipe (on files).
common_recipe_process_settings = seed_recipe_process_settings


class BatchedJpegDataset(Dataset):
    """The tuned pipeline's dataset: whole uint8 batches from a :class:`JpegDataset`'s bytes.

    ``ds[i]`` gives one ``(3xSxS uint8 tensor, label)``; ``ds.__getitems__(indices)`` (what a
    DataLoader calls with ``collate_fn=keep_batch``) gives ``(NxCxSxS uint8 tensor, labels)``
    whose memory is NHWC (``channels_last``), filled in place: decode (BGR), resize, then the
    colour swap on the resized image. Values equal ``ToTensorUint8(size)(base[i][0])``.
    """

    def __init__(self, base: JpegDataset, size: int = 224) -> None:
        if not hasattr(base, "encoded"):
            raise TypeError(f"base must be a JpegDataset (it needs .encoded(i)), got "
                            f"{type(base).__name__}.")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int (pixels), got {size!r}.")
        self.base, self.size = base, size

    def __len__(self) -> int:
        return len(self.base)

    def _decode_into(self, index: int, out: np.ndarray) -> None:
        bgr = cv2.imdecode(self.base.encoded(index), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f"sample {index} is not a decodable JPEG.")
        small = cv2.resize(bgr, (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        cv2.cvtColor(small, cv2.COLOR_BGR2RGB, dst=out)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        images, batch = uint8_batch(len(indices), self.size)
        for slot, index in enumerate(indices):
            self._decode_into(index, batch[slot])
        labels = torch.as_tensor([int(self.base.labels[i]) for i in indices], dtype=torch.int64)
        return images.permute(0, 3, 1, 2), labels

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        images, labels = self.__getitems__([index])
        return images[0].contiguous(), int(labels[0])


def _check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    return batch_size


def common_recipe_loader(base: Dataset, *, batch_size: int = 64, size: int = 224) -> DataLoader:
    """The common recipe's DataLoader over ``base`` (images as HxWx3 uint8 arrays)."""
    return DataLoader(TransformedDataset(base, CommonRecipeTransform(size)),
                      batch_size=_check_batch_size(batch_size), shuffle=True, num_workers=4,
                      pin_memory=True)


def tuned_loader(base: Dataset, *, batch_size: int = 64, size: int = 224,
                 num_workers: int | None = None) -> DataLoader:
    """The tuned CPU pipeline's DataLoader over ``base``: uint8 batches, limited worker pools.

    ``num_workers`` defaults to the usable CPUs. ``base`` must be a :class:`JpegDataset`
    (batched fetching reads its bytes). Batches are ``(uint8 NxCxHxW, labels)`` in
    channels_last memory; convert them with ``images.to(device).float().div_(255)``
    (lessons 04/05).
    """
    workers = usable_cpus() if num_workers is None else num_workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"num_workers must be an int >= 0 (or None for the usable CPUs), "
                         f"got {num_workers!r}.")
    return DataLoader(BatchedJpegDataset(base, size), collate_fn=keep_batch,
                      batch_size=_check_batch_size(batch_size), shuffle=True,
                      num_workers=workers, pin_memory=torch.cuda.is_available(),
                      worker_init_fn=make_worker_init(1) if workers else None)
