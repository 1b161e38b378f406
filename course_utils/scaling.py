"""How DataLoader throughput, start-up and memory scale with ``num_workers`` (lesson 03).

What is measured, and in what unit:

* **samples/s vs num_workers** (:func:`sweep_workers`): one
  :func:`~course_utils.bench.measure_loader` Measurement per worker count (steady state:
  worker start-up excluded by warm-up).
* **the knee** (:func:`find_knee`): the smallest worker count whose samples/s is at least
  ``tolerance`` (default 0.9) times the best samples/s on the curve. More workers than the knee
  buy at most ``1 - tolerance`` more speed, and cost CPU, memory and start-up time.
* **worker start-up** (:func:`worker_startup_time`): seconds from ``iter(loader)`` until every
  worker has delivered its first (tiny) item, per start method (``fork``, ``forkserver``,
  ``spawn``).
* **seconds per epoch** (:func:`time_epochs`): wall time of whole epochs, start-up included,
  for ``persistent_workers`` False vs True.
* **private memory per worker** (:func:`worker_memory`): each worker's USS (bytes of memory
  private to that process, read with psutil inside the worker) when it starts fetching and as
  it works through its share of one epoch. Growth over the epoch is the copy-on-read cost.

Datasets and helpers that DataLoader workers run live here (importable under every start
method): :class:`RecordListDataset` (records as a Python list of dicts: the copy-on-read trap),
:class:`RecordArrayDataset` (the same records packed into NumPy arrays: the fix),
:class:`BatchedArrayDataset` (``__getitems__`` and a batch-sampler path: one gather per batch),
:class:`BurstyLatencyDataset` (mostly fast samples, a few slow ones: what ``prefetch_factor``
smooths), :class:`EpochTaggedDataset` (shows that persistent workers keep their own copy of the
dataset). Nothing happens at import time.
"""
from __future__ import annotations

import gc
import math
import multiprocessing
import numbers
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .bench import Measurement, measure_loader
from .checks import check_fraction, check_int, check_seconds
from .config import pick
from .data import ArrayDataset, _index, ram_budget_bytes
from .plots import figure_title

__all__ = [
    "DEFAULT_TOLERANCE",
    "MAX_DEFAULT_WORKERS",
    "default_worker_counts",
    "find_knee",
    "CurveShape",
    "describe_curve",
    "WorkerSweep",
    "sweep_workers",
    "plot_sweeps",
    "worker_startup_time",
    "time_epochs",
    "children_uss_bytes",
    "EpochTaggedDataset",
    "BurstyLatencyDataset",
    "SimulatedStep",
    "RECORD_CLASSES",
    "make_records",
    "RecordListDataset",
    "RecordArrayDataset",
    "WorkerUss",
    "WorkerMemory",
    "worker_memory",
    "plot_worker_memory",
    "uss_bytes",
    "BatchedArrayDataset",
    "PerSampleView",
    "keep_batch",
    "gather_batch",
]

#: Default tolerance of :func:`find_knee`: the knee reaches 90 % of the best rate.
DEFAULT_TOLERANCE = 0.9
#: :func:`default_worker_counts` never goes beyond this many workers by default.
MAX_DEFAULT_WORKERS = 32
_MB = 1e6


def _new_axes(ax: Any, figsize: tuple[float, float]) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------

def _context(multiprocessing_context: Any, where: str) -> tuple[Any, str]:
    """(context object or None, start method name) for a DataLoader."""
    from multiprocessing.context import BaseContext

    from .machine import start_method

    if multiprocessing_context is None:
        return None, start_method()
    if isinstance(multiprocessing_context, BaseContext):
        return multiprocessing_context, multiprocessing_context.get_start_method()
    methods = multiprocessing.get_all_start_methods()
    if isinstance(multiprocessing_context, str) and multiprocessing_context in methods:
        return multiprocessing.get_context(multiprocessing_context), multiprocessing_context
    raise ValueError(f"{where}: multiprocessing_context={multiprocessing_context!r} is not a "
                     f"start method on this platform; use one of {methods}, a multiprocessing "
                     f"context, or None for the default.")


# --------------------------------------------------------------------------------------------
# worker counts and the knee
# --------------------------------------------------------------------------------------------

def default_worker_counts(max_workers: Optional[int] = None, *,
                          cap: int = MAX_DEFAULT_WORKERS) -> list[int]:
    """Worker counts worth measuring: 0 up to ``max_workers`` (default 2 x usable CPUs).

    The default top is twice :func:`~course_utils.machine.usable_cpus` (past the cores, to see
    what oversubscription does), capped at ``cap`` (32) so a big server does not sweep for an
    hour. Up to 8 every count is listed; above that a roughly geometric grid
    (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ...) plus the usable CPU count and the top itself.
    """
    from .machine import usable_cpus

    where = "default_worker_counts"
    cap = check_int("cap", cap, 1, where)
    usable = usable_cpus()
    top = min(2 * usable, cap) if max_workers is None else check_int("max_workers", max_workers,
                                                                    0, where)
    if top <= 8:
        return list(range(top + 1))
    grid = {0, 1, 2, 3, 4, 6, 8}
    step = 8
    while step <= top:
        grid.update({step, step + step // 2})
        step *= 2
    grid.add(top)
    if usable <= top:
        grid.add(usable)
    return sorted(c for c in grid if c <= top)


def _curve(workers: Any, rates: Any, where: str) -> tuple[list[int], list[float]]:
    """Validate a (workers, rates) curve; return both sorted by worker count."""
    for name, value in (("workers", workers), ("rates", rates)):
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__"):
            raise TypeError(f"{where}: {name} must be a sequence (list, tuple or 1-D array), "
                            f"got {type(value).__name__}.")
    if len(workers) != len(rates):
        raise ValueError(f"{where}: workers has {len(workers)} values but rates has "
                         f"{len(rates)}: pass one rate (samples/s) per worker count.")
    if len(workers) == 0:
        raise ValueError(f"{where}: the curve is empty; pass at least one worker count and "
                         f"its measured rate.")
    ws: list[int] = []
    for w in workers:
        if isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < 0:
            raise ValueError(f"{where}: workers must be whole numbers >= 0 (num_workers values), "
                             f"got {w!r}.")
        ws.append(int(w))
    if len(set(ws)) != len(ws):
        dup = sorted({w for w in ws if ws.count(w) > 1})
        raise ValueError(f"{where}: worker count(s) {dup} appear more than once; pass one rate "
                         f"per worker count (e.g. the median of the repeats).")
    rs: list[float] = []
    for r in rates:
        if isinstance(r, bool) or not isinstance(r, numbers.Real) or not math.isfinite(float(r)) \
                or float(r) < 0:
            raise ValueError(f"{where}: rates must be finite numbers >= 0 (samples per second), "
                             f"got {r!r}; re-measure the point that failed.")
        rs.append(float(r))
    if max(rs) <= 0:
        raise ValueError(f"{where}: every rate is 0, so there is no best rate to compare with; "
                         f"check the measurement.")
    order = sorted(range(len(ws)), key=ws.__getitem__)
    return [ws[i] for i in order], [rs[i] for i in order]


def find_knee(workers: Sequence[int], rates: Sequence[float],
              tolerance: float = DEFAULT_TOLERANCE) -> int:
    """The smallest worker count whose rate is at least ``tolerance`` x the best rate.

    ``workers``: the num_workers values measured (any order, no repeats); ``rates``: the
    samples/s measured at each. With the default ``tolerance=0.9`` the knee is the fewest
    workers that deliver 90 % of the best throughput on the curve: more workers would buy at
    most 10 % more, while each costs CPU, memory and start-up time. Robust to a noisy plateau
    (a lucky high point far out does not move the answer much) and to any grid of counts.
    Raises ValueError for an empty curve, mismatched lengths, repeated counts, negative or
    non-finite rates, or a curve whose rates are all 0.
    """
    tolerance = check_fraction("tolerance", tolerance, "find_knee")
    ws, rs = _curve(workers, rates, "find_knee")
    best = max(rs)
    for w, r in zip(ws, rs):
        if r >= tolerance * best:
            return w
    raise AssertionError("unreachable: the best point always qualifies")  # pragma: no cover


@dataclass
class CurveShape:
    """What a samples/s-vs-workers curve looks like, in numbers (see :func:`describe_curve`).

    ``kind`` is one of:

    * ``"flat"``: the fewest workers measured already reach the tolerance: more workers do not
      help (light work, where sending batches between processes costs about as much as
      making them);
    * ``"rising"``: only the largest count reaches the tolerance: still climbing, measure
      further (waiting-bound work: workers overlap their waits, not their CPU);
    * ``"peaked"``: the rate falls after the best point by more than ``1 - tolerance``
      (oversubscription: more busy processes than cores);
    * ``"plateau"``: rises, then stays within tolerance (CPU-bound work on a machine with
      spare cores, which the extra workers cannot use).
    """

    kind: str
    knee: int
    knee_rate: float
    best_workers: int
    best_rate: float
    first_workers: int
    first_rate: float
    last_workers: int
    last_rate: float
    tolerance: float

    @property
    def speedup_at_knee(self) -> float:
        """Rate at the knee / rate at the fewest workers measured."""
        return self.knee_rate / self.first_rate if self.first_rate > 0 else math.inf

    def __str__(self) -> str:
        tol = f"{self.tolerance:.0%}"
        if self.kind == "flat":
            return (f"flat: {self.first_workers} workers already give {self.first_rate:,.0f} "
                    f"samples/s, within {tol} of the best ({self.best_rate:,.0f} at "
                    f"{self.best_workers}); more workers do not help")
        if self.kind == "rising":
            return (f"still rising: only {self.last_workers} workers (the most measured) reach "
                    f"{tol} of the best ({self.last_rate:,.0f} samples/s); measure more workers")
        text = (f"knee at {self.knee} workers ({self.knee_rate:,.0f} samples/s, "
                f"{self.speedup_at_knee:.2f}x {self.first_workers} workers); best "
                f"{self.best_rate:,.0f} at {self.best_workers}")
        if self.kind == "peaked":
            return (f"peaked: {text}, then falls to {self.last_rate:,.0f} at {self.last_workers} "
                    f"workers ({self.last_rate / self.best_rate:.0%} of the best)")
        return f"plateau: {text}; {self.last_workers} workers give {self.last_rate:,.0f}"


def describe_curve(workers: Sequence[int], rates: Sequence[float],
                   tolerance: float = DEFAULT_TOLERANCE) -> CurveShape:
    """Classify a samples/s-vs-workers curve and collect its key numbers (a :class:`CurveShape`).

    The knee is :func:`find_knee` with the same ``tolerance``; ``kind`` follows the rules in
    :class:`CurveShape`, checked in the order flat, rising, peaked, plateau.
    """
    tolerance = check_fraction("tolerance", tolerance, "describe_curve")
    ws, rs = _curve(workers, rates, "describe_curve")
    knee = find_knee(ws, rs, tolerance)
    i_best = int(np.argmax(rs))
    best = rs[i_best]
    if len(ws) > 1 and knee == ws[0]:
        kind = "flat"
    elif len(ws) > 1 and knee == ws[-1]:
        kind = "rising"
    elif rs[-1] < tolerance * best:
        kind = "peaked"
    else:
        kind = "plateau"
    return CurveShape(kind=kind, knee=knee, knee_rate=rs[ws.index(knee)], best_workers=ws[i_best],
                      best_rate=best, first_workers=ws[0], first_rate=rs[0],
                      last_workers=ws[-1], last_rate=rs[-1], tolerance=tolerance)


# --------------------------------------------------------------------------------------------
# sweeping num_workers
# --------------------------------------------------------------------------------------------

@dataclass
class WorkerSweep(Sequence):
    """Measurements of one dataset at several ``num_workers`` (a sequence of Measurements).

    ``workers[i]`` is the worker count of ``measurements[i]``. Iterating, indexing and ``len``
    go to the measurements, so ``compare(sweep)`` works.
    """

    label: str
    workers: list[int]
    measurements: list[Measurement]
    settings: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.measurements)

    def __getitem__(self, i: Any) -> Any:
        return self.measurements[i]

    def __iter__(self) -> Iterator[Measurement]:
        return iter(self.measurements)

    @property
    def samples_per_s(self) -> list[float]:
        """Median samples/s at each worker count."""
        return [m.samples_per_s for m in self.measurements]

    @property
    def cpu_s_per_sample(self) -> list[Optional[float]]:
        """CPU seconds (main process + workers) per sample at each worker count."""
        return [m.cpu_s_per_sample for m in self.measurements]

    def at(self, workers: int) -> Measurement:
        """The Measurement made with ``workers`` workers."""
        if workers not in self.workers:
            raise ValueError(f"{workers} workers were not measured in {self.label!r}; measured: "
                             f"{self.workers}.")
        return self.measurements[self.workers.index(workers)]

    def knee(self, tolerance: float = DEFAULT_TOLERANCE) -> int:
        """:func:`find_knee` of this curve."""
        return find_knee(self.workers, self.samples_per_s, tolerance)

    def shape(self, tolerance: float = DEFAULT_TOLERANCE) -> CurveShape:
        """:func:`describe_curve` of this curve."""
        return describe_curve(self.workers, self.samples_per_s, tolerance)

    def speedups(self) -> list[float]:
        """samples/s at each count divided by samples/s at the fewest workers measured."""
        base = self.samples_per_s[0]
        return [r / base if base > 0 else math.nan for r in self.samples_per_s]

    def to_dict(self) -> dict:
        return {"label": self.label, "workers": list(self.workers),
                "settings": dict(self.settings),
                "measurements": [m.to_dict() for m in self.measurements]}

    def __str__(self) -> str:
        lines = [f"{self.label}: samples/s vs num_workers"]
        lines.append(f"  {'workers':>7}  {'samples/s':>10}  {'x ' + str(self.workers[0]):>6}  "
                     f"{'CPU ms/sample':>13}")
        for w, m, s in zip(self.workers, self.measurements, self.speedups()):
            cpu = "n/a" if m.cpu_s_per_sample is None else f"{m.cpu_s_per_sample * 1e3:.3g}"
            flag = " *" if m.noisy else ""
            lines.append(f"  {w:>7}  {m.samples_per_s:>10,.0f}  {s:>6.2f}  {cpu:>13}{flag}")
        if any(m.noisy for m in self.measurements):
            lines.append("  * noisy: IQR above 10% of the median")
        lines.append(f"  {self.shape()}")
        return "\n".join(lines)


def _timed_batches(target: int, workers: int, per_epoch: int, warm: int,
                   where: str) -> int:
    """``target`` rounded up to a multiple of ``workers`` (workers deliver their batches in
    rounds, so a window of whole rounds is not biased by where it cuts a round), then
    rounded down to fit the batches the epoch has left after ``warm`` warm-up batches."""
    k = max(1, workers)
    available = per_epoch - warm
    n = math.ceil(target / k) * k
    if n > available:
        n = (available // k) * k
    if n < 1:
        raise ValueError(f"{where}: with {workers} workers the epoch has {per_epoch} batches; "
                         f"after a warm-up of {warm} that leaves {max(0, available)}, not one "
                         f"round of {k}. Use a smaller batch_size, a bigger dataset, fewer "
                         f"workers or a smaller warmup_batches.")
    return n


def sweep_workers(dataset: Dataset, worker_counts: Optional[Sequence[int]] = None, *,
                  batch_size: int = 32, batches: Optional[int] = None,
                  warmup_batches: Optional[int] = None, repeats: Optional[int] = None,
                  label: Optional[str] = None, progress: bool = True, timeout_s: float = 120.0,
                  **loader_kwargs: Any) -> WorkerSweep:
    """Measure samples/s of ``DataLoader(dataset, num_workers=w, ...)`` for each ``w``.

    Each point is one :func:`~course_utils.bench.measure_loader` call (fresh workers for every
    repeat; warm-up untimed, by default ``max(2, prefetch_factor x w)`` batches: workers start
    one after the other, and an early one may have ``prefetch_factor`` batches ready before the
    clock starts; then about ``batches`` timed batches,
    default ``pick(full=48, quick=16)``). The count is rounded up to a multiple of ``w``: workers
    start together and deliver their batches in rounds, and a window that cuts a round biases
    a short measurement by up to one round. It is capped by the batches the epoch has left
    (so a point never reads past one epoch). ``worker_counts`` defaults to
    :func:`default_worker_counts` (0 .. 2 x usable CPUs, capped at 32); ``repeats`` defaults to
    ``pick(full=3, quick=2)``. ``loader_kwargs`` go to every DataLoader (``shuffle``,
    ``collate_fn``, ``prefetch_factor``, ...); options that need workers (``prefetch_factor``,
    ``persistent_workers``) are left out for ``w = 0``. torch's warning about more workers than
    CPUs is silenced (going past the cores is the point). Workers get ``timeout=timeout_s``
    seconds per batch, so a stuck worker raises instead of hanging. Returns a
    :class:`WorkerSweep`.
    """
    where = "sweep_workers"
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(f"{where}: dataset must be a map-style Dataset (with __getitem__ and "
                        f"__len__), got {type(dataset).__name__}.")
    counts = default_worker_counts() if worker_counts is None else list(worker_counts)
    if not counts:
        raise ValueError(f"{where}: worker_counts is empty; pass e.g. [0, 1, 2, 4] or None for "
                         f"the default.")
    counts = [check_int("worker_counts[i]", w, 0, where) for w in counts]
    if len(set(counts)) != len(counts):
        raise ValueError(f"{where}: worker_counts {counts} has repeats; list each count once.")
    counts.sort()
    batch_size = check_int("batch_size", batch_size, 1, where)
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    target = pick(full=48, quick=16) if batches is None else check_int("batches", batches, 1,
                                                                     where)
    if warmup_batches is not None:
        warmup_batches = check_int("warmup_batches", warmup_batches, 0, where)
    per_epoch = len(dataset) // batch_size + (1 if len(dataset) % batch_size else 0)
    if loader_kwargs.get("drop_last"):
        per_epoch = len(dataset) // batch_size
    if repeats is None:
        repeats = pick(full=3, quick=2)
    for bad in ("num_workers", "batch_size", "timeout", "dataset"):
        if bad in loader_kwargs:
            raise ValueError(f"{where}: pass {bad} through its own argument (or, for "
                             f"num_workers, worker_counts), not in the loader options.")
    name = label or type(dataset).__name__
    from tqdm.auto import tqdm

    measurements: list[Measurement] = []
    bar = tqdm(counts, desc=f"{name} sweep"[:40], unit="point", disable=not progress, leave=False)
    try:
        for w in bar:
            kwargs = dict(loader_kwargs)
            if w == 0:
                kwargs.pop("prefetch_factor", None)
                kwargs.pop("persistent_workers", None)
                kwargs.pop("multiprocessing_context", None)
            else:
                kwargs["timeout"] = timeout_s
            if warmup_batches is None:
                # everything the workers may have made before the clock starts: a worker that
                # started early has up to prefetch_factor batches ready
                warm = max(2, int(loader_kwargs.get("prefetch_factor") or 2) * w)
            else:
                warm = warmup_batches
            timed = _timed_batches(target, w, per_epoch, warm, where)
            with warnings.catch_warnings():
                # torch warns when num_workers exceeds the CPUs it sees: going past them is
                # the point of a sweep (to measure what oversubscription does)
                warnings.filterwarnings("ignore", message="This DataLoader will create")
                loader = DataLoader(dataset, batch_size=batch_size, num_workers=w, **kwargs)
                measurements.append(measure_loader(
                    loader, batches=timed, warmup_batches=warm, repeats=repeats,
                    label=f"{name}, {w} workers", progress=progress))
            del loader
    finally:
        bar.close()
    settings = {"batch_size": batch_size, "repeats": repeats, "batches": target}
    return WorkerSweep(label=name, workers=counts, measurements=measurements, settings=settings)


def plot_sweeps(sweeps: Sequence[WorkerSweep], *, metric: str = "speedup", ax: Any = None,
                tolerance: float = DEFAULT_TOLERANCE, title: Optional[str] = None) -> Any:
    """One line per :class:`WorkerSweep` against num_workers, knees marked, usable CPUs shaded.

    ``metric``: ``"speedup"`` (samples/s divided by the sweep's first point, so workloads of
    very different speeds share one axis), ``"samples_per_s"`` or ``"cpu_s_per_sample"``
    (shown in ms). A star marks each curve's knee (:func:`find_knee` with ``tolerance``); a
    dashed line marks the usable CPUs. Returns the Axes.
    """
    from .machine import usable_cpus

    if isinstance(sweeps, WorkerSweep):
        sweeps = [sweeps]
    sweeps = list(sweeps)
    if not sweeps or not all(isinstance(s, WorkerSweep) for s in sweeps):
        raise TypeError("sweeps must be a non-empty list of WorkerSweep (from sweep_workers).")
    labels = {"speedup": "speed-up vs the fewest workers measured (x)",
              "samples_per_s": "samples per second (higher is better)",
              "cpu_s_per_sample": "CPU ms per sample, all processes (lower is better)"}
    if metric not in labels:
        raise ValueError(f"metric={metric!r} is not known; use one of {', '.join(labels)}.")
    ax = _new_axes(ax, figsize=(7, 4.2))
    for s in sweeps:
        if metric == "speedup":
            ys = s.speedups()
        elif metric == "samples_per_s":
            ys = s.samples_per_s
        else:
            ys = [np.nan if c is None else c * 1e3 for c in s.cpu_s_per_sample]
        line, = ax.plot(s.workers, ys, marker="o", label=s.label)
        knee = s.knee(tolerance)
        y_knee = ys[s.workers.index(knee)]
        ax.plot([knee], [y_knee], marker="*", markersize=16, color=line.get_color(),
                markeredgecolor="black", linestyle="none")
    usable = usable_cpus()
    ax.axvline(usable, color="gray", linestyle="--", linewidth=1)
    ax.text(usable, 1.0, f" {usable} usable CPUs", color="gray", fontsize=8,
            transform=ax.get_xaxis_transform(), va="top")
    if metric == "speedup":
        ax.axhline(1.0, color="gray", linewidth=0.8, alpha=0.5)
    ax.set_xlabel("num_workers")
    ax.set_ylabel(labels[metric])
    ax.set_xticks(sorted({w for s in sweeps for w in s.workers}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title=f"star: knee ({tolerance:.0%} of best)", title_fontsize=8)
    headline = title or "Throughput vs num_workers"
    ax.set_title(figure_title(headline, sweeps[0].settings), fontsize=10, loc="left")
    return ax


# --------------------------------------------------------------------------------------------
# worker start-up, epochs, persistent workers
# --------------------------------------------------------------------------------------------

class _PidProbe(Dataset):
    """``n`` items; each is the pid of the process that fetched it (cheap: no real work)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return os.getpid()


def worker_startup_time(start_method: str, num_workers: int = 1, *, repeats: int = 3,
                        warmup: int = 0, timeout_s: float = 120.0) -> Measurement:
    """Seconds from ``iter(loader)`` until each of ``num_workers`` workers has answered once.

    The dataset is trivial (each item is the worker's pid), so the time is what starting the
    workers costs: creating the processes with ``start_method`` (``fork`` copies this process;
    ``spawn`` starts a fresh interpreter that imports torch and unpickles the dataset;
    ``forkserver`` forks a small server process, which must also import torch unless it was
    told to preload it) plus each worker's set-up. Shutting the workers down afterwards is not
    timed. Returns a Measurement: ``median_s`` is the start-up time, ``items_per_repeat`` the
    number of workers. ``warmup`` untimed starts come first (the first ``forkserver`` start
    also starts the server). Each answer is awaited at most ``timeout_s`` seconds.
    """
    where = "worker_startup_time"
    methods = multiprocessing.get_all_start_methods()
    if start_method not in methods:
        raise ValueError(f"{where}: start_method={start_method!r} is not available here; use "
                         f"one of {methods}.")
    num_workers = check_int("num_workers", num_workers, 1, where)
    repeats = check_int("repeats", repeats, 1, where)
    warmup = check_int("warmup", warmup, 0, where)
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    context = multiprocessing.get_context(start_method)
    times: list[float] = []
    for r in range(warmup + repeats):
        loader = DataLoader(_PidProbe(num_workers), batch_size=None, num_workers=num_workers,
                            multiprocessing_context=context, timeout=timeout_s)
        t0 = time.perf_counter()
        it = iter(loader)
        try:
            pids = {next(it) for _ in range(num_workers)}
            elapsed = time.perf_counter() - t0
        finally:
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            del it
        if len(pids) != num_workers:  # pragma: no cover - the DataLoader deals round-robin
            raise RuntimeError(f"{where}: expected answers from {num_workers} workers, got "
                               f"{len(pids)} distinct pids.")
        if r >= warmup:
            times.append(elapsed)
    return Measurement.from_times(
        f"{start_method}, {num_workers} worker{'s' if num_workers != 1 else ''}", times,
        num_workers, settings={"start_method": start_method, "num_workers": num_workers},
        warnings=[] if repeats >= 3 else ["start-up times are single events: few repeats"])


def time_epochs(loader: Iterable, epochs: int = 3, *, progress: bool = True) -> list[float]:
    """Wall seconds of each of ``epochs`` full passes over ``loader``, start-up included.

    Each epoch is ``for batch in loader: pass`` timed from before ``iter(loader)`` (which starts
    the workers, unless ``persistent_workers=True`` and they already run) to the end of the
    last batch. Compare the first epoch (everyone starts workers) with later ones.
    """
    if not hasattr(loader, "__iter__"):
        raise TypeError(f"time_epochs: loader must be iterable (a DataLoader), got "
                        f"{type(loader).__name__}.")
    epochs = check_int("epochs", epochs, 1, "time_epochs")
    from tqdm.auto import tqdm

    out: list[float] = []
    for _ in tqdm(range(epochs), desc="epochs", disable=not progress, leave=False):
        t0 = time.perf_counter()
        for _batch in loader:
            pass
        out.append(time.perf_counter() - t0)
    return out


def uss_bytes(pid: Optional[int] = None) -> Optional[int]:
    """USS of a process (this one by default), in bytes: memory private to it. None where the
    platform does not report it. On Linux this reads /proc/<pid>/smaps (a few ms)."""
    import psutil

    try:
        proc = psutil.Process(pid) if pid is not None else psutil.Process()
        return int(proc.memory_full_info().uss)
    except (psutil.Error, AttributeError, NotImplementedError, OSError):
        return None


def children_uss_bytes() -> Optional[int]:
    """Sum of the USS (bytes) of this process's live child processes, e.g. persistent workers
    (and helper processes such as a forkserver); 0 when there are none, None where USS is not
    reported."""
    import psutil

    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += int(child.memory_full_info().uss)
        except psutil.NoSuchProcess:  # exited meanwhile (zombies included)
            continue
        except (psutil.Error, AttributeError, NotImplementedError, OSError):
            return None
    return total


class EpochTaggedDataset(Dataset):
    """``n`` items, each the value of the attribute :attr:`epoch` *in the fetching process*.

    Set ``dataset.epoch = e`` in the main process before each epoch: fresh workers copy the
    dataset when they start and see the new value; persistent workers keep the copy they
    started with and do not.
    """

    def __init__(self, n: int = 8) -> None:
        self.n = check_int("n", n, 1, "EpochTaggedDataset")
        self.epoch = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        _index(i, self.n, "EpochTaggedDataset")
        return int(self.epoch)


class BurstyLatencyDataset(Dataset):
    """Mostly fast samples and a few slow ones: storage with cache misses.

    Every sample sleeps ``latency_s``; a fixed, seeded ``slow_fraction`` of the samples sleeps
    ``slow_s`` instead (same samples every epoch). Sleeping uses no CPU, so the effect is the
    same on any machine. Returns ``(uint8 tensor of item_shape, i % 10)``.
    :attr:`mean_latency_s` is the average sleep per sample.
    """

    def __init__(self, n: Optional[int] = None, latency_s: float = 0.001,
                 slow_fraction: float = 0.04, slow_s: float = 0.05, seed: int = 0,
                 item_shape: Sequence[int] = (3, 32, 32)) -> None:
        where = "BurstyLatencyDataset"
        self.n = check_int("n", pick(full=4000, quick=800) if n is None else n, 1, where)
        self.latency_s = check_seconds("latency_s", latency_s, where)
        self.slow_s = check_seconds("slow_s", slow_s, where)
        if isinstance(slow_fraction, bool) or not isinstance(slow_fraction, numbers.Real) \
                or not 0.0 <= float(slow_fraction) <= 1.0:
            raise ValueError(f"{where}: slow_fraction={slow_fraction!r} must be in [0, 1] "
                             f"(share of slow samples).")
        self.slow_fraction = float(slow_fraction)
        self.item_shape = tuple(int(d) for d in item_shape)
        rng = np.random.default_rng(check_int("seed", seed, 0, where))
        self.slow = rng.random(self.n) < self.slow_fraction

    @property
    def mean_latency_s(self) -> float:
        """Average sleep per sample over the dataset, in seconds."""
        k = int(self.slow.sum())
        return (k * self.slow_s + (self.n - k) * self.latency_s) / self.n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        i = _index(i, self.n, "BurstyLatencyDataset")
        time.sleep(self.slow_s if self.slow[i] else self.latency_s)
        return torch.full(self.item_shape, i % 256, dtype=torch.uint8), i % 10

    def describe(self) -> str:
        return (f"BurstyLatencyDataset: {self.n} samples, {self.latency_s * 1e3:g} ms each, "
                f"{int(self.slow.sum())} slow ones ({self.slow_fraction:.0%}) of "
                f"{self.slow_s * 1e3:g} ms; mean {self.mean_latency_s * 1e3:.2f} ms per sample")


class SimulatedStep:
    """A training step that takes ``step_s`` seconds without using the CPU (``time.sleep``),
    like a GPU step the main process waits for. Use as
    ``measure_data_wait(loader, step_fn=SimulatedStep(0.02))``."""

    def __init__(self, step_s: float) -> None:
        self.step_s = check_seconds("step_s", step_s, "SimulatedStep")

    def __call__(self, batch: Any) -> None:
        time.sleep(self.step_s)

    def __repr__(self) -> str:
        return f"SimulatedStep(step_s={self.step_s})"


# --------------------------------------------------------------------------------------------
# copy-on-read: records as Python objects vs NumPy arrays
# --------------------------------------------------------------------------------------------

#: Class names used by :func:`make_records` (label k is RECORD_CLASSES[k]).
RECORD_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                  "ship", "truck")
_RECORD_BYTES_ESTIMATE = 600  # generous bytes per record as Python objects (for the RAM guard)


def make_records(n: Optional[int] = None, seed: int = 0) -> list[dict]:
    """A typical annotation list: ``n`` dicts ``{"path": str, "label": int, "box": [4 floats]}``.

    ``path`` is ``"train/<class>/<7 digits>.jpg"`` (variable length), ``label`` in 0..9,
    ``box`` four floats in [0, 1) (x0, y0, x1, y1). About 450 bytes of Python objects per
    record. ``n`` defaults to ``pick(full=200_000, quick=60_000)``; refused (ValueError) when
    the records would take more than a quarter of the available RAM.
    """
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


def _record_item(path: str, label: int, box: Any) -> tuple[torch.Tensor, int, str]:
    return torch.tensor(box, dtype=torch.float32), int(label), path


def _object_bytes(records: Sequence[dict]) -> int:
    """Bytes of the Python objects that make up ``records`` (list, dicts, strs, lists, floats;
    keys and small ints are shared and not counted)."""
    import sys

    total = sys.getsizeof(records)
    for r in records:
        total += sys.getsizeof(r) + sys.getsizeof(r["path"]) + sys.getsizeof(r["box"])
        total += sum(sys.getsizeof(x) for x in r["box"])
    return total


class RecordListDataset(Dataset):
    """The copy-on-read trap: annotation records kept as a Python list of dicts.

    ``ds[i]`` returns ``(box, label, path)``: ``box`` a float32 tensor of shape (4,), ``label``
    an int, ``path`` a str. Reading record ``i`` in a forked worker increments the reference
    counts of the dict, its str and its list of floats: writes to the pages holding them, which
    the OS then copies into the worker (copy-on-write triggered by a read). Over a shuffled
    epoch every worker ends up with a private copy of most of the list.

    Build from ``records`` (as made by :func:`make_records`) or let it make ``n`` of them.
    """

    def __init__(self, records: Optional[Sequence[dict]] = None, *, n: Optional[int] = None,
                 seed: int = 0) -> None:
        if records is not None and n is not None:
            raise ValueError("RecordListDataset: pass records or n, not both.")
        self.records: list[dict] = make_records(n, seed) if records is None else records
        if not isinstance(self.records, list):
            raise TypeError(f"RecordListDataset: records must be a list of dicts (from "
                            f"make_records), got {type(self.records).__name__}.")

    @property
    def object_nbytes(self) -> int:
        """Bytes of Python objects the records occupy in this process (see make_records)."""
        return _object_bytes(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, str]:
        r = self.records[i]
        return _record_item(r["path"], r["label"], r["box"])

    def describe(self) -> str:
        return (f"RecordListDataset: {len(self):,} records as a Python list of dicts, "
                f"{self.object_nbytes / _MB:,.1f} MB of Python objects")


class RecordArrayDataset(Dataset):
    """The fix: the same records packed into a few NumPy arrays (no Python object per record).

    ``labels`` int64 (n,), ``boxes`` float32 (n, 4), and all paths UTF-8 encoded into one
    uint8 buffer ``path_bytes`` with ``path_offsets`` int64 (n + 1,): path i is
    ``path_bytes[path_offsets[i]:path_offsets[i+1]]``. A worker reading these touches no
    reference counts in the shared arrays, so nothing is copied. ``ds[i]`` returns exactly what
    :class:`RecordListDataset` returns for the same records.
    """

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
        """Bytes of the arrays."""
        return int(self.labels.nbytes + self.boxes.nbytes + self.path_offsets.nbytes
                   + self.path_bytes.nbytes)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, str]:
        i = _index(i, len(self.labels), "RecordArrayDataset")
        start, end = self.path_offsets[i], self.path_offsets[i + 1]
        path = self.path_bytes[start:end].tobytes().decode("utf-8")
        return torch.from_numpy(self.boxes[i].copy()), int(self.labels[i]), path

    def describe(self) -> str:
        return (f"RecordArrayDataset: {len(self):,} records in 4 NumPy arrays, "
                f"{self.nbytes / _MB:,.1f} MB")


# --------------------------------------------------------------------------------------------
# memory per worker over an epoch
# --------------------------------------------------------------------------------------------

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
        from torch.utils.data import get_worker_info

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
    def end_uss_bytes(self) -> int:
        return self.timeline[-1][1] if self.timeline else self.start_uss_bytes

    @property
    def growth_bytes(self) -> int:
        """USS at the end of the epoch minus USS at the start, in bytes."""
        return self.end_uss_bytes - self.start_uss_bytes


@dataclass
class WorkerMemory:
    """Per-worker private memory (USS) over one epoch of a dataset (see :func:`worker_memory`)."""

    label: str
    start_method: str
    num_workers: int
    samples: int
    workers: list[WorkerUss]
    gc_frozen: bool = False

    @property
    def growth_bytes(self) -> list[int]:
        """USS growth of each worker over the epoch, bytes."""
        return [w.growth_bytes for w in self.workers]

    @property
    def max_growth_bytes(self) -> int:
        return max(self.growth_bytes)

    @property
    def mean_growth_bytes(self) -> float:
        return float(np.mean(self.growth_bytes))

    @property
    def total_growth_bytes(self) -> int:
        """Sum over workers: extra RAM the epoch cost the whole machine."""
        return int(sum(self.growth_bytes))

    def to_dict(self) -> dict:
        return {"label": self.label, "start_method": self.start_method,
                "num_workers": self.num_workers, "samples": self.samples,
                "gc_frozen": self.gc_frozen,
                "workers": [{"worker_id": w.worker_id, "pid": w.pid,
                             "start_uss_bytes": w.start_uss_bytes, "timeline": w.timeline}
                            for w in self.workers]}

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
    """Run one epoch of ``dataset`` in real workers and measure each worker's private memory.

    Every worker fetches its share of the samples exactly as a DataLoader worker does
    (``dataset[i]`` per index, order shuffled with ``seed`` when ``shuffle``) and reads its own
    USS (psutil, bytes private to the process) before its first fetch and about ``readings``
    times during the epoch, always at its end. The samples themselves are dropped, so the
    measurement is only what *reading* the dataset costs. Under ``fork`` a worker starts
    sharing every page with the parent: growth is copy-on-read. Under ``spawn``/``forkserver``
    each worker unpickles its own copy of the dataset first, so the cost shows in the start
    USS instead. ``freeze_gc=True`` calls ``gc.freeze()`` in this process before the workers
    start (and ``gc.unfreeze()`` after), to test that advice. Each request is awaited at most
    ``timeout_s`` seconds. Returns a :class:`WorkerMemory`.
    """
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
    context, method = _context(multiprocessing_context, where)
    requests = _ProbeRequests(n, batch_size, bool(shuffle), int(seed), num_workers, readings)
    loader = DataLoader(_MemoryProbe(dataset), batch_size=None, sampler=requests,
                        num_workers=num_workers, multiprocessing_context=context,
                        timeout=timeout_s)
    frozen = False
    if freeze_gc:
        gc.collect()
        gc.freeze()
        frozen = True
    reports: list[dict] = []
    try:
        it = iter(loader)
        try:
            for report in it:
                reports.append(report)
        except RuntimeError as exc:
            if "timed out" in str(exc):
                raise RuntimeError(f"{where}: a worker did not answer within timeout_s="
                                   f"{timeout_s} s; the dataset's __getitem__ may be very slow "
                                   f"or stuck. Use a smaller dataset or a larger timeout_s."
                                   ) from exc
            raise
        finally:
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            del it
    finally:
        if frozen:
            gc.unfreeze()
    by_pid: dict[int, WorkerUss] = {}
    for r in reports:
        w = by_pid.get(r["pid"])
        if w is None:
            if "start_uss" not in r or r["start_uss"] is None:  # pragma: no cover
                raise RuntimeError(f"{where}: worker {r['pid']} did not report its start USS.")
            w = by_pid[r["pid"]] = WorkerUss(worker_id=r["worker_id"], pid=r["pid"],
                                             start_uss_bytes=int(r["start_uss"]), timeline=[])
        if r.get("uss") is not None:
            w.timeline.append((int(r["fetched"]), int(r["uss"])))
    workers = sorted(by_pid.values(), key=lambda w: (w.worker_id is None, w.worker_id or 0))
    return WorkerMemory(label=label or type(dataset).__name__, start_method=method,
                        num_workers=num_workers, samples=n, workers=workers, gc_frozen=frozen)


def plot_worker_memory(results: Sequence[WorkerMemory], *, ax: Any = None,
                       title: Optional[str] = None) -> Any:
    """USS growth (MB) of every worker against the samples it has fetched, one colour per
    :class:`WorkerMemory`, one line per worker. Returns the Axes."""
    if isinstance(results, WorkerMemory):
        results = [results]
    results = list(results)
    if not results or not all(isinstance(r, WorkerMemory) for r in results):
        raise TypeError("results must be a non-empty list of WorkerMemory (from worker_memory).")
    ax = _new_axes(ax, figsize=(7, 4.2))
    colors = [f"C{i}" for i in range(10)]
    for k, res in enumerate(results):
        for j, w in enumerate(res.workers):
            xs = [0] + [f for f, _ in w.timeline]
            ys = [0.0] + [(u - w.start_uss_bytes) / _MB for _, u in w.timeline]
            # earlier series drawn wider, so identical curves stay visible under later ones
            ax.plot(xs, ys, marker="o", markersize=3, color=colors[k % 10],
                    linewidth=max(1.0, 1.5 + 2.0 * (len(results) - 1 - k)),
                    linestyle=["-", "--", ":", "-."][j % 4],
                    label=res.label if j == 0 else None)
    ax.set_xlabel("samples fetched by the worker")
    ax.set_ylabel("worker's private memory growth, MB (USS)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="one line per worker", title_fontsize=8)
    first = results[0]
    ax.set_title(figure_title(title or "Private memory of each worker over one epoch",
                              {"start_method": first.start_method,
                               "num_workers": first.num_workers}), fontsize=10, loc="left")
    return ax


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


def keep_batch(batch: Any) -> Any:
    """A ``collate_fn`` that returns what the dataset's ``__getitems__`` made, unchanged.

    Use it with :class:`BatchedArrayDataset`, whose ``__getitems__`` already returns a batch."""
    return batch


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
