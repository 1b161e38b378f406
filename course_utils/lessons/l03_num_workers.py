"""Lesson 03's copy-on-read measurement, which the ``03.copy_on_read`` grader runs too: annotation
records as a Python list of dicts (:class:`RecordListDataset`, the trap) and packed into NumPy
arrays (:class:`RecordArrayDataset`, the fix the exercise asks for), and each worker's private
memory (USS, bytes, read by psutil inside the worker) over one epoch (:func:`worker_memory`).
"""
from __future__ import annotations

import gc
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from ..checks import check_index, check_int, check_seconds
from ..config import pick
from ..data import ram_budget_bytes
from ..process_tree import stop_workers
from ..start_methods import resolve_context, worker_timeout

__all__ = ["RECORD_CLASSES", "make_records", "RecordListDataset", "RecordArrayDataset", "uss_bytes",
           "WorkerUss", "WorkerMemory", "worker_memory"]

_MB = 1e6


#: Class names used by :func:`make_records` (label k is RECORD_CLASSES[k]).
RECORD_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                  "ship", "truck")
_RECORD_BYTES_ESTIMATE = 600  # generous bytes per record as Python objects (for the RAM guard)


def make_records(n: Optional[int] = None, seed: int = 0) -> list[dict]:
    """A typical annotation list: ``n`` dicts ``{"path": "train/<class>/<7 digits>.jpg",
    "label": 0..9, "box": [x0, y0, x1, y1] in [0, 1)}``, about 450 bytes of Python objects each.
    ``n`` defaults to ``pick(full=200_000, quick=60_000)``; refused (ValueError) when the records
    would take more than a quarter of the available RAM."""
    where = "make_records"
    n = check_int("n", pick(full=200_000, quick=60_000) if n is None else n, 1, where)
    budget = ram_budget_bytes(0.25)
    if n * _RECORD_BYTES_ESTIMATE > budget:
        raise ValueError(f"{where}: n={n:,} records would take about "
                         f"{n * _RECORD_BYTES_ESTIMATE / _MB:,.0f} MB as Python objects, more than "
                         f"the budget of {budget / _MB:,.0f} MB (a quarter of the available RAM); "
                         f"pass a smaller n.")
    rng = np.random.default_rng(check_int("seed", seed, 0, where))
    labels = rng.integers(0, len(RECORD_CLASSES), size=n).tolist()
    corners = np.sort(rng.random((n, 2, 2)), axis=1)  # x0 <= x1, y0 <= y1
    boxes = corners.transpose(0, 2, 1).reshape(n, 4)[:, [0, 2, 1, 3]].tolist()
    return [{"path": f"train/{RECORD_CLASSES[c]}/{i:07d}.jpg", "label": c, "box": b}
            for i, (c, b) in enumerate(zip(labels, boxes))]


class RecordListDataset(Dataset):
    """The copy-on-read trap: :func:`make_records`' list of dicts as it is; ``ds[i]`` is ``(box,
    label, path)``, a float32 (4,) tensor, an int, a str. Reading a record in a forked worker
    writes the reference counts of its objects, so the OS copies their pages into the worker."""

    def __init__(self, records: list[dict]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, str]:
        r = self.records[i]
        return torch.tensor(r["box"], dtype=torch.float32), int(r["label"]), r["path"]


class RecordArrayDataset(Dataset):
    """The fix: the same records in NumPy arrays (``labels`` int64 (n,), ``boxes`` float32 (n, 4),
    the paths UTF-8 in one uint8 ``path_bytes`` with ``path_offsets`` int64 (n + 1,)), so reading
    one writes no record's reference count (a worker copies only the pages of the few shared
    objects it touches: the Dataset, its arrays' headers); ``ds[i]`` equals the list's."""

    def __init__(self, records: Sequence[dict]) -> None:
        if isinstance(records, RecordListDataset):
            records = records.records
        n = len(records)
        if n == 0:
            raise ValueError("RecordArrayDataset: records is empty; pass the list from "
                             "make_records().")
        self.labels = np.fromiter((r["label"] for r in records), dtype=np.int64, count=n)
        self.boxes = np.array([r["box"] for r in records], dtype=np.float32).reshape(n, 4)
        encoded = [r["path"].encode("utf-8") for r in records]
        self.path_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=n),
                  out=self.path_offsets[1:])
        self.path_bytes = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()

    @property
    def nbytes(self) -> int:
        """Bytes of the four arrays."""
        return int(self.labels.nbytes + self.boxes.nbytes + self.path_offsets.nbytes
                   + self.path_bytes.nbytes)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, str]:
        i = check_index(i, len(self.labels), "RecordArrayDataset")
        start, end = self.path_offsets[i], self.path_offsets[i + 1]
        path = self.path_bytes[start:end].tobytes().decode("utf-8")
        return torch.from_numpy(self.boxes[i].copy()), int(self.labels[i]), path


def uss_bytes() -> Optional[int]:
    """This process's USS (memory private to it), in bytes; None where the platform does not
    report it. On Linux this reads /proc/self/smaps (a few ms)."""
    try:
        return int(psutil.Process().memory_full_info().uss)
    except (psutil.Error, AttributeError, NotImplementedError, OSError):
        return None


class _MemoryProbe(Dataset):
    """Wraps a dataset; ``probe[(indices, read)]`` fetches ``dataset[i]`` for every index (the
    real per-sample work) and reports this process's USS: always before its first fetch, and
    after the fetch when ``read`` is True. Results are small dicts, never the samples."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._state: dict[int, dict] = {}

    def __len__(self) -> int:  # pragma: no cover - used through a batch sampler only
        return len(self.dataset)

    def __getitem__(self, request: tuple) -> dict:
        indices, read = request
        pid = os.getpid()
        state = self._state.get(pid)
        report: dict = {"pid": pid}
        if state is None:
            info = get_worker_info()
            state = self._state[pid] = {"fetched": 0,
                                        "worker_id": None if info is None else info.id}
            report["start_uss"] = uss_bytes()
        for i in indices:
            self.dataset[i]
        state["fetched"] += len(indices)
        report["worker_id"] = state["worker_id"]
        report["fetched"] = state["fetched"]
        if read:
            report["uss"] = uss_bytes()
        return report


class _ProbeRequests(torch.utils.data.Sampler):
    """Batches of indices (shuffled with a fixed seed, or in order), each with a flag saying
    whether the worker should read its USS after fetching it."""

    def __init__(self, n: int, batch_size: int, shuffle: bool, seed: int, num_workers: int,
                 readings: int) -> None:
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.num_workers, self.readings = num_workers, readings

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[list[int], bool]]:
        order = (np.random.default_rng(self.seed).permutation(self.n) if self.shuffle
                 else np.arange(self.n))
        total = len(self)
        every = max(1, total // max(1, self.readings * self.num_workers))
        for b in range(total):
            chunk = order[b * self.batch_size:(b + 1) * self.batch_size].tolist()
            # the last 2 requests per worker always read, so every worker reports its end state
            read = b % every == 0 or b >= total - 2 * self.num_workers
            yield chunk, read


@dataclass
class WorkerUss:
    """One worker's private memory over an epoch: USS in bytes at the start (before its first
    fetch) and after ``fetched`` samples (``timeline``: (samples fetched, USS bytes) pairs)."""

    worker_id: Optional[int]
    pid: int
    start_uss_bytes: int
    timeline: list[tuple[int, int]]

    @property
    def growth_bytes(self) -> int:
        """USS at the end of the epoch minus USS at the start, in bytes."""
        return (self.timeline[-1][1] if self.timeline else self.start_uss_bytes) - self.start_uss_bytes


@dataclass
class WorkerMemory:
    """Per-worker private memory (USS) over one epoch of a dataset (see :func:`worker_memory`)."""

    label: str
    start_method: str
    num_workers: int
    samples: int
    workers: list[WorkerUss]

    @property
    def growth_bytes(self) -> list[int]:
        """USS growth of each worker over the epoch, bytes."""
        return [w.growth_bytes for w in self.workers]

    @property
    def mean_growth_bytes(self) -> float:
        return float(np.mean(self.growth_bytes))

    @property
    def total_growth_bytes(self) -> int:
        """Sum over workers: extra RAM the epoch cost the whole machine."""
        return int(sum(self.growth_bytes))

    def __str__(self) -> str:
        growth = " / ".join(f"{g / _MB:.1f}" for g in self.growth_bytes)
        start = " / ".join(f"{w.start_uss_bytes / _MB:.1f}" for w in self.workers)
        return (f"{self.label} ({self.start_method}, {self.num_workers} workers, "
                f"{self.samples:,} samples): USS growth per worker {growth} MB "
                f"(total {self.total_growth_bytes / _MB:.1f} MB); USS at start {start} MB")


def worker_memory(dataset: Dataset, num_workers: int = 2, *, batch_size: int = 256,
                  shuffle: bool = True, seed: int = 0, multiprocessing_context: Any = None,
                  readings: int = 6, freeze_gc: bool = False, timeout_s: float = 120.0,
                  label: Optional[str] = None) -> WorkerMemory:
    """Each worker's private memory (USS, bytes) over one epoch of ``dataset`` in real workers:
    read before its first fetch and about ``readings`` times in the epoch (always at its end), the
    samples (``dataset[i]``, shuffled with ``seed``) dropped: only *reading* it is measured. Under
    fork growth is copy-on-read; under spawn/forkserver each worker unpickles its own copy first
    (the start USS). ``freeze_gc``: ``gc.freeze()`` here while the workers run; ``timeout_s``: a
    request's limit (fork only: :func:`~course_utils.start_methods.worker_timeout`)."""
    where = "worker_memory"
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(f"{where}: dataset must be a map-style Dataset (with __getitem__ and "
                        f"__len__), got {type(dataset).__name__}.")
    num_workers = check_int("num_workers", num_workers, 1, where)
    batch_size = check_int("batch_size", batch_size, 1, where)
    readings = check_int("readings", readings, 1, where)
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    n = len(dataset)
    if n < num_workers * batch_size:
        raise ValueError(f"{where}: the dataset has {n} samples, fewer than num_workers x "
                         f"batch_size = {num_workers * batch_size}; use a smaller batch_size so "
                         f"every worker gets work.")
    if uss_bytes() is None:
        raise RuntimeError(f"{where}: this platform does not report USS (private memory) "
                           f"through psutil, so per-worker memory cannot be measured here.")
    context, method = resolve_context(multiprocessing_context, where)
    requests = _ProbeRequests(n, batch_size, bool(shuffle), int(seed), num_workers, readings)
    loader = DataLoader(_MemoryProbe(dataset), batch_size=None, sampler=requests,
                        num_workers=num_workers, multiprocessing_context=context,
                        timeout=worker_timeout(timeout_s, context))
    if freeze_gc:
        gc.collect()
        gc.freeze()
    try:
        it = iter(loader)
        try:
            reports = list(it)
        except RuntimeError as exc:
            if "timed out" in str(exc):
                raise RuntimeError(f"{where}: a worker did not answer within timeout_s="
                                   f"{timeout_s} s; the dataset's __getitem__ may be very slow "
                                   f"or stuck. Use a smaller dataset or a larger timeout_s."
                                   ) from exc
            raise
        finally:
            stop_workers(it)
            del it
    finally:
        if freeze_gc:
            gc.unfreeze()
    by_pid: dict[int, WorkerUss] = {}
    for r in reports:
        w = by_pid.get(r["pid"])
        if w is None:                       # a worker's first report carries its start USS
            w = by_pid[r["pid"]] = WorkerUss(worker_id=r["worker_id"], pid=r["pid"],
                                             start_uss_bytes=int(r["start_uss"]), timeline=[])
        if r.get("uss") is not None:
            w.timeline.append((int(r["fetched"]), int(r["uss"])))
    workers = sorted(by_pid.values(), key=lambda w: (w.worker_id is None, w.worker_id or 0))
    return WorkerMemory(label=label or type(dataset).__name__, start_method=method,
                        num_workers=num_workers, samples=n, workers=workers)

