"""How the tuner (lesson 06) measures: one setting's *window*, timed by the engine's
:func:`~course_utils.timing.measure_loader` with its warm-up rule, and :class:`SideBySide`, the
baselines measured with the same windows, consumer and score, rounds interleaved.

A window is a fresh epoch: its start-up (``iter`` to the first batch), the warm-up, N timed batches.
:class:`Timed` feeds each batch to the consumer before the next, copies it to the GPU, records each
start-up and stops its workers; :class:`Draws` makes an epoch the window's length (none in flight)."""
from __future__ import annotations

import gc
import signal
import statistics
import sys
import threading
import time
import traceback
import types
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, Sampler

from course_utils.checks import check_seconds
from course_utils.config import pick
from course_utils.data import CommonRecipeTransform
from course_utils.device import move_to_device
from course_utils.measurement import Comparison, Measurement, compare
from course_utils.pipelines import TransformedDataset, common_recipe_loader, recipe_process_settings
from course_utils.process_tree import stop_workers
from course_utils.start_methods import worker_timeout
from course_utils.timing import default_warmup, measure_loader

from .result import DEFAULTS_LABEL, RECIPE_LABEL, TUNED_LABEL, LoaderSettings

#: seconds a forked worker may take per batch, then a hung one raises (none elsewhere: worker_timeout)
WORKER_TIMEOUT_S = 120


class Draws(Sampler):
    """Shuffled passes over ``n`` indices, ``length`` per epoch (set so that a window ends it)."""

    def __init__(self, n: int) -> None:
        self.n, self.length = n, n

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        passes = max(1, -(-self.length // self.n))     # ceil(length / n) shuffled passes
        return iter(torch.cat([torch.randperm(self.n) for _ in range(passes)])[:self.length].tolist())


def drop_fd_sharer_resets(exc_type: type[BaseException], exc: BaseException,
                          tb: types.TracebackType | None) -> None:
    """``sys.excepthook`` in a tuner worker: multiprocessing's fd-sharing thread meets a closed
    connection once Ctrl-C ended the main process mid-handover; not news, so not printed."""
    if issubclass(exc_type, (ConnectionError, EOFError)) and any(
            frame.f_code.co_filename.endswith("resource_sharer.py") for frame, _ in traceback.walk_tb(tb)):
        return
    sys.__excepthook__(exc_type, exc, tb)


@dataclass
class QuietInit:
    """A worker_init_fn that leaves Ctrl-C (a terminal sends it to the whole process group) to the
    main process, which stops the workers; then runs ``fn``."""

    fn: Callable[[int], None] | None

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.excepthook = drop_fd_sharer_resets
        if self.fn is not None:
            self.fn(worker_id)


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Ctrl-C held back while workers start or stop, raised when the block ends: SIGINT is
    blocked in this thread (workers inherit the mask, through exec too), and in the main thread
    one delivered to another thread is only noted (a half-built iterator cannot be shut down)."""
    noted: list[bool] = []
    main = threading.current_thread() is threading.main_thread()
    old_handler = signal.signal(signal.SIGINT, lambda *_: noted.append(True)) if main else None
    blocking = hasattr(signal, "pthread_sigmask")   # not on Windows
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if blocking else None
    try:
        yield
    finally:
        if blocking:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)   # a pending SIGINT: noted
        if main:
            signal.signal(signal.SIGINT, old_handler)
            if noted and callable(old_handler):
                old_handler(signal.SIGINT, None)    # default_int_handler: KeyboardInterrupt


def rebuilt(loader: DataLoader) -> DataLoader:
    """``loader`` again with a :class:`Draws` sampler, a fork-only timeout, workers deaf to Ctrl-C."""
    kwargs: dict[str, Any] = dict(batch_size=loader.batch_size, num_workers=loader.num_workers,
                                  collate_fn=loader.collate_fn, pin_memory=loader.pin_memory)
    if loader.num_workers:
        context = loader.multiprocessing_context
        kwargs.update(worker_init_fn=QuietInit(loader.worker_init_fn), prefetch_factor=loader.prefetch_factor,
                      persistent_workers=loader.persistent_workers, multiprocessing_context=context,
                      timeout=loader.timeout or worker_timeout(WORKER_TIMEOUT_S, context))
    return DataLoader(loader.dataset, sampler=Draws(len(loader.dataset)), **kwargs)


class Timed:
    """A loader as a training loop sees it (module docstring); :meth:`close` stops its workers."""

    def __init__(self, loader: DataLoader, device: Any = None,
                 consumer: Callable[[Any], Any] | None = None) -> None:
        self._loader, self._device, self._consumer = loader, device, consumer
        self.startups: list[float] = []
        self._live: list[Any] = []   # held here, so stopped here: never by a __del__

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:  # num_workers, prefetch_factor, batch_size, ...
        return getattr(self.__dict__["_loader"], name)

    def end_epochs(self) -> None:
        """Stop the workers of every epoch started so far, except the iterator persistent
        workers reuse; a Ctrl-C meanwhile is raised once they are stopped."""
        with sigint_deferred():
            for inner in self._live:
                stop_workers(inner, self._loader)
            self._live = [i for i in self._live if i is self._loader._iterator]

    def __iter__(self) -> Iterator[Any]:
        self.end_epochs()
        with sigint_deferred():   # a Ctrl-C meanwhile is raised once `inner` is held
            t0 = time.perf_counter()
            inner = iter(self._loader)
            if inner not in self._live:
                self._live.append(inner)
        return self._epoch(inner, t0)

    def _epoch(self, inner: Any, t0: float) -> Iterator[Any]:
        for i, batch in enumerate(inner):
            if self._device is not None:
                batch = move_to_device(batch, self._device)
                torch.cuda.synchronize()
            if i == 0:
                self.startups.append(time.perf_counter() - t0)
            yield batch
            if self._consumer is not None:
                self._consumer(batch)      # the training step, before the next batch is pulled

    def close(self) -> None:
        """Shut down the workers of every iterator still alive, persistent ones included."""
        with sigint_deferred():
            for inner in [*self._live, self._loader._iterator]:
                stop_workers(inner)
            self._live.clear()
            self._loader._iterator = None


def measure_window(timed: Timed, batches: int, label: str) -> tuple[Measurement, float]:
    """One window of ``batches`` timed batches: its Measurement (seconds per window, consumer
    included) and start-up in seconds. Persistent workers start once first: the window sees their restart."""
    warm = default_warmup(timed)
    if timed.persistent_workers and timed._iterator is None:
        timed.sampler.length = warm * timed.batch_size
        for _ in timed:
            pass
    timed.sampler.length = (warm + batches) * timed.batch_size
    m = measure_loader(timed, batches=batches, repeats=1, label=label, progress=False)
    timed.end_epochs()      # its workers end now, not while another loader is measured
    return m, timed.startups[-1]


def pooled(parts: list[tuple[Measurement, float]], label: str) -> tuple[Measurement, float]:
    """The windows of one setting pooled: (their repeats as one Measurement, median start-up s)."""
    return Measurement.merge([m for m, _ in parts], label=label), statistics.median(s for _, s in parts)


def make_consumer(step_s: Any, step: Any) -> tuple[Callable[[Any], Any] | None, str]:
    """The consumer of each batch (a sleep of ``step_s`` seconds, or ``step(batch)``), described."""
    if step is not None and step_s is not None:
        raise ValueError("give step_s (seconds your training step takes per batch) or step (a "
                         "function called on each batch), not both.")
    if step is not None:
        if not callable(step):
            raise TypeError(f"step must be a function called on each batch (your training "
                            f"step), got {type(step).__name__}; or pass step_s=seconds.")
        return step, f"{getattr(step, '__name__', type(step).__name__)}(batch), called on each batch"
    seconds = 0.0 if step_s is None else check_seconds("step_s", step_s, "tune_loader")
    if not seconds:
        return None, "none: the loader alone (pass step_s or --step-ms: your training step)"
    return (lambda batch: time.sleep(seconds)), \
        f"a {seconds * 1e3:g} ms training step per batch (a sleep: a GPU step leaving the CPU free)"


def consumer_device(device: Any) -> str | None:
    """The CUDA device each batch is copied to ("auto": CUDA when available), or None (no copy)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else None
    if device is None or torch.device(device).type == "cpu":
        return None
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: the tuner copies batches to a CUDA device only, "
                         f"where torch.cuda.is_available(); pass device='auto' or None.")
    return device


class SideBySide:
    """DataLoader defaults, the common recipe and the tuned setting over the search's pipeline
    ``pipe``, one window per row per round; a note goes to ``notes`` when the recipe cannot run."""

    def __init__(self, pipe: Any, tuned: LoaderSettings, batch_size: int, notes: list[str]) -> None:
        self.entries: list[tuple[str, DataLoader, Callable[[], Any]]] = []
        if pipe.base is not None:
            recipe = common_recipe_loader(pipe.base, batch_size=batch_size, size=pipe.size)
            defaults = DataLoader(TransformedDataset(pipe.base, CommonRecipeTransform(pipe.size)),
                                  batch_size=batch_size, shuffle=True)
            self.entries += [(DEFAULTS_LABEL, defaults, nullcontext),
                             (RECIPE_LABEL, recipe, recipe_process_settings)]
        else:
            self.entries.append((DEFAULTS_LABEL, DataLoader(pipe.dataset, batch_size=batch_size,
                                                            shuffle=True), nullcontext))
            notes.append("the common recipe needs images as HxWx3 uint8 arrays (a JpegDataset "
                         "or ImageFolderDataset without a transform); compared with defaults only")
        self.entries.append((TUNED_LABEL, DataLoader(pipe.dataset, collate_fn=pipe.collate_fn,
                                                     **tuned.loader_kwargs()), nullcontext))
        self.settings = {label: LoaderSettings.of(loader) for label, loader, _ in self.entries}
        self.settings[TUNED_LABEL] = tuned
        self.runs: dict[str, list[tuple[Measurement, float]]] = {k: [] for k in self.settings}

    def measure(self, search: Any, min_batches: int) -> None:
        """Round 1 times ``min_batches`` batches per row (and its rate); later rounds give every row
        a window of the same seconds, sized to fit the rounds (two at least) in ``search``'s budget left."""
        rounds, t0 = pick(full=4, quick=3), search.elapsed()
        left_s, timed = max(0.0, search.budget_s - t0), {}
        try:
            timed.update((label, Timed(rebuilt(loader), search.device, search.consumer))
                         for label, loader, _ in self.entries)
            for r in range(rounds):
                window_s = 0.0
                if r:
                    spent_per_round = (search.elapsed() - t0) / r   # warm-ups, start-ups
                    if r >= 2 and left_s - (search.elapsed() - t0) < spent_per_round:
                        break
                    window_s = max(0.0, (left_s - (search.elapsed() - t0)) / (rounds - r)
                                   - spent_per_round) / len(self.entries)
                for label, _, context in self.entries:
                    t, parts = timed[label], self.runs[label]
                    rate = pooled(parts, label)[0].samples_per_s if parts else 0.0
                    batches = max(min_batches, round(window_s * rate / t.batch_size))
                    with context():
                        parts.append(measure_window(t, batches, label))
                    search.tick(f"side by side, round {r + 1}: {label}")
        finally:
            for t in timed.values():
                t.close()
            gc.collect()

    def summary(self) -> tuple[Comparison, dict[str, float]] | None:
        """(the rows' pooled windows, their median start-ups in seconds); None until each row has a window."""
        if not all(self.runs.values()):
            return None
        rows = {label: pooled(parts, label) for label, parts in self.runs.items()}
        return (compare([m for m, _ in rows.values()], baseline=RECIPE_LABEL if RECIPE_LABEL in rows else 0),
                {label: startup for label, (_, startup) in rows.items()})
