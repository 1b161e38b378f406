"""The first graded step of exercises 02, 04 and 06 (``02.share``, ``04.copy``,
``06.batched_fetch``): the reference passes, each plausible wrong answer fails with a message
that names what to change; and every stepped exercise has a check and two hint tiers per step."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from course_utils.grading import ExerciseFailed, check
from course_utils.grading.checker import exercise_ids
from course_utils.grading.ex02_worker_init.share import CASES
from course_utils.pipelines import BatchedJpegDataset
from test_grader04 import Reference as RightPrefetcher
from test_grader06 import Batches as RightBatches

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]
STEPPED = {"02": ["02.share", "02.worker_init"], "03": ["03.choose_workers", "03.copy_on_read"],
           "04": ["04.copy", "04.prefetcher"], "06": ["06.batched_fetch", "06.fast_pipeline"]}


def failure(exercise, answer, **options) -> ExerciseFailed:
    with pytest.raises(ExerciseFailed) as info:
        check(exercise, answer, **options)
    return info.value


# ---- the exercises' layout --------------------------------------------------------------------

@pytest.mark.parametrize("number", sorted(STEPPED))
def test_each_step_has_its_own_check_after_a_nudge_and_then_the_api(number):
    for folder in ("solutions", "exercises"):
        path = next((ROOT / folder).glob(f"{number}_*.ipynb"))
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        text = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells]
        checks = [(i, m) for i, t in enumerate(text) if cells[i]["cell_type"] == "code"
                  for m in re.findall(r'check\("(\d\d\.\w+)"', t)]
        assert [m for _, m in checks] == STEPPED[number], f"{path.name}: checks {checks}"
        for i, exercise in checks:
            before = "\n".join(text[max(0, i - 2):i])
            assert "Hint 1: a nudge" in before and "Hint 2: what to look up" in before, \
                f"{path.name}: the check of {exercise} has no two-tier hints just above it"
            assert before.index("Hint 1") < before.index("Hint 2")
    assert set(STEPPED[number]) <= set(exercise_ids())


# ---- 02.share ---------------------------------------------------------------------------------

def share(cpu_budget, num_workers, forked):
    return 1 if forked else max(1, cpu_budget // num_workers)


def test_the_share_cases_sit_at_each_rules_edge():
    args = [a for a, _ in CASES]
    assert (7, 2, False) in args and (1, 2, False) in args and (2, 2, False) in args
    assert any(forked and budget // workers > 1 for budget, workers, forked in args)
    assert all(share(*a) == want for a, want in CASES)


def test_the_right_share_passes():
    assert "all 7 cases" in str(check("02.share", share))


@pytest.mark.parametrize("wrong, words", [
    (lambda b, w, f: 1 if f else max(1, b / w), "not an int"),                # true division
    (lambda b, w, f: 1 if f else b // w, "at least one thread"),              # no floor
    (lambda b, w, f: max(1, b // w), "forked worker must keep 1 thread"),     # fork ignored
    (lambda b, w, f: 1 if f else max(1, -(-b // w)), "rounded down"),         # rounds up
    (lambda b, w, f: 1 if f else max(1, b // w) + (b == 8), "8 CPUs shared by 2 workers is 4"),
    (lambda b, w, f: None, "not an int"),                                     # no return
    (lambda b, w, f: True, "not an int"),                                     # a bool
])
def test_wrong_shares_fail_naming_the_rule(wrong, words):
    assert words in str(failure("02.share", wrong))


def test_the_share_needs_three_arguments_and_a_stub_is_not_done_yet():
    assert "takes three arguments" in str(failure("02.share", lambda budget, workers: 1))

    def stub(cpu_budget, num_workers, forked):
        raise NotImplementedError("Exercise: replace this line")
    assert "not done yet" in str(failure("02.share", stub))


# ---- 04.copy ----------------------------------------------------------------------------------

class Unmoved(RightPrefetcher):
    def copy(self, batch, stream):
        return batch                             # right on the CPU, wrong anywhere else


class ToFloat(RightPrefetcher):
    def copy(self, batch, stream):
        images, labels = super().copy(batch, stream)
        return images.float(), labels


class ImagesOnly(RightPrefetcher):
    def copy(self, batch, stream):
        return super().copy(batch, stream)[0]


class LabelsAsList(RightPrefetcher):
    def copy(self, batch, stream):
        images, labels = super().copy(batch, stream)
        return images, labels.tolist()


class Zeroed(RightPrefetcher):
    def copy(self, batch, stream):
        images, labels = super().copy(batch, stream)
        return torch.zeros_like(images), labels


class NotWritten(RightPrefetcher):
    def copy(self, batch, stream):
        raise NotImplementedError("Exercise: replace this line")


def test_the_right_copy_passes_and_is_checked_on_meta_without_a_gpu():
    result = check("04.copy", RightPrefetcher)
    assert "dtypes and values kept" in str(result)
    assert ("'meta'" in str(result)) == (not torch.cuda.is_available())


@pytest.mark.parametrize("wrong, words", [
    (Unmoved, "stayed on cpu"), (ToFloat, "changed dtype on the way"), (ImagesOnly, "single tensor"),
    (LabelsAsList, "pair of tensors"), (Zeroed, "wrong values"), (NotWritten, "not done yet"),
])
def test_wrong_copies_fail(wrong, words):
    if wrong is Unmoved and torch.cuda.is_available():
        words = "stayed on"
    message = str(failure("04.copy", wrong))
    assert message.startswith("04.copy") and words in message, message


def test_an_instance_instead_of_the_class_is_refused_for_the_step():
    message = str(failure("04.copy", RightPrefetcher([], "cpu")))
    assert message.startswith("04.copy: the answer looks like a prefetcher object")


# ---- 06.batched_fetch -------------------------------------------------------------------------

class FirstN(RightBatches):
    def __getitems__(self, indices):
        return super().__getitems__(list(range(len(indices))))     # ignores which indices


class Bgr(RightBatches):
    def __getitems__(self, indices):
        images, labels = super().__getitems__(indices)
        return images.flip(1), labels


class Float(RightBatches):
    def __getitems__(self, indices):
        images, labels = super().__getitems__(indices)
        return images.float(), labels


class PerSampleOnly(RightBatches):
    __getitems__ = None

    def __getitem__(self, i):
        return RightBatches.__getitems__(self, [i])


def test_the_right_batched_fetch_passes():
    assert "in that order" in str(check("06.batched_fetch", RightBatches))


@pytest.mark.parametrize("wrong, words", [
    (FirstN, "image values differ"), (Bgr, "BGR order"), (Float, "not torch.uint8"),
    (PerSampleOnly, "no __getitems__ method"),
])
def test_wrong_batched_fetches_fail(wrong, words):
    message = str(failure("06.batched_fetch", wrong))
    assert message.startswith("06.batched_fetch") and words in message, message


def test_the_course_dataset_is_refused_for_the_step():
    message = str(failure("06.batched_fetch", BatchedJpegDataset))
    assert message.startswith("06.batched_fetch: the answer is the course's own `BatchedJpegDataset`")
