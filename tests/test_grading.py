"""Graders pass the reference answer and fail plausible wrong answers with a teaching message."""
from __future__ import annotations

import functools
import time
import types

import cv2
import pytest
import threadpoolctl

import course_utils.threads as course_threads
from course_utils import make_worker_init, measure_loader, thread_pools
from course_utils.grading.checker import (CheckResult, ExerciseFailed, check, exercise_ids,
                                          refuse_course_helper)
from course_utils.grading.grade import grade_notebooks
from course_utils.measurement import Measurement
from course_utils.threads import WorkerThreadLimiter, limit_threads


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


# ---- answers that are the course's own helper ------------------------------------------------

INIT = make_worker_init(1)
LIMITERS = (make_worker_init, WorkerThreadLimiter, limit_threads)


def uses_a_global(worker_id):
    INIT(worker_id)


def uses_a_module_attribute(worker_id):
    course_threads.make_worker_init(1)(worker_id)


def imports_it_inside(worker_id):
    from course_utils import make_worker_init as limiter

    limiter(1)(worker_id)


def in_a_lambda(worker_id):
    return (lambda: course_threads.make_worker_init(1))()(worker_id)


def calls_another_function(worker_id):
    uses_a_global(worker_id)


def in_a_closure():
    init = make_worker_init(1)

    def limit(worker_id):
        init(worker_id)

    return limit


def as_a_default(worker_id, init=INIT):
    init(worker_id)


class CallsItInCall:
    def __call__(self, worker_id):
        make_worker_init(1)(worker_id)


class DerivesFromIt(WorkerThreadLimiter):
    pass


def own_code(worker_id):
    threadpoolctl.threadpool_limits(limits=1)
    cv2.setNumThreads(0)
    thread_pools()  # a course helper the exercise does not forbid


def same_name_but_local(worker_id):
    make_worker_init = threadpoolctl.threadpool_limits   # a local variable, not the helper
    make_worker_init(1)


@pytest.mark.parametrize("answer, name, seen", [
    (make_worker_init, "make_worker_init", "is `make_worker_init` itself"),
    (INIT, "WorkerThreadLimiter", "instance of it (what make_worker_init(...) returns)"),
    (DerivesFromIt, "WorkerThreadLimiter", "`DerivesFromIt` derives from it"),
    (DerivesFromIt(1), "WorkerThreadLimiter", "instance of it"),
    (uses_a_global, "WorkerThreadLimiter", "`uses_a_global` holds an instance of it"),
    (uses_a_module_attribute, "make_worker_init", "`uses_a_module_attribute` uses it"),
    (imports_it_inside, "make_worker_init", "`imports_it_inside` uses it"),
    (in_a_lambda, "make_worker_init", "`in_a_lambda` uses it"),
    (calls_another_function, "WorkerThreadLimiter", "`calls_another_function` -> `uses_a_global`"),
    (in_a_closure(), "WorkerThreadLimiter", "in_a_closure.<locals>.limit` holds an instance"),
    (as_a_default, "WorkerThreadLimiter", "`as_a_default` holds an instance"),
    (functools.partial(uses_a_global), "WorkerThreadLimiter", "`uses_a_global` holds"),
    (functools.partial(make_worker_init(1)), "WorkerThreadLimiter", "instance of it"),
    (CallsItInCall(), "make_worker_init", "`CallsItInCall.__call__` uses it"),
    (CallsItInCall().__call__, "make_worker_init", "`CallsItInCall.__call__` uses it"),
    (course_threads.thread_pools, "thread_pools", "itself"),  # any course object as the answer
])
def test_refuse_course_helper_finds_the_helper_and_teaches(answer, name, seen):
    with pytest.raises(ExerciseFailed) as info:
        refuse_course_helper("02.worker_init", answer, LIMITERS, write="limit the pools")
    err = info.value
    assert f"course's own `{name}` (course_utils." in err.problem, str(err)
    assert seen in err.seen, str(err)
    assert "write the mechanism yourself: limit the pools" in err.hint


@pytest.mark.parametrize("answer", [own_code, same_name_but_local, reference_time_loader,
                                    functools.partial(own_code)])
def test_refuse_course_helper_lets_own_code_through(answer):
    assert refuse_course_helper("02.worker_init", answer, LIMITERS, write="x") is None


# ---- exercise 00 refuses the course's timer -------------------------------------------------

def wraps_measure_loader(loader, batches, warmup_batches=2):
    return measure_loader(loader, batches=batches, warmup_batches=warmup_batches, repeats=1,
                          progress=False).samples_per_s


class MeasuresWithTheCourse:
    """A callable object whose method uses the course's Measurement."""

    def __call__(self, loader, batches, warmup_batches=2):
        return Measurement.merge([measure_loader(loader, batches=batches, progress=False)]).samples_per_s


@pytest.mark.parametrize("answer, name", [
    (measure_loader, "measure_loader"),
    (wraps_measure_loader, "measure_loader"),
    (functools.partial(measure_loader, repeats=1), "measure_loader"),
    (MeasuresWithTheCourse(), "Measurement"),
])
def test_time_loader_course_timer_is_refused(answer, name):
    with pytest.raises(ExerciseFailed, match=rf"(?s)course's own `{name}`.*write the mechanism "
                                             rf"yourself: pull the batches"):
        check("00.time_loader", answer)


def test_refuse_course_helper_finds_a_helper_instance_stored_on_the_answer():
    class Limiter:
        def __call__(self, worker_id):
            return None

    limiter = Limiter()
    limiter.spare = make_worker_init(1)
    with pytest.raises(ExerciseFailed) as info:
        refuse_course_helper("02.worker_init", limiter, LIMITERS, write="x")
    assert "Limiter` holds an instance of it" in info.value.seen


def test_refuse_course_helper_names_the_object_behind_a_course_method():
    with pytest.raises(ExerciseFailed) as info:
        refuse_course_helper("02.worker_init", make_worker_init(1).__call__, (), write="x")
    assert "`WorkerThreadLimiter.__call__` (course_utils." in info.value.problem


def test_time_loader_hints_do_not_print_the_solution_lines():
    with pytest.raises(ExerciseFailed) as info:
        check("00.time_loader", batches_per_second)
    assert "len(batch" not in info.value.hint and "samples / elapsed" not in str(info.value)


def test_refuse_course_helper_knows_a_copy_of_a_helper_left_in_another_course_module():
    copy = types.FunctionType(make_worker_init.__code__, make_worker_init.__globals__,
                              "make_worker_init", make_worker_init.__defaults__)
    copy.__module__, copy.__qualname__ = "course_utils.elsewhere", "make_worker_init"

    def wraps_the_copy(worker_id):
        copy(1)(worker_id)

    with pytest.raises(ExerciseFailed, match="course's own `make_worker_init`"):
        refuse_course_helper("02.worker_init", wraps_the_copy, LIMITERS, write="x")


# Grading a whole notebook (a solved one passes, its exercise version does not) is tested in
# tests/test_notebooks.py, in the one grade run that also grades every shipped exercise.


def test_grade_notebooks_needs_at_least_one_path():
    with pytest.raises(ValueError, match="paths is empty; pass at least one notebook"):
        grade_notebooks([])


@pytest.mark.parametrize("field", ["exercise", "problem", "expected", "seen", "hint"])
def test_every_part_of_a_failure_message_must_be_text(field):
    parts = {"exercise": "00.timing", "problem": "too slow.", "expected": "e", "seen": "s",
             "hint": "h"}
    ExerciseFailed(**parts)                                        # all text: fine
    with pytest.raises(TypeError, match=f"ExerciseFailed: {field} must be a str"):
        ExerciseFailed(**{**parts, field: None})
    if field in ("exercise", "problem"):
        with pytest.raises(TypeError, match=f"{field} must be a str"):
            ExerciseFailed(**{**parts, field: ""})
    else:
        assert f"{field}:" not in str(ExerciseFailed(**{**parts, field: ""}))  # an empty part is left out
