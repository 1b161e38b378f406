"""Graders for exercise 03: ``03.choose_workers`` on synthetic curves (also shuffled) and one
measured here; ``03.copy_on_read``, a dataset equal to ``RecordListDataset`` without a Python object
per record, whose forked workers' private memory does not grow."""
from __future__ import annotations

import multiprocessing
import numbers
import os
from typing import Any, Callable, Sequence

import numpy as np
import torch

from course_utils.config import pick
from course_utils.data import JpegDataset, ToTensorUint8
from course_utils.lessons.l03_num_workers import RecordListDataset, make_records, worker_memory
from course_utils.machine import usable_cpus
from course_utils.scaling import sweep_workers
from course_utils.threads import limit_threads, make_worker_init

from .checker import (CheckResult, ExerciseFailed, call_answer, describe, grader,
                      refuse_course_code, require_callable)

CHOOSE = "03.choose_workers"
COPY = "03.copy_on_read"

#: a good count's true rate reaches this fraction of the best, and it lies at most
#: STEPS_PAST_SATURATED counts past the first reaching SATURATED_FRACTION of it
ENOUGH_FRACTION = 0.85
SATURATED_FRACTION = 0.97
STEPS_PAST_SATURATED = 1
#: SATURATED_FRACTION for the curve measured here (more room for its noise)
MEASURED_SATURATED_FRACTION = 0.95
#: an attribute (or an entry in one) holding this fraction of the records' count of Python
#: objects or more is a Python object per record
OBJECTS_FRACTION = 0.1
#: the list version's mean growth per worker (bytes) below which there is too little to compare
MIN_LIST_GROWTH_BYTES = 8e6
#: each worker may grow at most this fraction of the list version's mean growth. Measured
#: (60,000 records, 2 workers): packed arrays 0.04-0.07, paths left in a list of str 0.24-0.26
GROWTH_FRACTION = 0.15


# ---- 03.choose_workers -----------------------------------------------------------------------
def synthetic_curves() -> list[dict]:
    """The curves the grader feeds (seeded noise: the same every run)."""
    plateau = [90, 100, 200, 300, 400, 500, 600, 700, 800, 798, 795, 793, 790, 788, 785, 782, 780]
    noisy = [90, 100, 200, 300, 400, 500, 580] + [600] * 10
    curves = [
        ("rise then plateau", "CPU-bound decoding on a machine with 8 usable cores", range(17),
         plateau, 0.03, 1),
        ("peak then decline", "every worker adds threads: past 4 workers the cores are "
         "oversubscribed", range(13), [250, 240, 460, 650, 750, 680, 610, 560, 510, 470, 430,
                                        400, 380], 0.03, 2),
        ("still rising", "latency-bound loading (network storage), measured on a doubling grid",
         [0, 1, 2, 4, 8, 16, 32], [100, 100, 198, 390, 760, 1450, 2600], 0.03, 3),
        ("workers do not help", "light in-memory data: sending batches between processes costs "
         "more than making them", range(9), [10000, 3500, 4300, 4400, 4200, 4000, 3800, 3500, 3300], 0.03, 4),
        ("noisy plateau", "a plateau measured on a busy machine (5 % noise)", range(17), noisy, 0.05, 16)]
    out = []
    for name, story, workers, truth, noise, seed in curves:
        factors = 1.0 + np.random.default_rng(seed).uniform(-noise, noise, size=len(truth))
        out.append({"name": name, "story": story, "workers": list(workers), "truth": list(truth),
                    "measured": [round(float(t * f), 1) for t, f in zip(truth, factors)]})
    return out


def shuffled(curve: dict, seed: int) -> dict:
    """``curve``'s measurements in a seeded order that is never the sorted one."""
    rng = np.random.default_rng(seed)
    n = len(curve["workers"])
    order = list(range(n))
    while n > 1 and order == sorted(order):
        order = rng.permutation(n).tolist()
    return {**curve, **{k: [curve[k][i] for i in order] for k in ("workers", "truth", "measured")}}


def acceptable(workers: Sequence[int], truth: Sequence[float], enough: float = ENOUGH_FRACTION,
               saturated: float = SATURATED_FRACTION) -> list[int]:
    """Worker counts a good choice may return for a curve whose true rates are ``truth``."""
    ws = list(workers)
    best = max(truth)
    first_saturated = next(i for i, t in enumerate(truth) if t >= saturated * best)
    last_allowed = min(first_saturated + STEPS_PAST_SATURATED, len(ws) - 1)
    return [w for i, w in enumerate(ws) if truth[i] >= enough * best and i <= last_allowed]


def _fmt_curve(workers: Sequence[int], rates: Sequence[float]) -> str:
    return ", ".join(f"{w}: {r:,.0f}" for w, r in zip(workers, rates))


def _call_choice(choose: Callable, curve: dict) -> Any:
    return call_answer(CHOOSE, choose, list(curve["workers"]), list(curve["measured"]))


def judge_choice(curve: dict, answer: Any, label: str, saturated: float = SATURATED_FRACTION) -> None:
    """Fail when ``answer`` is not a good choice for ``curve`` (see synthetic_curves)."""
    ws, truth = curve["workers"], curve["truth"]
    seen_curve = f"workers -> samples/s measured: {_fmt_curve(ws, curve['measured'])}"
    if isinstance(answer, bool) or not isinstance(answer, numbers.Integral):
        if isinstance(answer, float) and answer.is_integer():
            hint = "return an int, e.g. int(w); a worker count is a whole number."
        elif isinstance(answer, (list, tuple, np.ndarray)):
            hint = "return ONE worker count, not a list: the one you would pass as num_workers."
        else:
            hint = "return one of the worker counts you were given, as an int."
        raise ExerciseFailed(CHOOSE, f"the answer for the {label} curve is not a whole number.",
                             expected="an int, one of the measured worker counts",
                             seen=f"{type(answer).__name__}: {answer!r}", hint=hint)
    answer = int(answer)
    good = acceptable(ws, truth, saturated=saturated)
    if answer not in ws:
        hint = "choose from the worker counts that were measured; you know nothing about others."
        if 0 <= answer < len(ws) and ws[answer] in good:
            hint = (f"{answer} looks like a position in the list, not a worker count: "
                    f"return workers[{answer}] = {ws[answer]}.")
        raise ExerciseFailed(CHOOSE, f"{answer} workers were not measured on the {label} curve.",
                             expected=f"one of {ws} (a good choice here: {good})",
                             seen=f"{answer}; {seen_curve}", hint=hint)
    if answer in good:
        return
    i = ws.index(answer)
    best_i = int(np.argmax(truth))
    share = truth[i] / truth[best_i]
    story = f" ({curve['story']})" if curve.get("story") else ""
    if share < ENOUGH_FRACTION and answer < ws[best_i]:
        problem = (f"too few workers for the {label} curve{story}: {answer} workers reach only "
                   f"{share:.0%} of the best rate.")
        hint = ("find the best rate on the curve first, then take the smallest worker count "
                "whose rate is within about 10 % of it.")
    elif share < ENOUGH_FRACTION:
        problem = (f"too many workers for the {label} curve{story}: past the peak, {answer} "
                   f"workers deliver only {share:.0%} of the best rate.")
        hint = ("more workers are not always faster: when they outnumber the cores they slow "
                "each other down. Read the answer off the curve, not off the machine.")
    else:
        first_ok = min(good)
        problem = (f"more workers than needed for the {label} curve{story}: {first_ok} workers "
                   f"already deliver {truth[ws.index(first_ok)] / truth[best_i]:.0%} of the best "
                   f"rate; {answer} add almost nothing but cost CPU, memory and start-up time.")
        hint = ("the highest point of a measured curve is often a lucky measurement far out on "
                "the plateau: take the smallest worker count within about 10 % of the best, not "
                "the argmax.")
    raise ExerciseFailed(CHOOSE, problem, expected=f"one of {good}",
                         seen=f"{answer}; {seen_curve}", hint=hint)


def _judge_shuffled(choose: Callable, curve: dict, in_order: int, seed: int) -> None:
    """``choose`` on ``curve`` shuffled must still choose well (judged on the curve in order)."""
    mixed = shuffled(curve, seed)
    answer = _call_choice(choose, mixed)
    try:
        judge_choice(curve, answer, f"{curve['name']!r} (measurements shuffled)")
    except ExerciseFailed as exc:
        raise ExerciseFailed(
            CHOOSE, f"the answer depends on the order of the measurements: the {curve['name']!r} "
                    f"curve gave {in_order} with the worker counts in increasing order, but "
                    f"{answer!r} with the same measurements shuffled.",
            expected=f"{exc.expected}, whatever the order of the measurements",
            seen=f"{answer!r} for workers {mixed['workers']} with samples/s "
                 f"{[round(r) for r in mixed['measured']]}",
            hint="measurements can come in any order (a sweep run in random order, results "
                 "merged from several runs): keep each worker count with its own rate, and "
                 "choose by the counts themselves, not by their position in the lists.") from None


def _measured_curve() -> dict:
    """A samples/s-vs-workers curve of JPEG decoding measured now on this machine."""
    top = min(2 * usable_cpus(), 6)
    dataset = JpegDataset(n=pick(full=320, quick=160), min_side=320, max_side=640,
                          transform=ToTensorUint8(160))
    with limit_threads(1):  # the main process like the workers: one thread per pool
        sweep = sweep_workers(dataset, list(range(top + 1)), batch_size=8, batches=pick(24, 12),
                              repeats=1, progress=False, label="JPEG decode (measured now)",
                              worker_init_fn=make_worker_init(1))
    return {"name": "measured here", "story": "JPEG decoding measured on this machine just now",
            "workers": sweep.workers, "measured": sweep.samples_per_s, "truth": sweep.samples_per_s}


@grader(CHOOSE)
def grade_choose_workers(choose_num_workers: Callable[..., Any], *,
                         measure_real_curve: bool = True) -> CheckResult:
    """Check ``choose_num_workers(workers, samples_per_s)`` on synthetic curves and a real one."""
    require_callable(CHOOSE, choose_num_workers, "a function choose_num_workers(workers, samples_per_s)")
    curves = synthetic_curves()
    answers = [_call_choice(choose_num_workers, c) for c in curves]
    # the same answer whatever the curve: say so before judging any single curve
    plain = [int(a) for a in answers if isinstance(a, numbers.Integral) and not isinstance(a, bool)]
    if len(plain) == len(answers) and len(set(plain)) == 1:
        const = plain[0]
        why = (" — that is os.cpu_count(), which knows nothing about the workload"
               if const == (os.cpu_count() or -1) else "")
        raise ExerciseFailed(
            CHOOSE, f"the function returned {const} for every curve{why}.",
            expected="answers that follow the curves: " + ", ".join(
                f"{c['name']}: {acceptable(c['workers'], c['truth'])}" for c in curves),
            seen=f"{const} every time",
            hint="read the measured rates: CPU-bound work levels off near the core count, "
                 "waiting-bound work keeps rising, and light work may be fastest with 0 workers.")
    for curve, answer in zip(curves, answers):
        judge_choice(curve, answer, repr(curve["name"]))
    for i, (curve, answer) in enumerate(zip(curves, answers)):
        _judge_shuffled(choose_num_workers, curve, int(answer), seed=100 + i)
    details: dict[str, Any] = {c["name"]: int(a) for c, a in zip(curves, answers)}
    summary = "; ".join(f"{c['name']}: {int(a)}" for c, a in zip(curves, answers))
    if measure_real_curve:
        real = _measured_curve()
        answer = _call_choice(choose_num_workers, real)
        judge_choice(real, answer, "curve measured here", saturated=MEASURED_SATURATED_FRACTION)
        details["measured here"] = int(answer)
        details["measured curve"] = {"workers": real["workers"], "samples_per_s": real["measured"]}
        summary += (f"; measured here ({_fmt_curve(real['workers'], real['measured'])} "
                    f"samples/s): {int(answer)}")
    return CheckResult(CHOOSE, f"good choices on every curve ({summary}).", details)


# ---- 03.copy_on_read -------------------------------------------------------------------------
_LIST_BASELINE: dict[tuple, Any] = {}  # (n, seed, workers) -> WorkerMemory of the list version


def object_holders(dataset: Any, n: int) -> list[tuple[str, str, int]]:
    """(where, kind, count) for each place in ``dataset`` holding OBJECTS_FRACTION * n objects."""
    threshold, found, seen = max(1, int(n * OBJECTS_FRACTION)), [], set()

    def visit(obj: Any, path: str, depth: int) -> None:
        if id(obj) in seen or depth > 3 or isinstance(
                obj, (torch.Tensor, str, bytes, bytearray, memoryview, numbers.Number)):
            return
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            if obj.dtype == object and obj.size >= threshold:
                found.append((path, "NumPy array of dtype=object", int(obj.size)))
        elif isinstance(obj, (list, tuple, set, frozenset, dict)):
            if len(obj) >= threshold:
                found.append((path, type(obj).__name__, len(obj)))
            else:
                for k, v in (obj.items() if isinstance(obj, dict) else enumerate(obj)):
                    visit(v, f"{path}[{k!r}]", depth + 1)
        else:
            attrs = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
            attrs.update({a: getattr(obj, a) for a in getattr(type(obj), "__slots__", ()) or ()
                          if isinstance(a, str) and hasattr(obj, a)})
            for k, v in attrs.items():
                visit(v, f"{path}.{k}" if path else k, depth + 1)

    visit(dataset, "", 0)
    return found


def growth_verdict(list_growth: Sequence[float], answer_growth: Sequence[float]) -> str:
    """"too little to compare", "pass" or "fail": per-worker growth (bytes) vs the list's."""
    reference = float(np.mean(list_growth))
    if reference < MIN_LIST_GROWTH_BYTES:
        return "too little to compare"
    return "pass" if max(answer_growth) <= GROWTH_FRACTION * reference else "fail"


def _same_item(i: int, want: Any, got: Any) -> None:
    """Raise ExerciseFailed naming the first part of item ``i`` that differs from ``want``."""
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise ExerciseFailed(COPY, f"item {i} has the wrong shape.", seen=describe(got, 300),
                             expected="a tuple (box, label, path): box a float32 tensor of shape "
                                      "(4,), label an int, path a str",
                             hint="return exactly what RecordListDataset returns: (box, label, path).")
    box, label, path = got
    tensor = isinstance(box, torch.Tensor)
    for k, (part, kind, ok, hint) in enumerate((
            ("box", "a float32 tensor of shape (4,)", tensor and box.dtype == want[0].dtype
             and box.shape == want[0].shape and torch.equal(box, want[0]),
             "store the boxes as one float32 array of shape (n, 4) and return row i as a torch "
             "tensor made from a copy of the row (so the batch holds no view of the array)."),
            ("label", "an int", not isinstance(label, bool) and isinstance(label, numbers.Integral)
             and label == want[1], "store labels in an int64 array and return each as a plain "
                                   "Python int."),
            ("path", "a str", isinstance(path, str) and path == want[2],
             "a path is text: decode its UTF-8 bytes back to a str."))):
        if not ok:
            problem = "is not a torch tensor" if k == 0 and not tensor else "differs from the original"
            raise ExerciseFailed(COPY, f"item {i}: the {part} {problem}.", hint=hint,
                                 expected=f"{want[k]!r} ({kind})",
                                 seen=f"{type(got[k]).__name__}: {got[k]!r}"[:300])


@grader(COPY)
def grade_copy_on_read(make_safe: Callable[[list], Any], *, n_records: int = 60_000,
                       num_workers: int = 2, seed: int = 1) -> CheckResult:
    """``make_safe(records)``: RecordListDataset's items, no object per record, no page copies."""
    require_callable(COPY, make_safe, "a class (or function) called with the list of records, "
                                      "returning a dataset", what="class or function",
                     hint="pass the class itself, without calling it.")
    records = make_records(n_records, seed=seed)
    reference = RecordListDataset(records)
    safe = make_safe(records)
    if safe is records or isinstance(safe, RecordListDataset):
        raise ExerciseFailed(COPY, "the answer gives back the list (or the list dataset) itself.",
                             expected="a new dataset that keeps the records in NumPy arrays",
                             seen=type(safe).__name__,
                             hint="pack the fields into arrays in __init__ and read them in __getitem__.")
    refuse_course_code(COPY, safe)
    if not hasattr(safe, "__getitem__") or not hasattr(safe, "__len__"):
        raise ExerciseFailed(COPY, "the answer is not a dataset.", seen=describe(safe, 300),
                             expected="an object with __len__ and __getitem__ (a Dataset)")
    if len(safe) != len(records):
        raise ExerciseFailed(COPY, "the dataset has the wrong length.", seen=f"{len(safe)}",
                             expected=f"{len(records)} items (one per record)",
                             hint="__len__ should return the number of records.")
    rng = np.random.default_rng(seed)
    for i in [0, 1, len(records) - 1] + rng.integers(0, len(records), size=200).tolist():
        _same_item(i, reference[i], safe[i])

    holders = object_holders(safe, len(records))
    if holders:
        where, kind, size = holders[0]
        raise ExerciseFailed(
            COPY, f"the dataset still keeps {size:,} Python objects in `{where}` (a {kind}).",
            expected="only NumPy arrays of numbers or bytes (dtype int64, float32, uint8, fixed-"
                     "width strings) - no Python object per record",
            seen=", ".join(f"{w}: {k} of {s:,}" for w, k, s in holders),
            hint="every forked worker that reads a Python object writes its reference count, which copies "
                 "the memory page it lives on. Pack strings into one uint8 buffer plus an offsets array (or "
                 "np.array(paths), a fixed-width string array); numbers into int64/float32 arrays.")

    if "fork" not in multiprocessing.get_all_start_methods():
        return CheckResult(COPY, "items equal and no Python object per record (this platform has "
                                 "no 'fork', where copy-on-read happens, so worker memory was "
                                 "not measured).", {"measured": False})

    key = (len(records), seed, num_workers)
    if key not in _LIST_BASELINE:
        _LIST_BASELINE[key] = worker_memory(reference, num_workers, multiprocessing_context="fork",
                                            label="list of dicts")
    baseline = _LIST_BASELINE[key]
    del reference, records
    answer = worker_memory(safe, num_workers, multiprocessing_context="fork", label=type(safe).__name__)
    details = {"list_growth_bytes": baseline.growth_bytes, "answer_growth_bytes": answer.growth_bytes}
    verdict = growth_verdict(baseline.growth_bytes, answer.growth_bytes)
    if verdict == "too little to compare":
        return CheckResult(COPY, f"items equal and no Python object per record; on this machine "
                                 f"even the list version grew only {baseline.mean_growth_bytes / 1e6:.1f}"
                                 f" MB per worker, too little to compare.", details)
    yours, lists = (" / ".join(f"{g / 1e6:.1f}" for g in m.growth_bytes) + " MB per worker"
                    for m in (answer, baseline))
    if verdict == "fail":
        raise ExerciseFailed(
            COPY, "reading your dataset still copies memory into every worker.",
            expected=f"each worker's private memory to grow by at most "
                     f"{GROWTH_FRACTION * baseline.mean_growth_bytes / 1e6:.1f} MB over an epoch "
                     f"({GROWTH_FRACTION:.0%} of the list version's growth)",
            seen=f"your dataset: {yours}; the list of dicts: {lists}",
            hint="something __getitem__ reads is still a Python object per record (maybe held inside another "
                 "object, a closure or a bound method). Read only from NumPy arrays made in __init__.")
    return CheckResult(COPY, f"items equal; over one epoch in {num_workers} forked workers each worker's "
                             f"private memory grew {yours}, vs {lists} for the list of dicts.", details)
