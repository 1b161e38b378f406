"""Grader 00's verdict on a rate: both tolerances and every unit window pinned with made-up
figures just inside and just outside them, and plausible too-fast and wrong-unit answers run
through the real grader. (The reference answer and the too-slow answers: test_grading.py.)"""
from __future__ import annotations

import time

import pytest

import course_utils.grading.ex00_measure_first as G
from course_utils.grading.checker import ExerciseFailed, check

pytestmark = pytest.mark.timeout(120)

HONEST, BATCH, BATCHES, WARMUP = 1000.0, 8, 12, 2
STEADY = [WARMUP + BATCHES]          # one iterator that gave the warm-up and the timed batches
JUST = 1.02                          # "just inside / just outside" a threshold, as a factor


def judge(value, batches_per_iterator=STEADY):
    return G.judge_rate(value, HONEST, batch_size=BATCH, batches=BATCHES, warmup_batches=WARMUP,
                        startup_s=0.6, batches_per_iterator=batches_per_iterator)


# ---- the tolerances, with made-up figures ------------------------------------------------------

@pytest.mark.parametrize("ratio", [G.LOW_TOLERANCE * JUST, 1.0, G.HIGH_TOLERANCE / JUST],
                         ids=["just-above-low", "honest", "just-below-high"])
def test_rates_just_inside_both_tolerances_pass(ratio):
    assert f"honest measurement {HONEST:.1f} samples/s" in judge(ratio * HONEST)


def test_a_rate_just_below_the_lower_tolerance_is_too_slow():
    with pytest.raises(ExerciseFailed, match="too slow") as info:
        judge(G.LOW_TOLERANCE / JUST * HONEST)
    assert "start the clock after the warm-up" in info.value.hint


def test_a_rate_just_above_the_upper_tolerance_is_too_fast():
    with pytest.raises(ExerciseFailed, match="too fast") as info:
        judge(G.HIGH_TOLERANCE * JUST * HONEST)
    assert f"about {HONEST:.4g} samples/s" in info.value.expected
    assert "count only the samples of the batches you timed" in info.value.hint


@pytest.mark.parametrize("ratio", [0.75, 1.33], ids=["25%-slow", "33%-fast"])
def test_a_busy_machines_disagreement_passes(ratio):
    # the answer's and the honest timing ran at different moments of a busy machine
    assert "samples/s" in judge(ratio * HONEST)


@pytest.mark.parametrize("ratio, problem", [(0.5, "too slow"), (2.0, "too fast")],
                         ids=["half", "double"])
def test_half_or_double_the_honest_rate_fails(ratio, problem):
    # e.g. timing two batches per counted one, or counting every sample twice
    with pytest.raises(ExerciseFailed, match=problem):
        judge(ratio * HONEST)


# ---- what the answer did with the loader decides the too-slow hint -------------------------------

@pytest.mark.parametrize("per_iterator, hint", [
    ([WARMUP + BATCHES - 1], "pull `warmup_batches` batches before starting the clock"),
    ([WARMUP + BATCHES], "start the clock after the warm-up batches"),
    ([WARMUP, BATCHES], "you made a new iterator after the warm-up"),
    ([WARMUP + BATCHES, BATCHES], "you made a new iterator after the warm-up"),
], ids=["one-batch-short-of-a-warm-up", "warmed-up", "two-iterators", "a-second-whole-iterator"])
def test_too_slow_hint_follows_what_the_answer_pulled(per_iterator, hint):
    with pytest.raises(ExerciseFailed, match="too slow") as info:
        judge(0.3 * HONEST, per_iterator)
    assert hint in info.value.hint


# ---- unit slips: each unit's value, and its window's edges ---------------------------------------

UNITS = {"batches per second": HONEST / BATCH, "seconds per sample": 1 / HONEST,
         "seconds per batch": BATCH / HONEST, "milliseconds per sample": 1000 / HONEST}


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("factor", [1.0, G.LOW_TOLERANCE * JUST, G.HIGH_TOLERANCE / JUST],
                         ids=["exact", "just-inside-low", "just-inside-high"])
def test_a_value_in_another_unit_is_named(unit, factor):
    with pytest.raises(ExerciseFailed, match=f"wrong unit: this looks like {unit}") as info:
        judge(factor * UNITS[unit])
    assert "samples per second" in info.value.expected and info.value.hint


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("factor", [G.LOW_TOLERANCE / JUST, G.HIGH_TOLERANCE * JUST],
                         ids=["just-outside-low", "just-outside-high"])
def test_a_value_just_outside_a_units_window_is_not_called_that_unit(unit, factor):
    with pytest.raises(ExerciseFailed) as info:
        judge(factor * UNITS[unit])
    assert unit not in info.value.problem, str(info.value)


# ---- plausible wrong answers, through the real grader --------------------------------------------

def restarts_the_clock_every_batch(loader, batches, warmup_batches=2):
    """The clock line indented into the loop: only the last batch is timed."""
    iterator = iter(loader)
    for _ in range(warmup_batches):
        next(iterator)
    samples = 0
    for _ in range(batches):
        start = time.perf_counter()
        images, _ = next(iterator)
        samples += len(images)
    return samples / (time.perf_counter() - start)


def times_batches_already_pulled(loader, batches, warmup_batches=2):
    """Pulls every batch first, then times a loop over the list: times no loading at all."""
    iterator = iter(loader)
    pulled = [next(iterator) for _ in range(warmup_batches + batches)][warmup_batches:]
    samples = 0
    start = time.perf_counter()
    for images, _ in pulled:
        samples += len(images)
    return samples / (time.perf_counter() - start)


def counts_values_not_samples(loader, batches, warmup_batches=2):
    """Counts every number of the batch (N x C x H x W) as a sample."""
    iterator = iter(loader)
    for _ in range(warmup_batches):
        next(iterator)
    values = 0
    start = time.perf_counter()
    for _ in range(batches):
        images, _ = next(iterator)
        values += images.numel()
    return values / (time.perf_counter() - start)


def seconds_per_batch(loader, batches, warmup_batches=2):
    """The time of one batch: the inverse of a rate, and per batch, not per sample."""
    iterator = iter(loader)
    for _ in range(warmup_batches):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return (time.perf_counter() - start) / batches


@pytest.mark.parametrize("answer", [restarts_the_clock_every_batch, times_batches_already_pulled,
                                    counts_values_not_samples])
def test_too_fast_answers_fail_as_too_fast(answer):
    with pytest.raises(ExerciseFailed, match="too fast: the timing missed work"):
        check(G.EXERCISE, answer)


def test_seconds_per_batch_fails_with_the_unit_message():
    with pytest.raises(ExerciseFailed) as info:
        check(G.EXERCISE, seconds_per_batch)
    err = info.value
    assert "wrong unit: this looks like seconds per batch" in err.problem, str(err)
    assert "samples per second" in err.expected and "samples on top" in err.hint


# ---- exactly at a tolerance: both ends belong to "near" (mutation: <= vs <) --------------------

@pytest.mark.parametrize("factor", [G.LOW_TOLERANCE, G.HIGH_TOLERANCE], ids=["low", "high"])
def test_a_rate_exactly_at_a_tolerance_is_near(factor):
    target = 10.0
    assert factor * target / target == factor        # the ratio is the tolerance itself
    assert G.near(factor * target, target)


def test_nothing_is_near_a_target_of_zero():
    assert not G.near(0.0, 0.0) and not G.near(1.0, 0.0)   # and no ZeroDivisionError


@pytest.mark.parametrize("value, per_iterator", [
    (0.3 * HONEST, STEADY), (0.3 * HONEST, [WARMUP, BATCHES]), (0.3 * HONEST, [BATCHES]),
    (3.0 * HONEST, STEADY), (UNITS["seconds per batch"], STEADY)],
    ids=["too-slow", "new-iterator", "no-warm-up", "too-fast", "unit"])
def test_every_failure_names_its_exercise_and_says_what_was_expected_seen_and_why(value, per_iterator):
    with pytest.raises(ExerciseFailed) as info:
        judge(value, per_iterator)
    err = info.value
    assert err.exercise == G.EXERCISE and err.expected and err.hint
    assert err.seen.startswith(f"{value:.4g} (an honest measurement")


def test_a_pass_says_the_ratio_to_the_honest_rate():
    assert judge(1.25 * HONEST).endswith("(ratio 1.25).")
