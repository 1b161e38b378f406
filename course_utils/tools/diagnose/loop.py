"""``diagnose MODULE:FUNCTION``: is a training loop handed over as ``(loader, step)`` waiting for data?

``FUNCTION()`` (from a file, ``train.py:make``, or a module, ``mypkg.train:make``) returns
``(loader, step)``. Within a wall-clock budget :func:`diagnose` times the real loop per step
(the wait in ``next`` and the step; the first ``num_workers x prefetch_factor`` steps, at most
half an epoch, are warm-up, since batches made ahead look free; on CUDA, synchronised, so the
wait is an upper bound), then the step alone and the loader alone. ``data-bound`` when the loop
waited more than :data:`DATA_BOUND_FRACTION` of its time; then it names likely causes and times
the cheap fixes on the same loop (a fix that timed no step is a note, not a suggestion). Every
loader it starts is shut down before it returns.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader

from course_utils.device import synchronizer
from course_utils.machine import usable_cpus
from course_utils.process_tree import stop_workers
from course_utils.start_methods import start_method
from course_utils.threads import make_worker_init
from course_utils.timing import batch_size_of, time_op

from .rules import DiagnoseError, loader_barely_faster, runs_own_pools, step_slowed, verdict

# The clock of time_loop. Tests replace this module attribute with a fake clock.
_now: Callable[[], float] = time.perf_counter


def load_target(target: str) -> Callable[[], Any]:
    """The function named by ``MODULE:FUNCTION`` (MODULE: a ``.py`` file or an importable
    module). A file is imported under its own name, so spawn/forkserver workers can import it."""
    module_name, sep, function_name = str(target).rpartition(":")
    if not sep or not module_name or not function_name:
        raise DiagnoseError(f"{target!r} is not MODULE:FUNCTION; pass e.g. train.py:make_loop "
                            f"or mypackage.train:make_loop.")
    path = Path(module_name).expanduser()
    try:
        if module_name.endswith(".py") or path.is_file():   # a folder is a package, not a file
            if not path.is_file():
                raise DiagnoseError(f"MODULE {module_name!r}: no such file; pass the path of your "
                                    f"training script, e.g. train.py:make_loop.")
            sys.path.insert(0, str(path.resolve().parent))
            module = importlib.import_module(path.stem)
        else:
            module = importlib.import_module(module_name)
    except DiagnoseError:
        raise
    except ModuleNotFoundError as exc:
        raise DiagnoseError(f"MODULE {module_name!r} cannot be imported ({exc}); pass a .py file "
                            f"or a module on sys.path.") from exc
    except Exception as exc:
        raise DiagnoseError(f"importing {module_name!r} raised {type(exc).__name__}: "
                            f"{_first_line(exc)}; fix the module first.") from exc
    function = getattr(module, function_name, None)
    if function is None:
        raise DiagnoseError(f"MODULE {module_name!r} has no {function_name!r}; define "
                            f"def {function_name}(): ... return loader, step.")
    if not callable(function):
        raise DiagnoseError(f"{target!r} is a {type(function).__name__}, not a function; it must "
                            f"return (loader, step).")
    return function


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def build_loop(function: Callable[[], Any], target: str = "FUNCTION") -> tuple[Any, Callable]:
    """Call ``function()`` and check it returned ``(loader, step)``."""
    try:
        made = function()
    except Exception as exc:
        raise DiagnoseError(f"{target}() raised {type(exc).__name__}: {_first_line(exc)}") from exc
    if not (isinstance(made, tuple) and len(made) == 2):
        raise DiagnoseError(f"{target}() must return (loader, step), got {type(made).__name__}"
                            f"{f' of length {len(made)}' if isinstance(made, (tuple, list)) else ''}.")
    loader, step = made
    if not hasattr(loader, "__iter__"):
        raise DiagnoseError(f"{target}() returned a {type(loader).__name__} as loader; it must be "
                            f"iterable (a torch.utils.data.DataLoader).")
    if not callable(step):
        raise DiagnoseError(f"{target}() returned a {type(step).__name__} as step; it must be a "
                            f"function step(batch) that runs one training step.")
    return loader, step


@dataclass
class LoopTiming:
    """One timed run of ``next`` + ``step``: seconds per timed step, after the warm-up."""

    label: str
    wait_s: list[float]
    step_s: list[float]
    samples: int
    startup_s: float
    warmup_steps: int
    worker_threads: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.step_s)

    @property
    def wait_fraction(self) -> float:
        """Time blocked in ``next`` over the whole loop time (wait + step)."""
        total = sum(self.wait_s) + sum(self.step_s)
        return sum(self.wait_s) / total if total > 0 else 0.0

    @property
    def seconds_per_step(self) -> float:
        """Mean loop time per step (wait + step), in seconds."""
        return (sum(self.wait_s) + sum(self.step_s)) / max(1, self.steps)

    @property
    def samples_per_s(self) -> float:
        total = sum(self.wait_s) + sum(self.step_s)
        return self.samples / total if total > 0 else 0.0

    def wait_tail_s(self) -> dict[str, float]:
        """p50 / p95 / p99 of the per-step wait, in seconds."""
        waits = np.asarray(self.wait_s) if self.wait_s else np.zeros(1)
        return {f"p{q}": float(np.percentile(waits, q)) for q in (50, 95, 99)}

    def to_dict(self) -> dict:
        return {"label": self.label, "steps": self.steps, "wait_fraction": self.wait_fraction,
                "seconds_per_step": self.seconds_per_step, "samples_per_s": self.samples_per_s,
                "startup_s": self.startup_s, "warmup_steps": self.warmup_steps,
                "wait_tail_s": self.wait_tail_s(), "worker_threads": self.worker_threads}



def _shutdown(it: Any, loader: Any) -> None:
    """Stop the iterator's workers. A persistent-workers loader keeps its iterator for the next
    ``iter()``, which cannot restart a shut one, so the loader forgets it too."""
    stop_workers(it)
    if getattr(loader, "_iterator", None) is it:
        loader._iterator = None


def _worker_threads(it: Any) -> list[int]:
    counts = []
    for worker in getattr(it, "_workers", []) or []:
        try:
            counts.append(psutil.Process(worker.pid).num_threads())
        except (psutil.Error, AttributeError, TypeError):
            pass
    return counts


def _call_step(step: Callable, batch: Any) -> None:
    try:
        step(batch)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        raise DiagnoseError(f"step(batch) raised {type(exc).__name__}: {_first_line(exc)}; "
                            f"fix your step function first.") from exc


def _next(it: Any, what: str) -> Any:
    try:
        return next(it)
    except (StopIteration, KeyboardInterrupt):
        raise
    except Exception as exc:
        lines, head = str(exc).strip().splitlines(), f"{type(exc).__name__}: "
        if len(lines) > 2 and lines[0].startswith("Caught "):   # a worker's error, its traceback
            found = [line[len(head):] for line in lines if line.startswith(head)]
            raise DiagnoseError(f"the {what} raised {lines[0][7:].rstrip('.')} while loading a "
                                f"batch: {found[-1] if found else lines[-1].strip()}") from exc
        raise DiagnoseError(f"the {what} raised {type(exc).__name__} while loading a batch: "
                            f"{_first_line(exc)}") from exc


def _first_batch(it: Any) -> Any:
    try:
        return _next(it, "loader")
    except StopIteration:
        raise DiagnoseError("the loader gave no batch (an empty dataset, or fewer samples than "
                            "one batch with drop_last=True); return a loader with data.") from None


def warmup_steps(loader: Any) -> int:
    """Untimed steps (batches) before :func:`time_loop` times any: the ``num_workers x
    prefetch_factor`` batches the workers make ahead (they would look free), at least 1; when
    ``len(loader)`` is known, at most half an epoch, so an epoch still has steps to time."""
    warmup = max(1, (getattr(loader, "num_workers", 0) or 0)
                 * (getattr(loader, "prefetch_factor", None) or 2))
    try:
        batches = len(loader)
    except (TypeError, NotImplementedError):   # an IterableDataset's loader may have no length
        return warmup
    return max(1, min(warmup, batches // 2))


def time_loop(loader: Any, step: Callable | None, *, max_steps: int, seconds: float,
              label: str, tick: Callable[[], None] | None = None) -> LoopTiming:
    """Run ``step(batch)`` then ``next`` (only ``next`` when ``step`` is None) for at most
    ``max_steps`` timed steps or ``seconds`` of wall clock from the first batch; a new epoch
    starts if the loader ends. The first :func:`warmup_steps` steps are warm-up, not timed: the
    batches the workers made ahead, capped at half an epoch. Per timed step, in seconds: the
    step (synchronised on CUDA) and the wait in ``next`` for the following batch. ``loader`` may
    be any iterable; its ``num_workers``, ``prefetch_factor`` and ``len`` are used if it has them."""
    warmup = warmup_steps(loader)
    wait: list[float] = []
    stepped: list[float] = []
    samples, threads = 0, []
    t_start = _now()
    it = iter(loader)
    try:
        batch = _first_batch(it)
        arrived = _now()
        startup, deadline = arrived - t_start, arrived + seconds
        done = 0
        while len(stepped) < max_steps and _now() < deadline:
            if step is not None:
                _call_step(step, batch)
                synchronizer(None)()   # asked each step: the step may be what initialises CUDA
            t0 = _now()
            counted = done >= warmup
            if counted:
                stepped.append(t0 - arrived)
                samples += batch_size_of(batch)
            if done == warmup:
                threads = _worker_threads(it)
            try:
                batch = _next(it, "loader")
            except StopIteration:       # a new epoch; persistent workers carry on
                if not getattr(loader, "persistent_workers", False):
                    _shutdown(it, loader)
                it = iter(loader)
                batch = _next(it, "loader")
            arrived = _now()
            if counted:
                wait.append(arrived - t0)
            done += 1
            if tick is not None:
                tick()
    finally:
        _shutdown(it, loader)
        del it
    return LoopTiming(label, wait, stepped, samples, startup, warmup, threads)


def time_step_alone(step: Callable, batch: Any, *, repeats: int) -> float:
    """Median seconds of ``step(batch)`` on one cached batch: the step without any data wait
    (wall clock; on CUDA, synchronised like the loop)."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    times = time_op(lambda: _call_step(step, batch), device="cuda" if cuda else "cpu",
                    repeats=repeats, events=False)
    return statistics.median(times)


class _Chained:
    """A picklable ``worker_init_fn`` that runs the learner's, then limits every pool to 1."""

    def __init__(self, first: Callable | None) -> None:
        self.first, self.limit = first, make_worker_init(1)

    def __call__(self, worker_id: int) -> None:
        if self.first is not None:
            self.first(worker_id)
        self.limit(worker_id)


def rebuild(loader: DataLoader, **changes: Any) -> DataLoader:
    """A new DataLoader over the same dataset, sampler and collate function, with ``changes``."""
    keys = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
            "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers")
    kwargs = {k: getattr(loader, k) for k in keys if hasattr(loader, k)}
    kwargs["batch_sampler"] = loader.batch_sampler
    if getattr(loader, "in_order", True) is False:
        kwargs["in_order"] = False
    kwargs.update(changes)
    if kwargs.get("num_workers", 0) == 0:
        kwargs.update(prefetch_factor=None, persistent_workers=False, timeout=0,
                      multiprocessing_context=None, worker_init_fn=None)
    elif kwargs.get("prefetch_factor") is None:
        kwargs["prefetch_factor"] = 2
    return DataLoader(loader.dataset, **kwargs)


@dataclass
class Diagnosis:
    """What :func:`diagnose` measured and concluded (all times in seconds)."""

    target: str
    verdict: str
    loop: LoopTiming
    step_alone_s: float
    loader_alone: LoopTiming
    start_method: str
    causes: list[str]
    suggestions: list[dict]
    notes: list[str]

    @property
    def data_wait_fraction(self) -> float:
        return self.loop.wait_fraction

    def to_dict(self) -> dict:
        return {"target": self.target, "verdict": self.verdict,
                "data_wait_fraction": self.data_wait_fraction,
                "seconds_per_step_with_data": self.loop.seconds_per_step,
                "seconds_per_step_without_data": self.step_alone_s,
                "loader_samples_per_s": self.loader_alone.samples_per_s,
                "startup_s": self.loop.startup_s, "wait_tail_s": self.loop.wait_tail_s(),
                "worker_threads": self.loop.worker_threads, "start_method": self.start_method,
                "causes": self.causes, "suggestions": self.suggestions, "notes": self.notes,
                "loop": self.loop.to_dict(), "loader_alone": self.loader_alone.to_dict()}

    def __str__(self) -> str:
        tail = self.loop.wait_tail_s()
        ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
        lines = [f"diagnose {self.target}: {self.verdict.upper()}",
                 f"  data wait:      {self.data_wait_fraction:.0%} of the loop's time "
                 f"({self.loop.steps} timed steps after {self.loop.warmup_steps} warm-up)",
                 f"  wait per step:  p50 {ms(tail['p50'])}, p95 {ms(tail['p95'])}, p99 {ms(tail['p99'])}",
                 f"  loop:           {ms(self.loop.seconds_per_step)} per step = wait "
                 f"{ms(sum(self.loop.wait_s) / max(1, self.loop.steps))} + step "
                 f"{ms(sum(self.loop.step_s) / max(1, self.loop.steps))} (means)",
                 f"  step alone:     {ms(self.step_alone_s)} on a cached batch (median)",
                 f"  loader alone:   {self.loader_alone.samples_per_s:,.0f} samples/s; the loop used "
                 f"{self.loop.samples_per_s:,.0f} samples/s",
                 f"  start-up:       {self.loop.startup_s:.2f} s to the first batch; start method "
                 f"{self.start_method}",
                 f"  worker threads: {self.loop.worker_threads or 'no worker processes'}"]
        if self.causes:
            lines += ["likely causes:"] + [f"  - {c}" for c in self.causes]
        if self.suggestions:
            lines.append("cheap fixes, measured on the same loop in this run:")
            for s in self.suggestions:
                lines.append(f"  - {s['change']:<32} {s['seconds_per_step'] * 1e3:8.1f} ms/step, "
                             f"data wait {s['data_wait_fraction']:.0%}: {s['gain']:.2f}x the loop's speed")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _float_per_sample(batch: Any) -> str | None:
    images = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if torch.is_tensor(images) and images.dtype == torch.float32 and images.dim() == 4:
        mb = images.element_size() * images.nelement() / 1e6
        return (f"float32 batches from the workers ({mb:.1f} MB each); uint8 until the device would "
                f"move {mb / 4:.1f} MB (lesson 01)")
    return None


def _method_of(loader: Any) -> str:
    ctx = getattr(loader, "multiprocessing_context", None)
    if ctx is not None:
        return ctx if isinstance(ctx, str) else ctx.get_start_method()
    return start_method() if getattr(loader, "num_workers", 0) else "no workers (main process)"


def _fixes(loader: Any, loop: LoopTiming, cuda: bool) -> list[tuple[str, dict]]:
    if not isinstance(loader, DataLoader):
        return []
    workers, usable = loader.num_workers, usable_cpus()
    fixes = []
    for more in sorted({max(1, workers * 2), usable} - {workers}):
        if workers < more <= 2 * usable:
            fixes.append((f"num_workers={more}", {"num_workers": more}))
    if workers and runs_own_pools(loop.worker_threads):
        fixes.append(("worker_init_fn limits pools to 1", {"worker_init_fn": _Chained(loader.worker_init_fn)}))
    if cuda and not loader.pin_memory:
        fixes.append(("pin_memory=True", {"pin_memory": True}))
    return fixes[:3]


def _suggestion(change: str, loop: LoopTiming, fixed: LoopTiming) -> dict | None:
    """The measured fix (seconds per step, wait fraction, and ``gain``: the loop's seconds per
    step over the fix's), or None when the fix timed no step or a figure is not finite."""
    if not fixed.steps or not fixed.seconds_per_step > 0:
        return None
    found = {"change": change, "seconds_per_step": fixed.seconds_per_step,
             "data_wait_fraction": fixed.wait_fraction,
             "gain": loop.seconds_per_step / fixed.seconds_per_step}
    return found if all(math.isfinite(v) for v in found.values() if isinstance(v, float)) else None


def _step_slowdown(change: str, loop: LoopTiming, fixed: LoopTiming) -> str | None:
    """A note when the step itself (mean seconds, no wait) was slowed by the fix
    (:func:`step_slowed`)."""
    base_step, fixed_step = (sum(t.step_s) / max(1, t.steps) for t in (loop, fixed))
    if not (loop.steps and fixed.steps and step_slowed(base_step, fixed_step)):
        return None
    return (f"with {change} the step itself took {fixed_step / base_step:.1f}x as long "
            f"({base_step * 1e3:.1f} -> {fixed_step * 1e3:.1f} ms): the workers and the "
            f"step's threads share {usable_cpus()} CPUs (lesson 02)")


def diagnose(loader: Any, step: Callable, *, budget_s: float = 60.0, max_steps: int = 200,
             target: str = "loop", progress: bool = True) -> Diagnosis:
    """Measure the loop, give a verdict and try the cheap fixes (module docstring)."""
    from tqdm.auto import tqdm   # a progress bar only when diagnose runs
    bar = tqdm(total=None, desc="diagnose", unit="step", disable=not progress, leave=False)
    try:
        t_end = time.perf_counter() + budget_s
        loop = time_loop(loader, step, max_steps=max_steps, seconds=0.4 * budget_s,
                         label="your loop", tick=bar.update)
        first = _first_batch(iter(rebuild(loader, num_workers=0) if isinstance(loader, DataLoader)
                                  else loader))
        step_alone = time_step_alone(step, first, repeats=min(10, max(3, loop.steps // 4)))
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        alone = time_loop(loader, None, max_steps=max_steps, seconds=0.15 * budget_s,
                          label="loader alone", tick=bar.update)
        bound = verdict(loop.wait_fraction)
        causes, notes, suggestions = [], [], []
        if cuda:
            notes.append("CUDA: the device was synchronised around each step, so the wait fraction "
                         "is an upper bound (lesson 08 measures it without forced syncs).")
        if bound == "data-bound":
            workers = getattr(loader, "num_workers", 0)
            if workers < usable_cpus():
                causes.append(f"too few workers: num_workers={workers} on {usable_cpus()} usable CPUs")
            if runs_own_pools(loop.worker_threads):
                causes.append(f"thread pools inside the workers: {max(loop.worker_threads)} OS threads "
                              f"in a worker (oversubscription, lesson 02)")
            if (reason := _float_per_sample(first)) is not None:
                causes.append(reason)
            if loader_barely_faster(alone.samples_per_s, loop.samples_per_s):
                causes.append("the loader alone is barely faster than the loop: decode/augment-bound "
                              "(reduced-size decode, fewer bytes, lessons 01 and 03)")
            if cuda and not getattr(loader, "pin_memory", True):
                causes.append("unpinned memory: the copy to the GPU cannot overlap (lesson 04)")
            if workers and not getattr(loader, "persistent_workers", True):
                causes.append(f"start-up per epoch: {loop.startup_s:.2f} s each epoch without "
                              f"persistent_workers=True (lesson 03)")
            for change, kwargs in _fixes(loader, loop, cuda):
                left = t_end - time.perf_counter()
                if left < 1:
                    notes.append(f"not tried (budget spent): {change}")
                    continue
                slice_s = min(left, 0.15 * budget_s)
                fixed = time_loop(rebuild(loader, **kwargs), step, max_steps=max_steps,
                                  seconds=slice_s, label=change, tick=bar.update)
                suggestion = _suggestion(change, loop, fixed)
                if suggestion is None:
                    notes.append(f"not measured: {change} timed no step in {slice_s:.1f} s "
                                 f"({fixed.warmup_steps} warm-up batches)" if not fixed.steps else
                                 f"not measured: {change} gave no finite time per step")
                    continue
                if (slower := _step_slowdown(change, loop, fixed)) is not None:
                    notes.append(slower)
                suggestions.append(suggestion)
        return Diagnosis(target, bound, loop, step_alone, alone, _method_of(loader), causes,
                         suggestions, notes)
    finally:
        bar.close()
        for child in multiprocessing.active_children():   # nothing of ours outlives diagnose
            child.join(timeout=5)

