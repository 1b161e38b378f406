"""Grader for exercise 08: ``data_wait_fraction`` ("fetch" + "h2d copy" time over the counted
ProfilerStep steps' time) and ``bottleneck``, on synthetic traces where each plausible mistake gives
its own value, and on two loops profiled here."""
from __future__ import annotations

import copy
import functools
import json
import math
import numbers
import os
import random
import tempfile
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader, Dataset

from .checker import CheckResult, ExerciseFailed, call_answer, describe, grader, require_callable

WAIT = "08.wait_fraction"
STALL = "08.stall"
WAIT_NAMES = ("fetch", "h2d copy")
#: the DataLoader's own span inside "fetch" (multi-process iterator; single-process is alike)
NEXT_NAME = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
TOLERANCE = 1e-3          # synthetic traces: the answer is exact up to float rounding
REAL_TOLERANCE = 0.01     # real traces: the same events, so only rounding differs
#: On CUDA every annotation is recorded twice; this category is the GPU-side copy.
GPU_COPY = "gpu_user_annotation"


def _reference_fraction(events: Sequence[dict], warmup_steps: int = 1) -> float:
    """The grader's reference: "fetch" + "h2d copy" time over the counted steps' time, CPU side."""
    events = [e for e in events if e.get("cat") != GPU_COPY and e.get("ph") == "X"]
    counted = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")),
                     key=lambda e: e["ts"])[warmup_steps:]
    if not counted:
        raise ValueError(f"warmup_steps={warmup_steps} leaves no step to count.")
    wait = sum(e["dur"] for e in events if e.get("name") in WAIT_NAMES
               and any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in counted))
    return wait / sum(s["dur"] for s in counted)


# ---- synthetic traces with known answers -----------------------------------------------------
def synthetic_trace(steps: Sequence[tuple[float, float, float, float]], *, first: int = 2,
                    shuffle_seed: int | None = None) -> list[dict]:
    """Chrome-trace events of steps taking ``(fetch, copy, step, other)`` ms: ``ProfilerStep#N`` spans
    (N from ``first``) holding "fetch" (``__next__`` inside), "h2d copy", "step" and unmarked time,
    with the metadata and instant events (no ``dur``) a CPU profile has, each with a real one's keys."""
    pid = tid = 4242
    t = 1_700_000_000_000.0                                   # µs, like a real trace
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "ts": t, "pid": pid, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "ts": t, "pid": pid, "tid": tid,
         "args": {"name": f"thread {tid} (python)"}},
        {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": pid, "tid": tid, "ts": t}]
    start = t

    def span(name: str, cat: str, ts: float, dur_us: float) -> None:
        events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                       "dur": dur_us, "args": {"External id": len(events)}})

    for k, (fetch, copy_ms, step, other) in enumerate(steps):
        f, c, s, o = (1e3 * v for v in (fetch, copy_ms, step, other))
        span(f"ProfilerStep#{first + k}", "user_annotation", t, f + c + s + o)
        span("fetch", "user_annotation", t, f)
        span(NEXT_NAME, "user_annotation", t + 1.0, max(f - 2.0, 0.0))
        span("h2d copy", "user_annotation", t + f, c)
        span("aten::copy_", "cpu_op", t + f + 0.5, max(c - 1.0, 0.0))
        span("step", "user_annotation", t + f + c, s)
        span("aten::convolution", "cpu_op", t + f + c + 1.0, max(s - 2.0, 0.0))
        t += f + c + s + o
    span("PyTorch Profiler (0)", "Trace", start, t - start)
    events.append({"ph": "i", "s": "g", "name": "Record Window End", "pid": pid, "tid": tid, "ts": t})
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(events)
    return events


def _fraction(steps: Sequence[tuple], parts: str = "fc", over: str = "all") -> float:
    """From the spec: ``parts`` (f fetch, c copy, s step, n fetch + next) over the time."""
    take = {"f": lambda r: r[0], "c": lambda r: r[1], "s": lambda r: r[2], "n": lambda r: 2 * r[0] - 2e-3}
    return (sum(take[p](r) for r in steps for p in parts)
            / sum((r[0] + r[1] + r[2]) if over == "marked" else sum(r) for r in steps))


MISTAKES = {
    "warm-up": ("your fraction counts the warm-up steps as well.",
                "the first steps of a recorded loop hold the workers' start-up (the first fetch "
                "waits for every worker to start) and batches they made ahead: no training run "
                "pays that every step. Sort the ProfilerStep spans by their start time and leave "
                "out the first `warmup_steps` of them."),
    "step": ("you counted the training step as waiting for data.",
             "only the spans where the loop is blocked on data are wait: 'fetch' (in next() of "
             "the loader) and 'h2d copy'. The 'step' span is the work the data is for."),
    "no copy": ("you left out the copy to the device.",
                "a copy from pageable memory blocks the loop until it is done (lesson 04), and "
                "lesson 00's data wait counts it: add the 'h2d copy' spans to the wait."),
    "marked": ("you divided by the marked spans only, not by the steps' whole time.",
               "the loop's time is the ProfilerStep spans' durations: they also hold what no span marks (the "
               "optimizer, logging, Python between the calls), and that time is not wait either."),
    "next twice": ("you counted the DataLoader's own __next__ span as well as 'fetch'.",
                   "spans nest: the loader's 'enumerate(DataLoader)#...__next__' span lies inside "
                   "your 'fetch' span, so adding both counts the same wait twice. Count only "
                   "the spans named 'fetch' and 'h2d copy'."),
    "by name": ("you skipped the wrong steps: ProfilerStep names sort as text.",
                "as strings 'ProfilerStep#10' < 'ProfilerStep#8'; sort the steps by 'ts' (the "
                "start time, in µs) or by the number after '#'."),
    "list order": ("you skipped the first steps in the order the trace lists them.",
                   "a trace's events are not in time order; sort the ProfilerStep spans by 'ts' "
                   "(the start time, in µs) before you skip the warm-up."),
    "percent": ("that is a percentage; return a fraction between 0 and 1.",
                "return wait / time, e.g. 0.25 for a quarter of the time (format it as "
                "f'{x:.0%}' when you print it)."),
}


def synthetic_cases() -> list[dict]:
    """The held-back traces: name, steps, warmup_steps, events, answer and each mistake's value."""
    plain = [(4, 1, 5, 2), (6, 1, 3, 2), (2, 1, 7, 2), (5, 1, 4, 2)]
    startup = [(250, 0.5, 8, 1)] + [(0.3 + 0.1 * k, 0.2, 9, 0.5) for k in range(6)]
    numbered = [(150, 1, 3, 1), (0.2, 1, 3, 1)] + [(8 + k, 1, 3, 1) for k in range(4)] + [(0.5, 1, 3, 1)] * 2
    cases = [("a plain loop (warmup_steps=0)", plain, 0, 2, None),
             ("a loop whose first step holds the workers' start-up", startup, 1, 1, None),
             ("steps ProfilerStep#8..#15, events out of time order", numbered, 2, 8, 7)]
    out = []
    for name, steps, warmup, first, seed in cases:
        events = synthetic_trace(steps, first=first, shuffle_seed=seed)
        counted, right = steps[warmup:], _fraction(steps[warmup:])
        by_name = sorted(range(len(steps)), key=lambda k: f"ProfilerStep#{first + k}")
        listed = [int(e["name"].partition("#")[2]) - first for e in events if e.get("ph") == "X"
                  and str(e.get("name", "")).startswith("ProfilerStep#")]
        mistakes = {"warm-up": _fraction(steps), "step": _fraction(counted, "fcs"),
                    "no copy": _fraction(counted, "f"), "marked": _fraction(counted, over="marked"),
                    "next twice": _fraction(counted, "nc"),
                    "by name": _fraction([steps[k] for k in by_name[warmup:]]),
                    "list order": _fraction([steps[k] for k in listed[warmup:]]), "percent": 100 * right}
        mistakes = {k: v for k, v in mistakes.items() if abs(v - right) > 10 * TOLERANCE}
        out.append({"name": name, "steps": steps, "warmup_steps": warmup, "events": events,
                    "answer": right, "mistakes": mistakes})
    return out


# ---- loops profiled for real -----------------------------------------------------------------
class SleepyBatches(Dataset):
    """Ready-made NumPy batches, each after ``delay_s`` seconds of sleep."""

    def __init__(self, n: int, delay_s: float) -> None:
        self.n, self.delay_s = int(n), float(delay_s)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        time.sleep(self.delay_s)
        return np.full((4, 3, 8, 8), float(i), dtype=np.float32), np.arange(4) % 10


def as_is(batch: Any) -> Any:
    """A DataLoader ``collate_fn`` that leaves the batch as the dataset made it."""
    return batch


def profile_loop(delay_s: float, step_s: float, steps: int) -> list[dict]:
    """Trace events of ``steps + 1`` steps, the first holding the worker's start-up."""
    loader = DataLoader(SleepyBatches(steps + 4, delay_s), batch_size=None, collate_fn=as_is,
                        num_workers=1, timeout=120)
    sched = schedule(wait=0, warmup=1, active=steps + 1, repeat=1)
    it = None
    with tempfile.TemporaryDirectory(prefix="course08_") as tmp:
        try:
            with profile(activities=[ProfilerActivity.CPU], schedule=sched) as prof:
                prof.step()                         # the profiler's own warm-up: nothing in it
                for _ in range(steps + 1):
                    with record_function("fetch"):
                        it = iter(loader) if it is None else it
                        images, labels = next(it)
                    with record_function("h2d copy"):
                        batch = torch.as_tensor(images), torch.as_tensor(labels)
                    with record_function("step"):
                        batch[0].sum()
                        time.sleep(step_s)
                    prof.step()
        finally:
            del it
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)["traceEvents"]


@functools.lru_cache(maxsize=1)
def real_traces(steps: int = 8) -> tuple[dict, ...]:
    """Two loops profiled here (cached per process): a data-bound and a compute-bound one."""
    runs = [(name, profile_loop(delay_s, step_s, steps)) for name, delay_s, step_s in (
        ("a loader that sleeps 30 ms per batch, a fast step", 0.03, 0.0),
        ("a ready loader, a step that takes 50 ms", 0.0, 0.05))]
    return tuple({"name": name, "warmup_steps": 1, "events": events,
                  "answer": _reference_fraction(events, 1)} for name, events in runs)


# ---- calling the learner's functions and judging what they return ---------------------------
def _call(exercise: str, fn: Callable, events: list[dict], signature: str, **kwargs: Any) -> Any:
    """``fn`` on a copy of ``events``; an error fails with a hint for the common ones."""
    def hint(exc: Exception) -> str:
        if isinstance(exc, KeyError) and exc.args and exc.args[0] in ("dur", "ts"):
            return (f"not every event has {exc.args[0]!r}: metadata ('ph': 'M'), instant ('i') and flow "
                    "('s', 'f') events have no duration; keep the complete events, ph == 'X'.")
        if isinstance(exc, (ValueError, IndexError, ZeroDivisionError)):
            return ("the trace has steps to count; print the ProfilerStep spans you found and "
                    "the ones left after the warm-up.")
        return "run it on the trace above in a cell of its own and read the traceback."
    return call_answer(exercise, fn, copy.deepcopy(events), signature=signature, hint=hint, **kwargs)


def _judge(value: Any, answer: float, mistakes: dict[str, float], where: str, tol: float) -> float:
    """The answer's fraction, or ExerciseFailed naming the mistake whose value it matches."""
    value = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ExerciseFailed(WAIT, f"{where}: data_wait_fraction must return one number.",
                             expected="a finite float between 0 and 1, such as 0.42", seen=describe(value),
                             hint="return wait / time as a plain float (did it forget a `return`?); "
                                  "divide by the counted steps' total duration, which is > 0.")
    value = float(value)
    if abs(value - answer) <= tol:
        return value
    for key, wrong in mistakes.items():
        if abs(value - wrong) <= tol:
            problem, hint = MISTAKES[key]
            raise ExerciseFailed(WAIT, f"{where}: {problem}", expected=f"{answer:.4f}",
                                 seen=f"{value:.4f} (what that mistake gives)", hint=hint)
    problem, hint = (MISTAKES["percent"] if value > 1 else
                     ("the fraction is negative.", "durations are positive: add them up, don't "
                      "subtract.") if value < 0 else
                     ("the fraction is off.", "wait = the durations of the 'fetch' and 'h2d copy' "
                      "spans inside the counted steps; time = the counted ProfilerStep spans' "
                      "durations; the counted steps are all but the first `warmup_steps` in time "
                      "order. Print what you add up for each step."))
    raise ExerciseFailed(WAIT, f"{where}: {problem}", expected=f"{answer:.4f}", seen=f"{value:.4f}",
                         hint=hint)


def _cases(real: bool) -> list[tuple[str, dict, dict[str, float], float]]:
    """(where, case, its mistakes' values, tolerance) for the synthetic and the real traces."""
    out = [(f"on {c['name']}", c, c["mistakes"], TOLERANCE) for c in synthetic_cases()]
    for c in real_traces() if real else ():
        with_startup = _reference_fraction(c["events"], 0)
        out.append((f"on a loop profiled here ({c['name']})", c, {"warm-up": with_startup}
                    if abs(with_startup - c["answer"]) > 0.03 else {}, REAL_TOLERANCE))
    return out


@grader(WAIT)
def grade_wait_fraction(data_wait_fraction: Callable[..., Any], *, real: bool = True) -> CheckResult:
    """``data_wait_fraction(events, warmup_steps=1)`` on synthetic and real traces."""
    signature = "data_wait_fraction(events, warmup_steps=1)"
    require_callable(WAIT, data_wait_fraction, signature)
    found = {case["name"]: _judge(_call(WAIT, data_wait_fraction, case["events"], signature,
                                        warmup_steps=case["warmup_steps"]),
                                  case["answer"], mistakes, where, tol)
             for where, case, mistakes, tol in _cases(real)}
    shown = "; ".join(f"{k}: {v:.3f}" for k, v in found.items())
    return CheckResult(WAIT, f"every trace's fraction is right ({shown}).", found)


@grader(STALL)
def grade_bottleneck(bottleneck: Callable[..., Any], *, real: bool = True) -> CheckResult:
    """``bottleneck(events, warmup_steps=1, threshold=0.10)`` names the held-back loops."""
    signature = "bottleneck(events, warmup_steps=1, threshold=0.10)"
    require_callable(STALL, bottleneck, signature)
    near = synthetic_trace([(1.5, 0, 8.5, 0)] * 5)                 # waits 15 % of the time
    # (what, events, warmup_steps, threshold, fraction)
    trials = [(where[3:], c["events"], c["warmup_steps"], 0.10, c["answer"])
              for where, c, _, _ in _cases(real)]
    trials[len(synthetic_cases()):len(synthetic_cases())] = [
        ("a loop that waits 15 % of its time", near, 0, 0.10, 0.15),
        ("the same loop with threshold=0.25", near, 0, 0.25, 0.15)]
    labels = []
    for what, events, warmup, threshold, fraction in trials:
        label = _call(STALL, bottleneck, events, signature, warmup_steps=warmup, threshold=threshold)
        expected = "data" if fraction > threshold else "compute"
        if label not in ("data", "compute"):
            raise ExerciseFailed(
                STALL, f"on {what}: the answer must be 'data' or 'compute'.",
                expected=repr(expected), seen=describe(label),
                hint="diagnose prints 'data-bound'; this function returns the short words, exactly "
                     "'data' or 'compute' (lower case)." if isinstance(label, str) and
                label.lower().startswith(("data", "compute")) else "return the string 'data' or 'compute'.")
        if label != expected:
            raise ExerciseFailed(
                STALL, f"on {what}: the wrong bottleneck.", expected=repr(expected),
                seen=f"{label!r}; the loop waited {fraction:.0%} of its counted steps' time",
                hint=f"with the warm-up counted this loop looks data-bound, but after "
                     f"warmup_steps={warmup} it waited only {fraction:.0%}: skip the warm-up "
                     f"steps before you judge." if "start-up" in what else
                     f"'data' when the wait fraction is more than threshold (here {threshold:.2f}), else "
                     "'compute'; use the `threshold` argument, not a number of your own.")
        labels.append(f"{what}: {label}")
    return CheckResult(STALL, f"every loop named right ({'; '.join(labels)}).", {"labels": labels})
