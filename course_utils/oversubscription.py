"""Oversubscription: too many threads for the cores, measured (lesson 02).

What this module measures, and in what unit:

* :func:`run_grid` — a grid of ``num_workers`` x threads-per-library-pool on an OpenCV-heavy
  workload (:class:`OpenCVHeavyTransform`). Per cell: **samples per second** (median of the
  repeats), **CPU-seconds per sample** of the whole process tree (main process + workers), and
  **involuntary context switches per 1000 samples**, counted over *every thread* of every
  process of the tree (how often the kernel took a core away from a thread that still wanted
  it: the signature of more runnable threads than cores). Each cell's workers are limited with
  :func:`course_utils.threads.make_worker_init` and started with ``forkserver`` by default, so
  every worker starts real thread pools of the size asked (see "Why forkserver" below).
* :func:`env_after_vs_before_import` — the thread pools fresh Python processes report when the
  thread environment variables are set before the imports, after them, or when the pools are
  limited at run time. Each case runs in its own subprocess (so "before import" is real).
* :func:`fork_cv2_demo` — what ``cv2.setNumThreads(n)`` does in a forked child of a process
  that has used OpenCV's pool: the number of tries that finished and that hung (killed after a
  timeout). It runs in a subprocess; nothing can hang the caller.

Why forkserver for the grid: under ``fork``, a worker inherits the parent's thread pools'
*bookkeeping* but not their threads. When the notebook has used OpenCV before starting the
workers, ``cv2.getNumThreads()`` in a forked worker still reads the parent's count while the
worker really runs OpenCV on one thread; and torch's OpenMP pool cannot be given more than one
thread there without hanging. ``forkserver`` (and ``spawn``) workers start from a clean process:
their pools really have the threads they report. :func:`forkserver_context` preloads torch,
OpenCV and this package in the fork server, so each worker starts in a fraction of a second
instead of importing torch again.

Nothing happens at import time.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import numbers
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from .bench import thread_involuntary_switches
from .checks import check_int, check_seconds
from .config import QUICK_ENV
from .threads import THREAD_ENV_VARS, ThreadPools

__all__ = [
    "OpenCVHeavyTransform",
    "opencv_heavy_dataset",
    "forkserver_context",
    "grid_context",
    "involuntary_switches",
    "switches_between",
    "default_grid",
    "GRID_METRICS",
    "GridCell",
    "GridResult",
    "run_grid",
    "plot_grid",
    "close_loader",
    "EnvCase",
    "EnvReport",
    "ENV_CASES",
    "env_cases",
    "env_after_vs_before_import",
    "ForkCv2Report",
    "fork_cv2_demo",
]

#: Modules the fork server imports once, so forkserver workers start fast.
FORKSERVER_PRELOAD = ("numpy", "cv2", "torch", "course_utils.threads", "course_utils.data",
                      "course_utils.oversubscription")


# --------------------------------------------------------------------------------------
# small validation helpers
# --------------------------------------------------------------------------------------
def _int_list(name: str, values: Any, where: str) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{where}: {name} must be a list of ints such as [1, 2, 4], got "
                        f"{values!r}.")
    out = [check_int(f"{name}[{i}]", v, 1, where) for i, v in enumerate(values)]
    if not out:
        raise ValueError(f"{where}: {name} is empty; give at least one value, e.g. [1, 2].")
    if len(set(out)) != len(out):
        raise ValueError(f"{where}: {name}={out} has repeated values; list each once.")
    return out


# --------------------------------------------------------------------------------------
# the OpenCV-heavy workload
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpenCVHeavyTransform:
    """An augmentation chain that spends its time in OpenCV's thread pool.

    On a decoded (H, W, 3) uint8 image: ``cv2.resize`` to ``work_side`` x ``work_side``
    (bicubic), ``cv2.GaussianBlur`` (``blur_ksize``), a rotation by ``angle`` degrees
    (``cv2.warpAffine``), RGB -> HSV -> RGB (``cv2.cvtColor``, a colour-jitter stand-in), then
    ``cv2.resize`` down to ``size`` x ``size`` (area). Returns a (3, size, size) uint8 tensor.
    Every step but the JPEG decode (done by the dataset) can run on OpenCV's pool, which is why
    the number of OpenCV threads per worker matters. Picklable: works in workers under every
    start method.
    """

    size: int = 224
    work_side: int = 512
    blur_ksize: int = 9
    angle: float = 10.0

    def __post_init__(self) -> None:
        where = "OpenCVHeavyTransform"
        object.__setattr__(self, "size", check_int("size", self.size, 8, where))
        object.__setattr__(self, "work_side",
                           check_int("work_side", self.work_side, 16, where))
        k = check_int("blur_ksize", self.blur_ksize, 1, where)
        if k % 2 == 0:
            raise ValueError(f"{where}: blur_ksize must be odd (a Gaussian kernel has a centre "
                             f"pixel), got {k}; use e.g. 9.")
        if isinstance(self.angle, bool) or not isinstance(self.angle, numbers.Real):
            raise TypeError(f"{where}: angle must be a number of degrees, got {self.angle!r}.")

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        import cv2

        if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 \
                or image.dtype != np.uint8:
            raise ValueError(f"OpenCVHeavyTransform: image must be an (H, W, 3) uint8 array, got "
                             f"{getattr(image, 'shape', None)} {getattr(image, 'dtype', type(image))}.")
        s = self.work_side
        x = cv2.resize(image, (s, s), interpolation=cv2.INTER_CUBIC)
        x = cv2.GaussianBlur(x, (self.blur_ksize, self.blur_ksize), 0)
        rotation = cv2.getRotationMatrix2D((s / 2, s / 2), float(self.angle), 1.0)
        x = cv2.warpAffine(x, rotation, (s, s), flags=cv2.INTER_LINEAR,
                           borderMode=cv2.BORDER_REFLECT)
        x = cv2.cvtColor(cv2.cvtColor(x, cv2.COLOR_RGB2HSV), cv2.COLOR_HSV2RGB)
        x = cv2.resize(x, (self.size, self.size), interpolation=cv2.INTER_AREA)
        return torch.from_numpy(x).permute(2, 0, 1).contiguous()


def opencv_heavy_dataset(n: int | None = None, *, work_side: int | None = None,
                         max_side: int | None = None, seed: int = 0) -> Any:
    """The course JPEGs (:class:`course_utils.data.JpegDataset`) with :class:`OpenCVHeavyTransform`.

    ``n`` defaults to 2000 (full mode) or 200 (quick mode), as for JpegDataset.
    ``work_side`` (the transform's working size, pixels) defaults to 512 (full) or 320 (quick);
    ``max_side`` (the longest side of the stored JPEGs) to 512 (full) or 320 (quick): quick mode
    makes each sample about three times cheaper.
    """
    from .config import pick
    from .data import JpegDataset

    work_side = pick(full=512, quick=320) if work_side is None else work_side
    max_side = pick(full=512, quick=320) if max_side is None else max_side
    return JpegDataset(n, seed=seed, max_side=max_side, min_side=min(160, max_side),
                       transform=OpenCVHeavyTransform(work_side=work_side))


# --------------------------------------------------------------------------------------
# start methods
# --------------------------------------------------------------------------------------
def forkserver_context(preload: bool = True) -> Any:
    """The ``forkserver`` multiprocessing context, with torch and OpenCV preloaded in the server.

    With ``preload`` (the default) the fork server imports :data:`FORKSERVER_PRELOAD` once when
    it starts, and every worker forks from it already importing nothing: a worker starts in
    about a tenth of a second instead of seconds. The server only *imports* those libraries
    (it never runs a parallel region), so its children start clean thread pools. The preload
    list applies only if the fork server of this process has not been started yet; otherwise
    workers still work, they just import torch themselves. Raises ValueError where forkserver
    does not exist (Windows): use ``'spawn'`` there.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        raise ValueError("forkserver is not available on this platform "
                         f"(start methods: {multiprocessing.get_all_start_methods()}); use "
                         f"multiprocessing_context='spawn' instead.")
    ctx = multiprocessing.get_context("forkserver")
    if preload:
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx


def grid_context() -> Any:
    """The context the grid uses: :func:`forkserver_context` where it exists, else spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        return forkserver_context()
    return multiprocessing.get_context("spawn")


def _method_of(context: Any) -> str:
    if context is None:
        from .machine import start_method

        return start_method()
    if isinstance(context, str):
        if context not in multiprocessing.get_all_start_methods():
            raise ValueError(f"multiprocessing_context={context!r} is not a start method here; "
                             f"use one of {multiprocessing.get_all_start_methods()}.")
        return context
    get = getattr(context, "get_start_method", None)
    if get is None:
        raise TypeError(f"multiprocessing_context must be None, a start method name or a "
                        f"multiprocessing context, got {context!r}.")
    return str(get())


# --------------------------------------------------------------------------------------
# involuntary context switches of every thread of a process tree
# --------------------------------------------------------------------------------------
def involuntary_switches(pids: Sequence[int] | None = None) -> dict[tuple[int, int], int] | None:
    """Involuntary context switches of every *thread* of this process and its children.

    Returns ``{(pid, thread id): count}`` (a snapshot; subtract two with
    :func:`switches_between`), or None where the platform has no per-thread counts (only
    Linux's /proc has them). Why per thread: ``psutil.Process.num_ctx_switches()`` on Linux
    reads the main thread only, so a pool's threads being preempted would go unseen.
    """
    if not os.path.isdir("/proc/self/task"):
        return None
    if pids is None:
        import psutil

        me = psutil.Process()
        try:
            pids = [me.pid] + [p.pid for p in me.children(recursive=True)]
        except psutil.Error:
            pids = [me.pid]
    snap: dict[tuple[int, int], int] = {}
    for pid in pids:
        part = thread_involuntary_switches(int(pid))
        if part:
            snap.update(part)
    return snap


def switches_between(before: Mapping | None, after: Mapping | None) -> int | None:
    """Switches made between two :func:`involuntary_switches` snapshots (threads born in
    between count from zero; threads that ended are lost)."""
    if before is None or after is None:
        return None
    return int(sum(max(0, n - before.get(key, 0)) for key, n in after.items()))


class _SwitchWindow:
    """Wraps a loader; counts involuntary switches of all threads over measure_loader's window.

    The first snapshot is taken right before the last warm-up batch is handed over (outside the
    timed window), the second right before the last timed batch is handed over (one snapshot,
    a few ms, inside the window).
    """

    def __init__(self, loader: Any, warmup: int, timed: int) -> None:
        self._loader = loader
        self._warmup = warmup
        self._timed = timed
        self.windows: list[int | None] = []

    def __iter__(self) -> Iterator[Any]:
        # iter() of the loader now, not lazily in the generator: measure_loader lists the
        # process tree right after iter(), and must see the workers this starts.
        return self._batches(iter(self._loader))

    def _batches(self, it: Iterator[Any]) -> Iterator[Any]:
        try:
            start = involuntary_switches() if self._warmup == 0 else None
            for i in range(self._warmup):
                batch = next(it)
                if i == self._warmup - 1:
                    start = involuntary_switches()
                yield batch
            for j in range(self._timed):
                batch = next(it)
                if j == self._timed - 1:
                    self.windows.append(switches_between(start, involuntary_switches()))
                yield batch
        finally:
            del it

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:  # num_workers, batch_size, ... for measure_loader
        return getattr(self._loader, name)


def close_loader(loader: Any) -> None:
    """Shut down the workers a ``persistent_workers=True`` DataLoader keeps alive (no-op otherwise)."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        loader._iterator = None


# --------------------------------------------------------------------------------------
# the grid
# --------------------------------------------------------------------------------------
def default_grid(usable: int | None = None) -> tuple[list[int], list[int]]:
    """(worker_counts, thread_counts) for :func:`run_grid` on a machine with ``usable`` CPUs.

    Workers: powers of two up to twice the usable CPUs (the last row is oversubscribed by
    workers alone); threads per pool: powers of two up to the usable CPUs, which is also what
    OpenCV and BLAS use by default. Quick mode keeps at most three worker counts and the two
    ends of the thread axis.
    """
    from .config import quick_mode
    from .machine import usable_cpus

    u = usable_cpus() if usable is None else check_int("usable", usable, 1, "default_grid")
    workers = [w for w in (1, 2, 4, 8, 16, 32, 64, 128, 256) if w <= max(2, 2 * u)]
    threads = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= u]
    if u not in threads:
        threads.append(u)
    if quick_mode():
        workers = sorted({1, max(1, u), 2 * u} if u > 1 else {1, 2})
        workers = [workers[0], workers[len(workers) // 2], workers[-1]] if len(workers) > 3 else workers
        threads = sorted({1, u}) if u > 1 else [1, 2]
    else:
        if len(workers) > 6:
            workers = [1] + workers[-5:]
        if len(threads) > 5:
            threads = [1] + threads[-4:]
    return workers, threads


@dataclass
class GridCell:
    """One cell of the grid: ``workers`` DataLoader workers, each pool limited to ``threads``.

    samples_per_s: median throughput; cpu_s_per_sample: CPU-seconds of the process tree per
    sample; ctx_per_1k: involuntary context switches of all threads of the tree per 1000
    samples (None where not measurable); measurement: the full :class:`Measurement`.
    """

    workers: int
    threads: int
    samples_per_s: float
    cpu_s_per_sample: float | None
    ctx_per_1k: float | None
    measurement: Any = None

    @property
    def total_threads(self) -> int:
        """Threads that may want a core at once: workers x threads per pool."""
        return self.workers * self.threads

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("workers", "threads", "samples_per_s",
                                              "cpu_s_per_sample", "ctx_per_1k")}
        out["measurement"] = None if self.measurement is None else self.measurement.to_dict()
        return out


#: Metrics a grid knows: name -> (label for a person, scale for display, higher is better).
GRID_METRICS = {
    "samples_per_s": ("samples per second (higher is better)", 1.0, True),
    "cpu_s_per_sample": ("CPU ms per sample, all processes (lower is better)", 1e3, False),
    "ctx_per_1k": ("involuntary context switches per 1000 samples (lower is better)", 1.0, False),
}


@dataclass
class GridResult:
    """The measured grid: cells for every (workers, threads) pair, plus the settings used."""

    worker_counts: list[int]
    thread_counts: list[int]
    cells: list[GridCell]
    usable_cpus: int
    settings: dict = field(default_factory=dict)
    machine: str = ""

    def cell(self, workers: int, threads: int) -> GridCell:
        for c in self.cells:
            if c.workers == workers and c.threads == threads:
                return c
        raise KeyError(f"no cell for workers={workers}, threads={threads}; the grid has "
                       f"workers {self.worker_counts} x threads {self.thread_counts}.")

    def matrix(self, metric: str = "samples_per_s") -> np.ndarray:
        """(len(worker_counts), len(thread_counts)) array of ``metric`` (NaN where unmeasured)."""
        if metric not in GRID_METRICS:
            raise ValueError(f"metric={metric!r} is not a grid metric; use one of "
                             f"{', '.join(GRID_METRICS)}.")
        out = np.full((len(self.worker_counts), len(self.thread_counts)), np.nan)
        for c in self.cells:
            value = getattr(c, metric)
            if value is not None:
                out[self.worker_counts.index(c.workers), self.thread_counts.index(c.threads)] = value
        return out

    def best(self, metric: str = "samples_per_s") -> GridCell:
        """The best cell for ``metric`` (highest samples/s; lowest CPU or switches)."""
        if metric not in GRID_METRICS:
            raise ValueError(f"metric={metric!r} is not a grid metric; use one of "
                             f"{', '.join(GRID_METRICS)}.")
        cells = [c for c in self.cells if getattr(c, metric) is not None]
        if not cells:
            raise ValueError(f"{metric} was not measured in any cell.")
        higher = GRID_METRICS[metric][2]
        return (max if higher else min)(cells, key=lambda c: getattr(c, metric))

    def oversubscribed(self) -> list[GridCell]:
        """Cells with more threads (workers x threads) than usable CPUs."""
        return [c for c in self.cells if c.total_threads > self.usable_cpus]

    def to_dict(self) -> dict:
        return {"worker_counts": list(self.worker_counts),
                "thread_counts": list(self.thread_counts),
                "cells": [c.to_dict() for c in self.cells], "usable_cpus": self.usable_cpus,
                "settings": dict(self.settings), "machine": self.machine}

    def table(self, metric: str = "samples_per_s") -> str:
        """A text table of ``metric``: one row per worker count, one column per thread count."""
        label, scale, _ = GRID_METRICS[metric]
        m = self.matrix(metric) * scale
        head = ["workers \\ threads"] + [str(k) for k in self.thread_counts]
        rows = [[str(w)] + ["n/a" if not math.isfinite(v) else
                            (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}") for v in m[i]]
                for i, w in enumerate(self.worker_counts)]
        widths = [max(len(r[c]) for r in [head] + rows) for c in range(len(head))]
        lines = [label]
        lines += ["  ".join(r[c].rjust(widths[c]) for c in range(len(r))) for r in [head] + rows]
        return "\n".join(lines)

    def __str__(self) -> str:
        parts = [f"grid: workers {self.worker_counts} x threads per pool {self.thread_counts} "
                 f"({self.usable_cpus} usable CPUs)"]
        parts += [self.table(m) for m in GRID_METRICS]
        return "\n\n".join(parts)


def run_grid(worker_counts: Sequence[int] | None = None,
             thread_counts: Sequence[int] | None = None, *,
             dataset: Any = None, batch_size: int | None = None, batches: int | None = None,
             repeats: int | None = None, prefetch_factor: int = 1,
             multiprocessing_context: Any = None, timeout_s: float = 120.0,
             progress: bool = True) -> GridResult:
    """Measure every (num_workers, threads per pool) pair on an OpenCV-heavy loader.

    For each cell a DataLoader with ``num_workers=w``, ``worker_init_fn=make_worker_init(k)``
    (torch, every BLAS/OpenMP pool and OpenCV limited to ``k`` threads in each worker) and
    ``persistent_workers=True`` is measured with :func:`course_utils.bench.measure_loader`
    (warm-up of one batch per worker excluded, ``repeats`` repeats of at least ``batches``
    batches); the involuntary context switches of every thread of the process tree are counted
    over the same timed windows. Workers are shut down after each cell.

    Batches already in flight when the clock starts look free (see
    :mod:`course_utils.bench`); up to ``num_workers * prefetch_factor`` are. So each cell
    times at least ``3 * num_workers * prefetch_factor`` batches, and ``prefetch_factor``
    defaults to 1 (the steady state is the same; the short-window error is smaller).

    ``dataset`` defaults to :func:`opencv_heavy_dataset` sized to the cells;
    ``multiprocessing_context`` defaults to :func:`grid_context` (forkserver with preloaded
    libraries, so the pools in workers are real); ``'fork'`` is refused for threads > 1 (a
    forked worker cannot safely grow torch's OpenMP pool). ``timeout_s`` bounds the wait for
    any one batch (seconds). Defaults come from :func:`default_grid` and quick mode.
    """
    from torch.utils.data import DataLoader

    from .bench import measure_loader
    from .config import pick
    from .machine import machine_summary, usable_cpus
    from .threads import make_worker_init

    where = "run_grid"
    dw, dk = default_grid()
    workers = dw if worker_counts is None else _int_list("worker_counts", worker_counts, where)
    threads = dk if thread_counts is None else _int_list("thread_counts", thread_counts, where)
    batch_size = pick(full=8, quick=4) if batch_size is None else \
        check_int("batch_size", batch_size, 1, where)
    batches = pick(full=12, quick=4) if batches is None else check_int("batches", batches, 1, where)
    repeats = pick(full=3, quick=2) if repeats is None else check_int("repeats", repeats, 1, where)
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    prefetch_factor = check_int("prefetch_factor", prefetch_factor, 1, where)
    context = grid_context() if multiprocessing_context is None else multiprocessing_context
    method = _method_of(context)
    if method == "fork" and max(threads) > 1:
        raise ValueError(
            f"{where}: thread_counts={threads} asks for more than one thread per pool in workers "
            f"started with 'fork'. A forked worker inherits torch's OpenMP pool without its "
            f"threads, and growing it hangs; use multiprocessing_context='forkserver' (the "
            f"default) or 'spawn', or thread_counts=[1].")
    def timed_batches(w: int) -> int:
        return max(batches, 3 * w * prefetch_factor)

    max_warmup = max(2, max(workers))
    needed = batch_size * (max_warmup + max(timed_batches(w) for w in workers))
    if dataset is None:
        dataset = opencv_heavy_dataset(n=needed)
    elif len(dataset) < needed:
        raise ValueError(f"{where}: dataset has {len(dataset)} samples; one epoch must cover the "
                         f"warm-up ({max_warmup} batches) and the timed batches of "
                         f"{batch_size}: give at least {needed} samples, or fewer batches.")
    usable = usable_cpus()

    from tqdm.auto import tqdm

    pairs = [(w, k) for w in workers for k in threads]
    cells: list[GridCell] = []
    bar = tqdm(pairs, desc="grid", unit="cell", disable=not progress, leave=False)
    try:
        for w, k in bar:
            bar.set_postfix_str(f"{w} workers x {k} threads")
            loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=w,
                                worker_init_fn=make_worker_init(k),
                                multiprocessing_context=context, persistent_workers=True,
                                prefetch_factor=prefetch_factor, timeout=timeout_s)
            warmup = max(2, w)
            n_timed = timed_batches(w)
            counter = _SwitchWindow(loader, warmup, n_timed)
            try:
                m = measure_loader(counter, batches=n_timed, warmup_batches=warmup,
                                   repeats=repeats, label=f"{w} workers x {k} threads",
                                   settings={"threads_per_pool": k, "start_method": method},
                                   progress=False)
            finally:
                close_loader(loader)
            total = m.items_per_repeat * m.repeats
            windows = counter.windows
            if windows and all(x is not None for x in windows):
                ctx = 1000.0 * sum(windows) / total
            elif m.involuntary_ctx_switches is not None:
                ctx = 1000.0 * m.involuntary_ctx_switches / total  # main threads only
            else:
                ctx = None
            cells.append(GridCell(w, k, m.samples_per_s, m.cpu_s_per_sample, ctx, m))
    finally:
        bar.close()
    transform = getattr(dataset, "transform", None)
    settings = {"batch_size": batch_size, "batches": f"max({batches}, 3 x workers x prefetch)",
                "prefetch_factor": prefetch_factor, "repeats": repeats,
                "start_method": method}
    if transform is not None:
        settings["transform"] = repr(transform)
    return GridResult(workers, threads, cells, usable, settings, machine_summary())


def plot_grid(result: GridResult, metrics: Sequence[str] = tuple(GRID_METRICS), *,
              axes: Any = None, title: str = "workers x threads per pool") -> Any:
    """Heatmaps of ``metrics`` (one panel each): rows = num_workers, columns = threads per pool.

    Every cell shows its value; cells where workers x threads exceeds the usable CPUs are
    outlined in red (oversubscribed); the best cell of each panel is marked with a star. The
    machine and settings are in the title. Returns the array of Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from .plots import figure_title

    if not isinstance(result, GridResult):
        raise TypeError(f"result must be a GridResult made by run_grid(), got "
                        f"{type(result).__name__}.")
    metrics = list(metrics)
    unknown = [m for m in metrics if m not in GRID_METRICS]
    if not metrics or unknown:
        raise ValueError(f"metrics must be a non-empty list of {', '.join(GRID_METRICS)}; "
                         f"unknown: {unknown}.")
    if axes is None:
        ncol = len(metrics)
        fig, axes = plt.subplots(1, ncol, figsize=(4.6 * ncol, 1.6 + 0.55 * len(result.worker_counts)
                                                   + 1.2), layout="constrained", squeeze=False)
        axes = axes[0]
    else:
        axes = np.atleast_1d(axes)
        if len(axes) != len(metrics):
            raise ValueError(f"axes has {len(axes)} panels but {len(metrics)} metrics were asked.")
        fig = axes[0].figure
    for ax, metric in zip(axes, metrics):
        label, scale, higher = GRID_METRICS[metric]
        data = result.matrix(metric) * scale
        cmap = "viridis" if higher else "viridis_r"
        shown = np.ma.masked_invalid(data)
        ax.imshow(shown, cmap=cmap, aspect="auto")
        finite = data[np.isfinite(data)]
        mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
        best = None
        try:
            b = result.best(metric)
            best = (result.worker_counts.index(b.workers), result.thread_counts.index(b.threads))
        except ValueError:
            pass
        for i, w in enumerate(result.worker_counts):
            for j, k in enumerate(result.thread_counts):
                v = data[i, j]
                text = "n/a" if not math.isfinite(v) else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}")
                if best == (i, j):
                    text += " *"
                dark = math.isfinite(v) and ((v < mid) if higher else (v > mid))
                ax.text(j, i, text, ha="center", va="center", fontsize=9,
                        color="white" if dark else "black")
                if w * k > result.usable_cpus:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red",
                                           linewidth=1.5, linestyle="--"))
        ax.set_xticks(range(len(result.thread_counts)), [str(k) for k in result.thread_counts])
        ax.set_yticks(range(len(result.worker_counts)), [str(w) for w in result.worker_counts])
        ax.set_xlabel("threads per library pool in each worker")
        ax.set_ylabel("num_workers")
        ax.set_title(label, fontsize=9)
    settings = {k: v for k, v in result.settings.items() if k != "transform"}
    settings["usable_cpus"] = result.usable_cpus
    fig.suptitle(figure_title(f"{title} (red dashes: workers x threads > usable CPUs; "
                              f"* best)", settings), fontsize=9)
    return axes


# --------------------------------------------------------------------------------------
# environment variables: before vs after import, in fresh processes
# --------------------------------------------------------------------------------------
_CHILD_HEADER = "import json, os, sys\n"
_CHILD_IMPORTS = "import numpy, cv2, torch\n"
_CHILD_REPORT = ("from course_utils.threads import thread_pools\n"
                 "print('POOLS=' + json.dumps(thread_pools().to_dict()))\n")


@dataclass(frozen=True)
class EnvCase:
    """One way of limiting threads, run as a script in a fresh Python process."""

    name: str
    description: str
    before_imports: str = ""
    after_imports: str = ""

    def script(self) -> str:
        return (_CHILD_HEADER + self.before_imports + _CHILD_IMPORTS + self.after_imports
                + _CHILD_REPORT)


def _env_lines(names: Sequence[str], value: int) -> str:
    return "".join(f"os.environ[{n!r}] = '{value}'\n" for n in names)


def env_cases(n_threads: int = 1) -> list[EnvCase]:
    """The cases :func:`env_after_vs_before_import` runs, for a limit of ``n_threads``."""
    n = check_int("n_threads", n_threads, 1, "env_cases")
    return [
        EnvCase("nothing set", "no variable, no limit: the libraries' defaults"),
        EnvCase("OMP_NUM_THREADS before import",
                "os.environ['OMP_NUM_THREADS'] set at the top, before importing numpy/cv2/torch",
                before_imports=_env_lines(["OMP_NUM_THREADS"], n)),
        EnvCase("all variables before import",
                f"all of {', '.join(THREAD_ENV_VARS)} set before the imports",
                before_imports=_env_lines(THREAD_ENV_VARS, n)),
        EnvCase("all variables after import",
                "the same variables set right after importing numpy/cv2/torch (none used yet)",
                after_imports=_env_lines(THREAD_ENV_VARS, n)),
        EnvCase("run-time calls after import",
                f"threadpoolctl.threadpool_limits({n}), torch.set_num_threads({n}), "
                f"cv2.setNumThreads({0 if n == 1 else n}) after the imports",
                after_imports=("import threadpoolctl\n"
                               f"_limits = threadpoolctl.threadpool_limits(limits={n})\n"
                               f"torch.set_num_threads({n})\n"
                               f"cv2.setNumThreads({0 if n == 1 else n})\n")),
    ]


#: Names of the cases, in order.
ENV_CASES = tuple(c.name for c in env_cases())


@dataclass
class EnvReport:
    """Pools each fresh process reported (``pools[name]``), or why it could not (``errors``)."""

    cases: list[EnvCase]
    pools: dict[str, ThreadPools]
    errors: dict[str, str]
    n_threads: int
    seconds: float

    def limited(self, name: str) -> bool | None:
        """True when every pool of case ``name`` is at most ``n_threads`` (None if it failed)."""
        p = self.pools.get(name)
        return None if p is None else p.limited_to(self.n_threads)

    def unlimited_pools(self, name: str) -> dict[str, int]:
        """Pools of case ``name`` above ``n_threads``: {pool: threads}."""
        p = self.pools.get(name)
        if p is None:
            return {}
        return {k: v for k, v in p.pools.items() if v > self.n_threads}

    def table(self) -> str:
        """Rows = pools, columns = cases, cells = threads each fresh process reported."""
        names = [c.name for c in self.cases]
        pool_names: list[str] = []
        for name in names:
            for pool in (self.pools[name].pools if name in self.pools else {}):
                if pool not in pool_names:
                    pool_names.append(pool)
        head = ["pool"] + [f"({i + 1})" for i in range(len(names))]
        rows = []
        for pool in pool_names:
            rows.append([pool] + [str(self.pools[n].pools.get(pool, "-")) if n in self.pools
                                  else "error" for n in names])
        rows.append(["all limited?"] + [
            {True: "yes", False: "NO", None: "error"}[self.limited(n)] for n in names])
        widths = [max(len(r[c]) for r in [head] + rows) for c in range(len(head))]
        lines = ["  ".join([r[0].ljust(widths[0])] + [r[c].rjust(widths[c])
                                                     for c in range(1, len(r))])
                 for r in [head] + rows]
        lines.append("")
        lines += [f"({i + 1}) {c.name}: {c.description}" for i, c in enumerate(self.cases)]
        for name, err in self.errors.items():
            lines.append(f"error in {name!r}: {err}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV_VARS}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop(QUICK_ENV, None)  # the child only reports; keep its config out of it
    return env


def env_after_vs_before_import(n_threads: int = 1, *, cases: Sequence[str] | None = None,
                               timeout_s: float = 120.0, parallel: bool = True) -> EnvReport:
    """Run each of :func:`env_cases` in a fresh Python process and collect its thread pools.

    Each child starts with none of :data:`THREAD_ENV_VARS` set (whatever this process has),
    runs the case's lines before/after ``import numpy, cv2, torch``, and reports
    :func:`course_utils.threads.thread_pools` (threads per pool). The children run at the same
    time when ``parallel`` (each imports torch: seconds). ``timeout_s`` bounds the whole run;
    a child that does not answer in time is killed and reported in ``errors``. ``cases``
    picks some of :data:`ENV_CASES` by name (each case costs a torch import); None runs all.
    """
    where = "env_after_vs_before_import"
    n = check_int("n_threads", n_threads, 1, where)
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    all_cases = env_cases(n)
    if cases is None:
        chosen = all_cases
    else:
        if isinstance(cases, str) or not isinstance(cases, Sequence) or not cases:
            raise TypeError(f"{where}: cases must be a non-empty list of case names from "
                            f"{list(ENV_CASES)}, got {cases!r}.")
        unknown = [c for c in cases if c not in ENV_CASES]
        if unknown:
            raise ValueError(f"{where}: unknown case(s) {unknown}; choose from {list(ENV_CASES)}.")
        chosen = [c for c in all_cases if c.name in cases]
    cases = chosen
    env = _child_env()
    start = time.perf_counter()
    pools: dict[str, ThreadPools] = {}
    errors: dict[str, str] = {}

    def launch(case: EnvCase) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", case.script()], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def collect(case: EnvCase, proc: subprocess.Popen) -> None:
        left = max(1.0, timeout_s - (time.perf_counter() - start))
        try:
            out, err = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            errors[case.name] = f"no answer within timeout_s={timeout_s:g} s (killed)"
            return
        line = next((l for l in out.splitlines() if l.startswith("POOLS=")), None)
        if proc.returncode != 0 or line is None:
            tail = (err or out).strip().splitlines()[-3:]
            errors[case.name] = f"exit code {proc.returncode}: {' | '.join(tail)}"
            return
        pools[case.name] = ThreadPools.from_dict(json.loads(line[len("POOLS="):]))

    if parallel:
        procs = [(case, launch(case)) for case in cases]
        for case, proc in procs:
            collect(case, proc)
    else:
        for case in cases:
            collect(case, launch(case))
    return EnvReport(cases, pools, errors, n, time.perf_counter() - start)


# --------------------------------------------------------------------------------------
# cv2.setNumThreads in a forked child (run in a subprocess: it can hang)
# --------------------------------------------------------------------------------------
_FORK_DEMO = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, cv2
    args, tries, per_try = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    if cv2.getNumThreads() < 2:
        cv2.setNumThreads(2)
    img = np.random.default_rng(0).integers(0, 255, (1024, 1024, 3), dtype=np.uint8)
    cv2.GaussianBlur(img, (15, 15), 0)          # the parent uses OpenCV's pool
    parent = {"opencv": cv2.getNumThreads(), "os_threads": len(os.listdir("/proc/self/task"))
              if os.path.isdir("/proc/self/task") else None}
    result = {"parent": parent, "cases": {}}
    for arg in args:
        done = hung = 0
        child_info = None
        for t in range(tries):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                info = {"reads": cv2.getNumThreads(), "os_threads":
                        len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None}
                os.write(w, (json.dumps(info) + "\\n").encode())
                if arg is not None:
                    cv2.setNumThreads(arg)
                cv2.GaussianBlur(img, (15, 15), 0)
                os._exit(0)
            os.close(w)
            deadline = time.monotonic() + per_try
            while True:
                finished, _ = os.waitpid(pid, os.WNOHANG)
                if finished:
                    done += 1
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.01)
            data = os.read(r, 4096).decode()
            os.close(r)
            if child_info is None and data.strip():
                child_info = json.loads(data.splitlines()[0])
        result["cases"][json.dumps(arg)] = {"done": done, "hung": hung, "child": child_info}
    print("RESULT=" + json.dumps(result))
""")


@dataclass
class ForkCv2Report:
    """What ``cv2.setNumThreads(arg)`` did in forked children of a process that used OpenCV.

    ``cases[arg] = (finished, hung)`` out of ``tries`` forks (arg None: no call at all); a
    child is declared hung after ``per_try_s`` seconds and killed. ``child_reads`` is what
    ``cv2.getNumThreads()`` read in a child and ``child_os_threads`` how many OS threads it
    really had; ``parent_opencv`` / ``parent_os_threads`` the same in the parent.
    """

    cases: dict[Any, tuple[int, int]]
    tries: int
    per_try_s: float
    parent_opencv: int | None
    parent_os_threads: int | None
    child_reads: int | None
    child_os_threads: int | None
    available: bool = True
    error: str = ""

    def hung(self, arg: Any) -> int:
        return self.cases[arg][1]

    def __str__(self) -> str:
        if not self.available:
            return f"fork demo not run: {self.error}"
        lines = [f"parent: cv2.getNumThreads() = {self.parent_opencv}, "
                 f"{self.parent_os_threads} OS threads after using OpenCV's pool",
                 f"forked child: cv2.getNumThreads() reads {self.child_reads}, "
                 f"the child has {self.child_os_threads} OS thread(s)"]
        for arg, (done, hung) in self.cases.items():
            call = "no call" if arg is None else f"cv2.setNumThreads({arg})"
            lines.append(f"  {call:<22} finished {done}/{self.tries}, hung {hung}/{self.tries} "
                         f"(killed after {self.per_try_s:g} s)")
        return "\n".join(lines)


def fork_cv2_demo(args: Sequence[int | None] = (None, 0, 1), *, tries: int = 3,
                  per_try_s: float = 2.0, timeout_s: float = 60.0) -> ForkCv2Report:
    """Fork children of a process that has used OpenCV's pool and call ``cv2.setNumThreads``.

    Everything runs in a separate Python process (``sys.executable``): it uses OpenCV's pool
    (a Gaussian blur of a 1024x1024 image with at least 2 threads), then for each value in
    ``args`` forks ``tries`` children that call ``cv2.setNumThreads(value)`` (``None``: no
    call) and blur once more. A child that has not finished after ``per_try_s`` seconds counts
    as hung and is killed; ``timeout_s`` bounds the whole demo. Where ``os.fork`` does not exist
    the report says so (``available=False``).
    """
    where = "fork_cv2_demo"
    tries = check_int("tries", tries, 1, where)
    per_try_s = check_seconds("per_try_s", per_try_s, where, positive=True)
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    args = list(args)
    for a in args:
        if a is not None:
            check_int("args item", a, 0, where)
    if not hasattr(os, "fork"):
        return ForkCv2Report({}, tries, per_try_s, None, None, None, None, available=False,
                             error="this platform has no fork (Windows): workers always start "
                                   "fresh, and this hazard does not exist here.")
    try:
        proc = subprocess.run([sys.executable, "-c", _FORK_DEMO, json.dumps(args), str(tries),
                               str(per_try_s)], env=_child_env(), capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return ForkCv2Report({}, tries, per_try_s, None, None, None, None, available=False,
                             error=f"the demo did not finish within timeout_s={timeout_s:g} s.")
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT=")), None)
    if proc.returncode != 0 or line is None:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return ForkCv2Report({}, tries, per_try_s, None, None, None, None, available=False,
                             error=f"the demo process failed (exit {proc.returncode}): {tail}")
    data = json.loads(line[len("RESULT="):])
    cases: dict[Any, tuple[int, int]] = {}
    child: dict = {}
    for key, value in data["cases"].items():
        cases[json.loads(key)] = (int(value["done"]), int(value["hung"]))
        if not child and value.get("child"):
            child = value["child"]
    return ForkCv2Report(cases, tries, per_try_s, data["parent"].get("opencv"),
                         data["parent"].get("os_threads"), child.get("reads"),
                         child.get("os_threads"))
