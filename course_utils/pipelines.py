"""The two loaders the course benchmarks side by side: the common recipe and the tuned CPU pipeline.

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

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .bench import Comparison, Measurement, compare, measure_loader
from .config import pick
from .data import CommonRecipeTransform, JpegDataset, ToTensorUint8
from .machine import machine_summary, usable_cpus
from .threads import make_worker_init

RECIPE_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
COMMON_RECIPE_LABEL = "common recipe"
TUNED_LABEL = "tuned CPU pipeline"


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
    """A ``collate_fn`` that returns what the dataset's ``__getitems__`` made, unchanged.

    Use it with a dataset whose ``__getitems__`` already returns a batch (lesson 03's
    ``BatchedArrayDataset``, :class:`BatchedJpegDataset`)."""
    return batch


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
        batch = np.empty((len(indices), self.size, self.size, 3), dtype=np.uint8)
        for slot, index in enumerate(indices):
            self._decode_into(index, batch[slot])
        labels = torch.as_tensor([int(self.base.labels[i]) for i in indices], dtype=torch.int64)
        return torch.from_numpy(batch).permute(0, 3, 1, 2), labels

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        images, labels = self.__getitems__([index])
        return images[0].contiguous(), int(labels[0])


class common_recipe_process_settings:
    """Context manager: the common recipe's process-wide lines, undone on exit.

    Inside: ``torch.set_num_threads(1)`` and the thread environment variables set to "1"
    (after import, as the recipe does). On exit the previous values come back.
    """

    def __enter__(self) -> "common_recipe_process_settings":
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


@dataclass
class BenchmarkResult:
    """The common recipe and the tuned pipeline measured side by side in one run."""

    comparison: Comparison
    machine: str
    dataset: str
    targets: dict[str, float] = field(default_factory=lambda: {"speedup": 1.5, "cpu_ratio": 0.6})

    @property
    def speedup(self) -> float:
        """Tuned samples/s divided by the common recipe's."""
        return self.comparison.ratio(TUNED_LABEL, "samples_per_s")

    @property
    def cpu_ratio(self) -> float:
        """Tuned CPU-seconds per sample divided by the common recipe's."""
        return self.comparison.ratio(TUNED_LABEL, "cpu_s_per_sample")

    def __str__(self) -> str:
        speed_ok = self.speedup >= self.targets["speedup"]
        cpu_ok = self.cpu_ratio <= self.targets["cpu_ratio"]
        return "\n".join([
            f"Benchmark: {COMMON_RECIPE_LABEL} vs {TUNED_LABEL}, measured side by side",
            f"machine: {self.machine}",
            f"data:    {self.dataset}",
            "",
            str(self.comparison),
            "",
            f"samples/s:          tuned is {self.speedup:.2f}x the common recipe "
            f"(target >= {self.targets['speedup']}x: {'met' if speed_ok else 'NOT met'})",
            f"CPU-seconds/sample: tuned is {self.cpu_ratio:.2f}x the common recipe "
            f"(target <= {self.targets['cpu_ratio']}x: {'met' if cpu_ok else 'NOT met'})",
        ])

    def to_dict(self) -> dict:
        return {"machine": self.machine, "dataset": self.dataset, "speedup": self.speedup,
                "cpu_ratio": self.cpu_ratio, "targets": self.targets,
                "comparison": self.comparison.to_dict()}


def run_benchmark(*, n: int | None = None, batch_size: int | None = None,
                  repeats: int | None = None, progress: bool = True) -> BenchmarkResult:
    """Measure the common recipe and the tuned pipeline on the standard dataset, in one run.

    Sizes default to the mode (quick: 400 images, batch 32, 2 repeats; full: 2000 images,
    batch 64, 5 repeats). The recipe's process-wide settings apply only while it is measured.
    Repeats of the two loaders alternate so slow drifts of a shared machine hit both alike.
    """
    n = pick(full=2000, quick=400) if n is None else n
    batch_size = pick(full=64, quick=32) if batch_size is None else _check_batch_size(batch_size)
    repeats = pick(full=5, quick=2) if repeats is None else repeats
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}.")
    base = JpegDataset(n=n)
    recipe, tuned = common_recipe_loader(base, batch_size=batch_size), tuned_loader(base, batch_size=batch_size)
    runs: dict[str, list[Measurement]] = {COMMON_RECIPE_LABEL: [], TUNED_LABEL: []}
    for _ in range(repeats):
        with common_recipe_process_settings():
            runs[COMMON_RECIPE_LABEL].append(measure_loader(
                recipe, repeats=1, label=COMMON_RECIPE_LABEL, progress=progress))
        runs[TUNED_LABEL].append(measure_loader(tuned, repeats=1, label=TUNED_LABEL, progress=progress))
    merged = [Measurement.merge(runs[label]) for label in (COMMON_RECIPE_LABEL, TUNED_LABEL)]
    return BenchmarkResult(compare(merged, baseline=0), machine_summary(), base.describe())
