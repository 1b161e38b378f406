"""Tune a DataLoader on this machine within a time budget (lesson 06).

:func:`tune_loader` searches the loader settings that matter — ``num_workers``, ``batch_size``,
``prefetch_factor``, ``persistent_workers``, ``pin_memory`` (only where CUDA exists) and the
thread limit per worker — with a **coordinate search** whose structure is fixed, then measures
the best settings found side by side with the common recipe and with DataLoader defaults.

The search, in order (each stage starts from the best settings found so far):

1. ``num_workers``: a ladder 0, 1, 2, ... up to twice the usable CPUs. It stops climbing once it
   falls: :data:`LADDER_FALLS` rungs in a row below :data:`LADDER_FALL_FRACTION` of the best
   rung so far (two, because one worker is often slower than none before two are faster).
2. ``batch_size``: a ladder of doublings up from the starting batch size, then halvings down;
   each direction stops at the first rung below :data:`LADDER_FALL_FRACTION` of the best.
3. ``prefetch_factor`` (1, then 4; 2 is the default already measured) and
   ``persistent_workers=True`` — only when the best has workers.
4. ``pin_memory=True`` — only where CUDA exists (there, every trial also copies each batch to
   the GPU, since pinning only pays off in that copy); then more threads per worker, only where
   ``num_workers x threads`` still fits in the usable CPUs.

What one trial measures (with :func:`~course_utils.bench.measure_loader`): a short **probe**
window (:data:`PROBE_FRACTION` of a full window) and, unless the probe's score is below
:data:`PROBE_THRESHOLD` of the best score so far (early stopping: a hopeless setting is not
timed fully), a full window; each window starts after an untimed warm-up. It also records the
**start-up**: seconds from ``iter(loader)`` to the first batch (fresh workers, or for
``persistent_workers`` the restart of the living ones at the second epoch).

The **score** is samples per second over one epoch of the dataset, start-up included:
``epoch_samples / (startup + (epoch_samples - batch_size) / steady samples/s)``. It is what a
training epoch sees: ``persistent_workers`` only shows its worth here, and for a big dataset the
score tends to the steady rate. CPU seconds per sample (whole process tree) come from the same
measurements.

The budget (seconds, wall time) covers everything: the search gets ``1 - COMPARE_SHARE`` of it
and the comparison the rest. A trial starts only when its estimated time (from the rates
measured so far) fits in what is left of the search budget, so the search overruns by at most
one trial's estimation error; every window is a bounded number of batches and every worker has a
``timeout``. What the budget did not reach is listed in :attr:`TuningResult.not_tried`.

Nothing happens at import time.
"""
from __future__ import annotations

import gc
import math
import multiprocessing
import numbers
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from .bench import Comparison, Measurement, compare, measure_loader
from .device import move_to_device
from .config import pick
from .data import CommonRecipeTransform, ImageFolderDataset, JpegDataset, ToTensorUint8
from .machine import machine_summary, start_method, usable_cpus
from .pipelines import (BatchedJpegDataset, TransformedDataset, common_recipe_loader, keep_batch,
                        common_recipe_process_settings)
from .scaling import default_worker_counts
from .tuning_result import (COMPARE_SHARE, DEFAULTS_LABEL, LADDER_FALL_FRACTION, LADDER_FALLS, PROBE_FRACTION, PROBE_THRESHOLD, RECIPE_LABEL, TUNED_LABEL, LoaderSettings, Trial, TuningResult)

__all__ = [
    "LoaderSettings",
    "Trial",
    "TuningResult",
    "tune_loader",
    "PROBE_FRACTION",
    "PROBE_THRESHOLD",
    "LADDER_FALL_FRACTION",
    "LADDER_FALLS",
    "COMPARE_SHARE",
    "MIN_BUDGET_S",
    "MIN_FOLDER_IMAGES",
]

#: smallest budget that can try anything (the first trial starts workers-free, a few batches)
MIN_BUDGET_S = 2.0
#: a folder needs this many readable images (the smallest batch size the ladder tries)
MIN_FOLDER_IMAGES = 8
#: seconds a DataLoader waits for one batch from a worker before it gives up (a hung worker)
WORKER_TIMEOUT_S = 120


# --------------------------------------------------------------------------------------
# the pipeline being tuned
# --------------------------------------------------------------------------------------

@dataclass
class _Pipeline:
    dataset: Dataset                 # what the DataLoader reads
    collate_fn: Callable | None      # None: the default collate
    base: Dataset | None             # images as HxWx3 uint8 (for the recipe/defaults), or None
    description: str
    code_dataset: str                # Python expression of the dataset in the pasted code
    code_imports: list[str]
    size: int
    notes: list[str] = field(default_factory=list)   # e.g. damaged files skipped


def _check_size(size: Any) -> int:
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or not 1 <= size <= 8192:
        raise ValueError(f"size must be an int from 1 to 8192 (pixels of the square output "
                         f"image), got {size!r}; pass e.g. size=224.")
    return int(size)


def folder_for_tuning(data: ImageFolderDataset, where: str) -> ImageFolderDataset:
    """``data`` with its damaged files left out (checked once, unless that was done already);
    a ValueError naming ``where`` when fewer than :data:`MIN_FOLDER_IMAGES` images remain."""
    if not data.checked:
        data = ImageFolderDataset(data.root, extensions=data.extensions,
                                  skip_damaged=True).with_transform(data.transform)
    if len(data) < MIN_FOLDER_IMAGES:
        damaged = f" ({data.damaged_summary()})" if data.damaged else ""
        raise ValueError(f"{where}: only {len(data)} readable image(s){damaged}; the tuner needs "
                         f"at least {MIN_FOLDER_IMAGES} (one batch of the smallest batch size it "
                         f"tries). Add images or replace the damaged ones.")
    return data


def _pipeline(data: Any, size: int, n_images: int | None, progress: bool = True) -> _Pipeline:
    imports = ["from torch.utils.data import DataLoader"]
    if data is None:
        data = JpegDataset(n=pick(full=2000, quick=200) if n_images is None else n_images,
                           progress=None if progress else False)
    elif isinstance(data, (str, os.PathLike)):
        path = Path(data).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"data={str(data)!r}: no such folder; pass the folder that "
                                    f"holds your images (or data=None for the course data).")
        if not path.is_dir():
            raise NotADirectoryError(f"data={str(data)!r} is a file, not a folder; pass the "
                                     f"folder that holds your images.")
        data = ImageFolderDataset(path, skip_damaged=True)
    notes: list[str] = []
    if isinstance(data, ImageFolderDataset):
        data = folder_for_tuning(data, f"data={str(data.root)!r}")
        if data.damaged:
            notes.append(f"{data.damaged_summary()}; they were left out")
    if isinstance(data, JpegDataset) and data.transform is None:
        return _Pipeline(BatchedJpegDataset(data, size), keep_batch, data, data.describe(),
                         f"BatchedJpegDataset(dataset, size={size})",
                         imports + ["from course_utils import keep_batch, make_worker_init",
                                    "from course_utils.pipelines import BatchedJpegDataset"],
                         size)
    if isinstance(data, ImageFolderDataset) and data.transform is None:
        skip = ", skip_damaged=True" if data.damaged else ""
        return _Pipeline(data.with_transform(ToTensorUint8(size)), None, data, data.describe(),
                         f"ImageFolderDataset({str(data.root)!r}, "
                         f"transform=ToTensorUint8({size}){skip})",
                         imports + ["from course_utils import ToTensorUint8, make_worker_init",
                                    "from course_utils.data import ImageFolderDataset"], size, notes)
    if isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        describe = getattr(data, "describe", None)
        text = describe() if callable(describe) else f"{type(data).__name__} of {len(data)} items"
        return _Pipeline(data, None, None, text, "dataset",
                         imports + ["from course_utils import make_worker_init"], size, notes)
    raise TypeError(f"data must be None (the course's JPEG dataset), a folder of images (str or "
                    f"Path), a JpegDataset, an ImageFolderDataset or a map-style Dataset; got "
                    f"{type(data).__name__}.")


def _loader(dataset: Dataset, s: LoaderSettings, collate_fn: Callable | None,
            samples: int) -> DataLoader:
    """A DataLoader with settings ``s`` whose every epoch draws at least ``samples`` samples
    (a RandomSampler runs through several shuffles of a small dataset), so a window of any
    length fits in one epoch; the time per batch is what ``shuffle=True`` would give."""
    kwargs = s.loader_kwargs()
    kwargs.pop("shuffle")
    sampler = RandomSampler(dataset, num_samples=max(len(dataset), int(samples)))
    return DataLoader(dataset, sampler=sampler, collate_fn=collate_fn,
                      timeout=WORKER_TIMEOUT_S if s.num_workers else 0, **kwargs)


def _resampled(loader: DataLoader, samples: int) -> DataLoader:
    """The same DataLoader (dataset, batch size, workers, collate, pinning, worker init,
    prefetch, persistence, start method), with a RandomSampler drawing ``samples`` per epoch."""
    kwargs: dict[str, Any] = dict(batch_size=loader.batch_size, num_workers=loader.num_workers,
                                  collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                                  drop_last=loader.drop_last)
    if loader.num_workers:
        kwargs.update(worker_init_fn=loader.worker_init_fn,
                      prefetch_factor=loader.prefetch_factor,
                      persistent_workers=loader.persistent_workers,
                      multiprocessing_context=loader.multiprocessing_context,
                      timeout=loader.timeout or WORKER_TIMEOUT_S)
    sampler = RandomSampler(loader.dataset, num_samples=max(len(loader.dataset), int(samples)))
    return DataLoader(loader.dataset, sampler=sampler, **kwargs)


class _Timed:
    """A loader seen through a proxy that records the start-up of every epoch and, when
    ``device`` is given, copies each batch there (synchronised, so the copy is in the time)."""

    def __init__(self, loader: DataLoader, device: Any = None) -> None:
        self._loader = loader
        self._device = device
        self.startups: list[float] = []

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:  # num_workers, prefetch_factor, batch_size, ...
        return getattr(self.__dict__["_loader"], name)

    def __iter__(self) -> "_TimedIter":
        t0 = time.perf_counter()
        return _TimedIter(self, iter(self._loader), t0)


class _TimedIter:
    def __init__(self, owner: _Timed, inner: Any, t0: float) -> None:
        self.owner, self.inner, self.t0, self.first = owner, inner, t0, True

    def __iter__(self) -> "_TimedIter":
        return self

    def __next__(self) -> Any:
        batch = next(self.inner)
        if self.owner._device is not None:
            batch = move_to_device(batch, self.owner._device)
            torch.cuda.synchronize()
        if self.first:
            self.owner.startups.append(time.perf_counter() - self.t0)
            self.first = False
        return batch


# --------------------------------------------------------------------------------------
# the search
# --------------------------------------------------------------------------------------

def _check_budget(budget_s: Any) -> float:
    if isinstance(budget_s, bool) or not isinstance(budget_s, numbers.Real) \
            or not math.isfinite(budget_s):
        raise TypeError(f"budget_s must be a number of seconds, got {budget_s!r}; pass e.g. "
                        f"budget_s=60.")
    if budget_s <= 0:
        raise ValueError(f"budget_s={budget_s!r} must be more than 0 seconds; pass e.g. "
                         f"budget_s=60.")
    if budget_s < MIN_BUDGET_S:
        raise ValueError(f"budget_s={budget_s!r} is too small to try anything (the first trial "
                         f"alone needs about {MIN_BUDGET_S:g} s); pass budget_s >= "
                         f"{MIN_BUDGET_S:g}, e.g. 60.")
    return float(budget_s)


def _check_int_list(name: str, values: Any, lo: int) -> list[int] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list of ints, got {values!r}; pass e.g. {name}=[0, 1, 2].")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
            raise ValueError(f"{name} must hold ints >= {lo}, got {values!r}.")
        out.append(int(v))
    if not out:
        raise ValueError(f"{name} is empty; pass at least one value, or None for the default.")
    return sorted(set(out))


class _Search:
    """The state of one tuning run (kept out of the public API)."""

    def __init__(self, pipe: _Pipeline, *, budget_s: float, search_s: float, epoch_samples: int,
                 device: Any, progress: bool) -> None:
        self.pipe, self.budget_s, self.search_s = pipe, budget_s, search_s
        self.epoch_samples, self.device = epoch_samples, device
        self.t_start = time.perf_counter()
        self.trials: list[Trial] = []
        self.tried: dict[LoaderSettings, Trial] = {}
        self.not_tried: list[str] = []
        self.skipped: list[str] = []
        self.out_of_budget = False
        self.trial_s = min(8.0, max(0.3, search_s / 16))
        self.rate_est: float | None = None      # steady samples/s, best so far
        self.startup_est = 0.5
        from tqdm.auto import tqdm

        self.bar = tqdm(total=round(budget_s, 1), disable=not progress, desc="tuning",
                        unit="s", bar_format="{desc}: {n:.0f}/{total:.0f} s |{bar}| {postfix}")

    # -- time --------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def _tick(self, text: str) -> None:
        self.bar.n = min(self.bar.total, round(self.elapsed(), 1))
        self.bar.set_postfix_str(text[:60], refresh=False)
        self.bar.refresh()

    # -- one trial ---------------------------------------------------------------------
    @property
    def best_trial(self) -> Trial | None:
        full = [t for t in self.trials if t.complete and t.score is not None]
        return max(full, key=lambda t: t.score) if full else None

    def _score(self, rate: float, startup: float, batch_size: int) -> float:
        rest = max(0, self.epoch_samples - batch_size)
        return self.epoch_samples / (startup + rest / rate) if rate > 0 else 0.0

    def _plan(self, s: LoaderSettings) -> tuple[int, int, int]:
        """(warm-up, probe, full) batches for ``s``: the warm-up covers every batch the workers
        hold in flight; the full window lasts about ``trial_s`` at the best rate so far."""
        warm = max(2, s.num_workers * (s.prefetch_factor or 2))
        if self.rate_est is None:   # the first trial calibrates: a few batches
            return warm, 2, 4
        full = max(2, round(self.rate_est * self.trial_s / s.batch_size))
        return warm, max(1, round(PROBE_FRACTION * full)), full

    def estimate_s(self, s: LoaderSettings, plan: tuple[int, int, int]) -> float:
        warm, probe, full = plan
        if self.rate_est is None:
            return 1.0
        startup = self.startup_est if s.num_workers else 0.0
        if s.multiprocessing_context in ("forkserver", "spawn"):
            startup = max(startup, 3.0)
        return 2 * startup + (2 * warm + probe + full) * s.batch_size / self.rate_est

    def run(self, stage: str, s: LoaderSettings) -> Trial | None:
        """Try ``s`` (once); None when it was tried before, or the budget does not allow it."""
        if s in self.tried:
            return self.tried[s]
        if self.out_of_budget:
            self.not_tried.append(f"{stage}: {s.label()}")
            return None
        plan = self._plan(s)
        left = self.search_s - self.elapsed()
        if self.trials and (left <= 0 or self.estimate_s(s, plan) > left):
            self.out_of_budget = True
            self.not_tried.append(f"{stage}: {s.label()}")
            return None
        warm, probe, full = plan
        loader = _loader(self.pipe.dataset, s, self.pipe.collate_fn,
                         (warm + max(probe, full)) * s.batch_size)
        timed = _Timed(loader, self.device)
        t0 = time.perf_counter()
        trial = Trial(len(self.trials) + 1, stage, s, "full")
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*pin_memory.*")
                warnings.filterwarnings("ignore", message="This DataLoader will create")
                if s.persistent_workers:   # start the workers once: the probe sees epoch 2
                    first = iter(timed)
                    next(first)
                    del first
                m1 = measure_loader(timed, batches=probe, warmup_batches=warm, repeats=1,
                                    label=s.label(), progress=False)
                score1 = self._score(m1.samples_per_s, timed.startups[-1], s.batch_size)
                best = self.best_trial
                if best is not None and score1 < PROBE_THRESHOLD * best.score:
                    trial.status, measurement = "stopped after probe", m1
                else:
                    m2 = measure_loader(timed, batches=full, warmup_batches=warm, repeats=1,
                                        label=s.label(), progress=False)
                    measurement = Measurement.merge([m1, m2])
            trial.measurement = measurement
            trial.startup_s = timed.startups[-1]
            trial.score = self._score(measurement.samples_per_s, trial.startup_s, s.batch_size)
        except Exception as exc:  # one broken setting must not end the search
            if not self.trials:
                raise
            trial.status = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        finally:
            del timed, loader
            gc.collect()   # ends persistent workers now, not during the next trial
        trial.seconds = time.perf_counter() - t0
        self.trials.append(trial)
        self.tried[s] = trial
        if trial.measurement is not None:
            rate = trial.measurement.samples_per_s
            self.rate_est = rate if self.rate_est is None else max(self.rate_est, rate)
            if s.num_workers and trial.startup_s is not None and not s.persistent_workers:
                self.startup_est = max(self.startup_est * 0.5, trial.startup_s)
        best = self.best_trial
        self._tick(f"best {best.settings.label()}: {best.score:,.0f}/s" if best else "")
        return trial

    def ladder(self, stage: str, start: LoaderSettings, key: str, values: Sequence[int],
               falls_to_stop: int) -> None:
        """Try ``start`` with ``key`` set to each value in order; stop once the ladder falls."""
        ladder_best: float | None = None
        falls = 0
        for v in values:
            t = self.run(stage, start.replace(**{key: v}))
            if t is None or t.score is None:
                continue
            if ladder_best is None or t.score > ladder_best:
                ladder_best, falls = t.score, 0
            elif t.score < LADDER_FALL_FRACTION * ladder_best or not t.complete:
                falls += 1
                if falls >= falls_to_stop:
                    rest = [x for x in values if (x > v if values[-1] > values[0] else x < v)]
                    if rest:
                        self.skipped.append(
                            f"{stage}: {key} in {rest} (below {LADDER_FALL_FRACTION:.0%} "
                            f"of the ladder's best {falls} time(s) in a row, the last at "
                            f"{key}={v})")
                    return
            else:
                falls = 0

    def best_settings(self, fallback: LoaderSettings) -> LoaderSettings:
        best = self.best_trial
        return fallback if best is None else best.settings


def _interleaved_comparison(entries: list[tuple[str, DataLoader, Any]], left_s: float,
                            rounds: int, device: Any, clock: Callable[[], float]) -> Comparison:
    """Measure each (label, loader, context manager class) once per round, rounds interleaved.

    Round 1 times 2 batches of each loader after its own warm-up (every batch the workers hold
    in flight) and gives each loader's rate; the later rounds give every loader a window of the
    same length in seconds, sized so that all rounds fit in ``left_s`` (at least one batch)."""
    t0 = clock()
    runs: dict[str, list[Measurement]] = {label: [] for label, _, _ in entries}
    loaders = {}
    for label, loader, _ in entries:
        warm = max(2, loader.num_workers * (loader.prefetch_factor or 2))
        loaders[label] = (warm, _resampled(loader, 10**7))
    for r in range(rounds):
        if r == 0:
            window_s = 0.0
        else:
            spent_per_round = (clock() - t0) / r   # warm-ups and start-ups, mostly
            if r >= 2 and left_s - (clock() - t0) < spent_per_round:
                break   # two rounds at least (interleaved); more only while the budget lasts
            window_s = max(0.0, (left_s - (clock() - t0)) / (rounds - r) - spent_per_round)
            window_s /= len(entries)
        for label, _, context in entries:
            warm, loader = loaders[label]
            rate = runs[label][0].samples_per_s if runs[label] else 0.0
            batches = max(2 if r == 0 else 1, round(window_s * rate / loader.batch_size))
            with context():
                runs[label].append(measure_loader(
                    _Timed(loader, device), batches=batches, warmup_batches=warm, repeats=1,
                    label=label, progress=False))
    merged = [Measurement.merge(runs[label], label=label) for label, _, _ in entries]
    labels = [label for label, _, _ in entries]
    return compare(merged, baseline=RECIPE_LABEL if RECIPE_LABEL in labels else 0)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def tune_loader(data: Any = None, *, budget_s: float = 60.0, batch_size: int | None = None,
                size: int = 224, worker_counts: Sequence[int] | None = None,
                batch_sizes: Sequence[int] | None = None, epoch_samples: int | None = None,
                n_images: int | None = None, compare_with_baselines: bool = True,
                device: Any = "auto", progress: bool = True) -> TuningResult:
    """Find fast DataLoader settings for ``data`` on this machine within ``budget_s`` seconds.

    ``data``: None (the course's JPEG dataset, ``n_images`` images), a folder of your own images
    (str or Path; read with :class:`~course_utils.data.ImageFolderDataset`), a
    :class:`~course_utils.data.JpegDataset` or ImageFolderDataset (decoded, resized to
    ``size`` x ``size`` and kept uint8: batched fetching for JpegDataset), or any map-style
    Dataset (used as it is).

    ``batch_size``: where the batch-size ladder starts (default 64, quick mode 32); the
    recipe and the defaults are measured with it. ``batch_sizes``: the batch sizes to try
    (default: doublings and halvings of ``batch_size`` from 8 to 512; pass ``[batch_size]`` to
    keep it fixed, e.g. when your model needs it). ``worker_counts``: the num_workers ladder
    (default 0 .. 2 x usable CPUs). ``epoch_samples``: the epoch length the score assumes
    (default: the dataset's length). ``device``: "auto" (CUDA when available: batches are
    copied there and ``pin_memory`` is tried), None/"cpu" (no copy, no pin_memory), or a device.

    The search and its early stopping are described in the module docstring. Returns a
    :class:`TuningResult`.
    """
    budget_s = _check_budget(budget_s)
    size = _check_size(size)
    if batch_size is None:
        batch_size = pick(full=64, quick=32)
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) \
            or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}; pass e.g. "
                         f"batch_size=64.")
    batch_size = int(batch_size)
    worker_counts = _check_int_list("worker_counts", worker_counts, 0)
    batch_sizes = _check_int_list("batch_sizes", batch_sizes, 1)
    if n_images is not None and (isinstance(n_images, bool) or not isinstance(n_images, numbers.Integral)
                                 or n_images < 1):
        raise ValueError(f"n_images must be a positive int, got {n_images!r}; pass e.g. n_images=500.")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else None
    if device is not None and torch.device(device).type == "cpu":
        device = None
    if device is not None and torch.device(device).type != "cuda":
        raise ValueError(f"device={device!r}: the tuner copies batches to a CUDA device only; "
                         f"pass device='auto', 'cuda' or None.")
    if device is not None and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asks for CUDA but torch.cuda.is_available() is "
                         f"False here; pass device=None.")

    pipe = _pipeline(data, size, n_images, progress)
    n = len(pipe.dataset)
    if epoch_samples is None:
        epoch_samples = n
    elif isinstance(epoch_samples, bool) or not isinstance(epoch_samples, numbers.Integral) \
            or epoch_samples < 1:
        raise ValueError(f"epoch_samples must be a positive int, got {epoch_samples!r}.")
    if n < 2 * batch_size and batch_sizes is None:
        batch_size = max(1, n // 4)
    usable = usable_cpus()
    if worker_counts is None:
        worker_counts = default_worker_counts(min(2 * usable, 32))
    if batch_sizes is None:
        batch_sizes = sorted({batch_size} | {b for b in (8, 16, 32, 64, 128, 256, 512)
                                             if b <= n})
    elif batch_size not in batch_sizes:
        batch_size = batch_sizes[0] if len(batch_sizes) == 1 else batch_size
        batch_sizes = sorted(set(batch_sizes) | {batch_size})

    search_s = budget_s * (1 - COMPARE_SHARE) if compare_with_baselines else budget_s
    search = _Search(pipe, budget_s=budget_s, search_s=search_s,
                     epoch_samples=int(epoch_samples), device=device, progress=progress)
    notes: list[str] = list(pipe.notes)
    try:
        start = LoaderSettings(num_workers=worker_counts[0], batch_size=batch_size)
        # 1. num_workers ladder
        search.ladder("num_workers", start, "num_workers", worker_counts, LADDER_FALLS)
        # 2. batch size: up, then down
        best = search.best_settings(start)
        ups = [b for b in batch_sizes if b > best.batch_size]
        downs = [b for b in reversed(batch_sizes) if b < best.batch_size]
        search.ladder("batch_size", best, "batch_size", ups, 1)
        search.ladder("batch_size", search.best_settings(best), "batch_size", downs, 1)
        # 3. prefetch_factor and persistent_workers
        best = search.best_settings(start)
        with_workers = [t for t in search.trials if t.settings.num_workers and t.score]
        if best.num_workers:
            for pf in (1, 4):
                search.run("prefetch/persistent", best.replace(prefetch_factor=pf))
            best = search.best_settings(best)
            search.run("prefetch/persistent", best.replace(persistent_workers=True))
        elif with_workers:
            # workers may have lost only by their start-up: persistent workers pay it once
            w = max(with_workers, key=lambda t: t.score).settings.num_workers
            search.run("prefetch/persistent", best.replace(num_workers=w,
                                                           persistent_workers=True))
            search.skipped.append(f"prefetch/persistent: prefetch_factor (the best had no "
                                  f"workers; persistent_workers was tried with {w})")
        else:
            search.skipped.append("prefetch/persistent: prefetch_factor and persistent_workers "
                                  "(they need num_workers >= 1; no trial had workers)")
        # 4. pin_memory, threads per worker
        best = search.best_settings(start)
        if device is not None:
            search.run("pin_memory/threads", best.replace(pin_memory=True))
        else:
            search.skipped.append("pin_memory/threads: pin_memory=True (no CUDA device here: "
                                  "pinning is a CPU copy that only pays off in a later "
                                  "host-to-GPU copy)")
        best = search.best_settings(start)
        if best.num_workers and 2 * best.num_workers <= usable:
            context = None
            if start_method() == "fork" and "forkserver" in multiprocessing.get_all_start_methods():
                context = "forkserver"   # more than 1 thread in a forked worker can hang
            for threads in range(2, usable // best.num_workers + 1):
                search.run("pin_memory/threads",
                           best.replace(threads_per_worker=threads, multiprocessing_context=context))
        elif best.num_workers:
            search.skipped.append(f"pin_memory/threads: more than 1 thread per worker "
                                  f"({best.num_workers} workers x 2 threads would exceed the "
                                  f"{usable} usable CPUs)")
        else:
            search.skipped.append("pin_memory/threads: threads per worker (the best had no "
                                  "workers)")
        search_elapsed = search.elapsed()
        best_trial = search.best_trial
        if best_trial is None:
            failed = [t.status for t in search.trials]
            raise RuntimeError(f"no setting could be measured fully: {failed}; check that the "
                               f"dataset can be read (try dataset[0]).")

        # side-by-side comparison, in what is left of the budget
        comparison = None
        if compare_with_baselines:
            comparison = _compare(pipe, best_trial, search, batch_size, device, notes)
            over = search.elapsed() - budget_s
            if over > 0.1 * budget_s:
                notes.append(f"the side-by-side comparison ran {over:.0f} s past the budget: "
                             f"it needs two interleaved rounds, each with the baselines' "
                             f"warm-up, however slow they are")
    finally:
        search.bar.close()

    if search.out_of_budget:
        notes.append(f"the budget ran out after {len(search.trials)} trials; a larger budget_s "
                     f"tries the settings listed under 'Not tried'")
    return TuningResult(best=best_trial.settings, best_trial=best_trial, trials=search.trials,
                        not_tried=search.not_tried, skipped=search.skipped,
                        comparison=comparison, budget_s=budget_s, elapsed_s=search.elapsed(),
                        search_s=search_elapsed, epoch_samples=int(epoch_samples),
                        dataset=pipe.description, machine=machine_summary(),
                        code_dataset=pipe.code_dataset, code_imports=pipe.code_imports,
                        notes=notes)


def _compare(pipe: _Pipeline, best_trial: Trial, search: _Search, batch_size: int,
             device: Any, notes: list[str]) -> Comparison:
    """Defaults vs common recipe vs tuned, repeats interleaved, sized to the budget left."""
    s = best_trial.settings
    rounds = pick(full=4, quick=3)
    left = max(0.0, search.budget_s - search.elapsed())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        entries: list[tuple[str, Any, Any]] = []
        if pipe.base is not None:
            recipe = common_recipe_loader(pipe.base, batch_size=batch_size, size=pipe.size)
            defaults = DataLoader(TransformedDataset(pipe.base, CommonRecipeTransform(pipe.size)),
                                  batch_size=batch_size, shuffle=True)
            entries += [(DEFAULTS_LABEL, defaults, _nothing),
                        (RECIPE_LABEL, recipe, common_recipe_process_settings)]
        else:
            entries.append((DEFAULTS_LABEL, DataLoader(pipe.dataset, batch_size=batch_size,
                                                       shuffle=True), _nothing))
            notes.append("the common recipe needs images as HxWx3 uint8 arrays (a JpegDataset "
                         "or ImageFolderDataset without a transform); compared with defaults only")
        entries.append((TUNED_LABEL, _loader(pipe.dataset, s, pipe.collate_fn, 0), _nothing))
        try:
            return _interleaved_comparison(entries, left, rounds, device, search.elapsed)
        finally:
            del entries
            gc.collect()
