"""The double-buffered device prefetcher (lesson 04 writes one; exercise 04 asks for yours) and
:func:`compare_prefetch`, which times it against a plain loop with :func:`~.timing.time_op`."""
from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator

import torch

from .checks import check_int
from .config import pick
from .device import move_to_device, resolve_device, tensors_of
from .measurement import fmt_time
from .timing import time_op

__all__ = ["DevicePrefetcher", "PrefetchTiming", "compare_prefetch"]

_END = object()


class DevicePrefetcher:
    """Iterate over ``loader`` with every batch already on ``device``, batch k+1 copied while
    batch k is used. On CUDA the copies run on a side stream; the current stream waits for each
    batch (``wait_stream``) and marks its tensors as used (``record_stream``). Elsewhere the
    copies are synchronous."""

    def __init__(self, loader: Iterable, device: Any = None, *, non_blocking: bool = True) -> None:
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"loader must be iterable (e.g. a DataLoader), got {type(loader).__name__}.")
        self.loader = loader
        self.device = resolve_device(device, allow_meta=True)
        self.non_blocking = bool(non_blocking)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device) if cuda else None
        it = iter(self.loader)

        def preload() -> Any:
            batch = next(it, _END)
            if batch is _END:
                return _END
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                return move_to_device(batch, self.device, non_blocking=self.non_blocking and cuda)

        nxt = preload()
        while nxt is not _END:
            batch = nxt
            if cuda:
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(stream)              # the copy of this batch is done first
                for t in tensors_of(batch):
                    if t.device.type == "cuda":
                        t.record_stream(current)         # memory in use by the current stream
            nxt = preload()                              # queue the copy of batch k+1 ...
            yield batch                                  # ... while batch k is used


@dataclass
class PrefetchTiming:
    """Seconds per training step (median over passes) with a plain loop (``.to(device,
    non_blocking=True)`` before each step) and with DevicePrefetcher; ``copy_s_per_batch`` and
    ``step_s`` (the step alone), in seconds, where the caller measured them."""

    device: str
    steps: int
    plain_s_per_step: float
    prefetch_s_per_step: float
    copy_s_per_batch: float | None = None
    step_s: float | None = None
    note: str = ""

    @property
    def speedup(self) -> float:
        return self.plain_s_per_step / self.prefetch_s_per_step if self.prefetch_s_per_step > 0 else math.inf

    def to_dict(self) -> dict:
        return asdict(self) | {"speedup": self.speedup}

    def __str__(self) -> str:
        text = (f"{self.steps} steps on {self.device}: plain loop {fmt_time(self.plain_s_per_step)}/step, "
                f"DevicePrefetcher {fmt_time(self.prefetch_s_per_step)}/step ({self.speedup:.2f}x)")
        if self.copy_s_per_batch is not None and self.step_s is not None:
            text += (f"\n  alone: copy {fmt_time(self.copy_s_per_batch)}/batch, compute "
                     f"{fmt_time(self.step_s)}/step")
        return text + (f"\n  {self.note}" if self.note else "")


def compare_prefetch(loader: Iterable, step_fn: Callable[[Any], Any], *, device: Any = None,
                     repeats: int | None = None) -> PrefetchTiming:
    """Seconds per step of a pass over ``loader`` (``step_fn`` on every batch), plain and with
    DevicePrefetcher: one untimed pass each, then ``repeats`` passes of each, alternated, each
    one :func:`~.timing.time_op` call (the device synchronised before and after)."""
    dev = resolve_device(device)
    if not callable(step_fn):
        raise TypeError(f"step_fn must be a callable taking one batch, got {type(step_fn).__name__}.")
    repeats = pick(full=5, quick=2) if repeats is None else check_int("repeats", repeats, 1)

    def run(prefetch: bool) -> int:
        batches = (DevicePrefetcher(loader, dev) if prefetch else
                   (move_to_device(b, dev, non_blocking=True) for b in loader))
        n = 0
        for n, batch in enumerate(batches, 1):
            step_fn(batch)
        return n

    steps = run(False)
    run(True)
    if steps == 0:
        raise ValueError("loader yielded no batches: pass a loader with at least one batch.")
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for prefetch in (False, True):
            times[prefetch] += time_op(lambda: run(prefetch), device=dev, repeats=1, warmup=0,
                                       events=False)
    note = "" if dev.type == "cuda" else (
        "No CUDA streams here: both loops copy and compute one after the other, so they should "
        "take the same time (any difference is noise).")
    return PrefetchTiming(device=str(dev), steps=steps,
                          plain_s_per_step=statistics.median(times[False]) / steps,
                          prefetch_s_per_step=statistics.median(times[True]) / steps, note=note)
