"""How DataLoader throughput (samples/s) scales with ``num_workers``: the sweep and its knee.

Lesson 03 writes the sweep loop itself first; :func:`sweep_workers` is its packaged version,
used by the tuner (lesson 06) and the graders.
"""
from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np
from torch.utils.data import DataLoader, Dataset

from .checks import check_fraction, check_int, check_seconds
from .config import pick
from .machine import usable_cpus
from .measurement import Measurement
from .plots import figure_title
from .timing import measure_loader


__all__ = ["DEFAULT_TOLERANCE", "MAX_DEFAULT_WORKERS", "default_worker_counts", "find_knee",
           "CurveShape", "describe_curve", "WorkerSweep", "sweep_workers", "plot_sweeps"]


#: Default tolerance of :func:`find_knee`: the knee reaches 90 % of the best rate.
DEFAULT_TOLERANCE = 0.9
#: :func:`default_worker_counts` never goes beyond this many workers by default.
MAX_DEFAULT_WORKERS = 32


# ---- worker counts and the knee ------------------------------------------------------------

def default_worker_counts(max_workers: Optional[int] = None, *,
                          cap: int = MAX_DEFAULT_WORKERS) -> list[int]:
    """Worker counts worth measuring: 0 up to ``max_workers`` (default 2 x usable CPUs, past
    the cores to see oversubscription, capped at ``cap`` so a big server does not sweep for an
    hour). Above 8, a geometric grid (8, 12, 16, 24, ...) plus the usable CPUs and the top."""
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
    """The smallest worker count whose rate (samples/s) is at least ``tolerance`` x the best.

    More workers than the knee buy at most ``1 - tolerance`` more speed and cost CPU, memory
    and start-up time; a relative threshold is robust to a noisy plateau and any grid of counts.
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

    ``kind``: ``"flat"`` (the fewest workers already reach the tolerance: light work),
    ``"rising"`` (only the most workers do: waiting-bound work, measure further), ``"peaked"``
    (falls after the best by more than ``1 - tolerance``: oversubscription) or ``"plateau"``
    (rises, then stays within tolerance: CPU-bound work). Checked in that order.
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
    """Classify a samples/s-vs-workers curve and collect its key numbers (a :class:`CurveShape`)."""
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


# ---- sweeping num_workers ------------------------------------------------------------------

@dataclass
class WorkerSweep(Sequence):
    """Measurements of one dataset at several ``num_workers`` (``workers[i]`` is that of
    ``measurements[i]``); a sequence of the Measurements, so ``compare(sweep)`` works."""

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

    Each point is one :func:`~course_utils.timing.measure_loader` call: an untimed warm-up (by
    default ``max(2, prefetch_factor x w)`` batches: an early worker may have that many ready
    before the clock starts), then about ``batches`` timed batches (default 48, quick 16) in
    whole rounds of ``w``, within one epoch. ``loader_kwargs`` go to every DataLoader (those that
    need workers are dropped for ``w = 0``); ``timeout_s``: seconds a worker may take per batch,
    so a stuck worker raises instead of hanging.
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
    from tqdm.auto import tqdm  # lazy: kept out of `import course_utils` (workers)

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
    """One line per :class:`WorkerSweep` against num_workers, knees starred, usable CPUs dashed.

    ``metric``: ``"speedup"`` (over the sweep's first point, so workloads of very different
    speeds share one axis), ``"samples_per_s"`` or ``"cpu_s_per_sample"`` (in ms). Returns the Axes.
    """
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
    if ax is None:
        import matplotlib.pyplot as plt  # lazy: kept out of `import course_utils` (workers)

        _, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
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
