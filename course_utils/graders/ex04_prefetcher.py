"""Grader for exercise 04: a double-buffered device prefetcher.

The learner writes a class ``Prefetcher(loader, device)`` whose iterator yields every
``(images, labels)`` batch of ``loader`` on ``device``, in order, with the dtypes unchanged,
and fetches batch k+1 (and on CUDA starts its copy on a side stream) *before* handing out
batch k.

What is checked, on every device:

* order and values: a loader of batches with known contents (each batch different, first and
  last included) goes through the prefetcher; every batch must come out once, in order, with
  the same values; a second pass (a second epoch) must work too; an empty and a one-batch
  loader must work;
* placement and dtypes: images and labels on ``device``, uint8 images stay uint8. On a
  CPU-only machine the target device is also the CPU, so placement is checked a second time on
  PyTorch's ``meta`` device (shapes and dtypes, no data);
* double buffering, by behaviour: when batch k is handed out, the loader must already have
  been asked for batch k+1 (and not for the whole epoch).

Only on CUDA (it cannot be observed elsewhere):

* the copy of batch k+1 must overlap the compute on batch k — timed with a slow copy (large
  pinned batches) and a compute step calibrated to take about as long;
* the current stream must wait for the copy stream before a batch is used, and a batch's
  memory must not be reused while the current stream still reads it — checked by reading every
  batch on the current stream as it arrives, each pass and batch filled with its own value (so
  a reused block holding an earlier batch cannot pass for it): at once (a missing
  ``wait_stream`` reads a half-copied batch) and behind a busy current stream (a missing
  ``record_stream`` lets a later copy overwrite a batch before it is read).

On other devices the result says plainly which of these it could not check. The course's own
:class:`~course_utils.prefetch.DevicePrefetcher` (or a subclass, an instance or a wrapper of it)
is refused: the exercise is to write it.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ..device import move_to_device, resolve_device, synchronize
from ..grading import CheckResult, ExerciseFailed, grader, refuse_course_helper
from ..lessons.l04_copies import _median, time_op
from ..lessons.l04_overlap import _calibrated_compute
from ..prefetch import DevicePrefetcher

EXERCISE = "04.prefetcher"

#: the course's prefetcher, refused in an answer
COURSE_PREFETCHERS = (DevicePrefetcher,)

_SIGNATURE_HINT = ("pass the class itself: check(\"04.prefetcher\", Prefetcher); the grader "
                   "calls Prefetcher(loader, device) and iterates over the result.")


# --------------------------------------------------------------------------------------
# a loader with known batches that records how far it has been read
# --------------------------------------------------------------------------------------

class _RecordingLoader:
    """``n`` batches ``(images uint8 (B, 3, 8, 8), labels int64 (B,))`` with known values.

    Batch k's labels are k*B .. k*B+B-1 and its pixels a pattern shifted by k, so every batch
    (and every position in it) differs. ``pulled`` counts the batches handed out in the
    current pass; ``passes`` the passes started.
    """

    def __init__(self, n: int, batch_size: int = 4, *, shape: tuple[int, ...] = (3, 8, 8),
                 pin: bool = False, fill: str = "pattern") -> None:
        self.n, self.batch_size, self.shape = n, batch_size, shape
        self.pulled = 0
        self.passes = 0
        self.batches = [self._make(k, fill) for k in range(n)]
        if pin:
            self.batches = [(x.pin_memory(), y.pin_memory()) for x, y in self.batches]

    def _make(self, k: int, fill: str) -> tuple[torch.Tensor, torch.Tensor]:
        numel = self.batch_size
        for s in self.shape:
            numel *= s
        if fill == "constant":
            images = torch.full((self.batch_size, *self.shape), (k % 250) + 1, dtype=torch.uint8)
        else:
            images = ((torch.arange(numel, dtype=torch.int64) + 37 * k) % 251).to(torch.uint8)
            images = images.view(self.batch_size, *self.shape)
        labels = torch.arange(k * self.batch_size, (k + 1) * self.batch_size, dtype=torch.int64)
        return images, labels

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        self.passes += 1
        self.pulled = 0
        for batch in self.batches:
            self.pulled += 1
            yield batch


# --------------------------------------------------------------------------------------
# running the learner's code
# --------------------------------------------------------------------------------------

def _fail(problem: str, **kw: str) -> ExerciseFailed:
    return ExerciseFailed(EXERCISE, problem, **kw)


def _build(answer: Any, loader: Any, device: torch.device) -> Any:
    if hasattr(answer, "__iter__") and not isinstance(answer, type):
        raise _fail("the answer looks like a prefetcher object, not the class.",
                    expected="check(\"04.prefetcher\", Prefetcher)",
                    seen=f"an instance of {type(answer).__name__}", hint=_SIGNATURE_HINT)
    if not callable(answer):
        raise _fail(f"the answer is a {type(answer).__name__}, not a class.",
                    expected="the Prefetcher class", seen=repr(answer)[:80], hint=_SIGNATURE_HINT)
    try:
        return answer(loader, device)
    except NotImplementedError:
        raise
    except TypeError as exc:
        raise _fail(f"Prefetcher(loader, device) could not be created: {exc}",
                    expected="__init__(self, loader, device)", hint=_SIGNATURE_HINT) from exc
    except Exception as exc:
        raise _fail(f"Prefetcher(loader, device) raised {type(exc).__name__}: {exc}",
                    hint="__init__ should only store the loader and the device (and, on CUDA, "
                         "may create the side stream).") from exc


def _run_pass(prefetcher: Any, loader: _RecordingLoader, device: torch.device,
              on_batch: Callable[[Any], None] | None = None) -> tuple[list, list[int]]:
    """Iterate once; return the batches and loader.pulled at the moment each was handed out."""
    out, pulled = [], []
    try:
        it = iter(prefetcher)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise _fail(f"iter(prefetcher) raised {type(exc).__name__}: {exc}",
                    hint="__iter__ should return an iterator (a generator: a function with "
                         "`yield` in it).") from exc
    if it is None or not hasattr(it, "__next__"):
        raise _fail("iter(prefetcher) did not return an iterator.",
                    seen=type(it).__name__,
                    hint="write __iter__ as a generator: `yield batch` inside it (no return value).")
    while True:
        try:
            batch = next(it)
        except StopIteration:
            break
        except NotImplementedError:
            raise
        except Exception as exc:
            hint = "run a loop over your Prefetcher in a cell of its own and read the traceback."
            text = str(exc)
            if "pin" in text.lower() and device.type != "cuda":
                hint = ("pinning needs an accelerator: leave pinning to the DataLoader "
                        "(pin_memory=True); the prefetcher only copies.")
            elif "cuda" in text.lower() and device.type != "cuda":
                hint = ("CUDA calls (streams, record_stream) only on a CUDA device: test "
                        "`self.device.type == 'cuda'` before using them; elsewhere copy plainly.")
            raise _fail(f"iterating raised {type(exc).__name__}: {text}", hint=hint) from exc
        pulled.append(loader.pulled)
        if on_batch is not None:
            on_batch(batch)
        out.append(batch)
        if len(out) > 3 * loader.n + 3:
            raise _fail("the prefetcher yields more batches than the loader has.",
                        expected=f"{loader.n} batches", seen=f"more than {3 * loader.n + 3}",
                        hint="stop when the loader is exhausted (catch StopIteration / use "
                             "next(it, sentinel)).")
    return out, pulled


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor {tuple(x.shape)} {x.dtype} on {x.device}"
    return f"{type(x).__name__}: {x!r:.60}"


def _split(batch: Any, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        raise _fail(f"batch {k} came out as a single tensor; the loader gives (images, labels).",
                    expected="a tuple (images, labels), both on the device",
                    seen=_describe(batch),
                    hint="move every tensor of the batch and keep its structure: an (images, "
                         "labels) pair, both on the device.")
    if not isinstance(batch, (tuple, list)) or len(batch) != 2 or not all(
            isinstance(t, torch.Tensor) for t in batch):
        raise _fail(f"batch {k} is not an (images, labels) pair of tensors.",
                    expected="a tuple (images, labels)", seen=_describe(batch),
                    hint="yield the moved batch itself, with the same structure the loader gave.")
    return batch[0], batch[1]


def _index_of(labels: torch.Tensor, batch_size: int) -> int | None:
    if labels.device.type == "meta" or labels.numel() == 0:
        return None
    return int(labels.reshape(-1)[0].item()) // batch_size


def _check_order(batches: list, loader: _RecordingLoader, device: torch.device) -> None:
    n, bs = loader.n, loader.batch_size
    if device.type == "meta":
        if len(batches) != n:
            raise _fail(f"the prefetcher yielded {len(batches)} batches for a loader of {n}.",
                        expected=f"{n} batches", seen=f"{len(batches)}",
                        hint="yield every batch exactly once, the first and the last included.")
        return
    order = [_index_of(_split(b, k)[1].cpu(), bs) for k, b in enumerate(batches)]
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
    for k, batch in enumerate(batches):
        images, labels = _split(batch, k)
        want_images, want_labels = loader.batches[k]
        img_ok = images.device.type == device.type
        lab_ok = labels.device.type == device.type
        if not img_ok and lab_ok:
            raise _fail(f"the images of batch {k} stayed on {images.device}; only the labels "
                        f"moved to {device}.", expected=f"images and labels on {device}",
                        seen=f"images on {images.device}, labels on {labels.device}",
                        hint="move every tensor of the batch: the images are the big part, the "
                             "one whose copy you want to overlap.")
        if not img_ok or not lab_ok:
            raise _fail(f"batch {k} is not on {device}.", expected=f"images and labels on {device}",
                        seen=f"images on {images.device}, labels on {labels.device}",
                        hint="move both the images and the labels to the device.")
        if images.dtype != want_images.dtype or labels.dtype != want_labels.dtype:
            raise _fail(f"batch {k} changed dtype on the way.",
                        expected=f"images {want_images.dtype}, labels {want_labels.dtype} "
                                 f"(as the loader gave them)",
                        seen=f"images {images.dtype}, labels {labels.dtype}",
                        hint="the prefetcher only moves: copying uint8 is 4x fewer bytes than "
                             "float32; convert (and normalise) on the device after the copy, in "
                             "the training step.")
        if tuple(images.shape) != tuple(want_images.shape) or tuple(labels.shape) != tuple(want_labels.shape):
            raise _fail(f"batch {k} changed shape.",
                        expected=f"images {tuple(want_images.shape)}, labels {tuple(want_labels.shape)}",
                        seen=f"images {tuple(images.shape)}, labels {tuple(labels.shape)}",
                        hint="move the tensors as they are.")
        if device.type == "meta":
            continue
        if not torch.equal(labels.cpu(), want_labels) or not torch.equal(images.cpu(), want_images):
            raise _fail(f"batch {k} arrived with the wrong values.",
                        expected="the loader's values, unchanged",
                        seen=f"{int((images.cpu() != want_images).sum())} of {images.numel()} "
                             f"pixels differ",
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
                             "the device at a time",
                    seen=f"all {n} batches read before batch 0 was yielded",
                    hint="don't build a list of all batches: a real epoch does not fit in GPU "
                         "memory. Keep exactly one batch ahead.")


# --------------------------------------------------------------------------------------
# CUDA-only checks
# --------------------------------------------------------------------------------------

#: The race check's passes over 8 batches: False reads each batch the moment it arrives (a
#: missing ``wait_stream`` reads a half-copied batch); True first keeps the current stream busy
#: for about four copies, so the side stream runs ahead (a missing ``record_stream`` lets the
#: caching allocator give a batch's memory to a later copy before the current stream read it).
_RACE_PASSES = (False, False, False, True, True)
_RACE_BATCHES = 8


def _race_fill(pass_index: int, batch_index: int, n_batches: int = _RACE_BATCHES) -> int:
    """The value of every pixel of batch ``batch_index`` in pass ``pass_index``: 1..250, a
    different one for every (pass, batch) of the check, so memory that still holds another
    batch or an earlier pass (a block the caching allocator handed out again) never reads as
    the batch expected."""
    return 1 + (pass_index * n_batches + batch_index) % 250


def _cuda_race_check(answer: Any, device: torch.device, mib: int,
                     passes: tuple[bool, ...] = _RACE_PASSES) -> dict:
    """Read every batch on the current stream as it arrives and compare it with the value it
    was filled with in this pass (see :data:`_RACE_PASSES` and :func:`_race_fill`).

    The real check needs CUDA streams; on another device the same code runs without pinning,
    streams or a busy current stream (the tests use that to check the logic).
    """

    cuda = device.type == "cuda"
    n = _RACE_BATCHES
    per = max(1, mib * 1024 * 1024 // (3 * 64 * 64))
    loader = _RecordingLoader(n, per, shape=(3, 64, 64), pin=cuda, fill="constant")
    busy: Callable[[], Any] | None = None
    if cuda and any(passes):
        first = loader.batches[0][0]
        dst = torch.empty(first.shape, dtype=first.dtype, device=device)
        copy_s = _median(time_op(lambda: dst.copy_(first, non_blocking=True), device=device,
                                 repeats=3))
        busy = _calibrated_compute(device, 4 * copy_s)
        del dst
    end = object()
    bad: list[tuple[int, int]] = []
    for p, lagging in enumerate(passes):
        for k, (host_images, _) in enumerate(loader.batches):
            host_images.fill_(_race_fill(p, k, n))   # the last pass was synchronised: no copy reads it
        flags: list[torch.Tensor] = []
        it = iter(_build(answer, loader, device))
        while len(flags) < n:
            try:
                batch = next(it, end)
            except NotImplementedError:
                raise
            except Exception as exc:
                raise _fail(f"iterating raised {type(exc).__name__}: {exc}",
                            hint="run a loop over your Prefetcher in a cell of its own and read "
                                 "the traceback.") from exc
            if batch is end:
                break
            images, _ = _split(batch, len(flags))
            if lagging and busy is not None:
                busy()                                # the current stream falls behind the copies
            flags.append((images == _race_fill(p, len(flags), n)).all())
            del batch, images                         # free it, as a training loop does
        synchronize(device)
        bad += [(p, k) for k, ok in enumerate(flags) if not bool(ok.item())]
    if bad:
        early = any(not passes[p] for p, _ in bad)
        hint = ("a copy queued on a side stream is not finished when Python moves on: before "
                "handing out a batch, the current stream must wait for the side stream "
                "(Stream.wait_stream), and its tensors must be marked as used by the current "
                "stream (Tensor.record_stream) so the caching allocator does not reuse their "
                "memory too early.")
        if not early:
            hint = ("every batch was complete when read at once, but not when the current stream "
                    "was busy: its memory was reused for a later copy before the current stream "
                    "read it. The caching allocator only knows the stream a tensor was made on: "
                    "tell it the current stream uses every tensor of the batch (record_stream) "
                    "before handing it out.")
        raise _fail("batches were read before their copy had finished, or after their memory "
                    "was reused for another batch (a race).",
                    expected="every batch complete, with this pass's values, when the consumer "
                             "reads it",
                    seen=f"{len(bad)} wrong reads over {len(passes)} passes of {n} batches "
                         f"({mib} MiB each; {sum(passes)} passes with a busy current stream)",
                    hint=hint)
    return {"race_reads": len(passes) * n, "race_busy_passes": sum(passes)}


def _cuda_overlap_check(answer: Any, device: torch.device, mib: int, threshold: float) -> dict:

    per = max(1, mib * 1024 * 1024 // (3 * 64 * 64))
    loader = _RecordingLoader(12, per, shape=(3, 64, 64), pin=True, fill="constant")
    images0 = loader.batches[0][0]
    dst = torch.empty(images0.shape, dtype=images0.dtype, device=device)
    copy_s = _median(time_op(lambda: dst.copy_(images0, non_blocking=True), device=device,
                             repeats=5))
    chain = _calibrated_compute(device, copy_s)

    def step(batch: Any) -> None:
        images, _ = batch
        images[:1, :1, :1, :1].float().sum()   # the step reads the batch
        chain()

    step_s = _median(time_op(lambda: step((dst, None)), device=device, repeats=5))

    def plain() -> None:
        for batch in loader:
            step(move_to_device(batch, device, non_blocking=True))  # same stream: serial

    def learner() -> None:
        for batch in _build(answer, loader, device):
            step(batch)

    def timed(fn: Callable[[], None]) -> float:
        fn()
        torch.cuda.synchronize(device)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t0)
        return best

    t_plain, t_learner = timed(plain), timed(learner)
    n = loader.n
    hideable = n * min(copy_s, step_s)
    saved = (t_plain - t_learner) / hideable if hideable > 0 else 0.0
    details = {"copy_ms": copy_s * 1e3, "step_ms": step_s * 1e3, "plain_ms": t_plain * 1e3,
               "prefetcher_ms": t_learner * 1e3, "overlap_saved": saved}
    if saved < threshold:
        raise _fail("the copies did not overlap the compute.",
                    expected=f"at least {threshold:.0%} of the hideable copy time hidden "
                             f"({n} batches: copy {copy_s * 1e3:.2f} ms, step {step_s * 1e3:.2f} ms each)",
                    seen=f"plain loop {t_plain * 1e3:.1f} ms, your prefetcher {t_learner * 1e3:.1f} ms: "
                         f"{saved:.0%} hidden",
                    hint="the copy of batch k+1 must be queued on a stream of its own, and be "
                         "asynchronous, before batch k is handed out: a copy on the default "
                         "stream waits for the previous step's kernels, and a synchronous copy "
                         "(non_blocking=False) blocks Python until it is done.")
    return details


# --------------------------------------------------------------------------------------
# the grader
# --------------------------------------------------------------------------------------

@grader(EXERCISE)
def grade_prefetcher(answer: Any, *, device: Any = None, n_batches: int = 6, batch_size: int = 4,
                     cuda_checks: bool = True, copy_mib: int = 32,
                     overlap_threshold: float = 0.3) -> CheckResult:
    """Check a Prefetcher class: order, values, placement, dtypes and double buffering on any
    device; on CUDA also that copies overlap compute and that no batch is read mid-copy."""

    refuse_course_helper(EXERCISE, answer, COURSE_PREFETCHERS,
                         write="in your Prefetcher class, keep one batch ahead: start its copy "
                               "before you hand out the current one")
    dev = resolve_device(device)
    checked: list[str] = []
    not_checked: list[str] = []

    loader = _RecordingLoader(n_batches, batch_size)
    prefetcher = _build(answer, loader, dev)
    batches, pulled = _run_pass(prefetcher, loader, dev)
    _check_order(batches, loader, dev)
    _check_batches(batches, loader, dev)
    checked.append(f"all {n_batches} batches once, in order, with the loader's values and dtypes, "
                   f"images and labels on {dev}")
    _check_lookahead(pulled, n_batches)
    checked.append("batch k+1 was requested before batch k was handed out (double buffering)")

    again, _ = _run_pass(prefetcher, loader, dev)
    if len(again) != n_batches:
        raise _fail("a second pass over the same prefetcher (the next epoch) did not give the "
                    "batches again.", expected=f"{n_batches} batches in epoch 2",
                    seen=f"{len(again)} batches",
                    hint="create the loader's iterator inside __iter__ (iter(self.loader)), not in "
                         "__init__, so every epoch starts afresh.")
    _check_order(again, loader, dev)
    for n in (0, 1):
        small = _RecordingLoader(n, batch_size)
        got, _ = _run_pass(_build(answer, small, dev), small, dev)
        if len(got) != n:
            raise _fail(f"a loader with {n} batch{'es' if n != 1 else ''} gave {len(got)}.",
                        expected=f"{n} batches", seen=f"{len(got)}",
                        hint="handle the ends: an empty loader yields nothing, a loader with one "
                             "batch yields it once.")
        if n:
            _check_batches(got, small, dev)
    checked.append("a second epoch, an empty loader and a one-batch loader")

    if dev.type == "cpu":
        meta = torch.device("meta")
        mloader = _RecordingLoader(n_batches, batch_size)
        try:
            mbatches, _ = _run_pass(_build(answer, mloader, meta), mloader, meta)
        except ExerciseFailed as exc:
            not_checked.append(f"placement on a second device ('meta' failed: {exc.problem})")
        except NotImplementedError as exc:
            # the CPU pass above ran, so this is torch refusing an operation on 'meta' tensors
            # (they hold no data), not the exercise stub
            not_checked.append(f"placement on a second device (an operation is not supported "
                               f"on 'meta' tensors: {exc})")
        else:
            _check_order(mbatches, mloader, meta)
            _check_batches(mbatches, mloader, meta)
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
        why = ("this machine has no CUDA" if dev.type != "cuda" else "cuda_checks=False")
        not_checked.append(f"that copies overlap compute ({why}: only CUDA streams let a copy run "
                           f"while a kernel computes, so timing here cannot tell a synchronous "
                           f"copy from an overlapped one)")
        not_checked.append("that the current stream waits for the copy stream and that a "
                           "batch's memory is not reused while it is read (a missing "
                           "wait_stream or record_stream only shows as wrong values racing "
                           "on a GPU)")
    summary = "checked: " + "; ".join(checked) + "."
    if not_checked:
        summary += " NOT checked on this device: " + "; ".join(not_checked) + "."
    details["checked"], details["not_checked"] = checked, not_checked
    return CheckResult(EXERCISE, summary, details)
