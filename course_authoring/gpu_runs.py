"""The lessons' measurements on a real CUDA GPU, for ``gpu-check``: lesson 04's
(:func:`run_lesson04`: bandwidth, timing, overlap, dtypes, the prefetcher, pin_memory, the
forked-worker error) and lesson 05's (:func:`run_lesson05`: augmentation throughput and the
training loop, with their targets). Each returns a JSON-able dict that ``gpu-check`` writes into
``course_utils/reference_results/`` for the notebooks to show beside a learner's own figures.

Authors' tooling: it runs the lessons' harness in full mode within a budget, so it lives here,
out of the learner's package.
"""
from __future__ import annotations

import numbers
import os
import time
from typing import Any, Callable, Iterator, Optional

import torch

from course_utils.augment import AugmentParams
from course_utils.config import pick, quick_mode
from course_utils.data import JpegDataset
from course_utils.device import resolve_device
from course_utils.lessons.l04_copies import _fmt_bytes, _median, bandwidth_sweep, mismeasured_copy, time_op
from course_utils.lessons.l04_overlap import (_calibrated_compute, _MatmulChain, measure_overlap,
                                              uint8_vs_float32)
from course_utils.lessons.l04_workers import cuda_in_forked_worker, pin_memory_cost
from course_utils.lessons.l05_measure import DecodedImages, measure_augment_throughput
from course_utils.lessons.l05_training import compare_training
from course_utils.prefetch import PrefetchTiming, compare_prefetch
from course_utils.reference import LESSON05, describe_machine
from course_utils.transforms import normalize_batch


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

    def __init__(self, chain: _MatmulChain) -> None:
        self.chain = chain

    def __call__(self, batch: Any) -> Any:
        images, _ = batch
        x = normalize_batch(images)
        self.chain()
        return x


def run_lesson04(budget_s: float = 180.0, *, progress: bool = False) -> dict:
    """Run lesson 04's measurements on CUDA and return them as a JSON-friendly dict.

    Sections (each skipped, with the reason recorded, when the budget is spent): the bandwidth
    sweep (pageable / pinned / device-to-device), the naive vs honest timing, copy/compute
    overlap, uint8 vs float32, the DevicePrefetcher against a plain loop, pin_memory in a
    DataLoader, and the forked-worker error. Sizes follow the mode (full unless quick mode
    is on; the gpu-check command runs in full mode). ``targets["pinned_h2d"]`` holds the issue
    target: the best pinned copy >= 90% of the best host-to-device copy measured.
    Raises RuntimeError without CUDA: these are GPU reference results.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("run_gpu_benchmarks needs a CUDA GPU (torch.cuda.is_available() is "
                           "False): these results are the reference a CPU-only learner is shown.")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or budget_s <= 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}.")

    dev = torch.device("cuda")
    start = time.perf_counter()
    results: dict[str, Any] = {"mode": "quick" if quick_mode() else "full", "device": str(dev),
                               "device_name": torch.cuda.get_device_name(dev), "skipped": {},
                               "seconds": {}}

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

    sweep = run("sweep", 10, lambda: bandwidth_sweep(device=dev, progress=progress))
    run("mismeasure", 3, lambda: mismeasured_copy(device=dev))
    run("overlap", 5, lambda: measure_overlap(device=dev))
    run("dtype", 3, lambda: uint8_vs_float32(device=dev))

    def prefetch() -> PrefetchTiming:
        batch = pick(full=256, quick=32)
        pinned = [(torch.randint(0, 256, (batch, 3, 224, 224), dtype=torch.uint8).pin_memory(),
                   torch.arange(batch).pin_memory()) for _ in range(2)]
        loader = _PinnedBatches(pinned, pick(full=40, quick=8))
        dst = torch.empty(pinned[0][0].shape, dtype=torch.uint8, device=dev)
        copy_s = _median(time_op(lambda: dst.copy_(pinned[0][0], non_blocking=True), device=dev,
                                 repeats=5))
        step = _NormalizeAndCompute(_calibrated_compute(dev, copy_s))
        step_s = _median(time_op(lambda: step((dst, None)), device=dev, repeats=5))
        timing = compare_prefetch(loader, step, device=dev)
        timing.copy_s_per_batch, timing.step_s = copy_s, step_s
        timing.note = (f"batches of {batch} uint8 3x224x224 from pinned memory; the step "
                       f"(normalise + {step.chain.describe()}) is calibrated to about the copy time, "
                       f"so perfect overlap would be close to 2x.")
        return timing

    run("prefetch", 5, prefetch)
    run("pin_cost", 20, lambda: pin_memory_cost(device=dev, progress=progress))
    run("forked_worker", 15, lambda: cuda_in_forked_worker(timeout_s=max(15.0, min(60.0, left()))))

    targets: dict[str, Any] = {}
    if sweep is not None:
        frac = sweep.pinned_fraction_of_best()
        best = sweep.best_h2d()
        pinned = sweep.best("pinned")
        targets["pinned_h2d"] = {
            "description": "pinned host-to-device >= 90% of the best host-to-device figure measured",
            "value": frac, "target": ">= 0.9", "unit": "fraction of the best H2D GB/s",
            "met": None if frac is None else bool(frac >= 0.9),
            "detail": (f"best pinned {pinned[1]:.1f} GB/s at {_fmt_bytes(pinned[0])}; best H2D "
                       f"{best[2]:.1f} GB/s ({best[0]} at {_fmt_bytes(best[1])})"
                       if pinned and best else "pinned copies not measured"),
        }
    results["targets"] = targets
    results["total_s"] = time.perf_counter() - start
    return results


#: Targets of issue 4 measured by :func:`run_lesson05`.
AUGMENT_SPEEDUP_TARGET = 10.0
DATA_WAIT_TARGET = 0.05


def run_lesson05(budget_s: float = 300, *, device: Any = "cuda", quick: Optional[bool] = None,
                       progress: bool = False) -> dict:
    """Lesson 05's GPU measurements, for the gpu-check command; returns a JSON-able dict.

    Measured side by side in one run on ``device`` (CUDA; ``device='cpu'`` with ``quick=True``
    runs every code path on a CPU-only machine, for tests):

    1. augmentation throughput vs batch size (:func:`measure_augment_throughput`): batched on the
       GPU vs per sample in DataLoader workers using all usable CPUs. Target: the best GPU
       samples/s >= 10x the best per-sample CPU samples/s;
    2. the training loop (:func:`compare_training`) with the common recipe, the tuned CPU
       pipeline and the GPU pipeline. Target: the tuned pipeline waits for data < 5% of the step.

    Full sizes unless ``quick`` (default: full, whatever quick mode says). Each part checks the
    time left: what would not fit in ``budget_s`` seconds is skipped and listed in ``skipped``
    (its target reads ``met: None``). Keys: name, mode, device, machine, budget_s, elapsed_s,
    augmentation, training, targets, skipped.
    """

    if isinstance(budget_s, bool) or not isinstance(budget_s, numbers.Real) or budget_s <= 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}.")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("run_gpu_benchmarks needs a CUDA GPU (torch.cuda.is_available() is False). "
                           "Run `python -m course_authoring gpu-check` on a machine with an NVIDIA GPU; "
                           "on this machine, lesson 05 measures the CPU instead.")
    dev = resolve_device(dev)
    quick = False if quick is None else bool(quick)
    start = time.perf_counter()
    deadline = start + float(budget_s)
    if quick:
        plan = dict(n_images=8, input_side=48, output=32, batch_sizes=[4, 8], repeats=1,
                    worker_samples=16, target_s=0.01, n_jpeg=24, train_batch=4, steps=2, width=2,
                    num_workers=min(2, os.cpu_count() or 1))
    else:
        plan = dict(n_images=256, input_side=256, output=224, batch_sizes=[16, 32, 64, 128, 256],
                    repeats=3, worker_samples=2048, target_s=0.2, n_jpeg=1000, train_batch=64,
                    steps=30, width=32, num_workers=None)
    result: dict[str, Any] = {"name": LESSON05, "mode": "quick" if quick else "full",
                              "device": str(dev), "machine": describe_machine(), "budget_s": float(budget_s),
                              "plan": {k: v for k, v in plan.items()}, "augmentation": None, "training": None,
                              "skipped": []}
    if dev.type == "cuda":
        result["machine"]["cuda_device"] = torch.cuda.get_device_name(dev)

    # 1. throughput (keep about 55% of the budget for the training loop)
    params = AugmentParams(size=plan["output"])
    images = DecodedImages(n=plan["n_images"], side=plan["input_side"])
    aug_deadline = start + 0.45 * float(budget_s)
    result["augmentation"] = measure_augment_throughput(
        images, plan["batch_sizes"], params=params, device=dev, num_workers=plan["num_workers"],
        repeats=plan["repeats"], worker_samples=plan["worker_samples"], target_s=plan["target_s"],
        progress=progress, deadline=aug_deadline)
    missing = [b for b, v in zip(plan["batch_sizes"], result["augmentation"]["device_samples_per_s"]) if v is None]
    if missing:
        result["skipped"].append(f"augmentation at batch sizes {missing} (budget)")
    del images

    # 2. training loop (a dataset of real JPEGs first: a few seconds to encode)
    if time.perf_counter() < deadline - 20:
        base = JpegDataset(n=plan["n_jpeg"], progress=progress)
        result["training"] = compare_training(
            base, device=dev, batch_size=plan["train_batch"], steps=plan["steps"],
            image_side=plan["output"], input_side=plan["input_side"], width=plan["width"],
            num_workers=plan["num_workers"], progress=progress, deadline=deadline - 5)
        result["skipped"] += [f"training loop: {n} (budget)" for n in result["training"]["skipped"]]
    else:
        result["skipped"].append("training loop (budget)")

    aug = result["augmentation"]
    ratio = aug.get("best_ratio") if aug else None
    tuned = (result["training"] or {}).get("pipelines", {}).get("tuned CPU pipeline")
    wait = None if tuned is None else tuned["wait_fraction"]
    result["targets"] = {
        "augment_speedup": {
            "description": "best samples/s of batched on-device augmentation / best samples/s of "
                           "per-sample CPU augmentation in DataLoader workers using all usable CPUs",
            "value": ratio, "target": f">= {AUGMENT_SPEEDUP_TARGET:g}",
            "met": None if ratio is None else bool(ratio >= AUGMENT_SPEEDUP_TARGET),
            "detail": (f"(batch sizes {missing} not measured: budget)" if missing and ratio is not None else "")},
        "tuned_data_wait": {
            "description": "data-wait fraction of the training step, tuned CPU pipeline "
                           f"({(result['training'] or {}).get('model')}, batch {plan['train_batch']})",
            "value": wait, "target": f"< {DATA_WAIT_TARGET:g}",
            "met": None if wait is None else bool(wait < DATA_WAIT_TARGET),
            "detail": ("" if tuned is None else f"(step {tuned['median_step_s'] * 1e3:.1f} ms, model alone "
                       f"{result['training']['compute_only']['median_step_s'] * 1e3:.1f} ms)")},
    }
    result["elapsed_s"] = time.perf_counter() - start
    return result
