"""The one timing engine: ``time_op`` (one operation on a device), ``measure`` (a callable),
``measure_loader`` (a DataLoader) and ``measure_data_wait`` (a training loop). The clock::

    warmup = max(2, num_workers * prefetch_factor)   # every batch in flight: made before t0, free
    per repeat:  it = iter(loader); pull `warmup` batches untimed
                 t0 = perf_counter(); cpu0 = CPU of this process + the loader's workers
                 pull n >= MIN_TIMED_BATCHES batches, counting samples     # asked for after t0
                 t1 = perf_counter(); cpu1 = ...; stop the workers (outside the window)
    Measurement(times = [t1 - t0 per repeat], samples per repeat, cpu1 - cpu0, ...)
    per step of a training loop (same warm-up):
                 t0; batch = to_device(next(it)); sync; t1; step(batch); sync; t2
    DataWait(wait = [t1 - t0 per step], step = [t2 - t1 per step])

An epoch too short for the warm-up and MIN_TIMED_BATCHES is refused when both are left to the
defaults; a window set by hand that breaks either rule carries a warning. Peak memory (USS, PSS)
of the tree is sampled by a thread (:mod:`course_utils.process_tree`).
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
from .measurement import Measurement, fmt_time
from .process_tree import TreeMonitor, loader_worker_pids, stop_workers
from .start_methods import resolve_context

__all__ = ["time_op", "measure", "measure_loader", "batch_size_of", "batches_in_flight",
           "default_warmup", "window_warnings", "MIN_TIMED_BATCHES", "DataWait", "measure_data_wait"]

#: Batches a window times after the batches in flight, each asked for after the clock started.
MIN_TIMED_BATCHES = 10

# The clock. Tests replace this module attribute with a fake clock; nothing else should.
_now: Callable[[], float] = time.perf_counter


def _check_call(fn: Any, **counts: int) -> None:
    """``fn`` a callable; each count an int >= 1 (``warmup`` >= 0)."""
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments (e.g. a function or "
                        f"functools.partial), got {type(fn).__name__}.")
    for name, value in counts.items():
        check_int(name, value, 0 if name == "warmup" else 1)


def time_op(fn: Callable[[], Any], *, device: Any, repeats: int = 5, warmup: int = 1,
            inner: int = 1, events: bool = True) -> list[float]:
    """Seconds per call of ``fn``, one figure per repeat of ``inner`` calls: on CUDA with
    ``events``, CUDA events on ``device``'s current stream (the GPU's time); otherwise
    ``perf_counter`` with the whole device synchronised around the repeat (lesson 04)."""
    _check_call(fn, repeats=repeats, warmup=warmup, inner=inner)
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(dev)
    stream = torch.cuda.current_stream(dev) if dev.type == "cuda" and events else None
    times = []
    for _ in range(repeats):
        if stream is not None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
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


def _check_settings(settings: Any) -> dict:
    if settings is not None and not isinstance(settings, Mapping):
        raise TypeError(f"settings must be a dict of names to values, got {type(settings).__name__}.")
    return dict(settings or {})


def _measurement(label: str, times: list[float], items: int, samples: int, windows: list,
                 monitor: TreeMonitor, settings: dict, notes: Iterable[str] = ()) -> Measurement:
    """The Measurement of timed repeats and the tree's (CPU s, context switches) per window."""
    ctx = [c for _, c in windows]
    uss, pss = monitor.peaks()
    return Measurement.from_times(
        label, times, items, cpu_s_per_sample=sum(cpu for cpu, _ in windows) / samples,
        involuntary_ctx_switches=None if None in ctx else sum(ctx), peak_uss_bytes=uss,
        peak_pss_bytes=pss, settings=settings, warnings=notes)


def measure(fn: Callable[[], Any], *, items: int = 1, warmup: int = 1, repeats: int = 5,
            label: str | None = None, settings: dict | None = None,
            device: Any = None) -> Measurement:
    """Seconds per call of ``fn()`` over ``repeats`` calls after ``warmup`` untimed ones;
    ``items`` samples per call. CUDA (``device``, or already initialised) is synchronised
    around every call, so queued GPU work is timed."""
    _check_call(fn, items=items, warmup=warmup, repeats=repeats)
    all_settings = ({} if device is None else {"device": str(device)}) | _check_settings(settings)
    sync = synchronizer(device)
    for _ in range(warmup):
        fn()
    sync()
    monitor, times, windows = TreeMonitor(), [], []
    monitor.start()
    try:
        for _ in range(repeats):
            before = monitor.snapshot(fresh=True)
            sync()
            t0 = _now()
            fn()
            sync()
            times.append(_now() - t0)
            windows.append(monitor.window(before, monitor.snapshot(fresh=True)))
    finally:
        monitor.stop()
    if label is None:
        label = getattr(fn, "__name__", None) or type(fn).__name__
    return _measurement(label, times, items, items * repeats, windows, monitor, all_settings)


def batch_size_of(batch: Any) -> int:
    """Samples in ``batch``: a tensor's first dimension, else that of a dict's first value or a
    tuple's first element (``(images, labels)`` counts images), else a list's length."""
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
        if batch and (getattr(batch[0], "shape", None) is not None
                      or isinstance(batch[0], (Mapping, list, tuple))):
            return batch_size_of(batch[0])
        return len(batch)
    raise TypeError(f"cannot tell how many samples are in a batch of type {type(batch).__name__}: "
                    f"batches should be tensors, arrays, or tuples/lists/dicts of them.")


def batches_in_flight(loader: Any) -> int:
    """Batches a loader's workers make ahead of the loop: ``num_workers * prefetch_factor``."""
    prefetch = getattr(loader, "prefetch_factor", None)
    return int(getattr(loader, "num_workers", 0) or 0) * int(2 if prefetch is None else prefetch)


def default_warmup(loader: Any) -> int:
    """The one warm-up rule, in batches: ``max(2, num_workers * prefetch_factor)`` (fewer, and
    batches made before the clock count as free: 4 workers on 2 CPUs read 3.9x num_workers=0 in
    a 13-batch epoch). ``loader``: anything with those attributes (a DataLoader, a setting)."""
    return max(2, batches_in_flight(loader))


def window_warnings(loader: Any, warmup: int, timed: int, what: str = "batches") -> list[str]:
    """What makes a window's figure untrustworthy, from its counts: a warm-up shorter than the
    batches in flight, or fewer than :data:`MIN_TIMED_BATCHES` timed."""
    notes, ahead = [], batches_in_flight(loader)
    if warmup < ahead:
        notes.append(f"warm-up of {warmup} batches is shorter than the {ahead} in flight "
                     f"(num_workers x prefetch_factor): up to {min(ahead - warmup, timed)} of the "
                     f"{timed} timed batches were made before the clock started and look free; "
                     f"use warmup_{what} >= {ahead} (the default)")
    if timed < MIN_TIMED_BATCHES:
        notes.append(f"only {timed} {what} timed per repeat, fewer than {MIN_TIMED_BATCHES}: one "
                     f"slow or early batch moves this figure; time more")
    return notes


def _plan(loader: Any, timed: int | None, warmup: int | None, what: str) -> tuple[int, int | None, bool]:
    """(warm-up, batches to time per repeat or None for the rest of the epoch, whether both were
    left to the defaults), the arguments checked; an epoch known to be too short is refused."""
    if not hasattr(loader, "__iter__"):
        raise TypeError(f"loader must be iterable (e.g. a torch.utils.data.DataLoader), got "
                        f"{type(loader).__name__}.")
    check_int(what, timed, 1, allow_none=True)
    check_int(f"warmup_{what}", warmup, 0, allow_none=True)
    by_default = timed is None and warmup is None
    warmup = default_warmup(loader) if warmup is None else warmup
    try:
        n_total = len(loader)
    except TypeError:
        n_total = None
    if n_total is not None and n_total < warmup + (timed or 1):
        asked = "" if timed is None else f" + {what}={timed}"
        raise ValueError(f"the loader has only {n_total} batches per epoch, too few for warmup_{what}="
                         f"{warmup}{asked} and one to time: use a bigger dataset, a smaller "
                         f"batch_size, or fewer warmup_{what}/{what}.")
    if by_default and n_total is not None and n_total - warmup < MIN_TIMED_BATCHES:
        need, batch = warmup + MIN_TIMED_BATCHES, getattr(loader, "batch_size", None)
        samples = f" (at least {need * batch} samples at batch_size={batch})" if batch else ""
        raise ValueError(
            f"the loader has only {n_total} batches per epoch: an honest timing pulls warmup_{what}="
            f"{warmup} untimed (the batches its workers make ahead, num_workers x prefetch_factor) "
            f"and then times at least {MIN_TIMED_BATCHES}, so it needs {need}{samples}. Use more "
            f"data, a smaller batch_size or fewer workers; or pass {what}= and warmup_{what}= "
            f"yourself and read the warning the result carries.")
    if timed is None:
        cap = pick(full=None, quick=MIN_TIMED_BATCHES)
        timed = cap if n_total is None else min(n_total - warmup, cap or n_total)
    return warmup, timed, by_default


def _batches(it: Any, warmup: int, n_timed: int | None, asked: int | None, what: str) -> Any:
    """``warmup`` batches of ``it``, then up to ``n_timed`` more (None: to the epoch's end); an
    epoch that ends sooner is an error, unless warm-up is done and no count was ``asked``."""
    pulled = 0
    while n_timed is None or pulled < warmup + n_timed:
        try:
            batch = next(it)
        except StopIteration:
            if pulled >= warmup and asked is None:
                return
            asked_text = "" if pulled < warmup else f" + {what}={asked}"
            raise ValueError(f"the loader ran out after {pulled} batches of warmup_{what}={warmup}"
                             f"{asked_text}: ask for fewer, or use a loader with more batches.") from None
        pulled += 1
        yield batch


def _check_window(timed: int, samples: int, warmup: int, by_default: bool, what: str) -> None:
    """Refuse a window with nothing timed, or (defaults) one an unsized epoch cut short."""
    if samples == 0:
        raise ValueError(f"no {what} were timed: the loader had no batches left after warm-up (or "
                         f"only empty ones); use fewer warmup_{what} or more data.")
    if by_default and timed < MIN_TIMED_BATCHES:
        raise ValueError(f"the loader's epoch ended after {warmup + timed} batches: an honest "
                         f"timing pulls the {warmup} in flight untimed and then times at least "
                         f"{MIN_TIMED_BATCHES} {what}; use more data, a smaller batch_size or fewer "
                         f"workers, or pass {what}= yourself.")


def _loader_settings(loader: Any) -> dict:
    settings = {name: getattr(loader, name) for name in ("num_workers", "batch_size", "pin_memory",
                "persistent_workers", "prefetch_factor") if hasattr(loader, name)}
    if getattr(loader, "num_workers", 0):
        settings["start_method"] = resolve_context(getattr(loader, "multiprocessing_context", None))[1]
    return settings


def measure_loader(loader: Iterable, *, batches: int | None = None,
                   warmup_batches: int | None = None,
                   repeats: int = 3, label: str | None = None, settings: dict | None = None,
                   progress: bool = True) -> Measurement:
    """Samples per second ``loader`` delivers: each repeat a fresh ``iter(loader)``, then the
    clock of the module header (``batches`` default: the rest of the epoch, exactly
    :data:`MIN_TIMED_BATCHES` in quick mode). ``settings`` is merged over the loader's own. CPU
    is this process's and this loader's workers' (any other iterator: every child process's)."""
    check_int("repeats", repeats, 1)
    warmup, n_timed, by_default = _plan(loader, batches, warmup_batches, "batches")
    all_settings = _loader_settings(loader) | _check_settings(settings)
    if label is None:
        label = (f"{type(loader).__name__}(num_workers={loader.num_workers}, batch_size="
                 f"{getattr(loader, 'batch_size', None)})" if hasattr(loader, "num_workers")
                 else type(loader).__name__)

    from tqdm.auto import tqdm  # lazy: kept out of `import course_utils` (workers)

    monitor, times, runs, windows = TreeMonitor(), [], [], []   # runs: batch sizes per repeat
    with tqdm(total=None if n_timed is None else repeats * n_timed, disable=not progress,
              desc=str(label)[:40], unit="batch", leave=False) as bar:
        for _ in range(repeats):
            it = iter(loader)  # starts the workers (unless persistent and already running)
            try:
                monitor.roots = loader_worker_pids(it)   # this loader's workers, not another's
                procs, pull = monitor.list_tree(), _batches(it, warmup, n_timed, batches, "batches")
                for _ in zip(range(warmup), pull):
                    pass
                monitor.start(procs)   # the workers keep working: keep this gap short
                before, sizes = monitor.snapshot(), []
                t0 = _now()
                for batch in pull:
                    sizes.append(batch_size_of(batch))
                    bar.update(1)
                t1 = _now()
                after = monitor.snapshot(fresh=True)
            finally:
                monitor.stop()
                batch = pull = None
                stop_workers(it, loader)  # outside the timed window; a Ctrl-C now is raised
            _check_window(len(sizes), sum(sizes), warmup, by_default, "batches")
            times.append(t1 - t0)
            runs.append(sizes)
            windows.append(monitor.window(before, after))

    notes, counts = window_warnings(loader, warmup, min(map(len, runs))), [sum(r) for r in runs]
    if len(set(counts)) > 1:   # every repeat scaled to the first repeat's samples
        times = [t * counts[0] / c for t, c in zip(times, counts)]
        notes.append(f"repeats timed different numbers of samples ({counts}); times were "
                     f"scaled to {counts[0]} samples per repeat")
    return _measurement(label, times, counts[0], sum(counts), windows, monitor, all_settings, notes)


@dataclass
class DataWait:
    """A training loop's timed steps, in seconds per step: ``wait_s`` waiting for the batch
    (``next(iterator)`` and the copy to the device), ``step_s`` the step alone."""

    wait_s: list[float]
    step_s: list[float]

    @property
    def steps(self) -> int:
        return len(self.step_s)

    @property
    def iteration_s(self) -> list[float]:
        """Seconds per whole iteration: wait + step."""
        return [w + s for w, s in zip(self.wait_s, self.step_s)]

    @property
    def wait_fraction(self) -> float:
        """Total wait over the loop's total time (not a mean of per-step fractions)."""
        total = sum(self.wait_s) + sum(self.step_s)
        return sum(self.wait_s) / total if total > 0 else 0.0

    @property
    def median_wait_s(self) -> float:
        return float(np.median(self.wait_s))

    @property
    def median_step_s(self) -> float:
        """Median seconds of the step alone."""
        return float(np.median(self.step_s))

    @property
    def median_iteration_s(self) -> float:
        """Median seconds of a whole iteration, wait and step."""
        return float(np.median(self.iteration_s))

    def __str__(self) -> str:
        return (f"data wait: {self.wait_fraction:.0%} of the loop's time (median wait "
                f"{fmt_time(self.median_wait_s)}, median step {fmt_time(self.median_step_s)} "
                f"without it, {self.steps} steps)")


def measure_data_wait(loader: Iterable, step_fn: Callable[[Any], Any], *,
                      steps: int | None = None, warmup_steps: int | None = None,
                      device: Any = None) -> DataWait:
    """Run a training loop and time, per step, the wait for its batch (``next`` plus the move to
    ``device`` when given) and the step. The warm-up and window are :func:`measure_loader`'s. On
    CUDA every clock reading waits for the device (the syncs keep loading from overlapping the
    GPU's last kernels), so the wait is no bound either way; on a CPU it is what the loop waited."""
    if not callable(step_fn):
        raise TypeError(f"step_fn must be a callable taking one batch, got {type(step_fn).__name__}.")
    sync = synchronizer(device)
    warmup, n_timed, by_default = _plan(loader, steps, warmup_steps, "steps")
    wait: list[float] = []
    step: list[float] = []
    it = iter(loader)
    pull = (b if device is None else move_to_device(b, device)
            for b in _batches(it, warmup, n_timed, steps, "steps"))
    try:
        for _, batch in zip(range(warmup), pull):
            step_fn(batch)
        sync()
        t0 = _now()
        for batch in pull:
            sync()
            t1 = _now()
            step_fn(batch)
            sync()
            wait.append(t1 - t0)
            t0 = _now()                 # the next wait starts as this step ends
            step.append(t0 - t1)
    finally:
        batch = pull = None
        stop_workers(it, loader)
    _check_window(len(step), len(step), warmup, by_default, "steps")
    return DataWait(wait_s=wait, step_s=step)
