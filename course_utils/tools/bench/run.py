"""``python -m course_utils bench``: the recipes learners run vs the course's pipeline, on files.

Every row below is measured by :func:`~course_utils.timing.measure_loader` in one run on the same
JPEG files, repeats interleaved (a slow drift of a shared machine hits every row alike): the recipes
as written (:mod:`.recipes`); decode only, the ceiling; shipping only, what sending the pixels costs
alone; DALI where installed (:mod:`.dali`); the storage rows (:mod:`.storage`) unless turned off."""
from __future__ import annotations

import contextlib
import functools
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, ContextManager, Iterator

import torch
from torch.utils.data import Dataset

from course_utils.config import pick
from course_utils.data import JpegDataset
from course_utils.machine import usable_cpus
from course_utils.measurement import Comparison, Measurement, compare, fmt_time, jsonable
from course_utils.pipelines import BatchedJpegDataset, recipe_process_settings
from course_utils.timing import MIN_TIMED_BATCHES, default_warmup, measure_loader

from ..batch_buffers import ReusedSegments, slot_batch
from .dali import DaliLoader, dali_missing
from .recipes import (DecodeOnlyFiles, files_loader, imagenet_recipe_loader, seed_recipe_loader,
                      tuned_files_loader)
from .storage import PackedStore, evict_from_page_cache, folder_files_and_labels, write_image_folder

SEED = "seed recipe"
IMAGENET = "ImageNet training recipe"
TUNED = "tuned (files)"
DECODE_ONLY = "decode only (files)"
SHIPPING = "shipping only (no decode)"
DALI = "DALI, ImageNet recipe"
RAM_BYTES = "tuned, JPEG bytes in RAM"
COLD = "tuned, files, cold page cache"
MEMMAP = "packed uint8 store, np.memmap"
RAM_GATHER = "packed uint8 store, gathered from RAM"


@dataclass
class ShippingOnly(ReusedSegments, Dataset):
    """``n`` samples sent like :class:`~.recipes.BatchedJpegFiles`'s batches (N x 3 x size x size
    uint8, allocated the same way), every byte written but nothing read or decoded."""

    n: int
    size: int

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        images, _, slot = self.new_batch(len(indices))
        images.fill_(0)                      # every page touched, as the decode's writes touch them
        return slot_batch((images.permute(0, 3, 1, 2), torch.zeros(len(indices), dtype=torch.int64)), slot)


class ReusedJpegBatches(ReusedSegments, BatchedJpegDataset):
    """The lessons' :class:`~course_utils.pipelines.BatchedJpegDataset` (JPEG bytes in RAM) on
    reused segments, as the files rows are: the rows differ only in where the bytes come from."""


TARGETS = {"speedup": 2.0, "cpu_ratio": 0.5, "decode_share": 0.8, "memmap_share": 0.6}


def min_batches() -> int:
    """Batches per epoch every row needs: the engine's warm-up for the busiest loader (the recipes'
    4 workers, or the tuned rows' one per usable CPU), then ``MIN_TIMED_BATCHES`` timed."""
    busiest = SimpleNamespace(num_workers=max(4, usable_cpus()), prefetch_factor=None)
    return default_warmup(busiest) + MIN_TIMED_BATCHES


def benchmark_sizes(n: int | None = None, batch_size: int | None = None, repeats: int | None = None,
                    *, names: tuple[str, str] = ("n=", "batch_size=")) -> tuple[int, int, int]:
    """``(n, batch_size, repeats)`` with the quick/full defaults for None; a ValueError, spelling
    the first two as ``names``, when ``n`` images hold fewer than :func:`min_batches` batches."""
    batch_size = pick(full=64, quick=16) if batch_size is None else batch_size
    need = min_batches()
    if n is None:          # the default holds every row's window on any machine
        n = max(pick(full=2000, quick=400), need * batch_size)
    if n < need * batch_size:
        n_name, batch_name = names
        raise ValueError(f"{n_name}{n} is too few images for {batch_name}{batch_size}: every loader "
                         f"needs {need} batches here (the batches its workers make ahead, then "
                         f"{MIN_TIMED_BATCHES} timed); pass {n_name}{need * batch_size} or more, or "
                         f"a smaller {batch_name.strip(' =')}.")
    return n, batch_size, pick(full=5, quick=2) if repeats is None else repeats


@dataclass
class BenchmarkResult:
    """The loaders and the storage variants side by side (two core Comparisons: samples/s, CPU-s
    per sample) and their ratios: tuned / ImageNet recipe samples/s (``speedup``) and CPU-s per
    sample (``cpu_ratio``), tuned / decode-only and memmap / RAM-gather samples/s
    (``decode_share``, ``memmap_share``), DALI / ImageNet recipe samples/s (``dali_speedup``) and
    shipping-only / tuned CPU-s per sample (``shipping_share``); None where not measured."""

    loaders: Comparison
    storage: Comparison | None
    dataset: str
    folder: str
    cold_cache: str
    dali: str = "not measured"
    targets: dict[str, float] = field(default_factory=lambda: dict(TARGETS))

    @property
    def machine(self) -> str:
        return self.loaders.rows[0].machine

    @property
    def speedup(self) -> float:
        return self.loaders.ratio(TUNED)

    @property
    def cpu_ratio(self) -> float:
        return self.loaders.ratio(TUNED, "cpu_s_per_sample")

    @property
    def decode_share(self) -> float:
        return self.loaders.ratio(TUNED) / self.loaders.ratio(DECODE_ONLY)

    @property
    def dali_speedup(self) -> float | None:
        return self.loaders.ratio(DALI) if DALI in [m.label for m in self.loaders.rows] else None

    @property
    def memmap_share(self) -> float | None:
        return None if self.storage is None else self.storage.ratio(MEMMAP) / self.storage.ratio(RAM_GATHER)

    @property
    def shipping_share(self) -> float | None:
        tuned, shipping = (self.loaders.row(k).cpu_s_per_sample for k in (TUNED, SHIPPING))
        return shipping / tuned if tuned and shipping else None

    def checks(self) -> list[tuple[str, float, str, float, bool]]:
        """(what, measured, comparison, target, met) for each target."""
        rows = [("samples/s, tuned / ImageNet training recipe", self.speedup, ">=", self.targets["speedup"]),
                ("CPU-s/sample, tuned / ImageNet training recipe", self.cpu_ratio, "<=",
                 self.targets["cpu_ratio"]),
                ("samples/s, tuned / decode only", self.decode_share, ">=", self.targets["decode_share"])]
        if self.memmap_share is not None:
            rows.append(("samples/s, memmap / RAM gather", self.memmap_share, ">=",
                         self.targets["memmap_share"]))
        return [(what, value, op, target, value >= target if op == ">=" else value <= target)
                for what, value, op, target in rows]

    def __str__(self) -> str:
        lines = ["Benchmark: the recipes learners run vs the course's pipeline, on JPEG files, "
                 "side by side in one run",
                 f"data:    {self.dataset}", f"files:   {self.folder}",
                 "", str(self.loaders), f"DALI:    {self.dali}"]
        if self.storage is not None:
            lines += ["", "Storage (the tuned pipeline's reads; packed store = decoded once, "
                          "resized, one uint8 file):", str(self.storage), f"cold cache: {self.cold_cache}"]
        lines += [""] + [f"{what}: {value:.2f}x (target {op} {target}x: {'met' if met else 'NOT met'})"
                         for what, value, op, target, met in self.checks()]
        if self.dali_speedup is not None:
            lines.append(f"DALI ran the ImageNet recipe at {self.dali_speedup:.2f}x its DataLoader's "
                         f"samples/s, and at {self.loaders.ratio(DALI, 'cpu_s_per_sample'):.2f}x its "
                         f"CPU-s/sample.")
        if self.shipping_share is not None:
            tuned, shipping = (self.loaders.row(k).cpu_s_per_sample for k in (TUNED, SHIPPING))
            lines.append(f"Of the tuned loader's {fmt_time(tuned)} of CPU per sample, sending its "
                         f"pixels alone took {fmt_time(shipping)} ({self.shipping_share:.0%}); "
                         f"decode only sends none.")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return jsonable({name: getattr(self, name) for name in (
            "machine", "dataset", "folder", "cold_cache", "targets", "speedup", "cpu_ratio", "decode_share",
            "memmap_share", "shipping_share", "dali", "dali_speedup", "loaders", "storage")})


def _packed_store(base: JpegDataset, folder: Path, size: int) -> PackedStore:
    """The course data as a packed store beside its folder, written once (atomically)."""
    path = folder.with_name(folder.name + f"-packed{size}.npy")
    if path.exists() and path.with_suffix(".labels.npy").exists():
        return PackedStore(path)
    staging = path.with_name(f"{path.stem}.writing-{os.getpid()}.npy")
    PackedStore.write(base, staging, size)
    os.replace(staging.with_suffix(".labels.npy"), path.with_suffix(".labels.npy"))
    os.replace(staging, path)
    return PackedStore(path)


@contextlib.contextmanager
def _cold(files: list[Path]) -> Iterator[None]:
    """The files' cached pages dropped first (the cold-cache repeats)."""
    evict_from_page_cache(files)
    yield


def run_benchmark(*, n: int, batch_size: int, repeats: int, size: int = 224,
                  storage: bool = True, progress: bool = True) -> BenchmarkResult:
    """Measure every row (module docstring) on ``n`` course JPEGs written as files, ``repeats``
    interleaved rounds of one epoch each; sizes as :func:`benchmark_sizes` returns them."""
    base = JpegDataset(n=n, progress=progress)
    folder = write_image_folder(base)
    files, labels = folder_files_and_labels(folder)
    nothing = contextlib.nullcontext
    rows: list[tuple[str, Any, Callable[[], ContextManager]]] = [
        (SEED, seed_recipe_loader(folder, batch_size=batch_size, size=size), recipe_process_settings),
        (IMAGENET, imagenet_recipe_loader(folder, batch_size=batch_size, size=size), nothing),
        (TUNED, tuned_files_loader(folder, batch_size=batch_size, size=size), nothing),
        (DECODE_ONLY, files_loader(DecodeOnlyFiles(folder), batch_size=batch_size), nothing),
        (SHIPPING, files_loader(ShippingOnly(n, size), batch_size=batch_size), nothing)]
    dali_note = dali_missing()
    if dali_note is None:
        device = "mixed" if torch.cuda.is_available() else "cpu"
        rows.append((DALI, DaliLoader(files, labels, batch_size=batch_size, size=size,
                                      num_threads=usable_cpus(), device=device), nothing))
        dali_note = f"device={device!r}, num_threads={usable_cpus()} (one process, no workers)"
    cold_cache = "not measured (--no-storage)"
    if storage:
        store = _packed_store(base, folder, size)
        rows.append((RAM_BYTES, files_loader(ReusedJpegBatches(base, size), batch_size=batch_size), nothing))
        if evict_from_page_cache(files[:1]):
            rows.append((COLD, tuned_files_loader(folder, batch_size=batch_size, size=size),
                         functools.partial(_cold, files)))
            cold_cache = ("the files' pages were dropped before each repeat (posix_fadvise "
                          "DONTNEED); a VM's host may still cache them")
        else:
            cold_cache = ("not measured: this OS has no posix_fadvise to drop these files' cached "
                          "pages; emptying the whole cache takes admin rights (macOS: sudo purge; "
                          "Linux, as root: echo 3 > /proc/sys/vm/drop_caches) or a reboot")
        rows += [(MEMMAP, files_loader(store.dataset(), batch_size=batch_size), nothing),
                 (RAM_GATHER, files_loader(store.dataset(in_memory=True), batch_size=batch_size), nothing)]
    runs: dict[str, list[Measurement]] = {label: [] for label, _, _ in rows}
    with warnings.catch_warnings():   # about the recipes' 4 workers and pin_memory, as written
        warnings.filterwarnings("ignore", message=".*(worker processes in total|pin_memory).*")
        for _ in range(repeats):
            for label, loader, settings in rows:
                with settings():
                    runs[label].append(measure_loader(loader, repeats=1, label=label, progress=progress))
    merged = {label: Measurement.merge(parts) for label, parts in runs.items()}
    loaders = compare([merged[k] for k in (SEED, IMAGENET, TUNED, DECODE_ONLY, SHIPPING, DALI)
                       if k in merged], baseline=IMAGENET)
    stores = compare([merged[k] for k in (RAM_BYTES, TUNED, COLD, MEMMAP, RAM_GATHER) if k in merged],
                     baseline=RAM_BYTES) if storage else None
    return BenchmarkResult(loaders, stores, base.describe(), str(folder), cold_cache, dali_note)

