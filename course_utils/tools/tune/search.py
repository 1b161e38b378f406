"""Tune a DataLoader on this machine within a time budget (lesson 06): :func:`tune_loader`.

A coordinate search, each stage from the best so far: ``num_workers`` 0, 1, 2, ... until the ladder
falls; ``batch_size`` doublings up, then halvings down, each to its first falling rung;
``prefetch_factor`` 1 and 4, ``persistent_workers=True``; ``pin_memory`` only with CUDA; more threads
per worker only where they fit the CPUs.

A trial is a probe window and, unless it scores clearly below the best, a full window
(:mod:`.window`), scored by :func:`~.result.epoch_score` (the constants below: how much, when).
The budget (wall seconds) covers everything, the side by side with the baselines included
(:class:`~.window.SideBySide`: its winner is recommended); a trial starts only if its estimate fits
(else ``not_tried``); Ctrl-C stops every worker, raises :class:`TuningInterrupted`."""
from __future__ import annotations

import gc
import multiprocessing
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from torch.utils.data import DataLoader, Dataset

from course_utils.checks import check_folder, check_int, check_seconds
from course_utils.config import pick
from course_utils.data import JpegDataset, ToTensorUint8
from course_utils.image_folder import ImageFolderDataset
from course_utils.machine import start_method, usable_cpus
from course_utils.measurement import Measurement
from course_utils.pipelines import BatchedJpegDataset, keep_batch
from course_utils.scaling import default_worker_counts
from course_utils.timing import default_warmup

from .result import (RECIPE_LABEL, TUNED_LABEL, LoaderSettings, Trial, TuningInterrupted,
                     TuningResult, epoch_score)
from .window import (WORKER_TIMEOUT_S, SideBySide, Timed, consumer_device, make_consumer,
                     measure_window, pooled, rebuilt)

__all__ = ["LoaderSettings", "Trial", "TuningResult", "TuningInterrupted", "tune_loader",
           "epoch_score", "PROBE_FRACTION", "PROBE_THRESHOLD", "LADDER_FALL_FRACTION",
           "LADDER_FALLS", "COMPARE_SHARE", "MIN_BUDGET_S", "MIN_FOLDER_IMAGES", "WORKER_TIMEOUT_S"]

#: a probe window is this fraction of a full trial window
PROBE_FRACTION = 0.25
#: a probe whose score is below this fraction of the best score so far is not timed fully
PROBE_THRESHOLD = 0.8
#: a ladder rung "falls" when its score is below this fraction of the best rung so far
LADDER_FALL_FRACTION = 0.95
#: the num_workers ladder stops after this many falling rungs in a row (batch size: after one)
LADDER_FALLS = 2
#: share of the budget kept for the final side-by-side comparison
COMPARE_SHARE = 0.25
#: smallest budget that can try anything (the first trial starts workers-free, a few batches)
MIN_BUDGET_S = 2.0
#: a folder needs this many readable images (the smallest batch size the ladder tries)
MIN_FOLDER_IMAGES = 8


@dataclass
class _Pipeline:
    dataset: Dataset                 # what the DataLoader reads
    collate_fn: Callable | None      # None: the default collate
    base: Dataset | None             # images as HxWx3 uint8 (for the recipe/defaults), or None
    description: str
    code_dataset: str                # Python expression of the dataset in the pasted code
    code_imports: list[str]          # its imports, beside DataLoader's
    size: int
    notes: list[str]                 # e.g. damaged files skipped
    baseline_code: tuple[str, list[str]] = ("dataset", [])   # the baselines' dataset, as code


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
    if data is None:
        data = JpegDataset(n=pick(full=2000, quick=200) if n_images is None else n_images,
                           progress=None if progress else False)
    elif isinstance(data, (str, os.PathLike)):
        hint = "pass the folder that holds your images (or data=None for the course data)."
        data = ImageFolderDataset(check_folder(data, "data", hint), skip_damaged=True)
    notes: list[str] = []
    if isinstance(data, ImageFolderDataset):
        data = folder_for_tuning(data, f"data={str(data.root)!r}")
        if data.damaged:
            notes.append(f"{data.damaged_summary()}; they were left out")
    recipe = "from course_utils.data import CommonRecipeTransform"
    if isinstance(data, JpegDataset) and data.transform is None:
        return _Pipeline(BatchedJpegDataset(data, size), keep_batch, data, data.describe(),
                         f"BatchedJpegDataset(dataset, size={size})",
                         ["from course_utils import keep_batch, make_worker_init",
                          "from course_utils.pipelines import BatchedJpegDataset"], size, notes,
                         (f"TransformedDataset(dataset, CommonRecipeTransform({size}))",
                          [recipe, "from course_utils.pipelines import TransformedDataset"]))
    if isinstance(data, ImageFolderDataset) and data.transform is None:
        skip = ", skip_damaged=True" if data.damaged else ""
        folder = f"ImageFolderDataset({str(data.root)!r}, transform="
        folder_import = "from course_utils.image_folder import ImageFolderDataset"
        return _Pipeline(data.with_transform(ToTensorUint8(size)), None, data, data.describe(),
                         f"{folder}ToTensorUint8({size}){skip})",
                         ["from course_utils import ToTensorUint8, make_worker_init", folder_import], size,
                         notes, (f"{folder}CommonRecipeTransform({size}){skip})", [recipe, folder_import]))
    if isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        describe = getattr(data, "describe", None)
        text = describe() if callable(describe) else f"{type(data).__name__} of {len(data)} items"
        return _Pipeline(data, None, None, text, "dataset",
                         ["from course_utils import make_worker_init"], size, notes)
    raise TypeError(f"data must be None (the course's JPEG dataset), a folder of images (str or Path), a "
                    f"JpegDataset, an ImageFolderDataset or a map-style Dataset; got {type(data).__name__}.")


def _check_int_list(name: str, values: Any, lo: int) -> list[int] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list of ints, got {values!r}; pass e.g. {name}=[0, 1, 2].")
    out = sorted({check_int(f"{name}[i]", v, lo, "tune_loader") for v in values})
    if not out:
        raise ValueError(f"{name} is empty; pass at least one value, or None for the default.")
    return out


class _Search:
    """The state of one tuning run."""

    def __init__(self, pipe: _Pipeline, *, budget_s: float, search_s: float, epoch_samples: int,
                 device: Any, consumer: tuple[Callable[[Any], Any] | None, str], progress: bool) -> None:
        self.pipe, self.budget_s, self.search_s = pipe, budget_s, search_s
        self.epoch_samples, self.device = epoch_samples, device
        self.consumer, self.consumer_text = consumer
        self.t_start, self.trial_s = time.perf_counter(), min(8.0, max(0.3, search_s / 16))
        self.trials: list[Trial] = []
        self.tried: dict[LoaderSettings, Trial] = {}
        self.not_tried: list[str] = []
        self.skipped: list[str] = []
        self.out_of_budget, self.startup_est = False, 0.5
        self.rate_est: float | None = None      # steady samples/s, best so far
        from tqdm.auto import tqdm  # lazy: kept out of `import course_utils` (workers)

        self.bar = tqdm(total=round(budget_s, 1), disable=not progress, desc="tuning",
                        unit="s", bar_format="{desc}: {n:.0f}/{total:.0f} s |{bar}| {postfix}")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def tick(self, text: str) -> None:
        self.bar.n = min(self.bar.total, round(self.elapsed(), 1))
        self.bar.set_postfix_str(text[:60], refresh=False)
        self.bar.refresh()

    @property
    def best_trial(self) -> Trial | None:
        full = [t for t in self.trials if t.complete and t.score is not None]
        return max(full, key=lambda t: t.score) if full else None

    def plan(self, s: LoaderSettings) -> tuple[int, int, int]:
        """(warm-up, probe, full) batches for ``s``: the engine's warm-up; a full window lasts
        about ``trial_s`` seconds at the best rate so far."""
        warm = default_warmup(s)
        if self.rate_est is None:   # the first trial calibrates: a few batches
            return warm, 2, 4
        full = max(2, round(self.rate_est * self.trial_s / s.batch_size))
        return warm, max(1, round(PROBE_FRACTION * full)), full

    def score(self, s: LoaderSettings, m: Measurement, startup_s: float) -> float:
        return epoch_score(m.samples_per_s, startup_s, s.batch_size, self.epoch_samples)

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
        plan, left = self.plan(s), self.search_s - self.elapsed()
        if self.out_of_budget or (self.trials and (left <= 0 or self.estimate_s(s, plan) > left)):
            self.out_of_budget = True
            self.not_tried.append(f"{stage}: {s.label()}")
            return None
        warm, probe, full = plan
        loader = DataLoader(self.pipe.dataset, collate_fn=self.pipe.collate_fn, **s.loader_kwargs())
        timed = Timed(rebuilt(loader), self.device, self.consumer)
        t0 = time.perf_counter()
        trial = Trial(len(self.trials) + 1, stage, s, "full")
        try:
            parts = [measure_window(timed, probe, s.label())]
            best = self.best_trial
            if best is not None and self.score(s, *pooled(parts, s.label())) < PROBE_THRESHOLD * best.score:
                trial.status = "stopped after probe"
            else:
                parts.append(measure_window(timed, full, s.label()))
            trial.measurement, trial.startup_s = pooled(parts, s.label())
            trial.score = self.score(s, trial.measurement, trial.startup_s)
        except Exception as exc:  # one broken setting must not end the search
            if not self.trials:
                raise
            trial.status = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        finally:
            timed.close()      # every worker ends now (Ctrl-C included), not at the next trial
            del timed, loader
            gc.collect()
        trial.seconds = time.perf_counter() - t0
        self.trials.append(trial)
        self.tried[s] = trial
        if trial.measurement is not None:
            self.rate_est = max(self.rate_est or 0.0, trial.measurement.samples_per_s)
            if s.num_workers and trial.startup_s is not None and not s.persistent_workers:
                self.startup_est = max(self.startup_est * 0.5, trial.startup_s)
        best = self.best_trial
        self.tick(f"best {best.settings.label()}: {best.score:,.0f}/s" if best else "")
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
                        self.skipped.append(f"{stage}: {key} in {rest} (below "
                                            f"{LADDER_FALL_FRACTION:.0%} of the ladder's best "
                                            f"{falls} time(s) in a row, the last at {key}={v})")
                    return
            else:
                falls = 0

    def best_settings(self, fallback: LoaderSettings) -> LoaderSettings:
        return fallback if self.best_trial is None else self.best_trial.settings

    def stages(self, start: LoaderSettings, worker_counts: list[int], batch_sizes: list[int],
               usable: int) -> None:
        """The four stages of the module docstring, in order."""
        self.ladder("num_workers", start, "num_workers", worker_counts, LADDER_FALLS)
        best = self.best_settings(start)
        self.ladder("batch_size", best, "batch_size", [b for b in batch_sizes if b > best.batch_size], 1)
        self.ladder("batch_size", self.best_settings(best), "batch_size",
                    [b for b in reversed(batch_sizes) if b < best.batch_size], 1)
        best = self.best_settings(start)
        with_workers = [t for t in self.trials if t.settings.num_workers and t.score]
        if best.num_workers:
            for pf in (1, 4):
                self.run("prefetch/persistent", best.replace(prefetch_factor=pf))
            best = self.best_settings(best)
            self.run("prefetch/persistent", best.replace(persistent_workers=True))
        elif with_workers:
            # workers may have lost only by their start-up: persistent ones pay it once a run,
            # so the worker count with the best steady rate (full trials first) goes persistent
            w = max(with_workers, key=lambda t: (t.complete, t.samples_per_s)).settings.num_workers
            self.run("prefetch/persistent", best.replace(num_workers=w, persistent_workers=True))
            self.skipped.append(f"prefetch/persistent: prefetch_factor (the best had no "
                                f"workers; persistent_workers was tried with {w})")
        else:
            self.skipped.append("prefetch/persistent: prefetch_factor and persistent_workers "
                                "(they need num_workers >= 1; no trial had workers)")
        best = self.best_settings(start)
        if self.device is not None:
            self.run("pin_memory/threads", best.replace(pin_memory=True))
        else:
            self.skipped.append("pin_memory/threads: pin_memory=True (no CUDA device here: "
                                "pinning only pays off in a host-to-GPU copy)")
        best = self.best_settings(start)
        if best.num_workers and 2 * best.num_workers <= usable:
            context = None
            if start_method() == "fork" and "forkserver" in multiprocessing.get_all_start_methods():
                context = "forkserver"   # more than 1 thread in a forked worker can hang
            for threads in range(2, usable // best.num_workers + 1):
                self.run("pin_memory/threads",
                         best.replace(threads_per_worker=threads, multiprocessing_context=context))
        elif best.num_workers:
            self.skipped.append(f"pin_memory/threads: more than 1 thread per worker ({best.num_workers} "
                                f"workers x 2 threads would exceed the {usable} usable CPUs)")
        else:
            self.skipped.append("pin_memory/threads: threads per worker (the best had no workers)")


def _result(search: _Search, pipe: _Pipeline, side: SideBySide | None, notes: list[str],
            search_s: float) -> TuningResult | None:
    """What was measured (None: no trial complete); the side by side's winner is recommended."""
    best_trial = search.best_trial
    if best_trial is None:
        return None
    summary = side.summary() if side is not None else None
    notes = list(notes)
    if search.out_of_budget:
        notes.append(f"the budget ran out after {len(search.trials)} trials; a larger budget_s "
                     f"tries the settings listed under 'Not tried'")
    result = TuningResult(
        best=best_trial.settings, best_trial=best_trial, trials=search.trials, not_tried=search.not_tried,
        skipped=search.skipped, comparison=summary and summary[0], startups=summary[1] if summary else {},
        candidates=dict(side.settings) if summary else {TUNED_LABEL: best_trial.settings},
        budget_s=search.budget_s, elapsed_s=search.elapsed(), search_s=search_s,
        epoch_samples=search.epoch_samples, dataset=pipe.description, consumer=search.consumer_text,
        code_dataset=pipe.code_dataset, code_imports=pipe.code_imports, notes=notes)
    if summary:
        scores = result.scores
        result.winner = max(scores, key=scores.get)
        result.best = result.candidates[result.winner]
        if result.winner != TUNED_LABEL:
            result.code_dataset, result.code_imports = pipe.baseline_code
        if result.winner == RECIPE_LABEL:
            notes.append("the common recipe ran as it is written: torch.set_num_threads(1) and "
                         "OMP/MKL/OPENBLAS_NUM_THREADS=1 set after import, in the main process")
    return result


def tune_loader(data: Any = None, *, budget_s: float = 60.0, batch_size: int | None = None,
                size: int = 224, worker_counts: Sequence[int] | None = None,
                batch_sizes: Sequence[int] | None = None, epoch_samples: int | None = None,
                step_s: float | None = None, step: Callable[[Any], Any] | None = None,
                n_images: int | None = None, compare_with_baselines: bool = True,
                device: Any = "auto", progress: bool = True) -> TuningResult:
    """Fast DataLoader settings for ``data`` on this machine, found within ``budget_s`` seconds.

    ``data``: None (the course's JPEGs, ``n_images`` of them), a folder of images, a JpegDataset or
    ImageFolderDataset (decoded to ``size`` x ``size`` uint8), or any map-style Dataset (as is).
    ``batch_size``: where the batch-size ladder starts (default 64, quick mode 32) and the
    baselines'; ``epoch_samples``: the epoch the score assumes (default: the dataset's length).
    The consumer of each batch: ``step_s`` seconds of sleep (a GPU step leaving the CPU free) or
    ``step(batch)``. ``device``: "auto" (CUDA when available: batches are copied there and
    ``pin_memory`` is tried), or None. Ctrl-C raises :class:`TuningInterrupted`."""
    budget_s = check_seconds("budget_s", budget_s, "tune_loader")
    if budget_s < MIN_BUDGET_S:
        raise ValueError(f"budget_s={budget_s!r} is too small to try anything (the first trial "
                         f"needs about {MIN_BUDGET_S:g} s); pass e.g. budget_s=60.")
    size = check_int("size", size, 1, maximum=8192, hint=" Pass e.g. size=224 (pixels).")
    batch_size = check_int("batch_size", pick(full=64, quick=32) if batch_size is None
                           else batch_size, 1, hint=" Pass e.g. batch_size=64.")
    worker_counts = _check_int_list("worker_counts", worker_counts, 0)
    batch_sizes = _check_int_list("batch_sizes", batch_sizes, 1)
    consumer = make_consumer(step_s, step)
    n_images = check_int("n_images", n_images, 1, allow_none=True, hint=" Pass e.g. 500.")
    epoch_samples = check_int("epoch_samples", epoch_samples, 1, allow_none=True, hint=" Pass e.g. 500.")
    device = consumer_device(device)

    pipe = _pipeline(data, size, n_images, progress)
    n = len(pipe.dataset)
    if n < 2 * batch_size and batch_sizes is None:
        batch_size = max(1, n // 4)
    usable = usable_cpus()
    if worker_counts is None:
        worker_counts = default_worker_counts(min(2 * usable, 32))
    if batch_sizes is None:
        batch_sizes = sorted({batch_size} | {b for b in (8, 16, 32, 64, 128, 256, 512) if b <= n})
    elif batch_size not in batch_sizes:
        batch_size = batch_sizes[0] if len(batch_sizes) == 1 else batch_size
        batch_sizes = sorted(set(batch_sizes) | {batch_size})

    search_s = budget_s * (1 - COMPARE_SHARE) if compare_with_baselines else budget_s
    search = _Search(pipe, budget_s=budget_s, search_s=search_s, epoch_samples=int(epoch_samples or n),
                     device=device, consumer=consumer, progress=progress)
    notes: list[str] = list(pipe.notes)
    side: SideBySide | None = None
    stage, search_elapsed = "search", None
    try:
        with warnings.catch_warnings():   # DataLoader's about the tuner's own settings
            warnings.filterwarnings("ignore", message=".*pin_memory.*|This DataLoader will create")
            start = LoaderSettings(num_workers=worker_counts[0], batch_size=batch_size)
            search.stages(start, worker_counts, batch_sizes, usable)
            search_elapsed = search.elapsed()
            best_trial = search.best_trial
            if best_trial is None:
                failed = [t.status for t in search.trials]
                raise RuntimeError(f"no setting could be measured fully: {failed}; check that the "
                                   f"dataset can be read (try dataset[0]).")
            if compare_with_baselines:
                stage = "side-by-side comparison"
                side = SideBySide(pipe, best_trial.settings, batch_size, notes)
                side.measure(search, min_batches=max(2, search.plan(best_trial.settings)[1]))
                over = search.elapsed() - budget_s
                if over > 0.1 * budget_s:
                    notes.append(f"the side-by-side comparison ran {over:.0f} s past the budget: "
                                 f"it needs two interleaved rounds, each with the baselines' "
                                 f"warm-up, however slow they are")
    except KeyboardInterrupt:
        search.bar.leave = False
        search_elapsed = search.elapsed() if search_elapsed is None else search_elapsed
        partial = _result(search, pipe, side, notes + [f"interrupted during the {stage}"], search_elapsed)
        raise TuningInterrupted(partial, search.elapsed(), stage) from None
    finally:
        search.bar.close()
        gc.collect()
    return _result(search, pipe, side, notes, search_elapsed)
