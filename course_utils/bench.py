"""Measure a callable or a DataLoader honestly, and compare the results.

What is measured, and in what unit:

* **wall time per repeat** (seconds, ``time.perf_counter``): each repeat times one call of a
  function (:func:`measure`) or one pass over ``batches`` batches of a loader
  (:func:`measure_loader`). Warm-up calls/batches are run first and are never timed, so worker
  start-up, lazy imports and caches filling up do not pollute the result. We report the
  **median** and the **interquartile range (IQR)** of the repeats, like ``torch.utils.benchmark``.
* **samples per second** = samples in one repeat / median time per repeat.
* **CPU seconds per sample**: user + system CPU time of the *whole process tree* (this process and
  all its children, e.g. DataLoader workers), summed over the timed windows only, divided by the
  number of samples timed. Read with :mod:`psutil`. ``1.0 ms`` CPU per sample means the pipeline
  needs one core for 1000 samples/s, wherever that core's work happens.
* **involuntary context switches** of the process tree over the timed windows (how often the OS
  took a core away from a thread that still wanted it: a sign of oversubscription). ``None``
  where the platform does not report them.
* **peak memory** of the process tree during the timed windows, sampled by a background thread:
  the largest sum over the tree of USS (memory private to each process: what copy-on-read
  makes grow in every worker; pages a forked worker still shares with its parent are in
  nobody's USS) and of PSS (each shared page split between the processes sharing it: the
  tree's total footprint). ``None`` where the platform does not report them (PSS: Linux only).

The background sampler thread samples every 0.1 s, or less often when sampling itself is slow
(reading USS/PSS of a big process takes milliseconds), so that it stays below a few percent of
one core; its own CPU time is measured and subtracted from the CPU time reported.

A caveat that no timer avoids: a loader with workers keeps working ahead (up to
``prefetch_factor * num_workers`` batches in flight), so batches made before the clock starts
look free. The default warm-up of ``max(2, num_workers * prefetch_factor)`` batches and a window
of many batches keep that error small; a window of a handful of batches cannot.

Nothing happens at import time.
"""
from __future__ import annotations

import glob
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from .checks import check_int
from .config import pick
from .device import move_to_device, synchronizer
from .machine import machine_summary
from .start_methods import start_method

__all__ = [
    "NOISY_IQR_FRACTION",
    "Measurement",
    "measure",
    "measure_loader",
    "batch_size_of",
    "Comparison",
    "compare",
    "DataWait",
    "measure_data_wait",
]

#: A measurement is called noisy when its IQR is more than this fraction of its median.
NOISY_IQR_FRACTION = 0.10

#: Metrics that :meth:`Comparison.ratio` and :meth:`Comparison.plot` understand.
METRICS = (
    "samples_per_s",
    "median_s",
    "cpu_s_per_sample",
    "involuntary_ctx_switches",
    "peak_uss_bytes",
    "peak_pss_bytes",
)

# The clock. Tests replace this module attribute with a fake clock; nothing else should.
_now: Callable[[], float] = time.perf_counter


# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------

def _fmt_time(seconds: float) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if abs(seconds) >= 1.0:
        return f"{seconds:.3g} s" if abs(seconds) < 100 else f"{seconds:.0f} s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def _fmt_rate(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _fmt_mb(n_bytes: int | None) -> str:
    return "n/a" if n_bytes is None else f"{n_bytes / 1e6:,.1f}"


def _jsonable(value: Any) -> Any:
    """A JSON-friendly copy of ``value`` (str() for anything exotic, e.g. torch.device)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def _machine() -> str:
    return machine_summary()


# --------------------------------------------------------------------------------------
# process-tree monitoring (CPU time, context switches, memory)
# --------------------------------------------------------------------------------------

_Key = tuple  # (pid, create_time)


def thread_involuntary_switches(pid: int) -> dict[tuple[int, int], int] | None:
    """``{(pid, thread id): involuntary context switches}`` for every thread of ``pid``.

    Linux only (reads /proc/PID/task/*/status); None elsewhere. Per thread because
    ``psutil.Process.num_ctx_switches()`` on Linux reads the main thread only, so the threads
    of a pool being preempted would go unseen.
    """
    out: dict[tuple[int, int], int] = {}
    paths = glob.glob(f"/proc/{pid}/task/*/status")
    if not paths:
        return None
    for path in paths:
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("nonvoluntary_ctxt_switches"):
                        out[(pid, int(path.split("/")[4]))] = int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue  # the thread ended while we read
    return out


def _involuntary_switches(proc: Any) -> int:
    """Involuntary context switches of all threads of a psutil Process (main thread elsewhere)."""
    per_thread = thread_involuntary_switches(proc.pid)
    if per_thread is not None:
        return sum(per_thread.values())
    return int(proc.num_ctx_switches().involuntary)


class _TreeMonitor:
    """CPU time, involuntary context switches and memory of this process and its children.

    CPU time of the tree at an instant is the sum, over the live processes of the tree, of
    their own user + system time plus that of their children already reaped (``children_user``,
    ``children_system``). A worker that exits and is reaped during a window moves its time into
    its parent's reaped total, so nothing is lost or counted twice; a process born during the
    window counts from zero.

    ``start()`` lists the tree (cheap snapshots later reuse that list, so the window can start
    right after warm-up) and starts a daemon thread sampling memory (USS/PSS sums over the
    tree) every ~0.1 s; ``stop()`` stops it and takes a last sample. The sampler's own CPU time
    is measured (``time.thread_time``) and subtracted in :meth:`window`.
    """

    def __init__(self, interval_s: float = 0.1) -> None:
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process()
        self._interval_s = interval_s
        self._lock = threading.RLock()
        self._procs: list = [self._proc]
        self._last_ctx: dict[_Key, int] = {}
        self._sampler_cpu_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cost_s = 0.0
        self.ctx_available = True
        self.peak_uss: int | None = None
        self.peak_pss: int | None = None
        self.uss_available = True
        self.pss_available = True

    # -- process tree --------------------------------------------------------------
    def _tree(self) -> list:
        procs = [self._proc]
        try:
            procs += self._proc.children(recursive=True)
        except (self._psutil.Error, OSError):
            pass
        return procs

    def _read_cpu(self, procs: list) -> dict[_Key, tuple[float, int | None]]:
        ps = self._psutil
        snap: dict[_Key, tuple[float, int | None]] = {}
        for p in procs:
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    t = p.cpu_times()
                    cpu = float(t.user + t.system + getattr(t, "children_user", 0.0)
                                + getattr(t, "children_system", 0.0))
                    ctx: int | None = None
                    if self.ctx_available:
                        try:
                            ctx = _involuntary_switches(p)
                            self._last_ctx[key] = ctx
                        except (AttributeError, NotImplementedError, ps.AccessDenied):
                            self.ctx_available = False
            except (ps.NoSuchProcess, ps.AccessDenied, OSError):
                continue
            snap[key] = (cpu, ctx)
        return snap

    def snapshot(self, fresh: bool = False) -> dict:
        """CPU readings of the tree now: of the processes listed at :meth:`start` (fast), or
        of a fresh listing (``fresh=True``, a few ms). Never overlaps a memory sample."""
        procs = self._tree() if fresh else self._procs
        with self._lock:
            snap: dict = self._read_cpu(procs)
            snap["sampler_cpu_s"] = self._sampler_cpu_s
        return snap

    def window(self, start: dict, end: dict) -> tuple[float, int | None]:
        """CPU seconds and involuntary context switches of the tree between two snapshots,
        without the sampler thread's own CPU time."""
        start, end = dict(start), dict(end)
        sampler = end.pop("sampler_cpu_s") - start.pop("sampler_cpu_s")
        cpu = sum(c for c, _ in end.values()) - sum(c for c, _ in start.values())
        ctx = 0
        for key in set(start) | set(end):
            # a process that vanished: its last seen count; a new one: counted from zero
            x1 = end[key][1] if key in end else self._last_ctx.get(key)
            x0 = start[key][1] if key in start else 0
            if x1 is not None and x0 is not None:
                ctx += max(0, x1 - x0)
        return max(0.0, cpu - sampler), (ctx if self.ctx_available else None)

    # -- memory sampler --------------------------------------------------------------
    def _sample_memory(self, procs: list) -> None:
        ps = self._psutil
        uss = pss = 0
        for p in procs:
            try:
                info = p.memory_full_info()
            except (ps.NoSuchProcess, ps.ZombieProcess):
                continue
            except (ps.AccessDenied, NotImplementedError, AttributeError, OSError):
                self.uss_available = self.pss_available = False
                return
            u = getattr(info, "uss", None)
            s = getattr(info, "pss", None)
            if u is None:
                self.uss_available = False
            else:
                uss += int(u)
            if s is None:
                self.pss_available = False
            else:
                pss += int(s)
        if self.uss_available:
            self.peak_uss = uss if self.peak_uss is None else max(self.peak_uss, uss)
        if self.pss_available:
            self.peak_pss = pss if self.peak_pss is None else max(self.peak_pss, pss)

    def _sample_once(self) -> None:
        with self._lock:
            t0 = time.perf_counter()
            c0 = time.thread_time()
            try:
                procs = self._tree()
                if self.uss_available or self.pss_available:
                    self._sample_memory(procs)
                self._read_cpu(procs)  # remember context switches of processes that may exit
            except Exception:  # never let the sampler break a measurement
                pass
            self._sampler_cpu_s += time.thread_time() - c0
            self._cost_s = time.perf_counter() - t0

    def _run(self) -> None:
        # sample less often when sampling is slow, to keep its cost to a few % of one core
        while not self._stop.wait(max(self._interval_s, 20.0 * self._cost_s)):
            self._sample_once()

    def list_tree(self) -> list:
        """The processes of the tree now (a few ms: it scans the process table)."""
        return self._tree()

    def start(self, procs: list | None = None) -> None:
        """Remember the tree (``procs`` from :meth:`list_tree`, or listed now), then sample
        memory every ~0.1 s in a daemon thread until :meth:`stop`."""
        self.stop()
        self._procs = self._tree() if procs is None else list(procs)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="course-utils-tree-sampler",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the sampler thread (if running) and take a last sample."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10.0)
        self._thread = None
        self._sample_once()

    def peaks(self) -> tuple[int | None, int | None]:
        return (self.peak_uss if self.uss_available else None,
                self.peak_pss if self.pss_available else None)


# --------------------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------

@dataclass
class Measurement:
    """The result of :func:`measure` or :func:`measure_loader`.

    Times are seconds per repeat; ``samples_per_s`` uses the median repeat;
    ``cpu_s_per_sample`` is CPU seconds (user + system) of the whole process tree per sample;
    ``involuntary_ctx_switches`` is a total over all timed windows; memory peaks are bytes.
    Build one from raw times with :meth:`from_times`, or from saved data with :meth:`from_dict`.
    """

    label: str
    times_s: list[float]
    items_per_repeat: int
    median_s: float
    iqr_s: float
    samples_per_s: float
    cpu_s_per_sample: float | None = None
    involuntary_ctx_switches: int | None = None
    peak_uss_bytes: int | None = None
    peak_pss_bytes: int | None = None
    settings: dict = field(default_factory=dict)
    machine: str = ""
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def from_times(cls, label: str, times_s: Sequence[float], items_per_repeat: int, *,
                   cpu_s_per_sample: float | None = None,
                   involuntary_ctx_switches: int | None = None,
                   peak_uss_bytes: int | None = None, peak_pss_bytes: int | None = None,
                   settings: dict | None = None, machine: str | None = None,
                   warnings: Iterable[str] = ()) -> "Measurement":
        """Compute median, IQR, samples/s and the standard warnings from per-repeat times."""
        times = [float(t) for t in times_s]
        if not times:
            raise ValueError("times_s is empty: a Measurement needs at least one timed repeat.")
        if any(not math.isfinite(t) or t < 0 for t in times):
            raise ValueError(f"times_s must be finite, non-negative seconds, got {times}.")
        check_int("items_per_repeat", items_per_repeat, 1)
        median = float(np.median(times))
        q25, q75 = (float(q) for q in np.percentile(times, [25, 75]))
        rate = items_per_repeat / median if median > 0 else math.inf
        notes = list(warnings)
        if median > 0 and (q75 - q25) / median > NOISY_IQR_FRACTION:
            notes.append(f"noisy: IQR is {100 * (q75 - q25) / median:.0f}% of the median "
                         f"(more repeats, a quieter machine, or longer repeats help)")
        if len(times) < 3:
            notes.append(f"few repeats: {len(times)} (use 3 or more for a meaningful median and IQR)")
        if median < 1e-3:
            notes.append(f"short repeats: the median repeat is {_fmt_time(median)}; timer and "
                         f"call overhead matter at this scale, time more work per repeat")
        return cls(label=str(label), times_s=times, items_per_repeat=int(items_per_repeat),
                   median_s=median, iqr_s=q75 - q25, samples_per_s=rate,
                   cpu_s_per_sample=cpu_s_per_sample,
                   involuntary_ctx_switches=involuntary_ctx_switches,
                   peak_uss_bytes=peak_uss_bytes, peak_pss_bytes=peak_pss_bytes,
                   settings=dict(settings or {}),
                   machine=_machine() if machine is None else machine,
                   warnings=notes)

    @classmethod
    def merge(cls, parts: Sequence["Measurement"], label: str | None = None) -> "Measurement":
        """Pool the repeats of several Measurements of the same setup into one.

        Used when repeats of two setups are interleaved (A, B, A, B, ...) so that a drift of a
        shared machine hits both alike. CPU per sample is averaged over all samples, context
        switches are summed, memory peaks are the maximum.
        """
        parts = list(parts)
        if not parts or not all(isinstance(p, Measurement) for p in parts):
            raise ValueError("parts must be a non-empty list of Measurement objects.")
        items = parts[0].items_per_repeat
        times = [t * items / p.items_per_repeat for p in parts for t in p.times_s]
        samples = [p.items_per_repeat * len(p.times_s) for p in parts]
        cpu = None
        if all(p.cpu_s_per_sample is not None for p in parts):
            cpu = sum(p.cpu_s_per_sample * n for p, n in zip(parts, samples)) / sum(samples)
        ctx = (sum(p.involuntary_ctx_switches for p in parts)
               if all(p.involuntary_ctx_switches is not None for p in parts) else None)

        def peak(name: str) -> int | None:
            values = [getattr(p, name) for p in parts if getattr(p, name) is not None]
            return max(values) if values else None

        inherited = [w for p in parts for w in p.warnings
                     if not w.startswith(("noisy:", "few repeats:", "short repeats:"))]
        return cls.from_times(label or parts[0].label, times, items, cpu_s_per_sample=cpu,
                              involuntary_ctx_switches=ctx, peak_uss_bytes=peak("peak_uss_bytes"),
                              peak_pss_bytes=peak("peak_pss_bytes"), settings=parts[0].settings,
                              machine=parts[0].machine, warnings=list(dict.fromkeys(inherited)))

    @classmethod
    def from_dict(cls, data: Mapping) -> "Measurement":
        """Rebuild a Measurement saved with :meth:`to_dict` (e.g. results shipped as JSON)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"data must be a dict made by Measurement.to_dict(), got "
                            f"{type(data).__name__}.")
        names = [f for f in cls.__dataclass_fields__]
        missing = [n for n in ("label", "times_s", "items_per_repeat") if n not in data]
        if missing:
            raise ValueError(f"data is missing {missing}: pass a dict made by Measurement.to_dict().")
        kwargs = {n: data[n] for n in names if n in data}
        if "median_s" not in kwargs:
            m = cls.from_times(data["label"], data["times_s"], data["items_per_repeat"],
                               machine=data.get("machine", ""))
            kwargs.setdefault("median_s", m.median_s)
            kwargs.setdefault("iqr_s", m.iqr_s)
            kwargs.setdefault("samples_per_s", m.samples_per_s)
        return cls(**kwargs)

    # -- derived -----------------------------------------------------------------------
    @property
    def noisy(self) -> bool:
        """True when the IQR is more than 10 % of the median."""
        return self.median_s > 0 and self.iqr_s / self.median_s > NOISY_IQR_FRACTION

    @property
    def repeats(self) -> int:
        return len(self.times_s)

    @property
    def quartiles_s(self) -> tuple[float, float]:
        """(25th, 75th) percentile of the per-repeat times, in seconds."""
        q25, q75 = np.percentile(self.times_s, [25, 75])
        return float(q25), float(q75)

    def metric(self, name: str) -> float | None:
        """The value of one of :data:`METRICS` (``None`` when not measured)."""
        if name not in METRICS:
            raise ValueError(f"metric={name!r} is not known: use one of {', '.join(METRICS)}.")
        value = getattr(self, name)
        return None if value is None else float(value)

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (``json.dumps`` works on it); :meth:`from_dict` reads it."""
        out = {name: _jsonable(getattr(self, name)) for name in self.__dataclass_fields__}
        out["noisy"] = self.noisy
        return out

    def __str__(self) -> str:
        n = self.repeats
        rel = f", {100 * self.iqr_s / self.median_s:.1f}%" if self.median_s > 0 else ""
        lines = [
            self.label,
            f"  median {_fmt_time(self.median_s)} per repeat (IQR {_fmt_time(self.iqr_s)}{rel}), "
            f"{n} repeat{'s' if n != 1 else ''} of {self.items_per_repeat} samples",
        ]
        parts = [f"{_fmt_rate(self.samples_per_s)} samples/s"]
        if self.cpu_s_per_sample is not None:
            parts.append(f"{_fmt_time(self.cpu_s_per_sample)} CPU/sample")
        if self.involuntary_ctx_switches is not None:
            parts.append(f"{self.involuntary_ctx_switches:,} invol. ctx switches")
        if self.peak_uss_bytes is not None:
            parts.append(f"peak USS {_fmt_mb(self.peak_uss_bytes)} MB")
        if self.peak_pss_bytes is not None:
            parts.append(f"PSS {_fmt_mb(self.peak_pss_bytes)} MB")
        lines.append("  " + " | ".join(parts))
        for w in self.warnings:
            lines.append(f"  WARNING: {w}")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------
# measure a callable
# --------------------------------------------------------------------------------------

def measure(fn: Callable[[], Any], *, items: int = 1, warmup: int = 1, repeats: int = 5,
            label: str | None = None, settings: dict | None = None,
            device: Any = None) -> Measurement:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed calls, one call per repeat.

    ``items`` is how many samples one call processes (for samples/s and CPU-s/sample).
    When ``device`` is a CUDA device (or CUDA is already initialised) the device is synchronised
    before the clock starts and after every call, so queued GPU work is part of the time.
    CPU time and context switches of the process tree are measured around each timed call.
    Returns a :class:`Measurement` (times in seconds).
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments (e.g. a function or "
                        f"functools.partial), got {type(fn).__name__}.")
    check_int("items", items, 1)
    check_int("warmup", warmup, 0)
    check_int("repeats", repeats, 1)
    if settings is not None and not isinstance(settings, Mapping):
        raise TypeError(f"settings must be a dict of names to values, got {type(settings).__name__}.")
    sync = synchronizer(device)
    if label is None:
        label = getattr(fn, "__name__", None) or type(fn).__name__
    all_settings: dict = {}
    if device is not None:
        all_settings["device"] = str(device)
    all_settings.update(settings or {})

    for _ in range(warmup):
        fn()
    sync()

    monitor = _TreeMonitor()
    times: list[float] = []
    cpu_total = 0.0
    ctx_total: int | None = 0
    monitor.start()
    try:
        for _ in range(repeats):
            before = monitor.snapshot(fresh=True)
            sync()
            t0 = _now()
            fn()
            sync()
            t1 = _now()
            after = monitor.snapshot(fresh=True)
            times.append(t1 - t0)
            cpu, ctx = monitor.window(before, after)
            cpu_total += cpu
            ctx_total = None if (ctx is None or ctx_total is None) else ctx_total + ctx
    finally:
        monitor.stop()
    uss, pss = monitor.peaks()
    return Measurement.from_times(
        label, times, items,
        cpu_s_per_sample=cpu_total / (items * repeats),
        involuntary_ctx_switches=ctx_total,
        peak_uss_bytes=uss, peak_pss_bytes=pss, settings=all_settings)


# --------------------------------------------------------------------------------------
# measure a loader
# --------------------------------------------------------------------------------------

def batch_size_of(batch: Any) -> int:
    """How many samples are in ``batch``.

    Rules, in order: a tensor or array -> its first dimension; a dict -> the size of its first
    value; a tuple/list -> the size of its first element when that is a tensor/array/dict/
    tuple/list (so ``(images, labels)`` counts images), otherwise its length (a list of
    strings or numbers). A batch that is a list of *samples* (``collate_fn=list``) is not
    recognised: wrap it or count it yourself.
    """
    shape = getattr(batch, "shape", None)
    if shape is not None and not isinstance(batch, (str, bytes)):
        if len(shape) == 0:
            raise ValueError("batch is a 0-dimensional tensor/array: it has no batch dimension, "
                             "so the number of samples cannot be counted.")
        return int(shape[0])
    if isinstance(batch, Mapping):
        if not batch:
            raise ValueError("batch is an empty dict: cannot count its samples.")
        return batch_size_of(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)):
        if not batch:
            return 0
        first = batch[0]
        if getattr(first, "shape", None) is not None or isinstance(first, (Mapping, list, tuple)):
            return batch_size_of(first)
        return len(batch)
    raise TypeError(f"cannot tell how many samples are in a batch of type {type(batch).__name__}: "
                    f"batches should be tensors, arrays, or tuples/lists/dicts of them.")


def _loader_settings(loader: Any) -> dict:
    settings: dict = {}
    for name in ("num_workers", "batch_size", "pin_memory", "persistent_workers",
                 "prefetch_factor"):
        if hasattr(loader, name):
            settings[name] = getattr(loader, name)
    if getattr(loader, "num_workers", 0):
        ctx = getattr(loader, "multiprocessing_context", None)
        if ctx is None:
            method = start_method()
        elif isinstance(ctx, str):
            method = ctx
        else:
            method = ctx.get_start_method()
        settings["start_method"] = method
    return settings


def _default_label(loader: Any) -> str:
    if hasattr(loader, "num_workers"):
        return (f"{type(loader).__name__}(num_workers={loader.num_workers}, "
                f"batch_size={getattr(loader, 'batch_size', None)})")
    return type(loader).__name__


def _plan_batches(loader: Any, batches: int | None, warmup: int, what: str) -> int | None:
    """How many batches to time per repeat (None: until the epoch ends)."""
    try:
        n_total = len(loader)
    except TypeError:
        n_total = None
    if n_total is not None and batches is None and n_total <= warmup:
        raise ValueError(
            f"the loader has only {n_total} batches per epoch and warmup_{what}={warmup} would "
            f"use them all, leaving none to time: use a bigger dataset, a smaller batch_size, "
            f"or fewer warmup_{what}.")
    if n_total is not None and batches is not None and n_total < warmup + batches:
        raise ValueError(
            f"the loader has only {n_total} batches per epoch, fewer than "
            f"warmup_{what}={warmup} + {what}={batches} = {warmup + batches}: use a bigger "
            f"dataset, a smaller batch_size, or fewer warmup_{what}/{what}.")
    if batches is not None:
        return batches
    cap = pick(full=None, quick=10)
    if n_total is None:
        return cap
    remaining = n_total - warmup
    return remaining if cap is None else min(remaining, cap)


_END = object()


def _next_or_explain(it: Any, pulled: int, warmup: int, asked: int | None, what: str,
                     strict: bool = True) -> Any:
    """next(it); at the end of the epoch: _END, or (strict) an error saying what was asked."""
    try:
        return next(it)
    except StopIteration:
        if not strict:
            return _END
        if pulled < warmup or asked is None:
            raise ValueError(
                f"the loader ran out after {pulled} batches, during warmup_{what}={warmup}: "
                f"use fewer warmup_{what}, or a loader with more batches.") from None
        raise ValueError(
            f"the loader ran out after {pulled} batches, but warmup_{what}={warmup} + "
            f"{what}={asked} were asked for: use fewer, or a loader with more batches."
        ) from None


def _warmup_for(loader: Any, warmup_batches: int | None) -> int:
    """The warm-up to use: as given, or by default every batch the workers hold in flight.

    Workers start one after another and each runs ``prefetch_factor`` batches ahead, so until
    ``num_workers * prefetch_factor`` batches have been pulled, batches finished before the
    clock started would be counted as free (a latency-bound loader read 146% of its physical
    limit that way). Default: ``max(2, num_workers * prefetch_factor)``, capped at half the
    loader's length when it has one, so that at least half an epoch is timed.
    """
    if warmup_batches is not None:
        return warmup_batches
    workers = int(getattr(loader, "num_workers", 0) or 0)
    prefetch = int(getattr(loader, "prefetch_factor", None) or 2)
    warmup = max(2, workers * prefetch)
    try:
        length = len(loader)
    except TypeError:
        return warmup
    return max(1, min(warmup, length // 2))


def measure_loader(loader: Iterable, *, batches: int | None = None,
                   warmup_batches: int | None = None,
                   repeats: int = 3, label: str | None = None, settings: dict | None = None,
                   progress: bool = True) -> Measurement:
    """Time how fast ``loader`` delivers batches, in samples per second.

    Each repeat: a fresh ``iter(loader)`` (fresh workers unless ``persistent_workers``);
    ``warmup_batches`` batches pulled untimed (default: the batches the workers hold in flight,
    ``max(2, num_workers * prefetch_factor)``, at most half the epoch, so worker start-up and
    batches finished before the clock started are excluded); then ``batches``
    batches timed (default: the rest of the epoch; at most 10 in quick mode). Samples are counted
    from the real batch sizes (:func:`batch_size_of`), so a last partial batch counts exactly.
    CPU time and involuntary context switches of the process tree (main process + workers) are
    measured over the timed window only; peak memory (USS/PSS) is sampled during it. The iterator
    is deleted after each window (outside the timing), which shuts its workers down.

    ``settings`` is merged over what is read from the loader (num_workers, batch_size,
    pin_memory, persistent_workers, prefetch_factor, start_method).
    """
    if not hasattr(loader, "__iter__"):
        raise TypeError(f"loader must be iterable (e.g. a torch.utils.data.DataLoader), got "
                        f"{type(loader).__name__}.")
    check_int("batches", batches, 1, allow_none=True)
    check_int("warmup_batches", warmup_batches, 0, allow_none=True)
    check_int("repeats", repeats, 1)
    if settings is not None and not isinstance(settings, Mapping):
        raise TypeError(f"settings must be a dict of names to values, got {type(settings).__name__}.")
    warmup_batches = _warmup_for(loader, warmup_batches)
    n_timed = _plan_batches(loader, batches, warmup_batches, "batches")
    all_settings = _loader_settings(loader)
    all_settings.update(settings or {})
    if label is None:
        label = _default_label(loader)

    from tqdm.auto import tqdm

    bar = tqdm(total=None if n_timed is None else repeats * n_timed, disable=not progress,
               desc=str(label)[:40], unit="batch", leave=False)
    monitor = _TreeMonitor()
    times: list[float] = []
    counts: list[int] = []
    cpu_total = 0.0
    ctx_total: int | None = 0
    try:
        for _ in range(repeats):
            it = iter(loader)  # starts the workers (unless persistent and already running)
            try:
                procs = monitor.list_tree()
                for i in range(warmup_batches):
                    _next_or_explain(it, i, warmup_batches, batches, "batches")
                # keep the gap between warm-up and the clock short: the workers keep working
                monitor.start(procs)
                before = monitor.snapshot()
                samples = 0
                timed = 0
                t0 = _now()
                while n_timed is None or timed < n_timed:
                    batch = _next_or_explain(it, warmup_batches + timed, warmup_batches, batches,
                                             "batches", strict=batches is not None)
                    if batch is _END:  # the epoch ended before the quick-mode cap
                        break
                    timed += 1
                    samples += batch_size_of(batch)
                    bar.update(1)
                t1 = _now()
                after = monitor.snapshot(fresh=True)
            finally:
                monitor.stop()
                batch = None
                del it  # shuts the workers down (outside the timed window)
            if samples == 0:
                raise ValueError("no samples were timed: the loader had no batches (or only empty "
                                 "ones) left after warm-up; use fewer warmup_batches or more data.")
            times.append(t1 - t0)
            counts.append(samples)
            cpu, ctx = monitor.window(before, after)
            cpu_total += cpu
            ctx_total = None if (ctx is None or ctx_total is None) else ctx_total + ctx
    finally:
        bar.close()

    notes = []
    workers = int(getattr(loader, "num_workers", 0) or 0)
    if warmup_batches < workers:
        notes.append(f"warm-up of {warmup_batches} batches is shorter than num_workers={workers}: "
                     f"batches the workers made during warm-up look free in the timing; use "
                     f"warmup_batches >= num_workers (the default)")
    items = counts[0]
    if len(set(counts)) > 1:
        # normalise every repeat to the first repeat's sample count
        times = [t * items / c for t, c in zip(times, counts)]
        notes.append(f"repeats timed different numbers of samples ({counts}); times were "
                     f"scaled to {items} samples per repeat")
    uss, pss = monitor.peaks()
    return Measurement.from_times(
        label, times, items,
        cpu_s_per_sample=cpu_total / sum(counts),
        involuntary_ctx_switches=ctx_total,
        peak_uss_bytes=uss, peak_pss_bytes=pss, settings=all_settings, warnings=notes)


# --------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------

@dataclass
class Comparison:
    """Several Measurements side by side, with ratios to a baseline row.

    Ratios are ``value / baseline value``: for samples/s higher is better, for CPU-s/sample,
    time and memory lower is better.
    """

    rows: list[Measurement]
    baseline: int = 0

    def index(self, key: int | str) -> int:
        """Row index of a label (must be unique) or a (possibly negative) index."""
        if isinstance(key, bool) or not isinstance(key, (int, np.integer, str)):
            raise TypeError(f"expected a row label (str) or index (int), got {key!r}.")
        if isinstance(key, str):
            hits = [i for i, m in enumerate(self.rows) if m.label == key]
            if not hits:
                labels = ", ".join(repr(m.label) for m in self.rows)
                raise ValueError(f"no measurement is labelled {key!r}; labels are: {labels}.")
            if len(hits) > 1:
                raise ValueError(f"label {key!r} is used by rows {hits}: pass an index instead, "
                                 f"or give each measurement a distinct label=.")
            return hits[0]
        n = len(self.rows)
        if not -n <= key < n:
            raise ValueError(f"index {key} is out of range for {n} measurements "
                             f"(use 0..{n - 1}, or a label).")
        return int(key) % n

    def row(self, key: int | str) -> Measurement:
        return self.rows[self.index(key)]

    def ratio(self, label: int | str, metric: str = "samples_per_s") -> float:
        """``metric`` of the row ``label`` divided by the baseline's (e.g. 2.0 = twice the baseline)."""
        value = self.row(label).metric(metric)
        base = self.rows[self.baseline].metric(metric)
        if value is None or base is None:
            raise ValueError(f"{metric} was not measured for {self.row(label).label!r} or the "
                             f"baseline {self.rows[self.baseline].label!r} on this platform.")
        if base == 0:
            return math.inf if value > 0 else math.nan
        return value / base

    def best(self, metric: str = "samples_per_s") -> Measurement:
        """The best row for ``metric`` (highest samples/s; lowest for every other metric)."""
        rows = [m for m in self.rows if m.metric(metric) is not None]
        if not rows:
            raise ValueError(f"{metric} was not measured for any row.")
        if metric == "samples_per_s":
            return max(rows, key=lambda m: m.metric(metric))
        return min(rows, key=lambda m: m.metric(metric))

    def _ratio_text(self, i: int, metric: str) -> str:
        try:
            r = self.ratio(i, metric)
        except ValueError:
            return "n/a"
        return f"{r:.2f}x" if math.isfinite(r) else "n/a"

    def __str__(self) -> str:
        base = self.rows[self.baseline]
        header = ["label", "samples/s", "x base", "CPU ms/sample", "x base",
                  "invol. ctx sw.", "peak USS MB", "peak PSS MB"]
        table = []
        for i, m in enumerate(self.rows):
            name = m.label + (" *" if m.noisy else "") + (" (baseline)" if i == self.baseline else "")
            cpu = "n/a" if m.cpu_s_per_sample is None else f"{m.cpu_s_per_sample * 1e3:.3g}"
            ctx = "n/a" if m.involuntary_ctx_switches is None else f"{m.involuntary_ctx_switches:,}"
            table.append([name, _fmt_rate(m.samples_per_s), self._ratio_text(i, "samples_per_s"),
                          cpu, self._ratio_text(i, "cpu_s_per_sample"), ctx,
                          _fmt_mb(m.peak_uss_bytes), _fmt_mb(m.peak_pss_bytes)])
        widths = [max(len(r[c]) for r in [header] + table) for c in range(len(header))]

        def fmt(r: list[str]) -> str:
            return "  ".join([r[0].ljust(widths[0])] +
                             [r[c].rjust(widths[c]) for c in range(1, len(r))])

        lines = [fmt(header), "  ".join("-" * w for w in widths)] + [fmt(r) for r in table]
        lines.append(f"x base: ratio to {base.label!r}; samples/s: higher is better, "
                     f"CPU ms/sample: lower is better.")
        lines.append("CPU, context switches, memory: main process + workers. USS: private to "
                     "each process, summed; PSS: total, shared pages split.")
        if any(m.noisy for m in self.rows):
            lines.append(f"* noisy: IQR above {NOISY_IQR_FRACTION:.0%} of the median.")
        machines = sorted({m.machine for m in self.rows if m.machine})
        if len(machines) == 1:
            lines.append(f"machine: {machines[0]}")
        elif machines:
            lines.append("machines differ between rows:")
            lines += [f"  {m.label}: {m.machine}" for m in self.rows]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"baseline": self.baseline, "rows": [m.to_dict() for m in self.rows]}


def compare(measurements: Sequence[Measurement], baseline: int | str = 0) -> Comparison:
    """Put Measurements side by side; ``baseline`` is the row index or label that ratios use."""
    if isinstance(measurements, Measurement):
        raise TypeError("measurements must be a list of Measurements, got a single Measurement: "
                        "wrap it in a list, e.g. compare([a, b]).")
    try:
        rows = list(measurements)
    except TypeError:
        raise TypeError(f"measurements must be a list of Measurements, got "
                        f"{type(measurements).__name__}.") from None
    if not rows:
        raise ValueError("measurements is empty: pass at least one Measurement to compare.")
    for i, m in enumerate(rows):
        if not isinstance(m, Measurement):
            raise TypeError(f"measurements[{i}] is a {type(m).__name__}, not a Measurement "
                            f"(made by measure() or measure_loader()).")
    comparison = Comparison(rows=rows, baseline=0)
    try:
        comparison.baseline = comparison.index(baseline)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"baseline: {exc}") from None
    return comparison


# --------------------------------------------------------------------------------------
# data wait inside a training loop
# --------------------------------------------------------------------------------------

@dataclass
class DataWait:
    """How much of each training step was spent waiting for data (seconds per step).

    ``wait_s``: time blocked in ``next(iterator)`` plus the copy to the device;
    ``step_s``: the whole iteration (wait + ``step_fn``); ``wait_fraction`` = sum(wait)/sum(step).
    """

    steps: int
    wait_s: list[float]
    step_s: list[float]
    wait_fraction: float

    @property
    def median_step_s(self) -> float:
        return float(np.median(self.step_s))

    @property
    def median_wait_s(self) -> float:
        return float(np.median(self.wait_s))

    def to_dict(self) -> dict:
        return _jsonable({"steps": self.steps, "wait_s": self.wait_s, "step_s": self.step_s,
                          "wait_fraction": self.wait_fraction})

    def __str__(self) -> str:
        return (f"data wait: {self.wait_fraction:.0%} of step time (median step "
                f"{_fmt_time(self.median_step_s)}, median wait {_fmt_time(self.median_wait_s)}, "
                f"{self.steps} steps)")


def measure_data_wait(loader: Iterable, step_fn: Callable[[Any], Any], *,
                      steps: int | None = None, warmup_steps: int | None = None,
                      device: Any = None) -> DataWait:
    """Run a training loop and time how long each step waits for data.

    ``warmup_steps`` full steps run untimed first (default ``max(2, num_workers *
    prefetch_factor)``, at most half the loader, so the batches the workers made ahead at start-up
    are not counted as free). Then each timed step: the wait is the time
    spent in ``next(iterator)`` plus moving the batch to ``device`` (when given; non_blocking only
    from pinned memory); the step is the whole iteration including ``step_fn(batch)``.
    ``steps`` defaults to the rest of the epoch (at most 10 in quick mode). On CUDA the device is
    synchronised before each clock reading, so the copy counts as wait and queued GPU work counts
    in the step it belongs to (this also stops the GPU running ahead, as ``loss.item()`` would).
    On a GPU the fraction is therefore an upper bound: the forced syncs keep the CPU from queueing
    the next step while the GPU still works, so loading cannot overlap the GPU's last kernels.
    On a CPU the step is synchronous anyway and the fraction is what the loop really waited.
    """
    if not hasattr(loader, "__iter__"):
        raise TypeError(f"loader must be iterable (e.g. a torch.utils.data.DataLoader), got "
                        f"{type(loader).__name__}.")
    if not callable(step_fn):
        raise TypeError(f"step_fn must be a callable taking one batch, got {type(step_fn).__name__}.")
    check_int("steps", steps, 1, allow_none=True)
    check_int("warmup_steps", warmup_steps, 0, allow_none=True)
    warmup_steps = _warmup_for(loader, warmup_steps)
    sync = synchronizer(device)
    n_timed = _plan_batches(loader, steps, warmup_steps, "steps")

    def fetch(it: Any, pulled: int, strict: bool = True) -> Any:
        batch = _next_or_explain(it, pulled, warmup_steps, steps, "steps", strict=strict)
        if batch is _END or device is None:
            return batch
        return move_to_device(batch, device)

    wait: list[float] = []
    step: list[float] = []
    it = iter(loader)
    try:
        for i in range(warmup_steps):
            step_fn(fetch(it, i))
        sync()
        while n_timed is None or len(step) < n_timed:
            t0 = _now()
            batch = fetch(it, warmup_steps + len(step), strict=steps is not None)
            if batch is _END:  # the epoch ended before the quick-mode cap
                break
            sync()
            t1 = _now()
            step_fn(batch)
            sync()
            t2 = _now()
            wait.append(t1 - t0)
            step.append(t2 - t0)
    finally:
        batch = None
        del it
    if not step:
        raise ValueError("no steps were timed: the loader had no batches left after warm-up.")
    total = sum(step)
    fraction = sum(wait) / total if total > 0 else 0.0
    return DataWait(steps=len(step), wait_s=wait, step_s=step, wait_fraction=fraction)
