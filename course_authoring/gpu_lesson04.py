"""Lesson 04's measurements on a real CUDA GPU, for ``gpu-check`` (:func:`run_lesson04`:
bandwidth, timing, overlap, dtypes, the prefetcher, pin_memory, the forked-worker error). It
returns a JSON-able dict that ``gpu-check`` writes into ``course_utils/reference_results/`` for
lesson 04 to show beside a learner's own figures.

The measurements are the lesson's own: notebooks/04_host_to_device.ipynb writes them with
``%%writefile lesson04_*.py`` cells, and :func:`_lesson_modules` imports those files from the
notebook (:mod:`course_authoring.notebook_modules`), so a GPU machine needs no Jupyter. Only the
prefetcher step is composed here, from the package's prefetcher and compute stand-in.
"""
from __future__ import annotations

import statistics
import time
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import torch

from course_utils.config import pick, quick_mode
from course_utils.lessons.l04_copies import H2D_MODES, BandwidthSweep, fmt_bytes
from course_utils.lessons.l04_overlap import MatmulChain, calibrated_compute
from course_utils.prefetch import PrefetchTiming, compare_prefetch
from course_utils.timing import time_op
from course_utils.transforms import normalize_batch

from .notebook_modules import notebook_module

NOTEBOOK = "04_host_to_device.ipynb"
#: The notebook's modules run_lesson04 calls: lesson04_<name>.py.
MODULES = ("sweep", "naive", "overlap", "dtype", "pin", "fork")


def _lesson_modules() -> SimpleNamespace:
    """The notebook's ``lesson04_<name>`` modules (:data:`MODULES`), written out and imported."""
    return SimpleNamespace(**{name: notebook_module(NOTEBOOK, f"lesson04_{name}") for name in MODULES})


class _PinnedBatches:
    """An iterable over ``n`` batches cycling through a few pinned (images, labels) pairs."""

    def __init__(self, batches: list, n: int) -> None:
        self.batches, self.n = batches, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.n):
            yield self.batches[i % len(self.batches)]


class _NormalizeAndCompute:
    """A training-step stand-in: normalise the uint8 batch on the device, then a matmul chain."""

    def __init__(self, chain: MatmulChain) -> None:
        self.chain = chain

    def __call__(self, batch: Any) -> Any:
        images, _ = batch
        x = normalize_batch(images)
        self.chain()
        return x


def copy_modes_missing(sweep: BandwidthSweep) -> str | None:
    """Which of the three host-to-device copies (:data:`H2D_MODES`) ``sweep`` did not measure at
    any size, and why, as one line; None when it measured all three. On a GPU each is a failure:
    the reference results must hold pageable, pinned blocking and pinned non_blocking side by side."""
    missing = [m for m in H2D_MODES if not sweep.measured(m)]
    if not missing:
        return None
    return "copy modes not measured: " + "; ".join(f"{m} ({sweep.notes.get(m, 'no note')})"
                                                   for m in missing)


def run_lesson04(budget_s: float = 180.0, *, device: Any = "cuda", progress: bool = False) -> dict:
    """Run lesson 04's measurements on ``device`` and return them as a JSON-friendly dict.

    Sections (each skipped, with the reason recorded, when the budget is spent or it fails): the
    bandwidth sweep (the three host-to-device copies of
    :data:`~course_utils.lessons.l04_copies.H2D_MODES` -- pageable, pinned blocking, pinned
    non_blocking -- side by side, and device-to-device), the naive vs honest timing,
    copy/compute overlap (each copy mode, the copy or the compute queued first), uint8 vs
    float32, the DevicePrefetcher against a plain loop, pin_memory in a DataLoader, and the forked-worker error. Sizes follow the mode (full unless
    quick mode is on; the gpu-check command runs in full mode). ``targets["pinned_h2d"]`` holds
    the issue target: the best pinned copy >= 90% of the best host-to-device copy measured. On
    CUDA a copy mode the sweep did not measure is a failure (``skipped["copy_modes"]``).
    ``device="cpu"`` runs every code path on the CPU (gpu-check's rehearsal); asking for CUDA
    where there is none raises RuntimeError: these are GPU reference results.
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("run_lesson04 needs a CUDA GPU (torch.cuda.is_available() is "
                           "False): these results are the reference a CPU-only learner is shown.")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or budget_s <= 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}.")
    return _measure(dev, budget_s, progress=progress)


def _measure(dev: torch.device, budget_s: float, *, progress: bool = False) -> dict:
    """:func:`run_lesson04`'s sections on ``dev`` (the tests run them on the CPU)."""
    lesson = _lesson_modules()
    start = time.perf_counter()
    results: dict[str, Any] = {"mode": "quick" if quick_mode() else "full", "device": str(dev),
                               "device_name": (torch.cuda.get_device_name(dev)
                                               if dev.type == "cuda" else dev.type),
                               "skipped": {}, "seconds": {}}

    def left() -> float:
        return budget_s - (time.perf_counter() - start)

    def run(name: str, need_s: float, fn: Callable[[], Any]) -> Any:
        if left() < need_s:
            results["skipped"][name] = f"budget: {left():.0f} s left, about {need_s:.0f} s needed"
            return None
        t0 = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # record and go on: one failed section must not lose the rest
            results["skipped"][name] = f"failed: {type(exc).__name__}: {exc}"
            return None
        results["seconds"][name] = time.perf_counter() - t0
        results[name] = value.to_dict() if hasattr(value, "to_dict") else value
        return value

    sweep = run("sweep", 10, lambda: lesson.sweep.bandwidth_sweep(dev, progress=progress))
    if sweep is not None and dev.type == "cuda" and (why := copy_modes_missing(sweep)):
        results["skipped"]["copy_modes"] = f"failed: {why}"
    run("mismeasure", 3, lambda: lesson.naive.naive_vs_honest(dev))
    run("overlap", 6, lambda: lesson.overlap.measure_overlap(dev))
    run("dtype", 3, lambda: lesson.dtype.uint8_vs_float32(dev))

    def prefetch() -> PrefetchTiming:
        batch = pick(full=256, quick=32)
        pinned = []
        for _ in range(2):
            images = torch.randint(0, 256, (batch, 3, 224, 224), dtype=torch.uint8)
            labels = torch.arange(batch)
            if dev.type == "cuda":                    # what pin_memory=True does; CPU has none
                images, labels = images.pin_memory(), labels.pin_memory()
            pinned.append((images, labels))
        loader = _PinnedBatches(pinned, pick(full=40, quick=8))
        dst = torch.empty(pinned[0][0].shape, dtype=torch.uint8, device=dev)
        copy_s = statistics.median(time_op(lambda: dst.copy_(pinned[0][0], non_blocking=True),
                                           device=dev, repeats=5))
        step = _NormalizeAndCompute(calibrated_compute(dev, copy_s))
        step_s = statistics.median(time_op(lambda: step((dst, None)), device=dev, repeats=5))
        timing = compare_prefetch(loader, step, device=dev)
        timing.copy_s_per_batch, timing.step_s = copy_s, step_s
        timing.note = (f"batches of {batch} uint8 3x224x224 from pinned memory; the step "
                       f"(normalise + {step.chain.describe()}) is calibrated to about the copy time, "
                       f"so perfect overlap would be close to 2x.")
        return timing

    run("prefetch", 5, prefetch)
    run("pin_cost", 20, lambda: lesson.pin.pin_memory_cost(dev, progress=progress))
    run("forked_worker", 15,
        lambda: lesson.fork.cuda_in_forked_worker(timeout_s=max(15.0, min(60.0, left()))))

    targets: dict[str, Any] = {}
    if sweep is not None:
        frac = sweep.pinned_fraction_of_best()
        best = sweep.best_h2d()
        pinned = sweep.best_pinned()
        targets["pinned_h2d"] = {
            "description": "pinned host-to-device >= 90% of the best host-to-device figure measured",
            "value": frac, "target": ">= 0.9", "unit": "fraction of the best H2D GB/s",
            "met": None if frac is None else bool(frac >= 0.9),
            "detail": (f"best pinned {pinned[2]:.1f} GB/s ({pinned[0]} at {fmt_bytes(pinned[1])}); "
                       f"best H2D {best[2]:.1f} GB/s ({best[0]} at {fmt_bytes(best[1])})"
                       if pinned and best else "pinned copies not measured"),
        }
    results["targets"] = targets
    results["total_s"] = time.perf_counter() - start
    return results
