"""How DataLoader throughput (samples/s) scales with ``num_workers``: the sweep and its knee.

Lesson 03 writes the sweep loop itself first; :func:`sweep_workers` is its packaged version (each
point one :func:`~course_utils.timing.measure_loader` window), used by the tuner and the graders.
"""
from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np
from torch.utils.data import DataLoader, Dataset

from .checks import check_fraction, check_int, check_seconds
from .config import pick
from .machine import usable_cpus
from .measurement import Measurement, compare
from .plots import plot_curve
from .timing import default_warmup, measure_loader

__all__ = ["DEFAULT_TOLERANCE", "default_worker_counts", "find_knee", "CurveShape",
           "describe_curve", "WorkerSweep", "sweep_workers", "plot_sweeps"]

#: The knee is the fewest workers reaching this fraction of the best samples/s.
DEFAULT_TOLERANCE = 0.9


def default_worker_counts(max_workers: Optional[int] = None, *, cap: int = 32) -> list[int]:
    """Worker counts worth measuring: 0 to ``max_workers`` (default 2 x usable CPUs, to see
    oversubscription, at most ``cap``); above 8 a grid (8, 12, 16, 24, ...) plus the usable CPUs."""
    usable = usable_cpus()
    top = (min(2 * usable, check_int("cap", cap, 1, "default_worker_counts")) if max_workers is None
           else check_int("max_workers", max_workers, 0, "default_worker_counts"))
    if top <= 8:
        return list(range(top + 1))
    grid = {0, 1, 2, 3, 4, 6, 8, top} | ({usable} if usable <= top else set())
    step = 8
    while step <= top:
        grid.update({step, step + step // 2})
        step *= 2
    return sorted(c for c in grid if c <= top)


def _curve(workers: Any, rates: Any, where: str) -> tuple[list[int], list[float]]:
    """The curve sorted by worker count, checked: one finite rate >= 0 (samples/s) per distinct
    worker count >= 0, not every rate 0."""
    if not (hasattr(workers, "__len__") and hasattr(rates, "__len__")):
        raise TypeError(f"{where}: workers and rates must be sequences, got "
                        f"{type(workers).__name__} and {type(rates).__name__}.")
    ws, rs = list(workers), list(rates)
    ok = (ws and len(ws) == len(rs) and len(set(ws)) == len(ws)
          and all(isinstance(w, numbers.Integral) and not isinstance(w, bool) and w >= 0 for w in ws)
          and all(isinstance(r, numbers.Real) and 0 <= r < math.inf for r in rs) and max(rs) > 0)
    if not ok:
        raise ValueError(f"{where}: pass distinct worker counts (whole numbers >= 0) and one finite "
                         f"rate >= 0 (samples/s) each, not all 0; got workers={ws}, rates={rs}.")
    order = np.argsort(ws, kind="stable")
    return [int(ws[i]) for i in order], [float(rs[i]) for i in order]


def find_knee(workers: Sequence[int], rates: Sequence[float],
              tolerance: float = DEFAULT_TOLERANCE) -> int:
    """The fewest workers whose rate (samples/s) is at least ``tolerance`` x the best: more buy
    at most ``1 - tolerance`` more speed and cost CPU, memory and start-up time."""
    tolerance = check_fraction("tolerance", tolerance, "find_knee")
    ws, rs = _curve(workers, rates, "find_knee")
    return next(w for w, r in zip(ws, rs) if r >= tolerance * max(rs))


@dataclass
class CurveShape:
    """A samples/s-vs-workers curve in numbers. ``kind``, checked in this order: ``"flat"`` (the
    fewest workers reach the tolerance), ``"rising"`` (only the most do), ``"peaked"`` (falls
    after the best by more than ``1 - tolerance``), else ``"plateau"``."""

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
    """Classify a samples/s-vs-workers curve and collect its key numbers."""
    tolerance = check_fraction("tolerance", tolerance, "describe_curve")
    ws, rs = _curve(workers, rates, "describe_curve")
    knee = next(w for w, r in zip(ws, rs) if r >= tolerance * max(rs))
    i_best = int(np.argmax(rs))
    if len(ws) > 1 and knee == ws[0]:
        kind = "flat"
    elif len(ws) > 1 and knee == ws[-1]:
        kind = "rising"
    else:
        kind = "peaked" if rs[-1] < tolerance * rs[i_best] else "plateau"
    return CurveShape(kind=kind, knee=knee, knee_rate=rs[ws.index(knee)], best_workers=ws[i_best],
                      best_rate=rs[i_best], first_workers=ws[0], first_rate=rs[0],
                      last_workers=ws[-1], last_rate=rs[-1], tolerance=tolerance)


@dataclass
class WorkerSweep(Sequence):
    """Measurements of one dataset at several ``num_workers`` (``workers[i]`` is that of
    ``measurements[i]``); a sequence of them, so ``compare(sweep)`` and the plots take it."""

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

    def at(self, workers: int) -> Measurement:
        """The Measurement made with ``workers`` workers."""
        if workers not in self.workers:
            raise ValueError(f"{workers} workers were not measured in {self.label!r}; measured: "
                             f"{self.workers}.")
        return self.measurements[self.workers.index(workers)]

    def knee(self, tolerance: float = DEFAULT_TOLERANCE) -> int:
        return find_knee(self.workers, self.samples_per_s, tolerance)

    def shape(self, tolerance: float = DEFAULT_TOLERANCE) -> CurveShape:
        return describe_curve(self.workers, self.samples_per_s, tolerance)

    def speedups(self) -> list[float]:
        """samples/s at each count / samples/s at the fewest workers measured."""
        base = self.samples_per_s[0]
        return [r / base if base > 0 else math.nan for r in self.samples_per_s]

    def __str__(self) -> str:
        return f"{self.label}: samples/s vs num_workers\n{compare(self.measurements)}\n{self.shape()}"


def _timed_batches(target: int, workers: int, per_epoch: int, warm: int) -> int:
    """``target`` rounded up to whole rounds of ``workers`` (workers deliver in rounds), then
    down to what the epoch has left after ``warm`` warm-up batches."""
    k = max(1, workers)
    n = math.ceil(target / k) * k
    if n > per_epoch - warm:
        n = (per_epoch - warm) // k * k
    if n < 1:
        raise ValueError(f"sweep_workers: with {workers} workers the epoch has {per_epoch} batches; "
                         f"a warm-up of {warm} leaves not one round of {k}. Use a bigger dataset, a "
                         f"smaller batch_size, fewer workers or a smaller warmup_batches.")
    return n


def sweep_workers(dataset: Dataset, worker_counts: Optional[Sequence[int]] = None, *,
                  batch_size: int = 32, batches: Optional[int] = None,
                  warmup_batches: Optional[int] = None, repeats: Optional[int] = None,
                  label: Optional[str] = None, progress: bool = True, timeout_s: float = 120.0,
                  **loader_kwargs: Any) -> WorkerSweep:
    """samples/s of ``DataLoader(dataset, num_workers=w, ...)`` for each ``w``, one
    :func:`~course_utils.timing.measure_loader` window each: a warm-up of ``warmup_batches``
    (default :func:`~course_utils.timing.default_warmup`), then about ``batches`` (default 48,
    quick 16) in whole rounds of ``w``, within one epoch. ``loader_kwargs`` go to every loader
    (those that need workers are dropped at ``w = 0``); ``timeout_s``: seconds a worker may take
    per batch."""
    where = "sweep_workers"
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(f"{where}: dataset must be a map-style Dataset (with __getitem__ and "
                        f"__len__), got {type(dataset).__name__}.")
    counts = sorted(check_int("worker_counts[i]", w, 0, where)
                    for w in (default_worker_counts() if worker_counts is None else worker_counts))
    if not counts or len(set(counts)) != len(counts):
        raise ValueError(f"{where}: worker_counts must list each count once, e.g. [0, 1, 2, 4]; "
                         f"got {counts}.")
    batch_size = check_int("batch_size", batch_size, 1, where)
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    target = pick(full=48, quick=16) if batches is None else check_int("batches", batches, 1, where)
    check_int("warmup_batches", warmup_batches, 0, where, allow_none=True)
    repeats = pick(full=3, quick=2) if repeats is None else repeats
    for bad in ("num_workers", "batch_size", "timeout", "dataset"):
        if bad in loader_kwargs:
            raise ValueError(f"{where}: pass {bad} through its own argument (num_workers through "
                             f"worker_counts), not in the loader options.")
    drop = loader_kwargs.get("drop_last")
    per_epoch = len(dataset) // batch_size if drop else math.ceil(len(dataset) / batch_size)
    name = label or type(dataset).__name__
    from tqdm.auto import tqdm  # lazy: kept out of `import course_utils` (workers)

    measurements: list[Measurement] = []
    for w in tqdm(counts, desc=f"{name} sweep"[:40], unit="point", disable=not progress, leave=False):
        kwargs = dict(loader_kwargs, timeout=timeout_s) if w else {
            k: v for k, v in loader_kwargs.items()
            if k not in ("prefetch_factor", "persistent_workers", "multiprocessing_context")}
        with warnings.catch_warnings():
            # torch warns when num_workers exceeds the CPUs it sees: a sweep goes past them on purpose
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            loader = DataLoader(dataset, batch_size=batch_size, num_workers=w, **kwargs)
            warm = default_warmup(loader) if warmup_batches is None else warmup_batches
            measurements.append(measure_loader(
                loader, batches=_timed_batches(target, w, per_epoch, warm), warmup_batches=warm,
                repeats=repeats, label=f"{name}, {w} workers", progress=progress))
    return WorkerSweep(label=name, workers=counts, measurements=measurements,
                       settings={"batch_size": batch_size, "repeats": repeats, "batches": target})


_SWEEP_METRICS = {"speedup": "speed-up vs the fewest workers measured (x)",
                  "samples_per_s": "samples per second (higher is better)",
                  "cpu_s_per_sample": "CPU ms per sample, all processes (lower is better)"}


def plot_sweeps(sweeps: Sequence[WorkerSweep], *, metric: str = "speedup", ax: Any = None,
                tolerance: float = DEFAULT_TOLERANCE, title: Optional[str] = None) -> Any:
    """:func:`~course_utils.plots.plot_curve` of sweeps over the same worker counts, knees
    starred, usable CPUs dashed. ``metric``: ``"speedup"`` (over each sweep's first point, so
    workloads of very different speeds share an axis), ``"samples_per_s"`` or
    ``"cpu_s_per_sample"`` (ms)."""
    sweeps = [sweeps] if isinstance(sweeps, WorkerSweep) else list(sweeps)
    if not sweeps or not all(isinstance(s, WorkerSweep) and s.workers == sweeps[0].workers
                             for s in sweeps):
        raise TypeError("sweeps must be a non-empty list of WorkerSweep (from sweep_workers), all "
                        "over the same worker counts.")
    if metric not in _SWEEP_METRICS:
        raise ValueError(f"metric={metric!r} is not known; use one of {', '.join(_SWEEP_METRICS)}.")
    scale = 1e3 if metric == "cpu_s_per_sample" else 1.0
    ys = {s.label: s.speedups() if metric == "speedup" else
          [None if m.metric(metric) is None else m.metric(metric) * scale for m in s] for s in sweeps}
    workers = sweeps[0].workers
    ax = plot_curve(workers, ys, xlabel="num_workers", ylabel=_SWEEP_METRICS[metric], ax=ax,
                    title=title or "Throughput vs num_workers", settings=sweeps[0].settings)
    for line, s in zip(ax.get_lines()[-len(ys):], sweeps):
        knee = s.knee(tolerance)
        ax.plot([knee], [ys[s.label][workers.index(knee)]], marker="*", markersize=16,
                color=line.get_color(), markeredgecolor="black", linestyle="none")
    ax.axvline(usable_cpus(), color="gray", linestyle="--", linewidth=1,
               label=f"{usable_cpus()} usable CPUs")
    ax.set_xticks(workers)
    ax.legend(fontsize=8, title=f"star: knee ({tolerance:.0%} of best)", title_fontsize=8)
    return ax
