"""Graders pass the reference answer and fail plausible wrong answers with a teaching message."""
from __future__ import annotations

import time

import pytest

from course_utils.grading import CheckResult, ExerciseFailed, check, exercise_ids


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
