"""Graders of exercise 03 pass the reference answers and fail plausible wrong ones, teaching why."""
from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from course_utils.grading import CheckResult, ExerciseFailed, check, exercise_ids
from course_utils.graders.ex03_scaling import acceptable, synthetic_curves

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
        assert max(result.details["answer_growth_bytes"]) < \
            0.25 * np.mean(result.details["list_growth_bytes"])


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
