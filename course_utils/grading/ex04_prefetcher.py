"""Grader for exercise 04, ``Prefetcher(loader, device)``: order, values, placement, dtypes (also
on 'meta' on a CPU), epochs, and batch k+1 requested before batch k is handed out; on CUDA, copies
overlapping compute and no batch read mid-copy or reused. Step 1, ``04.copy``: ``copy`` alone."""
from __future__ import annotations

import functools
import statistics
from typing import Any, Callable, Iterator

import torch

from course_utils.device import move_to_device, resolve_device, synchronize
from course_utils.lessons.l04_overlap import calibrated_compute
from course_utils.timing import time_op

from .checker import CheckResult, ExerciseFailed, call_answer, describe, grader

EXERCISE = "04.prefetcher"

class _RecordingLoader:
    """``n`` distinct (uint8 images, int64 labels) batches; ``pulled``: handed out this pass."""

    def __init__(self, n: int, batch_size: int = 4, *, shape: tuple[int, ...] = (3, 8, 8),
                 pin: bool = False, constant: bool = False) -> None:
        self.n, self.batch_size, self.pulled, self.batches = n, batch_size, 0, []
        for k in range(n):
            size = (batch_size, *shape)
            images = (torch.full(size, (k % 250) + 1, dtype=torch.uint8) if constant else
                      ((torch.arange(torch.Size(size).numel()) + 37 * k) % 251).to(torch.uint8).view(size))
            batch = images, torch.arange(k * batch_size, (k + 1) * batch_size, dtype=torch.int64)
            self.batches.append(tuple(t.pin_memory() for t in batch) if pin else batch)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.pulled = 0
        for batch in self.batches:
            self.pulled += 1
            yield batch


_fail = functools.partial(ExerciseFailed, EXERCISE)


def _build(answer: Any, loader: Any, device: torch.device) -> Any:
    """``answer(loader, device)``: the learner's class made for one loader."""
    if not isinstance(answer, type) and (hasattr(answer, "__iter__") or not callable(answer)):
        raise _fail("the answer looks like a prefetcher object, not the class."
                    if hasattr(answer, "__iter__") else
                    f"the answer is a {type(answer).__name__}, not a class.",
                    expected="check(\"04.prefetcher\", Prefetcher)", seen=describe(answer),
                    hint="pass the class itself: the grader calls Prefetcher(loader, device) and "
                         "iterates over the result.")
    return call_answer(EXERCISE, answer, loader, device, what="Prefetcher(loader, device)",
                       signature="__init__(self, loader, device)",
                       hint="__init__ should only store the loader and the device (and, on "
                            "CUDA, may create the side stream).")


def _iteration_hint(exc: Exception, device: torch.device) -> str:
    text = str(exc).lower()
    if "pin" in text and device.type != "cuda":
        return ("pinning needs an accelerator: leave pinning to the DataLoader "
                "(pin_memory=True); the prefetcher only copies.")
    if "cuda" in text and device.type != "cuda":
        return ("CUDA calls (streams, record_stream) only on a CUDA device: test "
                "`self.device.type == 'cuda'` before using them; elsewhere copy plainly.")
    return "run a loop over your Prefetcher in a cell of its own and read the traceback."


def _batches(prefetcher: Any, loader: _RecordingLoader, device: torch.device) -> Iterator[tuple[Any, int]]:
    """The prefetcher's batches, each with the number the loader had handed out by then."""
    it = call_answer(EXERCISE, iter, prefetcher, what="iter(prefetcher)",
                     hint="__iter__ should return an iterator (a generator: a function with "
                          "`yield` in it).")
    if it is None or not hasattr(it, "__next__"):
        raise _fail("iter(prefetcher) did not return an iterator.", seen=type(it).__name__,
                    hint="write __iter__ as a generator: `yield batch` inside it (no return "
                         "value).")
    end = object()
    while (batch := call_answer(EXERCISE, next, it, end, what="iterating",
                                hint=lambda exc: _iteration_hint(exc, device))) is not end:
        yield batch, loader.pulled


def _run_pass(prefetcher: Any, loader: _RecordingLoader, device: torch.device) -> tuple[list, list[int]]:
    """One pass: the batches, and how many the loader had handed out as each came."""
    out, pulled = [], []
    for batch, handed_out in _batches(prefetcher, loader, device):
        out.append(batch)
        pulled.append(handed_out)
        if len(out) > 3 * loader.n + 3:
            raise _fail("the prefetcher yields more batches than the loader has.",
                        expected=f"{loader.n} batches", seen=f"more than {3 * loader.n + 3}",
                        hint="stop when the loader is exhausted (catch StopIteration / use "
                             "next(it, sentinel)).")
    return out, pulled


def _split(batch: Any, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        raise _fail(f"batch {k} came out as a single tensor; the loader gives (images, labels).",
                    expected="a tuple (images, labels), both on the device", seen=describe(batch),
                    hint="move every tensor of the batch and keep its structure: an (images, "
                         "labels) pair, both on the device.")
    if not isinstance(batch, (tuple, list)) or len(batch) != 2 or not all(
            isinstance(t, torch.Tensor) for t in batch):
        raise _fail(f"batch {k} is not an (images, labels) pair of tensors.",
                    expected="a tuple (images, labels)", seen=describe(batch),
                    hint="yield the moved batch itself, with the same structure the loader gave.")
    return batch[0], batch[1]


def _check_order(batches: list, loader: _RecordingLoader, device: torch.device) -> None:
    n = loader.n
    if device.type == "meta":
        if len(batches) != n:
            raise _fail(f"the prefetcher yielded {len(batches)} batches for a loader of {n}.",
                        expected=f"{n} batches", seen=f"{len(batches)}",
                        hint="yield every batch exactly once, the first and the last included.")
        return
    labels = [_split(b, k)[1].cpu().reshape(-1) for k, b in enumerate(batches)]
    order = [int(x[0]) // loader.batch_size if x.numel() else None for x in labels]
    want = list(range(n))
    if order == want:
        return
    if order == want[1:]:
        problem = "the first batch is missing."
        hint = ("the batch copied before the loop must be handed out too: every batch you "
                "start copying is yielded once, batch 0 included.")
    elif order == want[:-1]:
        problem = "the last batch is missing."
        hint = ("when the loader runs out, the batch already copied must still be yielded: "
                "stop only when there is no 'next' batch left.")
    elif sorted(order) == want:
        problem = "the batches came out in the wrong order."
        hint = "yield the batch copied earlier (k), not the one just started (k+1)."
    elif len(order) > n or len(set(order)) < len(order):
        problem = "some batches came out more than once."
        hint = "after yielding a batch, move on: the 'next' batch becomes the current one."
    else:
        problem = "some batches are missing."
        hint = "every batch of the loader must come out exactly once."
    raise _fail(problem, expected=f"batches {want}", seen=f"batches {order}", hint=hint)


def _check_batches(batches: list, loader: _RecordingLoader, device: torch.device) -> None:
    """Every batch once, in order, with the loader's values and dtypes, on ``device``."""
    _check_order(batches, loader, device)
    for k, batch in enumerate(batches):
        images, labels = _split(batch, k)
        want_images, want_labels = loader.batches[k]
        where = f"images on {images.device}, labels on {labels.device}"
        if images.device.type != device.type or labels.device.type != device.type:
            images_only = labels.device.type == device.type
            raise _fail(f"the images of batch {k} stayed on {images.device}; only the labels "
                        f"moved to {device}." if images_only else
                        f"batch {k} stayed on {images.device}, not moved to {device}.",
                        expected=f"images and labels on {device}", seen=where,
                        hint="move every tensor of the batch: the images are the big part, the "
                             "one whose copy you want to overlap." if images_only else
                             "move both the images and the labels to the device.")
        if images.dtype != want_images.dtype or labels.dtype != want_labels.dtype:
            raise _fail(f"batch {k} changed dtype on the way.",
                        expected=f"images {want_images.dtype}, labels {want_labels.dtype} "
                                 f"(as the loader gave them)",
                        seen=f"images {images.dtype}, labels {labels.dtype}",
                        hint="the prefetcher only moves: copying uint8 is 4x fewer bytes than float32; "
                             "convert (and normalise) on the device after the copy, in the training step.")
        if images.shape != want_images.shape or labels.shape != want_labels.shape:
            raise _fail(f"batch {k} changed shape.", hint="move the tensors as they are.",
                        expected=f"images {tuple(want_images.shape)}, labels {tuple(want_labels.shape)}",
                        seen=f"images {tuple(images.shape)}, labels {tuple(labels.shape)}")
        if device.type != "meta" and not (torch.equal(labels.cpu(), want_labels)
                                          and torch.equal(images.cpu(), want_images)):
            raise _fail(f"batch {k} arrived with the wrong values.",
                        expected="the loader's values, unchanged",
                        seen=f"{int((images.cpu() != want_images).sum())} of {images.numel()} pixels differ",
                        hint="copy the tensors as they are; on CUDA make the current stream wait "
                             "for the copy stream before handing the batch out.")


def _check_lookahead(pulled: list[int], n: int) -> None:
    if n < 3:
        return
    for k, p in enumerate(pulled[:-1]):
        if p < k + 2:
            raise _fail(
                "no second buffer: when batch k was handed out, batch k+1 had not been requested "
                "from the loader yet, so its copy cannot overlap the work on batch k.",
                expected=f"the loader asked for batch {k + 1} before batch {k} is yielded "
                         f"(at least {k + 2} batches read)",
                seen=f"{p} batches read when batch {k} was yielded",
                hint="keep one batch ahead: the copy of the next batch must already be under way "
                     "when the current one is handed out.")
    if pulled[0] >= n and n >= 4:
        raise _fail("the prefetcher read the whole epoch before handing out the first batch.",
                    expected="batch k+1 read (and copied) while batch k is used: two batches on "
                             "the device at a time", seen=f"all {n} batches read before batch 0 was yielded",
                    hint="don't build a list of all batches: a real epoch does not fit in GPU "
                         "memory. Keep exactly one batch ahead.")


# ---- CUDA-only checks ----------------------------------------------------------------
#: The race check's passes over 8 batches: False reads each batch the moment it arrives (a
#: missing ``wait_stream`` reads a half-copied batch); True first keeps the current stream busy
#: for about four copies (a missing ``record_stream`` lets the caching allocator give a batch's
#: memory to a later copy before the current stream read it).
_RACE_PASSES = (False, False, False, True, True)
_RACE_BATCHES = 8


def _race_fill(pass_index: int, batch_index: int, n_batches: int = _RACE_BATCHES) -> int:
    """Every pixel's value (1..250) for one batch of one pass: another for every (pass, batch)."""
    return 1 + (pass_index * n_batches + batch_index) % 250


def _big_loader(n: int, mib: int, pin: bool) -> _RecordingLoader:
    """``n`` batches of ``mib`` MiB of images, each pixel set to the batch's value."""
    return _RecordingLoader(n, max(1, mib * 1024 * 1024 // (3 * 64 * 64)), shape=(3, 64, 64),
                            pin=pin, constant=True)


def _copy_s(loader: _RecordingLoader, device: torch.device, repeats: int) -> float:
    """The median time of one batch's asynchronous copy to ``device``, in seconds."""
    first, dst = loader.batches[0][0], torch.empty_like(loader.batches[0][0], device=device)
    return statistics.median(time_op(lambda: dst.copy_(first, non_blocking=True), device=device,
                                     repeats=repeats))


def _cuda_race_check(answer: Any, device: torch.device, mib: int,
                     passes: tuple[bool, ...] = _RACE_PASSES) -> dict:
    """Every batch read on the current stream as it arrives (:data:`_RACE_PASSES`)."""
    cuda, n = device.type == "cuda", _RACE_BATCHES
    loader = _big_loader(n, mib, pin=cuda)
    busy = (calibrated_compute(device, 4 * _copy_s(loader, device, 3)) if cuda and any(passes) else None)
    bad: list[tuple[int, int]] = []
    for p, lagging in enumerate(passes):
        for k, (host_images, _) in enumerate(loader.batches):
            host_images.fill_(_race_fill(p, k, n))   # the last pass was synchronised: no copy reads it
        flags: list[torch.Tensor] = []
        for batch, _ in _batches(_build(answer, loader, device), loader, device):
            images, _ = _split(batch, len(flags))
            if lagging and busy is not None:
                busy()                                # the current stream falls behind the copies
            flags.append((images == _race_fill(p, len(flags), n)).all())
            del batch, images                         # free it, as a training loop does
            if len(flags) == n:
                break
        synchronize(device)
        bad += [(p, k) for k, ok in enumerate(flags) if not bool(ok.item())]
    if bad:
        raise _fail("batches were read before their copy had finished, or after their memory "
                    "was reused for another batch (a race).",
                    expected="every batch complete, with this pass's values, when the consumer "
                             "reads it",
                    seen=f"{len(bad)} wrong reads over {len(passes)} passes of {n} batches "
                         f"({mib} MiB each; {sum(passes)} passes with a busy current stream)",
                    hint="a copy queued on a side stream is not finished when Python moves on: "
                         "before handing out a batch, the current stream must wait for the side "
                         "stream (Stream.wait_stream), and its tensors must be marked as used by "
                         "the current stream (Tensor.record_stream) so the caching allocator does "
                         "not reuse their memory too early."
                    if any(not passes[p] for p, _ in bad) else
                    "every batch was complete when read at once, but not when the current stream "
                    "was busy: its memory was reused for a later copy before the current stream "
                    "read it. The caching allocator only knows the stream a tensor was made on: "
                    "tell it the current stream uses every tensor of the batch (record_stream) "
                    "before handing it out.")
    return {"race_reads": len(passes) * n, "race_busy_passes": sum(passes)}


def _cuda_overlap_check(answer: Any, device: torch.device, mib: int, threshold: float) -> dict:
    """A plain copy-then-step loop against the prefetcher, the step as long as a copy."""
    loader = _big_loader(12, mib, pin=True)
    copy_s = _copy_s(loader, device, 5)
    chain = calibrated_compute(device, copy_s)
    dst = torch.empty_like(loader.batches[0][0], device=device)

    def step(batch: Any) -> None:
        batch[0][:1, :1, :1, :1].float().sum()   # the step reads the batch
        chain()

    def timed(batches: Callable[[], Any]) -> float:   # best of 3 passes, the device synchronised
        return min(time_op(lambda: [step(b) for b in batches()], device=device, repeats=3, events=False))

    step_s = statistics.median(time_op(lambda: step((dst, None)), device=device, repeats=5))
    t_plain = timed(lambda: (move_to_device(b, device, non_blocking=True) for b in loader))
    t_learner = timed(lambda: _build(answer, loader, device))
    hideable = loader.n * min(copy_s, step_s)
    saved = (t_plain - t_learner) / hideable if hideable > 0 else 0.0
    if saved < threshold:
        raise _fail("the copies did not overlap the compute.",
                    expected=f"at least {threshold:.0%} of the hideable copy time hidden "
                             f"({loader.n} batches: copy {copy_s * 1e3:.2f} ms, step "
                             f"{step_s * 1e3:.2f} ms each)",
                    seen=f"plain loop {t_plain * 1e3:.1f} ms, your prefetcher "
                         f"{t_learner * 1e3:.1f} ms: {saved:.0%} hidden",
                    hint="the copy of batch k+1 must be queued on a stream of its own, and be "
                         "asynchronous, before batch k is handed out: a copy on the default "
                         "stream waits for the previous step's kernels, and a synchronous copy "
                         "(non_blocking=False) blocks Python until it is done.")
    return {"copy_ms": copy_s * 1e3, "step_ms": step_s * 1e3, "plain_ms": t_plain * 1e3,
            "prefetcher_ms": t_learner * 1e3, "overlap_saved": saved}


@grader(EXERCISE)
def grade_prefetcher(answer: Any, *, device: Any = None, n_batches: int = 6, batch_size: int = 4,
                     cuda_checks: bool = True, copy_mib: int = 32,
                     overlap_threshold: float = 0.3) -> CheckResult:
    """A Prefetcher class (see the module docstring)."""
    dev = resolve_device(device)
    loader = _RecordingLoader(n_batches, batch_size)
    prefetcher = _build(answer, loader, dev)
    batches, pulled = _run_pass(prefetcher, loader, dev)
    _check_batches(batches, loader, dev)
    _check_lookahead(pulled, n_batches)
    checked = [f"all {n_batches} batches once, in order, with the loader's values and dtypes, "
               f"images and labels on {dev}",
               "batch k+1 was requested before batch k was handed out (double buffering)"]
    not_checked: list[str] = []
    again, _ = _run_pass(prefetcher, loader, dev)
    if len(again) != n_batches:
        raise _fail("a second pass over the same prefetcher (the next epoch) did not give the "
                    "batches again.", expected=f"{n_batches} batches in epoch 2",
                    seen=f"{len(again)} batches",
                    hint="create the loader's iterator inside __iter__ (iter(self.loader)), not in "
                         "__init__, so every epoch starts afresh.")
    _check_batches(again, loader, dev)
    for n in (0, 1):
        small = _RecordingLoader(n, batch_size)
        got, _ = _run_pass(_build(answer, small, dev), small, dev)
        if len(got) != n:
            raise _fail(f"a loader with {n} batch{'es' if n != 1 else ''} gave {len(got)}.",
                        expected=f"{n} batches", seen=f"{len(got)}",
                        hint="handle the ends: an empty loader yields nothing, a loader with one "
                             "batch yields it once.")
        _check_batches(got, small, dev)
    checked.append("a second epoch, an empty loader and a one-batch loader")

    if dev.type == "cpu":
        meta = torch.device("meta")
        try:
            mbatches, _ = _run_pass(_build(answer, loader, meta), loader, meta)
        except ExerciseFailed as exc:
            not_checked.append(f"placement on a second device ('meta' failed: {exc.problem})")
        except NotImplementedError as exc:  # the CPU pass ran: torch refuses an op on 'meta'
            not_checked.append(f"placement on a second device (an operation is not supported "
                               f"on 'meta' tensors: {exc})")
        else:
            _check_batches(mbatches, loader, meta)
            checked.append("placement and dtypes again on PyTorch's 'meta' device (this machine's "
                           "device is the CPU, where everything is 'on the device' already)")

    details: dict[str, Any] = {"device": str(dev), "batches": n_batches}
    if dev.type == "cuda" and cuda_checks:
        details.update(_cuda_race_check(answer, dev, copy_mib))
        checked.append("no batch read before its copy finished or after its memory was reused "
                       "(wait_stream and record_stream)")
        details.update(_cuda_overlap_check(answer, dev, copy_mib, overlap_threshold))
        checked.append(f"copies overlapped compute: {details['overlap_saved']:.0%} of the hideable "
                       f"copy time hidden (plain loop {details['plain_ms']:.1f} ms, yours "
                       f"{details['prefetcher_ms']:.1f} ms)")
    else:
        why = "this machine has no CUDA" if dev.type != "cuda" else "cuda_checks=False"
        not_checked += [f"that copies overlap compute ({why}: only CUDA streams let a copy run "
                        f"while a kernel computes)", "that the current stream waits for the copy "
                        "stream and that a batch's memory is not reused while it is read (a "
                        "missing wait_stream or record_stream only shows as a race on a GPU)"]
    details.update(checked=checked, not_checked=not_checked)
    return CheckResult(EXERCISE, "checked: " + "; ".join(checked) + "." + (
        " NOT checked on this device: " + "; ".join(not_checked) + "." if not_checked else ""), details)


# ---- step 1: copy() alone ------------------------------------------------------------
COPY = "04.copy"


@grader(COPY)
def grade_copy(answer: Any, *, device: Any = None) -> CheckResult:
    """Step 1: ``copy(batch, stream)`` returns the pair on the device (also on 'meta' on a CPU)."""
    dev = resolve_device(device)
    loader = _RecordingLoader(1, 2)
    for target in [dev] + ([torch.device("meta")] if dev.type == "cpu" else []):
        stream = torch.cuda.Stream(target) if target.type == "cuda" else None
        try:
            out = call_answer(COPY, _build(answer, loader, target).copy, loader.batches[0], stream,
                              what="prefetcher.copy(batch, stream)",
                              hint=lambda exc: _iteration_hint(exc, target))
            if stream is not None:
                stream.synchronize()                # the check reads the values: let it finish
            _check_batches([out], loader, target)
        except ExerciseFailed as exc:
            raise exc.as_exercise(COPY) from None
    where = " and on 'meta' (placement)" if dev.type == "cpu" else ""
    return CheckResult(COPY, f"copy() moved images and labels to {dev}{where}, dtypes and values "
                             f"kept. Now __iter__: check(\"04.prefetcher\", Prefetcher).")
