"""Exercise 08's judging code (course_utils.grading.ex08_find_the_stall): the reference fraction on
hand-made traces, _judge's tolerance and mistake matching on made-up values (both sides of each),
the held-back cases' answers and mistakes worked by hand, and the real loops' warm-up rule with
the profiled loops replaced by synthetic ones (nothing is profiled here)."""
from __future__ import annotations

import pytest
import torch

from course_utils.grading import ex08_find_the_stall as ex08
from course_utils.grading.checker import ExerciseFailed, check
from course_utils.grading.ex08_find_the_stall import (MISTAKES, REAL_TOLERANCE, STALL, TOLERANCE,
                                                      WAIT, _judge, _reference_fraction,
                                                      synthetic_cases, synthetic_trace)


def span(name, ts, dur, cat="user_annotation"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


# ---- the reference fraction -------------------------------------------------------------------

def test_reference_counts_waits_inside_the_counted_steps_over_their_time():
    # steps listed out of time order: #3 at 100 (the warm-up, first in time), #1 at 200, #2 at 300
    events = [span("ProfilerStep#1", 200, 100), span("ProfilerStep#3", 100, 100),
              span("ProfilerStep#2", 300, 60),
              span("fetch", 100, 90),                    # in the warm-up step: not counted
              span("fetch", 200, 30), span("h2d copy", 230, 10),
              span("step", 240, 50),                     # not a wait
              span("fetch", 300, 12),
              {"ph": "M", "name": "process_name"}, {"ph": "i", "name": "fetch", "ts": 310}]
    # wait 30 + 10 + 12 = 52 over 100 + 60 = 160
    assert _reference_fraction(events, 1) == pytest.approx(52 / 160)
    # no warm-up: (90 + 52) / 260
    assert _reference_fraction(events, 0) == pytest.approx(142 / 260)


def test_a_wait_belongs_to_a_step_from_its_start_up_to_but_not_at_its_end():
    events = [span("ProfilerStep#1", 0, 100), span("ProfilerStep#2", 100, 50),
              span("fetch", 100, 20),                    # starts as step 2 starts: step 2's
              span("h2d copy", 150, 5)]                  # starts as step 2 ends: no step's
    assert _reference_fraction(events, 1) == pytest.approx(20 / 50)
    assert _reference_fraction(events, 0) == pytest.approx(20 / 150)


def test_the_gpu_copies_of_annotations_are_not_counted():
    events = [span("ProfilerStep#1", 0, 100), span("fetch", 10, 40),
              span("ProfilerStep#1", 0, 100, cat="gpu_user_annotation"),
              span("fetch", 10, 40, cat="gpu_user_annotation")]
    assert _reference_fraction(events, 0) == pytest.approx(40 / 100)


def test_no_step_left_after_the_warm_up_is_an_error():
    events = [span("ProfilerStep#1", 0, 100), span("fetch", 10, 40)]
    with pytest.raises(ValueError, match="warmup_steps=1 leaves no step"):
        _reference_fraction(events, 1)


def test_synthetic_trace_holds_the_asked_durations_in_microseconds():
    events = synthetic_trace([(4, 1, 5, 2), (3, 2, 1, 0)], first=7)
    by_name = {}
    for e in events:
        if e.get("ph") == "X":
            by_name.setdefault(e["name"], []).append(e)
    assert [(e["ts"] - events[2]["ts"], e["dur"]) for e in by_name["ProfilerStep#7"]] == [(0, 12e3)]
    assert [e["dur"] for e in by_name["ProfilerStep#8"]] == [6e3]
    assert [e["dur"] for e in by_name["fetch"]] == [4e3, 3e3]
    assert [e["dur"] for e in by_name["h2d copy"]] == [1e3, 2e3]
    assert [e["dur"] for e in by_name[ex08.NEXT_NAME]] == [4e3 - 2.0, 3e3 - 2.0]
    assert by_name["h2d copy"][1]["ts"] - by_name["ProfilerStep#8"][0]["ts"] == 3e3
    assert _reference_fraction(events, 0) == pytest.approx((5 + 5) / 18)


# ---- the held-back cases, worked by hand ------------------------------------------------------

def test_the_held_back_answers_and_mistakes():
    plain, startup, numbered = synthetic_cases()
    # plain, no warm-up: wait (4+1)+(6+1)+(2+1)+(5+1) = 21 over 4 * 12 = 48
    assert plain["answer"] == pytest.approx(21 / 48) and plain["warmup_steps"] == 0
    assert plain["mistakes"] == pytest.approx({
        "step": (21 + 19) / 48,                                   # + the steps 5+3+7+4
        "no copy": 17 / 48,                                       # fetch only
        "marked": 21 / 40,                                        # over fetch + copy + step
        "next twice": (2 * 17 - 4 * 2e-3 + 4) / 48,               # __next__ is fetch - 2 µs
        "percent": 100 * 21 / 48})
    # start-up: after it, 6 steps of 0.3+0.1k fetch, 0.2 copy: wait 3.3 + 1.2 over 60 + 1.5
    assert startup["answer"] == pytest.approx(4.5 / 61.5)
    # with the start-up: (250.5 + 4.5) / (259.5 + 61.5)
    assert startup["mistakes"]["warm-up"] == pytest.approx(255 / 321)
    # numbered #8..#15, 2 warm-up steps: fetch 8+9+10+11+0.5+0.5 = 39, copy 6, time 58 + 11
    assert numbered["answer"] == pytest.approx(45 / 69)
    # as text #10..#15 come first, so #12..#15, #8 (the start-up) and #9 are counted:
    # fetch 10+11+0.5+0.5+150+0.2 = 172.2, copy 6: 178.2 over 15+16+5.5+5.5+155+5.2 = 202.2
    assert numbered["mistakes"]["by name"] == pytest.approx(178.2 / 202.2)
    for case in (plain, startup, numbered):
        assert all(abs(v - case["answer"]) > 10 * TOLERANCE for v in case["mistakes"].values())
    assert "warm-up" not in plain["mistakes"] and "by name" not in plain["mistakes"]


# ---- _judge on made-up values -----------------------------------------------------------------

def judged(value, answer=0.4, mistakes=None, tol=1e-3):
    with pytest.raises(ExerciseFailed) as info:
        _judge(value, answer, mistakes or {}, "on a trace", tol)
    err = info.value
    assert err.exercise == WAIT and err.expected and err.seen and err.hint
    assert err.problem.startswith("on a trace: ") and len(err.problem) > len("on a trace: ")
    return err


def test_the_answer_passes_within_the_tolerance_on_both_sides():
    assert _judge(0.4009, 0.4, {}, "w", 1e-3) == pytest.approx(0.4009)    # the value, not 0.4
    assert _judge(0.3991, 0.4, {}, "w", 1e-3) == pytest.approx(0.3991)
    assert "the fraction is off" in judged(0.4011).problem
    assert "the fraction is off" in judged(0.3989).problem
    assert _judge(torch.tensor(0.4), 0.4, {}, "w", 1e-3) == pytest.approx(0.4)
    assert isinstance(_judge(torch.tensor(0.4), 0.4, {}, "w", 1e-3), float)


def test_a_value_near_a_mistake_names_it_on_both_sides_of_its_tolerance():
    mistakes = {"no copy": 0.2, "step": 0.7}
    for value in (0.7009, 0.6991):
        err = judged(value, mistakes=mistakes)
        assert err.problem == f"on a trace: {MISTAKES['step'][0]}" and err.hint == MISTAKES["step"][1]
        assert err.expected == "0.4000" and err.seen == f"{value:.4f} (what that mistake gives)"
    assert "left out the copy" in judged(0.2, mistakes=mistakes).problem
    # exactly the tolerance away (0.25, binary-exact) still counts, for the answer and a mistake
    assert _judge(0.75, 0.5, {}, "w", 0.25) == 0.75
    assert "counted the training step" in judged(0.5, answer=0.0, mistakes={"step": 0.25}, tol=0.25).problem
    err = judged(0.7011, mistakes=mistakes)
    assert "the fraction is off" in err.problem and err.seen == "0.7011"


def test_what_is_not_a_mistake_s_value_is_told_by_its_sign_and_size():
    assert MISTAKES["percent"][0] in judged(1.01).problem and judged(1.5).hint == MISTAKES["percent"][1]
    assert judged(1.01).expected == "0.4000" and judged(1.01).seen == "1.0100"
    assert "the fraction is off" in judged(1.0).problem               # 1 is a fraction
    assert "negative" in judged(-0.01).problem
    assert "the fraction is off" in judged(0.0).problem


@pytest.mark.parametrize("value", [True, "0.4", None, float("nan"), float("inf"),
                                   torch.tensor([0.4, 0.4])], ids=repr)
def test_anything_but_one_finite_number_fails(value):
    err = judged(value)
    assert "must return one number" in err.problem and err.problem.startswith("on a trace: ")
    assert err.expected == "a finite float between 0 and 1, such as 0.42" and "return wait / time" in err.hint
    assert type(value).__name__ in err.seen


# ---- the real loops' cases, the loops replaced ------------------------------------------------

def fake_real(monkeypatch, *steps_lists):
    cases = tuple({"name": f"loop {i}", "warmup_steps": 1, "events": synthetic_trace(steps),
                   "answer": _reference_fraction(synthetic_trace(steps), 1)}
                  for i, steps in enumerate(steps_lists))
    monkeypatch.setattr(ex08, "real_traces", lambda: cases)
    return cases


def test_a_real_loop_names_the_warm_up_mistake_only_past_three_points(monkeypatch):
    # loop 0: start-up 10 ms then 4 steps of 1 + 9: counted 0.1, with the start-up 14 / 50 = 0.28
    # loop 1: every step 1 + 9 ms and the first 1.3 + 9: counted 0.1, with it 5.3 / 50.3 (0.0054 off)
    # loop 2: the first 2.3 + 9: with it 6.3 / 51.3 = 0.1228 (0.0228 off, under 0.03)
    fake_real(monkeypatch, [(10, 0, 0, 0)] + [(1, 0, 9, 0)] * 4, [(1.3, 0, 9, 0)] + [(1, 0, 9, 0)] * 4,
              [(2.3, 0, 9, 0)] + [(1, 0, 9, 0)] * 4)
    real = ex08._cases(True)[len(synthetic_cases()):]
    assert [r[0] for r in real] == [f"on a loop profiled here (loop {i})" for i in range(3)]
    assert real[0][2] == pytest.approx({"warm-up": 14 / 50}) and real[0][3] == REAL_TOLERANCE
    assert real[1][2] == {} and real[2][2] == {}
    assert len(ex08._cases(False)) == 3


def test_a_real_loop_with_a_warm_up_just_over_three_points_names_the_mistake(monkeypatch):
    # first step 2.9 + 9: with it 6.9 / 51.9 = 0.1329, 0.0329 off the counted 0.1
    fake_real(monkeypatch, [(2.9, 0, 9, 0)] + [(1, 0, 9, 0)] * 4)
    (where, case, mistakes, tol), = ex08._cases(True)[3:]
    assert mistakes == pytest.approx({"warm-up": 6.9 / 51.9})


def test_grading_a_right_fraction_reports_every_case(monkeypatch):
    fake_real(monkeypatch, [(10, 0, 0, 0)] + [(1, 0, 9, 0)] * 4)

    def right(events, warmup_steps=1):
        return _reference_fraction(events, warmup_steps)

    result = check(WAIT, right)
    assert result.details["loop 0"] == pytest.approx(0.1)
    assert result.summary.startswith("every trace's fraction is right (a plain loop (warmup_steps=0)"
                                     ": 0.438; ")
    assert "loop 0: 0.100)" in result.summary

    def warm_up_counted_on_the_real_loop(events, warmup_steps=1):
        steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep")]
        return _reference_fraction(events, 0 if len(steps) == 5 else warmup_steps)  # loop 0's 5

    with pytest.raises(ExerciseFailed) as info:
        check(WAIT, warm_up_counted_on_the_real_loop)
    assert "on a loop profiled here (loop 0): your fraction counts the warm-up" in info.value.problem


# ---- the bottleneck's threshold ---------------------------------------------------------------

def label_from(fraction_fn):
    def bottleneck(events, warmup_steps=1, threshold=0.10):
        return "data" if fraction_fn(events, warmup_steps) > threshold else "compute"
    return bottleneck


def test_the_bottleneck_follows_the_threshold_on_both_sides():
    result = check(STALL, label_from(_reference_fraction), real=False)
    labels = result.details["labels"]
    assert "a loop that waits 15 % of its time: data" in labels
    assert "the same loop with threshold=0.25: compute" in labels
    # the held-back cases: 0.4375 data, 0.073 compute (after the start-up), 0.652 data
    assert [label.rsplit(": ", 1)[1] for label in labels] == ["data", "compute", "data", "data",
                                                              "compute"]


def test_a_fixed_threshold_fails_on_the_raised_one_and_says_so():
    with pytest.raises(ExerciseFailed) as info:
        check(STALL, lambda events, warmup_steps=1, threshold=0.10:
              "data" if _reference_fraction(events, warmup_steps) > 0.10 else "compute", real=False)
    err = info.value
    assert err.problem == "on the same loop with threshold=0.25: the wrong bottleneck."
    assert err.expected == "'compute'" and err.seen.startswith("'data'; the loop waited 15%")
    assert "(here 0.25)" in err.hint


def test_counting_the_start_up_fails_where_it_flips_the_label():
    with pytest.raises(ExerciseFailed) as info:
        check(STALL, label_from(lambda events, w: _reference_fraction(events, 0)), real=False)
    err = info.value
    assert "start-up: the wrong bottleneck" in err.problem and "warmup_steps=1" in err.hint
    assert "only 7%" in err.hint


def test_a_label_in_other_words_fails_with_the_short_words():
    with pytest.raises(ExerciseFailed) as info:
        check(STALL, lambda events, warmup_steps=1, threshold=0.10: "Data", real=False)
    assert "must be 'data' or 'compute'" in info.value.problem and "lower case" in info.value.hint
    with pytest.raises(ExerciseFailed) as info:
        check(STALL, lambda events, warmup_steps=1, threshold=0.10: 1, real=False)
    assert "return the string 'data' or 'compute'" in info.value.hint
    assert info.value.expected == "'data'"


def test_the_loops_the_bottleneck_is_asked_about_wait_what_the_grader_says():
    asked = []

    def recording(events, warmup_steps=1, threshold=0.10):
        fraction = _reference_fraction(events, warmup_steps)
        asked.append((round(fraction, 6), warmup_steps, threshold))
        return "data" if fraction > threshold else "compute"

    check(STALL, recording, real=False)
    # the three held-back cases, then the loop of 5 steps waiting 1.5 of every 10 ms, twice
    assert asked == [(round(21 / 48, 6), 0, 0.10), (round(4.5 / 61.5, 6), 1, 0.10),
                     (round(45 / 69, 6), 2, 0.10), (0.15, 0, 0.10), (0.15, 0, 0.25)]


def test_the_synthetic_trace_s_other_events_sit_where_a_real_trace_has_them():
    # a second step with no fetch, no copy and a 1 µs step: no span gets a negative duration
    events = synthetic_trace([(4, 1, 5, 2), (0, 0, 0.001, 1)], first=3)
    t = events[2]["ts"]
    spans = {}
    for e in events:
        if e.get("ph") == "X":
            spans.setdefault(e["name"], []).append((e["ts"] - t, e["dur"], e["cat"]))
    user, cpu = "user_annotation", "cpu_op"
    assert spans["ProfilerStep#3"] == [(0, 12e3, user)] and spans["fetch"][0] == (0, 4e3, user)
    assert spans["h2d copy"][0] == (4e3, 1e3, user) and spans["step"][0] == (5e3, 5e3, user)
    assert spans[ex08.NEXT_NAME] == [(1.0, 4e3 - 2.0, user), (12e3 + 1.0, 0.0, user)]
    assert spans["aten::copy_"] == [(4e3 + 0.5, 1e3 - 1.0, cpu), (12e3 + 0.5, 0.0, cpu)]
    assert spans["aten::convolution"] == [(5e3 + 1.0, 5e3 - 2.0, cpu), (12e3 + 1.0, 0.0, cpu)]
    assert spans["PyTorch Profiler (0)"] == [(0, 13e3 + 1.0, "Trace")]
    assert [(e["name"], e["ts"] - t) for e in events if "dur" not in e] == [
        ("process_name", 0), ("thread_name", 0), ("Iteration Start: PyTorch Profiler", 0),
        ("Record Window End", 13e3 + 1.0)]                   # the events with no duration
    shuffled = synthetic_trace([(4, 1, 5, 2)], first=3, shuffle_seed=1)
    assert shuffled == synthetic_trace([(4, 1, 5, 2)], first=3, shuffle_seed=1)   # reproducible
    plain = synthetic_trace([(4, 1, 5, 2)], first=3)
    assert sorted(map(repr, shuffled)) == sorted(map(repr, plain)) and shuffled != plain
    two = synthetic_trace([(4, 1, 5, 2), (3, 1, 6, 2)])
    assert _reference_fraction(two) == pytest.approx(4 / 12)          # the default skips one step


@pytest.mark.parametrize("exc, words", [
    (KeyError("ts"), "not every event has 'ts'"),
    (KeyError("dur"), "not every event has 'dur'"),
    (IndexError("list index out of range"), "the trace has steps to count"),
    (ZeroDivisionError("division by zero"), "the trace has steps to count"),
    (KeyError("name"), "run it on the trace above"),
    (AttributeError("x"), "run it on the trace above"),
], ids=repr)
def test_an_error_in_the_answer_gets_the_hint_for_its_kind(exc, words):
    def raises(events, warmup_steps=1):
        raise exc

    with pytest.raises(ExerciseFailed) as info:
        check(WAIT, raises, real=False)
    assert words in info.value.hint and info.value.exercise == WAIT


def test_each_call_gets_its_own_copy_of_the_events():
    # the 15 % loop is asked about twice: an answer that empties its list must not spoil the next
    seen = []

    def spoils(events, warmup_steps=1, threshold=0.10):
        seen.append(len(events))
        label = "data" if _reference_fraction(events, warmup_steps) > threshold else "compute"
        for e in events:                                  # spoils the dicts, not only the list
            e["name"] = "spoilt"
        return label

    check(STALL, spoils, real=False)
    assert len(seen) == 5 and seen[3] == seen[4] > 20


# ---- the dataset of the loop profiled for real ----------------------------------------------------

def test_sleepy_batches_are_ready_made_numpy_batches():
    ds = ex08.SleepyBatches(3, 0.0)
    images, labels = ds[2]
    assert len(ds) == 3 and ds.delay_s == 0.0 and isinstance(ds.n, int)
    assert images.shape == (4, 3, 8, 8) and images.dtype == "float32" and float(images.min()) == 2.0
    assert float(images.max()) == 2.0 and labels.tolist() == [0, 1, 2, 3]
    assert ex08.as_is(ds[0]) is not None and ex08.as_is(labels) is labels



def test_the_held_back_traces_number_their_steps_as_the_cases_say():
    plain, startup, numbered = synthetic_cases()
    steps = [sorted(int(e["name"][13:]) for e in c["events"]
                    if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))
             for c in (plain, startup, numbered)]
    assert steps == [[2, 3, 4, 5], list(range(1, 8)), list(range(8, 16))]
