"""Grader of exercise 06 passes the reference answer and fails plausible wrong ones, teaching why."""
from __future__ import annotations

import functools
import time

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from course_utils import ExerciseFailed, check, keep_batch, make_worker_init, tune_loader
from course_utils.graders.ex06_tune import COURSE_LOADERS, FAST as EXERCISE
from course_utils.grading import CheckResult, exercise_ids, refuse_course_helper
from course_utils.pipelines import common_recipe_loader, tuned_loader
from course_utils.pipelines import BatchedJpegDataset

pytestmark = pytest.mark.timeout(240)
FAST = {"n_images": 96, "batches": 4, "rounds": 3, "cpu_budget": 1}


def reference(dataset, *, batch_size, size, cpu_budget):
    return DataLoader(BatchedJpegDataset(dataset, size), batch_size=batch_size, shuffle=True,
                      collate_fn=keep_batch, num_workers=cpu_budget,
                      persistent_workers=cpu_budget > 0,
                      worker_init_fn=make_worker_init(1) if cpu_budget else None)


def the_common_recipe(dataset, *, batch_size, size, cpu_budget):
    return common_recipe_loader(dataset, batch_size=batch_size, size=size)


def over_budget(dataset, *, batch_size, size, cpu_budget):
    return DataLoader(BatchedJpegDataset(dataset, size), batch_size=batch_size, shuffle=True,
                      collate_fn=keep_batch, num_workers=cpu_budget + 2,
                      worker_init_fn=make_worker_init(1))


class BgrBatches(BatchedJpegDataset):
    """Forgets the BGR -> RGB swap."""

    def _decode_into(self, index, out):
        bgr = cv2.imdecode(self.base.encoded(index), cv2.IMREAD_COLOR)
        out[...] = cv2.resize(bgr, (self.size, self.size), interpolation=cv2.INTER_LINEAR)


def wrong_colours(dataset, *, batch_size, size, cpu_budget):
    return DataLoader(BgrBatches(dataset, size), batch_size=batch_size, collate_fn=keep_batch)


def list_of_batches(dataset, *, batch_size, size, cpu_budget):
    return list(reference(dataset, batch_size=batch_size, size=size, cpu_budget=0))


def wrong_batch_size(dataset, *, batch_size, size, cpu_budget):
    return reference(dataset, batch_size=2 * batch_size, size=size, cpu_budget=cpu_budget)


class SlowBatches(BatchedJpegDataset):
    """Right values, but waits 20 ms per sample (a slow storage or a needless sleep)."""

    def __getitems__(self, indices):
        time.sleep(0.02 * len(indices))
        return super().__getitems__(indices)


def too_slow(dataset, *, batch_size, size, cpu_budget):
    return DataLoader(SlowBatches(dataset, size), batch_size=batch_size, collate_fn=keep_batch)


def not_done(dataset, *, batch_size, size, cpu_budget):
    raise NotImplementedError("Exercise: replace this line with your code")


def test_known_id():
    assert "06.fast_pipeline" in exercise_ids()


def test_reference_passes():
    result = check("06.fast_pipeline", reference, n_images=160, batches=8, cpu_budget=1)
    assert isinstance(result, CheckResult)
    assert "right samples" in result.summary and result.details["cpu_budget"] == 1


@pytest.mark.parametrize("answer, words", [
    (the_common_recipe, ["torch.float32", "uint8"]),
    (over_budget, ["over the CPU budget", "num_workers <= 1"]),
    (wrong_colours, ["values differ", "BGR"]),
    (list_of_batches, ["did not return a DataLoader"]),
    (wrong_batch_size, ["batch_size"]),
    (too_slow, ["the reference's samples/s", "at least 0.60x"]),
    ("not a function", ["not a function"]),
])
def test_wrong_answers_fail_with_a_teaching_message(answer, words):
    with pytest.raises(ExerciseFailed) as info:
        check("06.fast_pipeline", answer, **FAST)
    message = str(info.value)
    for word in words:
        assert word in message, message
    assert "06.fast_pipeline" in message


def test_not_done_says_so():
    with pytest.raises(ExerciseFailed, match="not done yet"):
        check("06.fast_pipeline", not_done, **FAST)


# ---- the reference loader itself is refused ----------------------------------------------------

def wraps_the_reference(dataset, *, batch_size, size, cpu_budget):
    return tuned_loader(dataset, batch_size=batch_size, size=size, num_workers=cpu_budget)


@pytest.mark.parametrize("answer, seen", [
    (tuned_loader, "`tuned_loader` itself"),
    (wraps_the_reference, "`wraps_the_reference` uses it"),
    (functools.partial(tuned_loader, num_workers=1), "uses it"),
    (lambda dataset, **kw: tuned_loader(dataset, batch_size=kw["batch_size"], size=kw["size"]),
     "uses it"),
])
def test_the_reference_loader_is_refused_with_a_teaching_message(answer, seen):
    with pytest.raises(ExerciseFailed) as info:
        check(EXERCISE, answer, **FAST)
    err = info.value
    assert "course's own `tuned_loader` (course_utils." in err.problem, str(err)
    assert seen in err.seen and "write the mechanism yourself" in err.hint, str(err)


def test_the_helpers_the_lesson_gives_are_not_refused():
    def with_the_tuner(dataset, *, batch_size, size, cpu_budget):
        best = tune_loader(dataset, worker_counts=range(cpu_budget + 1), batch_sizes=[batch_size])
        return best

    for answer in (reference, with_the_tuner, the_common_recipe):
        assert refuse_course_helper(EXERCISE, answer, COURSE_LOADERS, write="x") is None
