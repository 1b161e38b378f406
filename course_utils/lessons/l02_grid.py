"""Lesson 02's grid: ``num_workers`` x threads per library pool on the OpenCV-heavy workload.

Per cell (:func:`run_grid`): **samples per second** (median of the repeats), **CPU-seconds per
sample** of the whole process tree (main process + workers), and **involuntary context switches
per 1000 samples**, counted over *every thread* of every process of the tree (how often the
kernel took a core away from a thread that still wanted it: the signature of more runnable
threads than cores). Each cell's workers are limited with
:func:`course_utils.threads.make_worker_init` and started with ``forkserver`` by default
(:mod:`course_utils.lessons.l02_workload` says why). The notebook writes one cell of it first.
Nothing happens at import time.
"""
from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Iterator

import matplotlib.pyplot as plt
import numpy as np
import psutil
from matplotlib.patches import Rectangle
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..bench import measure_loader
from ..checks import check_int, check_seconds
from ..config import pick, quick_mode
from ..machine import machine_summary, usable_cpus
from ..plots import figure_title
from ..process_tree import thread_involuntary_switches
from ..start_methods import start_method
from ..threads import make_worker_init
from .l02_workload import close_loader, grid_context, opencv_heavy_dataset


__all__ = [
    "involuntary_switches",
    "switches_between",
    "default_grid",
    "GridCell",
    "GRID_METRICS",
    "GridResult",
    "run_grid",
    "plot_grid",
]



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


def _method_of(context: Any) -> str:
    if context is None:

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
