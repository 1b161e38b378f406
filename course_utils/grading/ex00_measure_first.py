"""Grader for exercise 00: ``time_loader(loader, batches, warmup_batches=2)``'s steady-state
samples/s, against :func:`~course_utils.timing.measure_loader` on the same slow-starting loader."""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Iterator, Sequence

import torch.utils.data as tud

from course_utils.data import LatencyDataset
from course_utils.timing import measure_loader

from .checker import CheckResult, ExerciseFailed, describe, grader, require_callable

EXERCISE = "00.time_loader"


class RecordingLoader:
    """Wraps a DataLoader and records how many batches each of its iterators gave."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self.batches_per_iterator: list[int] = []

    def __iter__(self) -> Iterator[Any]:
        slot = len(self.batches_per_iterator)
        self.batches_per_iterator.append(0)
        for batch in self._loader:
            self.batches_per_iterator[slot] += 1
            yield batch

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:  # batch_size, num_workers, dataset, ...
        return getattr(self._loader, name)


#: an answer passes within these factors of the honest rate measured in the same run; a unit
#: slip is recognised within the same factors of the value that unit would give
LOW_TOLERANCE = 0.6
HIGH_TOLERANCE = 1.6


def near(value: float, target: float) -> bool:
    """``value`` is within LOW_TOLERANCE..HIGH_TOLERANCE times a positive ``target``."""
    return target > 0 and LOW_TOLERANCE <= value / target <= HIGH_TOLERANCE


@grader(EXERCISE)
def grade_time_loader(time_loader: Callable[..., Any], *, latency_s: float = 0.004,
                      startup_s: float = 0.6, batch_size: int = 8, batches: int = 12,
                      warmup_batches: int = 2) -> CheckResult:
    """Check ``time_loader`` returns the loader's steady-state samples per second."""
    require_callable(EXERCISE, time_loader, "a function time_loader(loader, batches, warmup_batches=2)")
    dataset = LatencyDataset(n=batch_size * (warmup_batches + batches + 4), latency_s=latency_s,
                             startup_s=startup_s, item_shape=(3, 8, 8))
    loader = tud.DataLoader(dataset, batch_size=batch_size, num_workers=1)
    recorder = RecordingLoader(loader)
    value = time_loader(recorder, batches, warmup_batches)

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ExerciseFailed(EXERCISE, "time_loader must return one number: samples per second.",
                             expected="a float such as 231.5", seen=describe(value),
                             hint="return the rate as one plain float (float(...) if you computed a tensor).")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ExerciseFailed(EXERCISE, "the rate must be a positive, finite number.",
                             seen=repr(value), hint="check you divide samples by a positive elapsed time.")

    pulled = sum(recorder.batches_per_iterator)
    if pulled < batches:
        raise ExerciseFailed(
            EXERCISE, "timed the wrong thing: the function did not pull the batches it timed.",
            expected=f"at least {batches} batches pulled from the loader", seen=f"{pulled} batches",
            hint="a DataLoader does no work until you iterate it; time a loop over next(it) "
                 "that consumes `batches` batches, not iter(loader) or the loader's creation.")

    honest = measure_loader(loader, batches=batches, warmup_batches=warmup_batches, repeats=1,
                            progress=False).samples_per_s
    details = {"answer": value, "honest": honest, "iterators": len(recorder.batches_per_iterator),
               "batches_per_iterator": recorder.batches_per_iterator}
    return CheckResult(EXERCISE, judge_rate(value, honest, batch_size=batch_size, batches=batches,
                                            warmup_batches=warmup_batches, startup_s=startup_s,
                                            batches_per_iterator=recorder.batches_per_iterator), details)


def judge_rate(value: float, honest: float, *, batch_size: int, batches: int,
               warmup_batches: int, startup_s: float, batches_per_iterator: Sequence[int]) -> str:
    """A pass's summary, or what the timing got wrong: ``value`` against ``honest`` samples/s."""
    iterators = len(batches_per_iterator)
    seen = f"{value:.4g} (an honest measurement of the same loader just gave {honest:.4g} samples/s)"
    if near(value, honest):
        return (f"{value:.1f} samples/s, honest measurement {honest:.1f} samples/s "
                f"(ratio {value / honest:.2f}).")
    # What the function did with the loader comes first: without warm-up (or with a fresh
    # iterator) a timing can land near honest / batch_size (spawn), which looks like a unit slip.
    no_warmup = batches_per_iterator[0] < warmup_batches + batches
    too_slow = "too slow: the timing includes work that is not steady-state loading."
    expected = f"about {honest:.4g} samples/s"
    if value < honest and (iterators > 1 or no_warmup):
        raise ExerciseFailed(EXERCISE, too_slow, expected=expected, seen=seen, hint=(
            "you made a new iterator after the warm-up: each new iterator starts fresh workers "
            "and pays their start-up again. Warm up and time the same iterator."
            if iterators > 1 else
            f"pull `warmup_batches` batches before starting the clock: the first batch pays "
            f"worker start-up (here {startup_s:.1f} s plus starting the process), which a "
            f"training run pays once, not every step."))
    inverted = "a rate puts the samples on top and the seconds below, not the other way round."
    for unit, target, hint in (
            ("batches per second", honest / batch_size, "count samples, not batches: add up the "
             "size of every timed batch (the last batch of an epoch may be smaller)."),
            ("seconds per sample", 1 / honest, inverted),
            ("seconds per batch", batch_size / honest, inverted),
            ("milliseconds per sample", 1000 / honest, inverted)):
        if near(value, target):
            raise ExerciseFailed(EXERCISE, f"wrong unit: this looks like {unit}.", seen=seen,
                                 expected="samples per second (a rate: bigger is faster)", hint=hint)
    if value < honest:
        raise ExerciseFailed(EXERCISE, too_slow, expected=expected, seen=seen,
                             hint="start the clock after the warm-up batches and stop it right "
                                  "after the last timed batch arrives; don't time anything else.")
    raise ExerciseFailed(EXERCISE, "too fast: the timing missed work the loader really does.",
                         expected=expected, seen=seen,
                         hint="stop the clock after the last timed batch has arrived, and count "
                              "only the samples of the batches you timed.")
