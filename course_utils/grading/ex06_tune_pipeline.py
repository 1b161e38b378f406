"""Grader for exercise 06: ``build_loader``'s first batch (read as its fetcher reads it) equals
the reference, made by one dataset call, within ``cpu_budget``, at :data:`PASS_RATIO` or more of
``tuned_loader``'s samples/s (:func:`speed_verdict`). Step 1, ``06.batched_fetch``: the fetch alone."""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler
from torch.utils.data._utils.collate import default_collate

from course_utils.config import pick
from course_utils.data import JpegDataset, ToTensorUint8
from course_utils.machine import usable_cpus
from course_utils.measurement import Measurement, compare
from course_utils.pipelines import tuned_loader
from course_utils.start_methods import worker_timeout
from course_utils.timing import default_warmup, measure_loader
from course_utils.tools.tune.search import WORKER_TIMEOUT_S

from .checker import CheckResult, ExerciseFailed, call_answer, describe, grader, require_callable

FAST = "06.fast_pipeline"
#: the answer passes at this fraction of the reference's samples/s or more: on a busy 2-core
#: machine the reference against itself read 0.59-1.16, and the mark sits below the lowest
PASS_RATIO = 0.5
#: below it, too slow (an answer at PASS_RATIO slowed by the worst noise, x 0.59); between, re-run
SLOW_RATIO = 0.3
#: cores of CPU-seconds per wall-second allowed above the budget (the main process's share)
CPU_ALLOWANCE = 0.4
#: interleaved rounds (answer, reference, answer, reference, ...)
ROUNDS = 5
_fail = functools.partial(ExerciseFailed, FAST)


# ---- the first batch, read as the DataLoader's fetcher reads it ------------------------------
def _per_batch(loader: DataLoader) -> int | None:
    """Samples per batch, or None when it cannot be told."""
    if loader.batch_sampler is not None:
        return loader.batch_size or getattr(loader.batch_sampler, "batch_size", None)
    return getattr(loader.sampler, "batch_size", None)


def _first_indices(loader: DataLoader, batch_size: int) -> list[int]:
    """``[0, .., B-1]``; a loader without automatic batching must sample lists of indices."""
    if loader.batch_sampler is None and not isinstance(first := next(iter(loader.sampler), None),
                                                         (list, tuple)):
        raise _fail("with batch_size=None the loader fetches one index at a time.",
                    expected=f"batches of {batch_size} samples, one dataset call per batch",
                    seen=f"the sampler yields {describe(first)}; each becomes a 'batch' as is",
                    hint="without automatic batching, dataset[...] receives exactly what the "
                         "sampler yields. Which sampler yields lists of indices?")
    return list(range(batch_size))


def _attempt(problem: str, fn: Callable[[], Any], hint: str) -> Any:
    """``fn()``; an error (but NotImplementedError) fails the check with ``problem``."""
    try:
        return fn()
    except NotImplementedError:
        raise
    except Exception as exc:
        raise _fail(problem, seen=f"{type(exc).__name__}: {exc}"[:300], hint=hint) from exc


def _fetch(loader: DataLoader, indices: list[int]) -> tuple[Any, Any]:
    """(what the dataset call returned, what collate_fn made of it), as the fetcher does."""
    ds, auto = loader.dataset, loader.batch_sampler is not None
    getitems = getattr(ds, "__getitems__", None) if auto else None
    if not getitems and type(ds).__getitem__ is Dataset.__getitem__:
        call = "dataset[i] for every index" if auto else "dataset[indices] (__getitem__)"
        raise _fail(f"your dataset has no __getitem__, and this loader calls {call}.",
                    expected="a dataset method for the call this loader makes",
                    seen=f"{type(ds).__name__} defines "
                         f"{'__getitems__ only' if hasattr(ds, '__getitems__') else 'neither'}",
                    hint="read _MapDatasetFetcher.fetch in torch/utils/data/_utils/fetch.py: which method "
                         "does it call with batch_size=B, and which with batch_size=None?")
    fetched = _attempt("fetching the first batch from your dataset failed.", lambda: (
        getitems(indices) if getitems else [ds[i] for i in indices] if auto else ds[indices]),
        "call your dataset's fetch yourself on a few indices, e.g. ds.__getitems__([0, 1, 2]), "
        "and fix what it says.")
    hint = ("collate_fn is default_collate, which takes its input for a list of samples and "
            "stacks element 0 with element 1, ... What does it do with a batch that is already "
            "made, and what should a collate_fn do with one?"
            if loader.collate_fn is default_collate and getitems else
            "call collate_fn on what your dataset returns, yourself, and fix what it says.")
    given = "what your __getitems__ returned" if getitems else "the fetched samples"
    return fetched, _attempt(f"collate_fn failed on {given}.", lambda: loader.collate_fn(fetched), hint)


def _check_batch(batch: Any, dataset: JpegDataset, indices: Sequence[int], size: int) -> None:
    """The batch of ``indices``, in order: uint8 images equal to the reference's, int64 labels."""
    shape = (len(indices), 3, size, size)
    want = (f"a tuple (images, labels): images a torch.uint8 tensor of shape {shape}, labels a "
            f"torch.int64 tensor of shape ({len(indices)},)")
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise _fail("a batch is not (images, labels).", expected=want, seen=describe(batch, 200))
    images, labels = batch
    if not isinstance(images, torch.Tensor):
        raise _fail("the images of a batch are not a torch tensor.", expected=want,
                    seen=type(images).__name__,
                    hint="torch.from_numpy(array) makes a tensor that shares the array's memory.")
    if images.dtype != torch.uint8:
        raise _fail(f"the images are {images.dtype}, not torch.uint8.", expected=want,
                    seen=describe(images), hint="keep uint8 until the end (lesson 01): convert to "
                    "float on the device, for the whole batch, in the training step - a float32 "
                    "batch is 4x the bytes to make, send between processes and copy.")
    if tuple(images.shape) != shape:
        raise _fail("the images have the wrong shape.", expected=f"{shape} (N, C, H, W)",
                    seen=str(tuple(images.shape)), hint=f"every image resized to {size}x{size}, "
                    f"channels first. A decoded image is (H, W, C): which tensor method reorders "
                    f"dimensions without copying?")
    ref = torch.stack([ToTensorUint8(size)(dataset[i][0]) for i in indices])
    if not torch.equal(images, ref):
        diff = (images.int() - ref.int()).abs()
        raise _fail("the image values differ from the reference pipeline's.",
                    expected="images equal to ToTensorUint8(size)(dataset[i][0]) for sample i",
                    seen=f"{int((diff > 0).sum()):,} of {diff.numel():,} values differ (largest "
                         f"difference {int(diff.max())})",
                    hint="the colour channels are in BGR order: OpenCV decodes to BGR; the check "
                         "wants RGB." if torch.equal(images, ref.flip(1)) else
                         "the reference decodes, resizes with cv2.resize(image, (size, size), "
                         "interpolation=cv2.INTER_LINEAR), RGB order, no normalisation: "
                         "ToTensorUint8(size)(dataset[i][0]). Compare one of your images with it.")
    want_labels = torch.as_tensor(np.asarray(dataset.labels)[list(indices)], dtype=torch.int64)
    if not isinstance(labels, torch.Tensor) or labels.dtype != torch.int64 \
            or not torch.equal(labels, want_labels):
        raise _fail("the labels differ from the dataset's.", expected=f"{want_labels.tolist()}",
                    seen=(f"{labels.dtype} {labels.tolist()}" if isinstance(labels, torch.Tensor)
                          else describe(labels, 200))[:200],
                    hint="sample i's label is dataset.labels[i]; the batch holds them as one "
                         "int64 tensor, in the order of the indices asked for.")


def _pointers(obj: Any) -> set[int]:
    """Start addresses of the tensors and arrays in ``obj`` and its first level of items."""
    out: set[int] = set()
    for item in [obj] + (list(obj) if isinstance(obj, (tuple, list)) and len(obj) <= 4 else []):
        if isinstance(item, torch.Tensor):
            out |= {item.data_ptr(), item.untyped_storage().data_ptr()}
        elif isinstance(item, np.ndarray):
            out.add(item.ctypes.data)
    return out


def _check_one_fetch(loader: DataLoader, fetched: Any, images: torch.Tensor, batch_size: int) -> None:
    """One dataset call made the whole batch, and collate_fn kept its memory."""
    if loader.batch_sampler is not None and not getattr(loader.dataset, "__getitems__", None):
        raise _fail("your loader fetches one sample at a time.",
                    expected="one dataset call per batch that makes the whole batch",
                    seen=f"the fetcher calls dataset[i] {batch_size} times per batch, then "
                         f"collate_fn makes the batch out of {batch_size} samples",
                    hint="lesson 03, deep dive 8: what does the fetcher call instead, when the "
                         "dataset offers it? One call per batch can write every image straight "
                         "into one batch tensor: no tensor per sample, no stacking copy.")
    if isinstance(fetched, (tuple, list)) and len(fetched) == batch_size != 2:
        raise _fail("your dataset's fetch returns the batch as separate samples.",
                    expected="one call that returns (images, labels) for the whole batch",
                    seen=f"a {type(fetched).__name__} of {batch_size} items, which collate_fn "
                         f"then stacks into a new tensor",
                    hint="one tensor per sample and one stacking copy per batch are what a "
                         "batched fetch saves. Allocate the batch once, fill it image by image, "
                         "and ask what collate_fn must then do with it.")
    if images.data_ptr() not in _pointers(fetched):
        raise _fail("the batch's images are not the memory your fetch filled: collate_fn made a copy.",
                    expected="collate_fn returns the images your dataset made (same memory)",
                    seen=f"collate_fn={getattr(loader.collate_fn, '__name__', loader.collate_fn)}"
                         f" returned images at another address",
                    hint="a copy of every batch (stack, contiguous, clone, a new tensor) costs "
                         "time and memory bandwidth in the worker. Which collate_fn keeps "
                         "what it is given? Do the images need to be contiguous in NCHW order?")


def _check_loader(loader: Any, batch_size: int) -> None:
    """A map-style DataLoader batching ``batch_size``."""
    if not isinstance(loader, DataLoader):
        raise _fail("build_loader did not return a DataLoader.",
                    expected="a torch.utils.data.DataLoader", seen=describe(loader, 200),
                    hint="return DataLoader(...) itself, not a list of batches, an iterator or "
                         "a generator: the training loop iterates it once per epoch.")
    if isinstance(loader.dataset, IterableDataset):
        raise _fail("the loader's dataset is an IterableDataset.",
                    expected="a map-style Dataset (len and indexing), so the sampler can "
                             "shuffle and the check can read the samples it chooses",
                    seen=type(loader.dataset).__name__)
    per_batch = _per_batch(loader)
    if per_batch is not None and per_batch != batch_size:
        raise _fail("the loader's batch size is not the one you were given.",
                    expected=f"{batch_size} samples per batch (the model decides it)",
                    seen=f"{per_batch} samples per batch",
                    hint="use the batch_size argument of build_loader, wherever your loader "
                         "decides how many indices make a batch.")


# ---- speed and cores, side by side with the reference --------------------------------------
def _resampled(loader: DataLoader, batch_size: int, samples: int, keep_workers: bool) -> DataLoader:
    """The same loader drawing ``samples`` random samples an epoch; ``keep_workers``: persistent.
    Its own timeout, else WORKER_TIMEOUT_S under fork and none elsewhere (why: tune/window.py)."""
    kwargs: dict[str, Any] = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                                  pin_memory=loader.pin_memory)
    if loader.num_workers:
        kwargs.update(worker_init_fn=loader.worker_init_fn, prefetch_factor=loader.prefetch_factor,
                      persistent_workers=loader.persistent_workers or keep_workers,
                      multiprocessing_context=loader.multiprocessing_context,
                      timeout=loader.timeout or worker_timeout(WORKER_TIMEOUT_S,
                                                               loader.multiprocessing_context))
    draw = RandomSampler(loader.dataset, num_samples=max(len(loader.dataset), int(samples)))
    if loader.batch_sampler is not None:
        return DataLoader(loader.dataset, batch_size=batch_size, sampler=draw,
                          drop_last=loader.drop_last, **kwargs)
    return DataLoader(loader.dataset, batch_size=None,
                      sampler=BatchSampler(draw, batch_size, drop_last=False), **kwargs)


def _side_by_side(loader: DataLoader, reference: DataLoader, batch_size: int, window: int,
                  rounds: int) -> dict[str, list[Measurement]]:
    """Both loaders measured in interleaved rounds, back to back (the reference's workers kept)."""
    plans = [(label, warm, _resampled(ld, batch_size, (warm + window + 1) * batch_size, keep))
             for label, ld, keep in (("your loader", loader, False), ("reference", reference, True))
             for warm in [default_warmup(ld)]]
    runs: dict[str, list[Measurement]] = {"your loader": [], "reference": []}
    for _ in range(rounds):
        for label, warm, ld in plans:
            runs[label].append(measure_loader(ld, batches=window, warmup_batches=warm,
                                              repeats=1, label=label, progress=False))
    return runs


def speed_verdict(answer_rates: Sequence[float], reference_rates: Sequence[float], *,
                  pass_ratio: float = PASS_RATIO, slow_ratio: float = SLOW_RATIO) -> tuple[str, float]:
    """("pass" | "re-run" | "slow", the median of the per-round ratios answer / reference)."""
    ratio = float(np.median([a / r if r > 0 else math.nan
                             for a, r in zip(answer_rates, reference_rates)] or [math.nan]))
    if not math.isfinite(ratio) or ratio < slow_ratio:
        return "slow", ratio
    return ("pass" if ratio >= pass_ratio else "re-run"), ratio


def over_cpu_budget(cores: float, budget: int) -> bool:
    """Whether ``cores`` (CPU-seconds per wall-second, all processes) is over ``budget``."""
    return cores > budget + CPU_ALLOWANCE


@grader(FAST)
def grade_fast_pipeline(build_loader: Callable[..., Any], *, cpu_budget: int | None = None,
                        batch_size: int = 32, size: int = 160, n_images: int | None = None,
                        batches: int | None = None, rounds: int = ROUNDS, pass_ratio: float = PASS_RATIO,
                        slow_ratio: float = SLOW_RATIO) -> CheckResult:
    """``build_loader(dataset, batch_size=, size=, cpu_budget=)`` (default: half the CPUs)."""
    require_callable(FAST, build_loader, "a function build_loader(dataset, *, batch_size, size, "
                                         "cpu_budget) returning a DataLoader",
                     hint="pass the function itself, not what it returns: "
                          "check(\"06.fast_pipeline\", build_loader).")
    k = max(1, usable_cpus() // 2) if cpu_budget is None else int(cpu_budget)
    dataset = JpegDataset(n=pick(full=600, quick=240) if n_images is None else n_images,
                          min_side=200, max_side=480, seed=6)
    loader = build_loader(dataset, batch_size=batch_size, size=size, cpu_budget=k)
    _check_loader(loader, batch_size)
    fetched, batch = _fetch(loader, _first_indices(loader, batch_size))
    _check_batch(batch, dataset, range(batch_size), size)
    _check_one_fetch(loader, fetched, batch[0], batch_size)
    if loader.num_workers > k:
        raise _fail(f"{loader.num_workers} workers is over the CPU budget of {k} core(s).",
                    expected=f"num_workers <= {k}", seen=f"num_workers={loader.num_workers}",
                    hint="each busy worker needs a core; more workers than the budget only "
                         "share the same cores (and the trainer's).")

    reference = tuned_loader(dataset, batch_size=batch_size, size=size, num_workers=k)
    runs = _side_by_side(loader, reference, batch_size,
                         pick(full=40, quick=16) if batches is None else batches, rounds)
    verdict, ratio = speed_verdict([m.samples_per_s for m in runs["your loader"]],
                                   [m.samples_per_s for m in runs["reference"]],
                                   pass_ratio=pass_ratio, slow_ratio=slow_ratio)
    mine, ref = (Measurement.merge(runs[label]) for label in ("your loader", "reference"))
    cores, ref_cores = ((m.cpu_s_per_sample or 0.0) * m.samples_per_s for m in (mine, ref))
    seen = (f"your loader {mine.samples_per_s:,.0f} samples/s using {cores:.2f} cores; reference "
            f"{ref.samples_per_s:,.0f} samples/s using {ref_cores:.2f} cores ({ratio:.2f}x)")
    details = {"ratio": ratio, "cores": cores, "reference_cores": ref_cores, "cpu_budget": k,
               "comparison": compare([ref, mine], baseline=0).to_dict()}
    if over_cpu_budget(cores, k):
        raise _fail(f"your loader kept {cores:.2f} cores busy; the budget is {k}.",
                    expected=f"at most {k} + {CPU_ALLOWANCE} cores (CPU-seconds per wall-second "
                             f"of the main process and all workers)", seen=seen,
                    hint="lesson 02: how many threads does OpenCV run in each worker, and in the main "
                         "process when num_workers=0? Every busy thread counts against the budget.")
    expected = (f"at least {pass_ratio:.2f}x, measured side by side (the median of {rounds} "
                f"interleaved rounds)")
    faster = ("does every core of the budget work, with one thread each? Is any pixel work done on the "
              "full-size image that could be done on the small one, or any copy made twice?")
    if verdict == "slow":
        raise _fail(f"your loader reached {ratio:.2f}x the reference's samples/s: too slow.",
                    expected=expected, seen=seen, hint=faster)
    if verdict == "re-run":
        raise _fail(f"not decided: your loader reached {ratio:.2f}x the reference's samples/s, "
                    f"between {slow_ratio:.2f}x (too slow) and {pass_ratio:.2f}x (passes), "
                    f"where a busy machine's noise can put a right answer. Re-run the check on "
                    f"a quiet machine.", expected=expected, seen=seen,
                    hint="close other notebooks and programs that use the CPU and run the "
                         "check again. If it lands here again on a quiet machine, your loader "
                         "is slower than it should be: " + faster)
    return CheckResult(FAST, f"right samples, one fetch per batch; {ratio:.2f}x the reference's "
                             f"samples/s ({mine.samples_per_s:,.0f} vs {ref.samples_per_s:,.0f}) "
                             f"using {cores:.2f} cores of a budget of {k}.", details)


# ---- step 1: the batched fetch alone -------------------------------------------------------
BATCHED = "06.batched_fetch"


@grader(BATCHED)
def grade_batched_fetch(answer: Callable[..., Any], *, size: int = 96) -> CheckResult:
    """Step 1: ``JpegBatches(dataset, size).__getitems__`` on indices out of order."""
    require_callable(BATCHED, answer, "the class JpegBatches(dataset, size)",
                     hint="pass the class itself: check(\"06.batched_fetch\", JpegBatches).")
    dataset = JpegDataset(n=12, min_side=200, max_side=480, seed=6)
    batches = call_answer(BATCHED, answer, dataset, size, what=f"JpegBatches(dataset, {size})",
                          signature="JpegBatches(dataset, size)")
    if not callable(getattr(batches, "__getitems__", None)):
        raise ExerciseFailed(BATCHED, "JpegBatches has no __getitems__ method.",
                             expected="def __getitems__(self, indices): return images, labels",
                             seen=describe(batches),
                             hint="the DataLoader's fetcher calls dataset.__getitems__(indices) "
                                  "once per batch when the dataset has that method.")
    indices = [5, 0, 9, 3]
    batch = call_answer(BATCHED, batches.__getitems__, indices, what=f"__getitems__({indices})")
    try:
        _check_batch(batch, dataset, indices, size)
    except ExerciseFailed as exc:
        raise exc.as_exercise(BATCHED) from None
    return CheckResult(BATCHED, f"__getitems__({indices}) gave those {len(indices)} samples, in that order: "
                                "uint8 images equal to the reference pipeline's, int64 labels. Now the "
                                "loader: check(\"06.fast_pipeline\", build_loader).")
