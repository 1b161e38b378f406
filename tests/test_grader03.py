"""Graders of exercise 03 pass the reference answers and fail plausible wrong ones, teaching why."""
from __future__ import annotations

import functools
import multiprocessing
import os

import types

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import course_utils.grading.ex03_num_workers as G
from course_utils.grading.checker import CheckResult, ExerciseFailed, check, exercise_ids
from course_utils.grading.ex03_num_workers import acceptable, shuffled, synthetic_curves
from course_utils.lessons.l03_num_workers import RecordArrayDataset, make_records
from course_utils.scaling import find_knee

pytestmark = pytest.mark.timeout(180)
HAS_FORK = "fork" in multiprocessing.get_all_start_methods()


# ---- 03.choose_workers -------------------------------------------------------------------------

def reference_choose(workers, samples_per_s):
    best = max(samples_per_s)
    for w, rate in sorted(zip(workers, samples_per_s)):
        if rate >= 0.9 * best:
            return int(w)


def stricter_choose(workers, samples_per_s):
    best = max(samples_per_s)
    return min(w for w, r in zip(workers, samples_per_s) if r >= 0.95 * best)


def argmax_choose(workers, samples_per_s):
    return workers[int(np.argmax(samples_per_s))]


def index_choose(workers, samples_per_s):
    best = max(samples_per_s)
    return next(i for i, r in enumerate(samples_per_s) if r >= 0.9 * best)


def most_workers(workers, samples_per_s):
    return max(workers)


def half_of_best(workers, samples_per_s):
    best = max(samples_per_s)
    return next(w for w, r in zip(workers, samples_per_s) if r >= 0.5 * best)


def cpu_count_choose(workers, samples_per_s):
    return os.cpu_count()


def always_four(workers, samples_per_s):
    return 4


def float_choose(workers, samples_per_s):
    return float(reference_choose(workers, samples_per_s))


def not_done_choose(workers, samples_per_s):
    raise NotImplementedError("Exercise: replace this line with your code")


def test_known_ids():
    assert {"03.choose_workers", "03.copy_on_read"} <= set(exercise_ids())


def test_every_synthetic_curve_has_a_unique_good_range():
    curves = synthetic_curves()
    assert len(curves) >= 5
    ranges = [tuple(acceptable(c["workers"], c["truth"])) for c in curves]
    assert all(ranges) and len(set(ranges)) == len(ranges)
    # no single count is good for every curve, so no constant answer can pass
    assert not set.intersection(*(set(r) for r in ranges))
    # the curves are the same on every run
    assert synthetic_curves()[0]["measured"] == curves[0]["measured"]


def test_choose_workers_reference_passes_with_a_real_curve():
    result = check("03.choose_workers", reference_choose)
    assert isinstance(result, CheckResult)
    assert "PASSED 03.choose_workers" in str(result) and "measured here" in str(result)
    assert result.details["noisy plateau"] == 6


def test_choose_workers_stricter_tolerance_also_passes():
    assert "PASSED" in str(check("03.choose_workers", stricter_choose, measure_real_curve=False))


@pytest.mark.parametrize("answer, message", [
    (argmax_choose, "more workers than needed.*not\\s+the argmax"),
    (most_workers, "more workers than needed"),
    (index_choose, "looks like a position in the list"),
    (half_of_best, "too few workers"),
    (cpu_count_choose, "for every curve"),
    (always_four, "returned 4 for every curve"),
    (float_choose, "not a whole number.*int"),
    (lambda w, r: [4], "ONE worker count"),
    (not_done_choose, "not done yet"),
    ("four", "not a function"),
])
def test_choose_workers_wrong_answers_fail_with_their_message(answer, message):
    with pytest.raises(ExerciseFailed, match=f"(?s){message}"):
        check("03.choose_workers", answer, measure_real_curve=False)


def test_choose_workers_cpu_count_message_names_cpu_count():
    with pytest.raises(ExerciseFailed) as info:
        check("03.choose_workers", cpu_count_choose, measure_real_curve=False)
    assert "os.cpu_count()" in str(info.value)


def test_choose_workers_oversubscription_is_explained():
    def past_the_peak(workers, samples_per_s):
        if len(workers) == 13:  # the peak-then-decline curve
            return 10
        return reference_choose(workers, samples_per_s)

    with pytest.raises(ExerciseFailed, match="(?s)past the peak.*expected: one of \\[3, 4, 5\\]"):
        check("03.choose_workers", past_the_peak, measure_real_curve=False)


def first_good_in_given_order(workers, samples_per_s):
    """Right only when the workers come sorted: the first within 10 % in the order given."""
    best = max(samples_per_s)
    return next(w for w, r in zip(workers, samples_per_s) if r >= 0.9 * best)


def assumes_sorted_workers(workers, samples_per_s):
    """Right only when the workers come sorted: walks the lists by position."""
    best = max(samples_per_s)
    for i in range(len(workers)):
        if samples_per_s[i] >= 0.9 * best:
            return workers[i]


@pytest.mark.parametrize("answer", [first_good_in_given_order, assumes_sorted_workers])
def test_choose_workers_an_answer_that_needs_sorted_input_fails_on_shuffled(answer):
    for curve in synthetic_curves():  # right on every curve in order ...
        assert answer(curve["workers"], curve["measured"]) in acceptable(curve["workers"],
                                                                          curve["truth"])
    with pytest.raises(ExerciseFailed) as info:   # ... but not shuffled
        check("03.choose_workers", answer, measure_real_curve=False)
    err = info.value
    assert "depends on the order of the measurements" in err.problem, str(err)
    assert "whatever the order" in err.expected and "any order" in err.hint
    # the seen line shows the shuffled lists the answer was given (the same every run: seeded)
    assert err.seen.startswith(f"{err.seen.split()[0]} for workers [") and "with samples/s [" in err.seen
    again = pytest.raises(ExerciseFailed, check, "03.choose_workers", answer, measure_real_curve=False)
    assert again.value.seen == err.seen


def test_shuffled_curves_are_never_sorted_and_keep_each_rate_with_its_count():
    for i, curve in enumerate(synthetic_curves()):
        mixed = shuffled(curve, 100 + i)
        assert mixed["workers"] != sorted(mixed["workers"])
        assert sorted(zip(mixed["workers"], mixed["measured"])) == \
            sorted(zip(curve["workers"], curve["measured"]))


@pytest.mark.parametrize("answer", [find_knee, functools.partial(find_knee, tolerance=0.9)])
def test_choose_workers_the_course_helper_is_refused(answer):
    with pytest.raises(ExerciseFailed, match=r"(?s)course's own `find_knee` \(course_utils\.scaling\)"
                                             r".*write this mechanism yourself"):
        check("03.choose_workers", answer, measure_real_curve=False)


# ---- 03.choose_workers: the accepted window, on made-up curves ---------------------------------

JUST = 1.01   # "just inside / just outside" a threshold, as a factor
BEST = 1000.0


def made_up(truth):
    return {"name": "made up", "story": "", "workers": list(range(len(truth))),
            "truth": list(truth), "measured": list(truth)}


def test_choose_workers_window_worked_example():
    # 840 is under 85 % of the best, 860 over; 971 is the first within 97 %; one count more
    truth = [100, 300, 600, 840, 860, 971, 990, 1000, 1000]
    assert acceptable(range(9), truth) == [4, 5, 6]


def saturating_at_4(first_saturated_rate=G.SATURATED_FRACTION * BEST * JUST):
    """Workers 0..8, saturating at 4 workers unless ``first_saturated_rate`` is too low; 5 and
    more are within SATURATED_FRACTION of the best."""
    return made_up([100, 300, 600, 800, first_saturated_rate, 985, 990, 995, BEST])


def test_choose_workers_just_inside_the_window_past_saturation_passes():
    G.judge_choice(saturating_at_4(), 4 + G.STEPS_PAST_SATURATED, "made-up")


def test_choose_workers_just_outside_the_window_past_saturation_fails():
    with pytest.raises(ExerciseFailed, match="more workers than needed.*4 workers already"):
        G.judge_choice(saturating_at_4(), 4 + G.STEPS_PAST_SATURATED + 1, "made-up")


@pytest.mark.parametrize("rate_at_4, first_saturated", [
    (G.SATURATED_FRACTION * BEST * JUST, 4), (G.SATURATED_FRACTION * BEST / JUST, 5)],
    ids=["just-saturated", "just-short"])
def test_choose_workers_window_ends_past_the_first_saturated_count(rate_at_4, first_saturated):
    curve = saturating_at_4(rate_at_4)
    assert max(acceptable(curve["workers"], curve["truth"])) == \
        first_saturated + G.STEPS_PAST_SATURATED


def rising_to(rate_at_2):
    """Workers 0..5, rate_at_2 at 2 workers, saturating at 4."""
    return made_up([100, 500, rate_at_2, 900, BEST, BEST])


def test_choose_workers_just_enough_of_the_best_rate_passes():
    G.judge_choice(rising_to(G.ENOUGH_FRACTION * BEST * JUST), 2, "made-up")


def test_choose_workers_just_short_of_enough_is_too_few():
    curve = rising_to(G.ENOUGH_FRACTION * BEST / JUST)
    with pytest.raises(ExerciseFailed, match="too few workers") as info:
        G.judge_choice(curve, 2, "made-up")
    assert info.value.exercise == "03.choose_workers"
    assert f"reach only {G.ENOUGH_FRACTION / JUST:.0%} of the best" in info.value.problem
    assert info.value.expected == f"one of {acceptable(curve['workers'], curve['truth'])}"
    assert "within about 10 %" in info.value.hint


def test_choose_workers_past_the_peak_just_short_of_enough_is_too_many():
    peak = made_up([100, 600, BEST, 900, G.ENOUGH_FRACTION * BEST / JUST])
    with pytest.raises(ExerciseFailed, match="too many workers.*past the peak"):
        G.judge_choice(peak, 4, "made-up")


def test_choose_workers_the_measured_curve_saturates_at_its_own_fraction():
    curve = saturating_at_4(G.MEASURED_SATURATED_FRACTION * BEST * JUST)
    measured = functools.partial(G.judge_choice, saturated=G.MEASURED_SATURATED_FRACTION)
    measured(curve, 4 + G.STEPS_PAST_SATURATED, "measured")
    with pytest.raises(ExerciseFailed, match="more workers than needed"):
        measured(curve, 4 + G.STEPS_PAST_SATURATED + 1, "measured")
    G.judge_choice(curve, 4 + G.STEPS_PAST_SATURATED + 1, "synthetic")  # 5 saturate at 97 %


# ---- 03.copy_on_read ---------------------------------------------------------------------------

class Packed(Dataset):
    """The reference answer: labels, boxes, and all paths in one uint8 buffer + offsets."""

    def __init__(self, records):
        n = len(records)
        self.labels = np.array([r["label"] for r in records], dtype=np.int64)
        self.boxes = np.array([r["box"] for r in records], dtype=np.float32)
        encoded = [r["path"].encode("utf-8") for r in records]
        self.offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=self.offsets[1:])
        self.path_bytes = np.frombuffer(b"".join(encoded), dtype=np.uint8)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        path = self.path_bytes[self.offsets[i]:self.offsets[i + 1]].tobytes().decode("utf-8")
        return torch.from_numpy(self.boxes[i].copy()), int(self.labels[i]), path


class FixedWidthPaths(Packed):
    """Also right: paths as a fixed-width NumPy string array."""

    def __init__(self, records):
        super().__init__(records)
        self.paths = np.array([r["path"] for r in records])

    def __getitem__(self, i):
        box, label, _ = super().__getitem__(i)
        return box, label, str(self.paths[i])


class KeepsTheList(Dataset):
    def __init__(self, records):
        self.records = list(records)

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        r = self.records[i]
        return torch.tensor(r["box"], dtype=torch.float32), r["label"], r["path"]


class Tuples(KeepsTheList):
    def __init__(self, records):
        self.records = [(r["box"], r["label"], r["path"]) for r in records]

    def __getitem__(self, i):
        box, label, path = self.records[i]
        return torch.tensor(box, dtype=torch.float32), label, path


class ObjectArray(KeepsTheList):
    def __init__(self, records):
        self.records = np.array(records, dtype=object)


class PathsStillAList(Packed):
    def __init__(self, records):
        super().__init__(records)
        self.paths = [r["path"] for r in records]

    def __getitem__(self, i):
        box, label, _ = super().__getitem__(i)
        return box, label, self.paths[i]


class HiddenList(Dataset):
    """Keeps the records behind a bound method: no container in its attributes, but every
    read still touches the Python objects (only the memory measurement can tell)."""

    def __init__(self, records):
        self._fetch = records.__getitem__
        self.n = len(records)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        r = self._fetch(i)
        return torch.tensor(r["box"], dtype=torch.float32), r["label"], r["path"]


class NumpyBox(Packed):
    def __getitem__(self, i):
        box, label, path = super().__getitem__(i)
        return box.numpy(), label, path


class BytesPath(Packed):
    def __getitem__(self, i):
        box, label, path = super().__getitem__(i)
        return box, label, path.encode()


class Float64Box(Packed):
    def __getitem__(self, i):
        box, label, path = super().__getitem__(i)
        return box.double(), label, path


class DropsLast(Packed):
    def __len__(self):
        return len(self.labels) - 1


class NotDone(Dataset):
    def __init__(self, records):
        raise NotImplementedError("Exercise: replace this line with your code")


@pytest.mark.parametrize("answer", [Packed, FixedWidthPaths])
def test_copy_on_read_right_answers_pass(answer):
    result = check("03.copy_on_read", answer)
    assert "PASSED 03.copy_on_read" in str(result)
    if HAS_FORK:
        assert "forked workers" in str(result)
        assert max(result.details["answer_growth_bytes"]) <= \
            G.GROWTH_FRACTION * np.mean(result.details["list_growth_bytes"])


@pytest.mark.parametrize("answer, message", [
    (KeepsTheList, "20,000 Python objects in `records` \\(a list\\)"),
    (Tuples, "Python objects in `records`"),
    (ObjectArray, "dtype=object"),
    (PathsStillAList, "Python objects in `paths`"),
    (NumpyBox, "box is not a torch tensor"),
    (BytesPath, "path differs"),
    (Float64Box, "box differs"),
    (DropsLast, "wrong length"),
    (lambda records: records, "gives back the list"),
    (lambda records: 42, "not a dataset"),
    (NotDone, "not done yet"),
    (None, "not a class or function"),
])
def test_copy_on_read_wrong_answers_fail_with_their_message(answer, message):
    # these fail before any worker starts: fewer records keep the test fast
    with pytest.raises(ExerciseFailed, match=f"(?s){message}"):
        check("03.copy_on_read", answer, n_records=20_000)


@pytest.mark.skipif(not HAS_FORK, reason="copy-on-read is measured under fork only")
def test_copy_on_read_measurement_catches_what_the_scan_cannot():
    with pytest.raises(ExerciseFailed, match="(?s)still copies memory into every worker.*"
                                             "expected:.*seen:.*hint:"):
        check("03.copy_on_read", HiddenList)


@pytest.mark.parametrize("answer", [RecordArrayDataset, lambda records: RecordArrayDataset(records)])
def test_copy_on_read_the_course_dataset_is_refused_handed_in_or_returned(answer):
    with pytest.raises(ExerciseFailed) as info:
        check("03.copy_on_read", answer, n_records=2_000)
    err = info.value
    assert "course's own `RecordArrayDataset` (course_utils.lessons" in err.problem, str(err)
    assert "write this mechanism yourself" in err.hint, str(err)


# ---- 03.copy_on_read: the decision on measured memory, with made-up figures --------------------

MB = 1e6
LIST_GROWTH = [13.1 * MB, 13.1 * MB]    # the list of dicts, measured on a 2-core machine


@pytest.mark.parametrize("answer_growth, verdict", [
    ([0.97 * MB, 0.97 * MB], "pass"),     # packed arrays, measured there
    ([3.45 * MB, 3.45 * MB], "fail"),     # packed, but the paths left in a list of str
    (LIST_GROWTH, "fail"),
], ids=["packed", "paths-in-a-list", "the-list-itself"])
def test_growth_verdict_on_measured_figures(answer_growth, verdict):
    assert G.growth_verdict(LIST_GROWTH, answer_growth) == verdict


@pytest.mark.parametrize("answer_growth, verdict", [
    ([1 / JUST, 1 / JUST], "pass"),
    ([1 / JUST, JUST], "fail"),           # one worker over the limit is enough to fail
], ids=["both-just-under", "one-just-over"])
def test_growth_verdict_at_the_limit(answer_growth, verdict):
    limit = G.GROWTH_FRACTION * np.mean(LIST_GROWTH)
    assert G.growth_verdict(LIST_GROWTH, [g * limit for g in answer_growth]) == verdict


def test_growth_verdict_too_little_list_growth_to_compare():
    small = [G.MIN_LIST_GROWTH_BYTES / JUST] * 2
    assert G.growth_verdict(small, small) == "too little to compare"
    enough = [G.MIN_LIST_GROWTH_BYTES * JUST] * 2
    assert G.growth_verdict(enough, enough) == "fail"
    assert G.growth_verdict(enough, [0.0, 0.0]) == "pass"


@pytest.mark.parametrize("count, found", [(99, False), (100, True)])
def test_object_holders_threshold_is_a_fraction_of_the_records(count, found):
    n = round(100 / G.OBJECTS_FRACTION)       # so the threshold is 100 objects
    dataset = types.SimpleNamespace(labels=np.zeros(n), classes=[str(i) for i in range(count)])
    assert bool(G.object_holders(dataset, n)) == found


class HalfFixed(Packed):
    """Labels, boxes and paths packed, but __getitem__ reads the paths from a list of str held
    behind a bound method, where the scan for Python objects cannot see it."""

    def __init__(self, records):
        super().__init__(records)
        self.path_of = [r["path"] for r in records].__getitem__

    def __getitem__(self, i):
        box, label, _ = super().__getitem__(i)
        return box, label, self.path_of(i)


@pytest.mark.skipif(not HAS_FORK, reason="copy-on-read is measured under fork only")
def test_copy_on_read_half_fixed_dataset_fails_on_its_memory_growth():
    with pytest.raises(ExerciseFailed) as info:
        check("03.copy_on_read", HalfFixed)
    err = info.value
    assert "still copies memory into every worker" in err.problem, str(err)
    assert f"{G.GROWTH_FRACTION:.0%} of the list version's growth" in err.expected


def test_the_course_packed_dataset_keeps_no_python_object_per_record():
    records = make_records(2_000, seed=0)
    dataset = RecordArrayDataset(records)
    storage = {name: type(value).__name__ if not isinstance(value, np.ndarray) else value.dtype
               for name, value in vars(dataset).items()}
    assert storage and all(isinstance(v, np.dtype) and v != object for v in storage.values()), \
        f"RecordArrayDataset should keep only NumPy arrays of numbers or bytes; it keeps {storage}"
    assert G.object_holders(dataset, len(records)) == []
    assert [dataset[i][2] for i in (0, 1999)] == [records[0]["path"], records[1999]["path"]]


# ---- exactly at a threshold (mutation: >= vs >), and the curves themselves -----------------------

def test_a_rate_exactly_at_enough_and_at_saturated_counts_as_reaching_them():
    assert G.ENOUGH_FRACTION * BEST == 850.0 and G.SATURATED_FRACTION * BEST == 970.0
    # 2 workers reach exactly 85 % (enough), 3 exactly 97 % (the first saturated count)
    truth = [100, 500, 850.0, 970.0, 990, BEST, BEST, BEST]
    assert G.STEPS_PAST_SATURATED == 1
    assert acceptable(range(8), truth) == [2, 3, 4]     # from 2 (enough) to 3 + 1 (saturated)


def test_growth_exactly_at_the_limits():
    ref = G.MIN_LIST_GROWTH_BYTES
    assert G.growth_verdict([ref, ref], [ref]) == "fail"          # exactly enough list growth
    limit = G.GROWTH_FRACTION * 80e6
    assert G.growth_verdict([80e6], [limit]) == "pass"           # exactly the allowed growth


def test_shuffling_is_seeded_and_never_sorted_even_for_two_counts():
    curve = made_up([100, 200])
    for seed in range(20):
        assert shuffled(curve, seed)["workers"] == [1, 0]
    one = made_up([100])
    assert shuffled(one, 0)["workers"] == [0]                   # one count: returns, unchanged
    long = made_up(list(range(100, 1000, 100)))
    assert shuffled(long, 7) == shuffled(long, 7) != shuffled(long, 8)


def test_synthetic_measurements_are_the_true_rates_within_their_noise_to_one_decimal():
    for curve in synthetic_curves():
        pairs = list(zip(curve["truth"], curve["measured"]))
        assert all(abs(m / t - 1) <= 0.05 + 1e-9 for t, m in pairs), curve["name"]
        assert all(m == round(m, 1) for _, m in pairs)
        assert any(m != round(m) for _, m in pairs), curve["name"]   # not rounded to integers
        assert curve["story"]


def test_a_choice_past_the_peak_tells_the_curves_story():
    curve = dict(made_up([100, 600, BEST, 900, 500]), story="every worker adds threads")
    with pytest.raises(ExerciseFailed, match=r"\(every worker adds threads\)"):
        G.judge_choice(curve, 4, "made-up")


def test_an_answer_that_raises_is_reported_under_its_exercise():
    def broken(workers, samples_per_s):
        raise KeyError("oops")
    with pytest.raises(ExerciseFailed) as info:
        check("03.choose_workers", broken, measure_real_curve=False)
    assert info.value.exercise == "03.choose_workers" and "KeyError" in str(info.value)


# ---- where the scan for Python objects looks (object_holders), entry by entry --------------------

N_RECORDS = round(100 / G.OBJECTS_FRACTION)          # a threshold of 100 objects
MANY = [str(i) for i in range(100)]


class Slotted:
    __slots__ = ("paths", "unset")

    def __init__(self, paths):
        self.paths = paths


def holders(**attrs):
    return G.object_holders(types.SimpleNamespace(**attrs), N_RECORDS)


def test_object_holders_names_each_place_it_found_objects():
    assert holders(paths=MANY, labels=np.zeros(3)) == [("paths", "list", 100)]
    assert holders(meta={"paths": MANY, "n": 3}) == [("meta['paths']", "list", 100)]
    assert holders(meta={"a": {"paths": MANY}}) == [("meta['a']['paths']", "list", 100)]
    assert holders(meta={"a": {"b": {"paths": MANY}}}) == []            # four levels down
    assert holders(parts=(np.zeros(2), MANY)) == [("parts[1]", "list", 100)]
    assert holders(index=Slotted(MANY)) == [("index.paths", "list", 100)]
    assert holders(a=MANY, b=set(MANY)) == [("a", "list", 100), ("b", "set", 100)]


def test_an_object_array_is_a_holder_from_exactly_the_threshold():
    at = np.array(MANY, dtype=object)
    assert holders(paths=at) == [("paths", "NumPy array of dtype=object", 100)]
    assert holders(paths=at[:99]) == [] and holders(paths=np.array(MANY)) == []  # str array: no objects


def test_the_scan_looks_three_levels_below_the_dataset_and_at_each_object_once():
    level3 = types.SimpleNamespace(b=types.SimpleNamespace(paths=MANY))     # a.b.paths: found
    assert holders(a=level3) == [("a.b.paths", "list", 100)]
    level4 = types.SimpleNamespace(b=types.SimpleNamespace(c=types.SimpleNamespace(paths=MANY)))
    assert holders(a=level4) == []                                          # a.b.c.paths: not
    shared = types.SimpleNamespace(paths=MANY)
    assert holders(x=shared, y=shared) == [("x.paths", "list", 100)]       # seen once
    assert holders(x=MANY, y=[MANY]) == [("x", "list", 100)]               # the same list


# ---- 03.copy_on_read: an item that differs from the original, part by part ----------------------

def item_changed_by(change):
    """A packed answer whose items pass through ``change(box, label, path)``."""
    class Changed(Packed):
        def __getitem__(self, i):
            return change(*super().__getitem__(i))
    return Changed


@pytest.mark.parametrize("change, problem", [
    (lambda b, l, p: (b, l), "item 0 has the wrong shape"),
    (lambda b, l, p: {"box": b, "label": l, "path": p}, "item 0 has the wrong shape"),
    (lambda b, l, p: (b.numpy(), l, p), "item 0: the box is not a torch tensor"),
    (lambda b, l, p: (b.double(), l, p), "item 0: the box differs"),
    (lambda b, l, p: (b[None], l, p), "item 0: the box differs"),
    (lambda b, l, p: (b + 1, l, p), "item 0: the box differs"),
    (lambda b, l, p: (b, float(l), p), "item 0: the label differs"),
    (lambda b, l, p: (b, l + 1, p), "item 0: the label differs"),
    (lambda b, l, p: (b, l, p.encode()), "item 0: the path differs"),
    (lambda b, l, p: (b, l, p + "x"), "item 0: the path differs"),
], ids=["pair", "dict", "numpy-box", "float64-box", "box-shape", "box-values", "float-label",
        "label", "bytes-path", "path"])
def test_copy_on_read_an_item_that_differs_is_named_with_what_was_expected(change, problem):
    with pytest.raises(ExerciseFailed, match=problem) as info:
        check("03.copy_on_read", item_changed_by(change), n_records=200)
    err = info.value
    assert err.exercise == "03.copy_on_read" and err.expected and err.seen and err.hint


def test_a_bool_label_is_not_an_int_label():
    records = make_records(200, seed=1)
    falsy = next(i for i, r in enumerate(records) if r["label"] in (0, 1))
    class BoolLabels(Packed):
        def __getitem__(self, i):
            box, label, path = super().__getitem__(i)
            return box, bool(label) if i == falsy else label, path
    with pytest.raises(ExerciseFailed, match=f"item {falsy}: the label differs"):
        check("03.copy_on_read", BoolLabels, n_records=200)


def test_what_a_wrong_item_was_is_shown_in_at_most_300_characters():
    with pytest.raises(ExerciseFailed) as info:
        check("03.copy_on_read", item_changed_by(lambda b, l, p: tuple(range(1000))), n_records=200)
    assert len(info.value.seen) == 300 and info.value.seen.startswith("tuple: (0, 1, 2")


# ---- judge_choice: the answer that is not a measured count, and the exact edge past the peak --------

def unsorted_curve():
    # 4 workers measured first: the only good choice; 1 and 2 are far below it
    return {"name": "made up", "story": "", "workers": [4, 1, 2], "truth": [1000.0, 100.0, 500.0],
            "measured": [1000.0, 100.0, 500.0]}


@pytest.mark.parametrize("answer, hint", [
    (0, "0 looks like a position in the list, not a worker count: return workers[0] = 4."),
    (3, "choose from the worker counts that were measured"),      # one past the last position
    (7, "choose from the worker counts that were measured"),
], ids=["position-0", "past-the-end", "unmeasured"])
def test_an_unmeasured_count_is_refused_and_a_position_is_recognised(answer, hint):
    with pytest.raises(ExerciseFailed, match=f"{answer} workers were not measured") as info:
        G.judge_choice(unsorted_curve(), answer, "made-up")
    err = info.value
    assert err.hint.startswith(hint) and err.expected == "one of [4, 1, 2] (a good choice here: [4])"
    assert err.seen == f"{answer}; workers -> samples/s measured: 4: 1,000, 1: 100, 2: 500"


def test_a_count_past_the_window_at_exactly_enough_is_more_than_needed_not_past_the_peak():
    peak = made_up([100, 600, BEST, 900, 850.0])       # 4 workers: exactly 85 %, past the window
    with pytest.raises(ExerciseFailed, match="more workers than needed.*2 workers already deliver 100%") as info:
        G.judge_choice(peak, 4, "made-up")
    assert info.value.seen.startswith("4; workers -> samples/s measured: 0: 100, 1: 600")


@pytest.mark.parametrize("answer, kind", [(2.0, "return an int, e.g. int(w)"),
                                          ([2], "return ONE worker count, not a list"),
                                          ("2", "return one of the worker counts you were given")])
def test_an_answer_that_is_not_a_whole_number_says_what_it_was(answer, kind):
    with pytest.raises(ExerciseFailed, match="is not a whole number") as info:
        G.judge_choice(made_up([100, 200, 300]), answer, "made-up")
    assert info.value.hint.startswith(kind)
    assert info.value.seen == f"{type(answer).__name__}: {answer!r}"
    assert info.value.expected == "an int, one of the measured worker counts"


def test_each_synthetic_curve_has_the_window_its_story_describes():
    # the knee of a CPU-bound plateau, the top of a peak, the end of a still-rising grid, no
    # workers for light data, and a plateau blurred by noise: what each curve is there to test
    windows = {c["name"]: acceptable(c["workers"], c["truth"]) for c in synthetic_curves()}
    assert windows == {"rise then plateau": [7, 8, 9], "peak then decline": [3, 4, 5],
                       "still rising": [32], "workers do not help": [0], "noisy plateau": [6, 7, 8]}
