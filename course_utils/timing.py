"""The one timing engine: time one operation on a device, measure a callable, a DataLoader, or
the data wait of a training loop (lessons 00 and 04 show why each step is there).

* **wall time per repeat** (seconds, ``time.perf_counter``), warm-up untimed; the **median** and
  **IQR** of the repeats are reported; **samples per second** = samples per repeat / median.
* **CPU seconds per sample**: user + system CPU of the *whole process tree* (workers included)
  over the timed windows, per sample timed (1.0 ms means one core per 1000 samples/s).
* **involuntary context switches** of the tree over the timed windows (oversubscription).
* **peak memory** of the tree in bytes, sampled by a thread: summed USS (private pages: what
  copy-on-read grows) and PSS (shared pages split: the total footprint; Linux only).

A loader's workers work ahead, so batches made before the clock starts look free. The default
warm-up is therefore every batch in flight, ``max(2, num_workers * prefetch_factor)``, and the
window then times at least :data:`MIN_TIMED_BATCHES` batches, each asked for after the clock
started. A loader too short for both is refused with the size it needs; a window set by hand
that breaks either rule gets a warning in the result.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import torch

from .checks import check_int
from .config import pick
from .device import move_to_device, synchronize, synchronizer
from .measurement import Measurement, fmt_time, jsonable
from .process_tree import TreeMonitor, loader_worker_pids, stop_workers
from .start_methods import start_method

__all__ = ["time_op", "measure", "measure_loader", "batch_size_of", "batches_in_flight",
           "default_warmup", "window_warnings", "MIN_TIMED_BATCHES", "DataWait", "measure_data_wait"]

# Batches a window must time after the batches in flight are consumed (each of them asked for
# after the clock started); fewer and one slow or early batch moves the figure.
MIN_TIMED_BATCHES = 10

# The clock. Tests replace this module attribute with a fake clock; nothing else should.
_now: Callable[[], float] = time.perf_counter


def time_op(fn: Callable[[], Any], *, device: Any, repeats: int = 5, warmup: int = 1,
            inner: int = 1, events: bool = True) -> list[float]:
    """Seconds per call of ``fn``, one figure per repeat (``fn`` runs ``inner`` times per repeat).

    CUDA with ``events``: CUDA events recorded on ``device``'s own current stream around the
    ``inner`` calls, read after the end event completes (the GPU's time, not Python's).
    Otherwise: ``time.perf_counter`` with the whole device synchronised (every stream) before the
    clock starts and stops. Lesson 04 writes this loop in its own cells
    (``lesson04_copies.time_calls``).
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments, got {type(fn).__name__}.")
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    check_int("inner", inner, 1)
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(dev)
    stream = torch.cuda.current_stream(dev) if dev.type == "cuda" and events else None
    times = []
    for _ in range(repeats):
        if stream is not None:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(inner):
                fn()
            end.record(stream)
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds
        else:
            synchronize(dev)
            t0 = _now()
            for _ in range(inner):
                fn()
            synchronize(dev)
            seconds = _now() - t0
        times.append(seconds / inner)
    return times


def measure(fn: Callable[[], Any], *, items: int = 1, warmup: int = 1, repeats: int = 5,
            label: str | None = None, settings: dict | None = None,
            device: Any = None) -> Measurement:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed calls, one per repeat.

    ``items`` is how many samples one call processes. On CUDA (``device``, or CUDA already
    initialised) the device is synchronised around every call, so queued GPU work is timed.
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
    all_settings = ({} if device is None else {"device": str(device)}) | dict(settings or {})

    for _ in range(warmup):
        fn()
    sync()

    monitor = TreeMonitor()
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


def batch_size_of(batch: Any) -> int:
    """How many samples are in ``batch``: a tensor's first dimension, else that of a dict's first
    value or a tuple's first element (``(images, labels)`` counts images), else a list's length.
    A list of *samples* (``collate_fn=list``) is not recognised: count it yourself."""
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
        settings["start_method"] = (start_method() if ctx is None else
                                    ctx if isinstance(ctx, str) else ctx.get_start_method())
    return settings


def batches_in_flight(loader: Any) -> int:
    """How many batches a loader's workers make ahead of the loop: ``num_workers *
    prefetch_factor`` (0 without workers: each batch is made when it is asked for)."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    prefetch = getattr(loader, "prefetch_factor", None)
    return workers * int(2 if prefetch is None else prefetch)


def _too_short(loader: Any, n_total: int, warmup: int, what: str) -> ValueError:
    """The error for a loader whose epoch cannot hold the warm-up and an honest window."""
    need = warmup + MIN_TIMED_BATCHES
    batch = getattr(loader, "batch_size", None)
    samples = f" (at least {need * batch} samples at batch_size={batch})" if batch else ""
    return ValueError(
        f"the loader has only {n_total} batches per epoch: an honest timing pulls warmup_{what}="
        f"{warmup} untimed (the batches its workers make ahead, num_workers x prefetch_factor) "
        f"and then times at least {MIN_TIMED_BATCHES}, so it needs {need}{samples}. Use more "
        f"data, a smaller batch_size or fewer workers; or pass {what}= and warmup_{what}= "
        f"yourself and read the warning the result carries.")


def _ended_early(pulled: int, warmup: int, what: str) -> ValueError:
    """The error for a loader without len() whose epoch ended before an honest window."""
    return ValueError(f"the loader's epoch ended after {pulled} batches: an honest timing pulls "
                      f"the {warmup} in flight untimed and then times at least "
                      f"{MIN_TIMED_BATCHES} {what}; use more data, a smaller batch_size or fewer "
                      f"workers, or pass {what}= yourself.")


def _plan_batches(loader: Any, batches: int | None, warmup: int, what: str,
                  strict: bool = False) -> int | None:
    """How many batches to time per repeat (None: until the epoch ends). ``strict`` (the whole
    window left to the defaults): the epoch must hold the warm-up and :data:`MIN_TIMED_BATCHES`
    more, else a clear error."""
    try:
        n_total = len(loader)
    except TypeError:
        n_total = None
    if n_total is not None and n_total < warmup + (batches or 1):
        asked = "" if batches is None else f" + {what}={batches}"
        raise ValueError(f"the loader has only {n_total} batches per epoch, too few for warmup_{what}="
                         f"{warmup}{asked} and one to time: use a bigger dataset, a smaller "
                         f"batch_size, or fewer warmup_{what}/{what}.")
    if batches is not None:
        return batches
    if strict and n_total is not None and n_total - warmup < MIN_TIMED_BATCHES:
        raise _too_short(loader, n_total, warmup, what)
    cap = pick(full=None, quick=MIN_TIMED_BATCHES)
    if n_total is None:
        return cap
    remaining = n_total - warmup
    return remaining if cap is None else min(remaining, cap)


def window_warnings(loader: Any, warmup: int, timed: int, what: str = "batches") -> list[str]:
    """What makes a window's figure untrustworthy, judged from counts alone: a warm-up shorter
    than the batches in flight (the rest were made before the clock started and look free), or
    fewer than :data:`MIN_TIMED_BATCHES` timed."""
    notes = []
    ahead = batches_in_flight(loader)
    if warmup < ahead:
        notes.append(f"warm-up of {warmup} batches is shorter than the {ahead} in flight "
                     f"(num_workers x prefetch_factor): up to {min(ahead - warmup, timed)} of the "
                     f"{timed} timed batches were made before the clock started and look free; "
                     f"use warmup_{what} >= {ahead} (the default)")
    if timed < MIN_TIMED_BATCHES:
        notes.append(f"only {timed} {what} timed per repeat, fewer than {MIN_TIMED_BATCHES}: one "
                     f"slow or early batch moves this figure; time more")
    return notes


_END = object()


def _next_or_explain(it: Any, pulled: int, warmup: int, asked: int | None, what: str,
                     strict: bool = True) -> Any:
    """next(it); at the end of the epoch: _END, or (strict) an error saying what was asked."""
    try:
        return next(it)
    except StopIteration:
        if not strict:
            return _END
        asked_text = "" if pulled < warmup or asked is None else f" + {what}={asked}"
        raise ValueError(f"the loader ran out after {pulled} batches of warmup_{what}={warmup}"
                         f"{asked_text}: ask for fewer, or use a loader with more batches.") from None


def default_warmup(loader: Any) -> int:
    """The one warm-up rule, in batches: every batch the workers hold in flight, at least 2,
    ``max(2, num_workers * prefetch_factor)`` (fewer, and batches made before the clock count
    as free: 4 workers on 2 CPUs read 3.9x num_workers=0 in a 13-batch epoch). ``loader`` is
    anything with ``num_workers`` and ``prefetch_factor`` (a DataLoader, a tuner's setting)."""
    return max(2, batches_in_flight(loader))


def _warmup_for(loader: Any, warmup_batches: int | None) -> int:
    """The warm-up to use: as given, or :func:`default_warmup`."""
    return default_warmup(loader) if warmup_batches is None else warmup_batches


def measure_loader(loader: Iterable, *, batches: int | None = None,
                   warmup_batches: int | None = None,
                   repeats: int = 3, label: str | None = None, settings: dict | None = None,
                   progress: bool = True) -> Measurement:
    """Time how fast ``loader`` delivers batches, in samples per second.

    Each repeat takes a fresh ``iter(loader)``, pulls ``warmup_batches`` untimed (default: every
    batch in flight), then times ``batches`` (default: the rest of the epoch, exactly
    :data:`MIN_TIMED_BATCHES` in quick mode), counting real batch sizes. With both left to the
    defaults, an epoch too short for that is a clear error; a window set by hand that breaks the
    rules carries :func:`window_warnings` in the result.
    ``settings`` is merged over what is read from the loader. CPU time is this process's and
    the loader's own workers' (another loader's workers are not counted; an iterator other than
    a DataLoader's counts every child process).
    """
    if not hasattr(loader, "__iter__"):
        raise TypeError(f"loader must be iterable (e.g. a torch.utils.data.DataLoader), got "
                        f"{type(loader).__name__}.")
    check_int("batches", batches, 1, allow_none=True)
    check_int("warmup_batches", warmup_batches, 0, allow_none=True)
    check_int("repeats", repeats, 1)
    if settings is not None and not isinstance(settings, Mapping):
        raise TypeError(f"settings must be a dict of names to values, got {type(settings).__name__}.")
    by_default = batches is None and warmup_batches is None
    warmup_batches = _warmup_for(loader, warmup_batches)
    n_timed = _plan_batches(loader, batches, warmup_batches, "batches", strict=by_default)
    all_settings = _loader_settings(loader) | dict(settings or {})
    if label is None:
        label = (f"{type(loader).__name__}(num_workers={loader.num_workers}, batch_size="
                 f"{getattr(loader, 'batch_size', None)})" if hasattr(loader, "num_workers")
                 else type(loader).__name__)

    from tqdm.auto import tqdm  # lazy: kept out of `import course_utils` (workers)

    bar = tqdm(total=None if n_timed is None else repeats * n_timed, disable=not progress,
               desc=str(label)[:40], unit="batch", leave=False)
    monitor = TreeMonitor()
    times: list[float] = []
    counts: list[int] = []
    timed_per_repeat: list[int] = []
    cpu_total = 0.0
    ctx_total: int | None = 0
    try:
        for _ in range(repeats):
            it = iter(loader)  # starts the workers (unless persistent and already running)
            try:
                monitor.roots = loader_worker_pids(it)   # this loader's workers, not another's
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
                stop_workers(it, loader)  # outside the timed window; a Ctrl-C now is raised
                del it
            if samples == 0:
                raise ValueError("no samples were timed: the loader had no batches (or only empty "
                                 "ones) left after warm-up; use fewer warmup_batches or more data.")
            if by_default and timed < MIN_TIMED_BATCHES:   # an iterable's epoch ended
                raise _ended_early(warmup_batches + timed, warmup_batches, "batches")
            times.append(t1 - t0)
            counts.append(samples)
            timed_per_repeat.append(timed)
            cpu, ctx = monitor.window(before, after)
            cpu_total += cpu
            ctx_total = None if (ctx is None or ctx_total is None) else ctx_total + ctx
    finally:
        bar.close()

    notes = window_warnings(loader, warmup_batches, min(timed_per_repeat))
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


@dataclass
class DataWait:
    """How much of each training step was spent waiting for data (seconds per step): ``wait_s``
    is ``next(iterator)`` plus the copy to the device, ``step_s`` the whole iteration."""

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
        return jsonable({"steps": self.steps, "wait_s": self.wait_s, "step_s": self.step_s,
                          "wait_fraction": self.wait_fraction})

    def __str__(self) -> str:
        return (f"data wait: {self.wait_fraction:.0%} of step time (median step "
                f"{fmt_time(self.median_step_s)}, median wait {fmt_time(self.median_wait_s)}, "
                f"{self.steps} steps)")


def measure_data_wait(loader: Iterable, step_fn: Callable[[Any], Any], *,
                      steps: int | None = None, warmup_steps: int | None = None,
                      device: Any = None) -> DataWait:
    """Run a training loop and time how long each step waits for data.

    After ``warmup_steps`` untimed steps (default as :func:`measure_loader`), the wait is
    ``next(iterator)`` plus the move to ``device`` (when given). On CUDA the device is
    synchronised before each clock reading, so the fraction is an upper bound: the syncs keep
    loading from overlapping the GPU's last kernels. On a CPU it is what the loop really waited.
    """
    if not hasattr(loader, "__iter__"):
        raise TypeError(f"loader must be iterable (e.g. a torch.utils.data.DataLoader), got "
                        f"{type(loader).__name__}.")
    if not callable(step_fn):
        raise TypeError(f"step_fn must be a callable taking one batch, got {type(step_fn).__name__}.")
    check_int("steps", steps, 1, allow_none=True)
    check_int("warmup_steps", warmup_steps, 0, allow_none=True)
    by_default = steps is None and warmup_steps is None
    warmup_steps = _warmup_for(loader, warmup_steps)
    sync = synchronizer(device)
    n_timed = _plan_batches(loader, steps, warmup_steps, "steps", strict=by_default)

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
        stop_workers(it, loader)
        del it
    if not step:
        raise ValueError("no steps were timed: the loader had no batches left after warm-up.")
    if by_default and len(step) < MIN_TIMED_BATCHES:     # an iterable's epoch ended
        raise _ended_early(warmup_steps + len(step), warmup_steps, "steps")
    total = sum(step)
    fraction = sum(wait) / total if total > 0 else 0.0
    return DataWait(steps=len(step), wait_s=wait, step_s=step, wait_fraction=fraction)
