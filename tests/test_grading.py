"""Graders pass the reference answer and fail plausible wrong answers with a teaching message."""
from __future__ import annotations

import functools
import time

import cv2
import pytest
import threadpoolctl

from course_utils import make_worker_init, measure_loader, thread_pools
from course_utils.grading.checker import (CheckResult, ExerciseFailed, check, exercise_ids,
                                          refuse_course_code)
from course_utils.threads import WorkerThreadLimiter


# ---- exercise 00: time_loader --------------------------------------------------------------

def reference_time_loader(loader, batches, warmup_batches=2):
    iterator = iter(loader)
    for _ in range(warmup_batches):
        next(iterator)
    samples = 0
    start = time.perf_counter()
    for _ in range(batches):
        images, _ = next(iterator)
        samples += len(images)
    return samples / (time.perf_counter() - start)


def no_warmup(loader, batches, warmup_batches=2):
    start = time.perf_counter()
    samples = 0
    for i, (images, _) in enumerate(loader):
        if i == batches:
            break
        samples += len(images)
    return samples / (time.perf_counter() - start)


def batches_per_second(loader, batches, warmup_batches=2):
    iterator = iter(loader)
    for _ in range(warmup_batches):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches / (time.perf_counter() - start)


def seconds_per_sample(loader, batches, warmup_batches=2):
    return 1.0 / reference_time_loader(loader, batches, warmup_batches)


def times_iterator_creation(loader, batches, warmup_batches=2):
    start = time.perf_counter()
    iter(loader)
    return batches * loader.batch_size / (time.perf_counter() - start)


def fresh_iterator_after_warmup(loader, batches, warmup_batches=2):
    iterator = iter(loader)
    for _ in range(warmup_batches):
        next(iterator)
    return reference_time_loader(loader, batches, warmup_batches=0)


def not_done(loader, batches, warmup_batches=2):
    raise NotImplementedError("Exercise: replace this line with your code")


pytestmark = pytest.mark.timeout(120)


def test_known_ids():
    assert "00.time_loader" in exercise_ids()


def test_unknown_id_is_a_clear_error():
    with pytest.raises(ValueError, match=r"no such exercise; known ids: .*00.time_loader"):
        check("00.nope", reference_time_loader)


def test_time_loader_reference_passes():
    result = check("00.time_loader", reference_time_loader)
    assert isinstance(result, CheckResult)
    assert "PASSED 00.time_loader" in str(result)


@pytest.mark.parametrize("answer, message", [
    (no_warmup, "too slow.*pull `warmup_batches` batches before starting the clock"),
    (fresh_iterator_after_warmup, "too slow.*new iterator"),
    (batches_per_second, "batches per second"),
    (seconds_per_sample, "seconds per sample"),
    (times_iterator_creation, "timed the wrong thing"),
    (not_done, "not done yet"),
    (42, "not a function"),
    (lambda loader, batches, warmup_batches=2: "fast", "one number"),
])
def test_time_loader_wrong_answers_fail_with_their_message(answer, message):
    with pytest.raises(ExerciseFailed, match=f"(?s){message}"):
        check("00.time_loader", answer)


def test_failure_message_has_expected_seen_hint():
    with pytest.raises(ExerciseFailed) as info:
        check("00.time_loader", batches_per_second)
    text = str(info.value)
    assert "expected:" in text and "seen:" in text and "hint:" in text


# ---- answers defined in the course package are refused ---------------------------------------

def own_code(worker_id):
    threadpoolctl.threadpool_limits(limits=1)
    cv2.setNumThreads(0)
    thread_pools()  # what the answer calls is not judged: only where it was defined


@pytest.mark.parametrize("answer, name", [
    (make_worker_init, "make_worker_init"),                           # a course function
    (WorkerThreadLimiter, "WorkerThreadLimiter"),                     # a course class
    (make_worker_init(1), "WorkerThreadLimiter"),                     # an instance of one
    (make_worker_init(1).__call__, "WorkerThreadLimiter.__call__"),   # its bound method
    (functools.partial(measure_loader, repeats=1), "measure_loader"),  # behind a partial
])
def test_an_answer_defined_in_the_course_package_is_refused(answer, name):
    with pytest.raises(ExerciseFailed) as info:
        refuse_course_code("02.worker_init", answer)
    err = info.value
    assert f"course's own `{name}` (course_utils." in err.problem, str(err)
    assert err.expected and err.seen and "write this mechanism yourself" in err.hint


@pytest.mark.parametrize("answer", [own_code, functools.partial(own_code), reference_time_loader,
                                    threadpoolctl.threadpool_limits, len, 42])
def test_an_answer_defined_elsewhere_is_not_refused(answer):
    assert refuse_course_code("02.worker_init", answer) is None


def test_check_refuses_the_course_helper_before_grading():
    with pytest.raises(ExerciseFailed, match=r"course's own `measure_loader` \(course_utils\.timing\)"):
        check("00.time_loader", measure_loader)


def test_time_loader_hints_do_not_print_the_solution_lines():
    with pytest.raises(ExerciseFailed) as info:
        check("00.time_loader", batches_per_second)
    assert "len(batch" not in info.value.hint and "samples / elapsed" not in str(info.value)


# Grading a whole notebook (a solved one passes, its exercise version does not) is tested in
# tests/test_notebooks.py, in the one grade run that also grades every shipped exercise.
