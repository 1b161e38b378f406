"""Grader for exercise 06: the fastest pipeline for a dataset under a CPU budget.

``06.fast_pipeline``: the learner writes ``build_loader(dataset, *, batch_size, size,
cpu_budget) -> DataLoader`` for a :class:`~course_utils.data.JpegDataset`. Its batches must be
``(images, labels)``: images a ``uint8`` tensor of shape ``(batch_size, 3, size, size)`` equal,
sample for sample, to ``ToTensorUint8(size)(dataset[i][0])``, labels ``int64`` equal to
``dataset.labels``.

**The CPU budget** ``cpu_budget = K`` (cores) means two things, both checked:

* structurally: at most ``K`` workers (``num_workers <= K``; with ``num_workers = 0`` the main
  process does the work on its own cores);
* measured: over the timed windows, the loader's whole process tree (main process + workers)
  uses at most ``K + CPU_ALLOWANCE`` CPU-seconds per wall-second (``CPU-seconds per sample x
  samples/s``, from :func:`~course_utils.bench.measure_loader`). The allowance is for the main
  process receiving batches; a worker (or main process) with more than one busy thread shows
  up here.

**Speed**: the learner's loader and the reference (:func:`~course_utils.pipelines.tuned_loader`
with ``K`` workers) read the same dataset, the same number of samples per window, after each
one's own warm-up, in :data:`ROUNDS` interleaved rounds; the answer passes when the median of
the per-round ratios (answer / reference samples/s) is at least :data:`PASS_RATIO`. The ratio
was chosen on a busy 2-core machine (another job running) where the reference against itself
ranged 0.59-1.16 (hence 5 rounds, paired ratios and 0.6); a loader that sleeps 20 ms per
sample reaches about 0.1.

The reference itself (``tuned_loader``), handed in or wrapped, is refused: the exercise is to
build the loader. The pieces the lesson gives (``BatchedJpegDataset``, ``keep_batch``,
``make_worker_init``, ``tune_loader``) may be used.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..grading import CheckResult, ExerciseFailed, grader, refuse_course_helper
from ..pipelines import tuned_loader

FAST = "06.fast_pipeline"

#: the answer's samples/s must reach this fraction of the reference's
PASS_RATIO = 0.6
#: cores of CPU-seconds per wall-second allowed above the budget (the main process's share)
CPU_ALLOWANCE = 0.4
#: interleaved rounds (answer, reference, answer, reference, ...)
ROUNDS = 5
#: the reference loader, refused in an answer
COURSE_LOADERS = (tuned_loader,)


def default_cpu_budget() -> int:
    """The budget the exercise uses: half the usable CPUs, at least 1."""
    from ..machine import usable_cpus

    return max(1, usable_cpus() // 2)


def _fail(problem: str, **kw: str) -> ExerciseFailed:
    return ExerciseFailed(FAST, problem, **kw)


def _check_batches(loader: Any, dataset: Any, batch_size: int, size: int) -> None:
    """The loader's dataset + collate_fn, read in order, give the reference's samples."""
    import torch
    from torch.utils.data import DataLoader

    from ..data import ToTensorUint8

    try:
        seq = DataLoader(loader.dataset, batch_size=batch_size, shuffle=False,
                         collate_fn=loader.collate_fn, num_workers=0)
        batch = next(iter(seq))
    except Exception as exc:
        raise _fail("reading the first batch of your loader's dataset failed.",
                    seen=f"{type(exc).__name__}: {exc}"[:300],
                    hint="try next(iter(build_loader(...))) yourself and fix what it says.") from exc
    shape = (batch_size, 3, size, size)
    want = (f"a tuple (images, labels): images a torch.uint8 tensor of shape {shape}, labels a "
            f"torch.int64 tensor of shape ({batch_size},)")
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise _fail("a batch is not (images, labels).", expected=want,
                    seen=f"{type(batch).__name__}"[:200])
    images, labels = batch
    if not isinstance(images, torch.Tensor):
        raise _fail("the images of a batch are not a torch tensor.", expected=want,
                    seen=type(images).__name__)
    if images.dtype != torch.uint8:
        hint = ("keep uint8 until the end (lesson 01): convert to float on the device, for the "
                "whole batch, in the training step - a float32 batch is 4x the bytes to make, "
                "send between processes and copy.")
        raise _fail(f"the images are {images.dtype}, not torch.uint8.", expected=want,
                    seen=f"{images.dtype}, shape {tuple(images.shape)}", hint=hint)
    if tuple(images.shape) != shape:
        raise _fail("the images have the wrong shape.", expected=f"{shape} (N, C, H, W)",
                    seen=str(tuple(images.shape)),
                    hint=f"resize every image to {size}x{size} and put channels first "
                         f"(permute(2, 0, 1), or BatchedJpegDataset which does both).")
    ref = torch.stack([ToTensorUint8(size)(dataset[i][0]) for i in range(batch_size)])
    if not torch.equal(images, ref):
        diff = (images.int() - ref.int()).abs()
        swapped = torch.equal(images, ref.flip(1))
        hint = ("the colour channels are in BGR order: OpenCV decodes to BGR, convert with "
                "cv2.cvtColor(..., cv2.COLOR_BGR2RGB)." if swapped else
                "decode, then cv2.resize to (size, size) with INTER_LINEAR, RGB order, no "
                "normalisation - exactly ToTensorUint8(size); BatchedJpegDataset gives the same "
                "values.")
        raise _fail("the image values differ from the reference pipeline's.",
                    expected="images equal to ToTensorUint8(size)(dataset[i][0]) for sample i",
                    seen=f"{int((diff > 0).sum()):,} of {diff.numel():,} values differ (largest "
                         f"difference {int(diff.max())})", hint=hint)
    want_labels = torch.as_tensor(np.asarray(dataset.labels[:batch_size]), dtype=torch.int64)
    if not isinstance(labels, torch.Tensor) or labels.dtype != torch.int64 \
            or not torch.equal(labels, want_labels):
        raise _fail("the labels differ from the dataset's.", expected=f"{want_labels.tolist()}",
                    seen=f"{labels!r}"[:200], hint="labels are dataset.labels[i], int64.")


@grader(FAST)
def grade_fast_pipeline(build_loader: Callable[..., Any], *, cpu_budget: int | None = None,
                        batch_size: int = 32, size: int = 160, n_images: int | None = None,
                        batches: int | None = None, rounds: int = ROUNDS,
                        pass_ratio: float = PASS_RATIO) -> CheckResult:
    """Check ``build_loader(dataset, batch_size=, size=, cpu_budget=)``: right samples, within
    the CPU budget, at least ``pass_ratio`` of the reference's samples/s measured side by side."""
    import torch
    from torch.utils.data import DataLoader

    from ..bench import compare, measure_loader, Measurement
    from ..config import pick
    from ..data import JpegDataset
    from ..tuning import _resampled

    if not callable(build_loader):
        raise _fail("the answer is not a function.",
                    expected="a function build_loader(dataset, *, batch_size, size, cpu_budget) "
                             "returning a DataLoader",
                    seen=f"{type(build_loader).__name__}: {build_loader!r}"[:200])
    refuse_course_helper(FAST, build_loader, COURSE_LOADERS,
                         write="build the DataLoader yourself, choosing its dataset, workers and "
                               "settings from what lessons 01-06 measured")
    k = default_cpu_budget() if cpu_budget is None else int(cpu_budget)
    dataset = JpegDataset(n=pick(full=600, quick=240) if n_images is None else n_images,
                          min_side=200, max_side=480, seed=6)
    loader = build_loader(dataset, batch_size=batch_size, size=size, cpu_budget=k)
    if not isinstance(loader, DataLoader):
        raise _fail("build_loader did not return a DataLoader.",
                    expected="a torch.utils.data.DataLoader",
                    seen=f"{type(loader).__name__}: {loader!r}"[:200],
                    hint="return DataLoader(...) itself, not a list of batches, an iterator or "
                         "a generator: the training loop iterates it once per epoch.")
    if loader.batch_size != batch_size:
        raise _fail("the loader's batch_size is not the one you were given.",
                    expected=f"batch_size={batch_size} (the model decides it)",
                    seen=f"batch_size={loader.batch_size}",
                    hint="pass batch_size=batch_size to the DataLoader.")
    _check_batches(loader, dataset, batch_size, size)
    if loader.num_workers > k:
        raise _fail(f"{loader.num_workers} workers is over the CPU budget of {k} core(s).",
                    expected=f"num_workers <= {k}", seen=f"num_workers={loader.num_workers}",
                    hint="each busy worker needs a core; more workers than the budget only "
                         "share the same cores (and the trainer's).")

    reference = tuned_loader(dataset, batch_size=batch_size, size=size, num_workers=k)
    window = pick(full=40, quick=16) if batches is None else batches
    plans = []
    for label, ld in (("your loader", loader), ("reference", reference)):
        warm = max(2, ld.num_workers * (ld.prefetch_factor or 2))
        plans.append((label, warm, _resampled(ld, (warm + window + 1) * batch_size)))
    runs: dict[str, list[Measurement]] = {"your loader": [], "reference": []}
    for _ in range(rounds):
        for label, warm, ld in plans:
            runs[label].append(measure_loader(ld, batches=window, warmup_batches=warm,
                                              repeats=1, label=label, progress=False))
    mine, ref = (Measurement.merge(runs[label]) for label in ("your loader", "reference"))
    table = compare([ref, mine], baseline=0)
    # the median of the per-round ratios: each round's pair ran back to back, so a drift of a
    # busy machine cancels out better than in the ratio of the two medians
    ratio = float(np.median([a.samples_per_s / b.samples_per_s
                             for a, b in zip(runs["your loader"], runs["reference"])]))
    cores = (mine.cpu_s_per_sample or 0.0) * mine.samples_per_s
    ref_cores = (ref.cpu_s_per_sample or 0.0) * ref.samples_per_s
    seen = (f"your loader {mine.samples_per_s:,.0f} samples/s using {cores:.2f} cores; reference "
            f"{ref.samples_per_s:,.0f} samples/s using {ref_cores:.2f} cores ({ratio:.2f}x)")
    details = {"ratio": ratio, "cores": cores, "reference_cores": ref_cores, "cpu_budget": k,
               "comparison": table.to_dict()}
    if cores > k + CPU_ALLOWANCE:
        raise _fail(f"your loader kept {cores:.2f} cores busy; the budget is {k}.",
                    expected=f"at most {k} + {CPU_ALLOWANCE} cores (CPU-seconds per wall-second "
                             f"of the main process and all workers)", seen=seen,
                    hint="limit every thread pool in the workers (worker_init_fn="
                         "make_worker_init(1), lesson 02); with num_workers=0, the main "
                         "process's OpenCV and torch threads count too.")
    if not math.isfinite(ratio) or ratio < pass_ratio:
        raise _fail(f"your loader reached {ratio:.2f}x the reference's samples/s.",
                    expected=f"at least {pass_ratio:.2f}x, measured side by side", seen=seen,
                    hint="use the budget: as many workers as cores allowed, one thread each; "
                         "fetch whole batches (BatchedJpegDataset + keep_batch); keep uint8. "
                         "If the machine is busy, run the check again.")
    return CheckResult(FAST, f"right samples; {ratio:.2f}x the reference's samples/s "
                             f"({mine.samples_per_s:,.0f} vs {ref.samples_per_s:,.0f}) using "
                             f"{cores:.2f} cores of a budget of {k}.", details)
