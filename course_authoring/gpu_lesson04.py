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
from typing import Any, Callable, Iterator, Mapping, Optional

import torch

from course_utils.config import pick, quick_mode
from course_utils.lessons.l04_copies import H2D_MODES, BandwidthSweep, fmt_bytes
from course_utils.lessons.l04_overlap import MatmulChain, calibrated_compute
from course_utils.machine import usable_cpus
from course_utils.prefetch import PrefetchTiming, compare_prefetch
from course_utils.timing import time_op
from course_utils.transforms import normalize_batch

from .notebook_modules import notebook_module

NOTEBOOK = "04_host_to_device.ipynb"
#: The notebook's modules run_lesson04 calls: lesson04_<name>.py.
MODULES = ("sweep", "naive", "overlap", "dtype", "pin", "fork")
#: pin_memory_cost's loaders (notebook 04's lesson04_pin): a sample is a uint8 3x224x224 image and
#: an int64 label; DataLoader's default prefetch_factor; full-mode batch size; at most 4 workers.
PIN_SAMPLE_BYTES = 3 * 224 * 224 + 8
PIN_PREFETCH = 2
PIN_BATCH, PIN_MIN_BATCH, PIN_WORKERS = 128, 16, 4
#: Share of the free /dev/shm those loaders may fill (the part runs alone; the rest is margin).
PIN_SHM_SHARE = 0.8
#: pinned_h2d: the sweep's best pinned copy >= this share of the fastest host-to-device copy
#: timed anywhere in the run (:func:`pinned_h2d_target`).
PINNED_SHARE = 0.9


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


def pin_loader_bytes(batch_size: int, workers: int, prefetch: int = PIN_PREFETCH,
                     sample_bytes: int = PIN_SAMPLE_BYTES) -> int:
    """Bytes a DataLoader's batches hold in /dev/shm at once: ``workers x prefetch`` batches in
    flight (each worker collates into shared memory) and the one the main process is using."""
    return (workers * prefetch + 1) * batch_size * sample_bytes if workers else 0


def plan_pin_loaders(shm_free: Optional[int], *, batch_size: int, workers: int,
                     share: float = PIN_SHM_SHARE) -> tuple[Optional[dict], str]:
    """Fit pin_memory_cost's loaders into ``share`` of ``shm_free`` bytes of /dev/shm: fewer
    workers first (down to 1), then halved batches (down to PIN_MIN_BATCH). (plan, what was done)
    with plan = {batch_size, num_workers, need_bytes}; (None, why) when even the smallest does not
    fit. ``shm_free`` None (no /dev/shm): the plan as asked."""
    def plan(b: int, w: int) -> dict:
        return {"batch_size": b, "num_workers": w, "need_bytes": pin_loader_bytes(b, w)}

    if shm_free is None:
        return plan(batch_size, workers), "no /dev/shm figure: loaders as asked"
    room = share * shm_free
    asked = pin_loader_bytes(batch_size, workers)
    b, w = batch_size, workers
    while pin_loader_bytes(b, w) > room and w > 1:
        w -= 1
    while pin_loader_bytes(b, w) > room and b // 2 >= PIN_MIN_BATCH:
        b //= 2
    if pin_loader_bytes(b, w) > room:
        return None, (f"/dev/shm has {fmt_bytes(shm_free)} free: even 1 worker with batches of {b} "
                      f"needs {fmt_bytes(pin_loader_bytes(b, w))} there (more than "
                      f"{share:.0%} of it); pin_memory in a DataLoader not measured")
    if (b, w) == (batch_size, workers):
        return plan(b, w), f"{fmt_bytes(asked)} of {fmt_bytes(shm_free)} free in /dev/shm: loaders as asked"
    return plan(b, w), (f"/dev/shm has {fmt_bytes(shm_free)} free, {workers} workers with batches "
                        f"of {batch_size} need {fmt_bytes(asked)}: shrunk to {w} worker(s), batches of {b}")


def run_h2d_copies(results: Mapping[str, Any], prefetch_bytes: Optional[int] = None) -> list[tuple[str, float]]:
    """Every host-to-device copy the run timed outside the sweep, as (what, GB/s): the honest
    copy of ``mismeasure``, each copy alone in ``overlap``, and the prefetcher's batch copy
    (``prefetch_bytes`` bytes in ``copy_s_per_batch``)."""
    found = []
    if (demo := results.get("mismeasure")) and demo.get("honest_gbps"):
        found.append((f"naive-vs-honest copy ({'pinned' if demo.get('pinned') else 'pageable'}, "
                      f"{fmt_bytes(demo['nbytes'])})", float(demo["honest_gbps"])))
    if overlap := results.get("overlap"):
        for mode, seconds in overlap["times_s"]["copy alone"].items():
            if seconds and seconds > 0:
                found.append((f"overlap: {mode} alone ({fmt_bytes(overlap['copy_bytes'])})",
                              overlap["copy_bytes"] / seconds / 1e9))
    prefetch = results.get("prefetch") or {}
    if prefetch_bytes and prefetch.get("copy_s_per_batch"):
        found.append((f"prefetcher's batch copy ({fmt_bytes(prefetch_bytes)})",
                      prefetch_bytes / prefetch["copy_s_per_batch"] / 1e9))
    return found


def pinned_h2d_target(sweep: BandwidthSweep, copies: list[tuple[str, float]]) -> dict:
    """The ``pinned_h2d`` target: the sweep's best pinned GB/s against the fastest host-to-device
    copy of the whole run (the sweep's three modes at every size, pageable too, and ``copies``).
    Judged against the sweep alone it read 1.0 whenever pinned was the sweep's fastest mode;
    against every copy the run timed it fails when the sweep's pinned figure is not the link's
    best this run reached. It cannot tell how near that is to the link's rated speed."""
    pinned, best = sweep.best_pinned(), sweep.best_h2d()
    every = ([(f"sweep: {best[0]} at {fmt_bytes(best[1])}", best[2])] if best else []) + list(copies)
    top = max(every, key=lambda c: c[1], default=None)
    frac = None if pinned is None or top is None or top[1] <= 0 else pinned[2] / top[1]
    return {"description": f"the sweep's best pinned host-to-device copy >= {PINNED_SHARE:.0%} of the "
                           f"fastest host-to-device copy timed anywhere in the run (every mode, pageable too)",
            "value": frac, "target": f">= {PINNED_SHARE:g}", "unit": "fraction of the run's best H2D GB/s",
            "met": None if frac is None else bool(frac >= PINNED_SHARE),
            "detail": (f"best pinned {pinned[2]:.1f} GB/s ({pinned[0]} at {fmt_bytes(pinned[1])}); "
                       f"the run's fastest {top[1]:.1f} GB/s ({top[0]}; {len(every)} copies compared)"
                       if pinned and top else "pinned copies not measured")}


def run_lesson04(budget_s: float = 180.0, *, device: Any = "cuda", progress: bool = False,
                 shm_bytes: Optional[int] = None) -> dict:
    """Run lesson 04's measurements on ``device`` and return them as a JSON-friendly dict.

    Sections (each skipped, with the reason recorded, when the budget is spent or it fails): the
    bandwidth sweep (the three host-to-device copies of
    :data:`~course_utils.lessons.l04_copies.H2D_MODES` -- pageable, pinned blocking, pinned
    non_blocking -- side by side, and device-to-device), the naive vs honest timing,
    copy/compute overlap (each copy mode, the copy or the compute queued first), uint8 vs
    float32, the DevicePrefetcher against a plain loop, pin_memory in a DataLoader, and the forked-worker error. Sizes follow the mode (full unless
    quick mode is on; the gpu-check command runs in full mode). ``targets["pinned_h2d"]`` holds
    the issue target (:func:`pinned_h2d_target`). On CUDA a copy mode the sweep did not measure
    is a failure (``skipped["copy_modes"]``). ``shm_bytes`` (free bytes in /dev/shm) sizes the
    pin_memory loaders to fit (:func:`plan_pin_loaders`, recorded in ``pin_plan``), or skips them
    with the reason.
    ``device="cpu"`` runs every code path on the CPU (gpu-check's rehearsal); asking for CUDA
    where there is none raises RuntimeError: these are GPU reference results.
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("run_lesson04 needs a CUDA GPU (torch.cuda.is_available() is "
                           "False): these results are the reference a CPU-only learner is shown.")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or budget_s <= 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}.")
    return _measure(dev, budget_s, progress=progress, shm_bytes=shm_bytes)


def _measure(dev: torch.device, budget_s: float, *, progress: bool = False,
             shm_bytes: Optional[int] = None) -> dict:
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

    prefetch_bytes = pick(full=256, quick=32) * 3 * 224 * 224

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
    pin_plan, why = plan_pin_loaders(shm_bytes, batch_size=pick(full=PIN_BATCH, quick=32),
                                     workers=min(PIN_WORKERS, usable_cpus()))
    results["pin_plan"] = {"shm_free_bytes": shm_bytes, "plan": pin_plan, "note": why}
    if pin_plan is None:
        print(f"[lesson04] skipped pin_cost: {why}")
        results["skipped"]["pin_cost"] = why
    else:
        run("pin_cost", 20, lambda: lesson.pin.pin_memory_cost(
            dev, pin_plan["batch_size"], num_workers=pin_plan["num_workers"], progress=progress))
    run("forked_worker", 15,
        lambda: lesson.fork.cuda_in_forked_worker(timeout_s=max(15.0, min(60.0, left()))))

    targets: dict[str, Any] = {}
    if sweep is not None:
        targets["pinned_h2d"] = pinned_h2d_target(sweep, run_h2d_copies(results, prefetch_bytes))
    results["targets"] = targets
    results["total_s"] = time.perf_counter() - start
    return results
