"""Exercise 08 grader: right answers pass; plausible wrong answers fail with their message."""
from __future__ import annotations

import pytest

from course_utils.grading.checker import CheckResult, ExerciseFailed, check, exercise_ids
from course_utils.grading.ex08_find_the_stall import (NEXT_NAME, STALL, WAIT, _reference_fraction,
                                                      profile_loop, real_traces, synthetic_cases,
                                                      synthetic_trace)

pytestmark = pytest.mark.timeout(300)


# --- right answers (the solution notebook's, and another way to write it) -----------------------

def data_wait_fraction(events, warmup_steps=1):
    """The solution notebook's answer."""
    complete = [e for e in events if e.get("ph") == "X"]
    steps = sorted((e for e in complete if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    counted = steps[warmup_steps:]
    if not counted:
        raise ValueError(f"warmup_steps={warmup_steps} leaves none of the {len(steps)} steps; pass fewer.")
    wait = sum(e["dur"] for e in complete if e["name"] in ("fetch", "h2d copy")
               and any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in counted))
    return wait / sum(s["dur"] for s in counted)


def bottleneck(events, warmup_steps=1, threshold=0.10):
    """The solution notebook's answer."""
    return "data" if data_wait_fraction(events, warmup_steps) > threshold else "compute"


def by_step_number(events, warmup_steps=1):
    """Right too: steps ordered by their number, the window from first start to last end."""
    steps = {int(e["name"].split("#")[1]): e for e in events
             if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")}
    kept = [steps[k] for k in sorted(steps)[warmup_steps:]]
    lo, hi = kept[0]["ts"], kept[-1]["ts"] + kept[-1]["dur"]
    wait = sum(e["dur"] for e in events if e.get("ph") == "X"
               and e.get("name") in ("fetch", "h2d copy") and lo <= e["ts"] < hi)
    return wait / (hi - lo)


@pytest.fixture(scope="module")
def traces():
    # Profiled afresh for this module (then cached): a cache filled earlier in this process (by
    # another module, or by mutmut's parent before it forks a mutant) would hide profile_loop.
    real_traces.cache_clear()
    return real_traces()


def test_registered():
    assert {WAIT, STALL} <= set(exercise_ids())


@pytest.mark.parametrize("answer", [data_wait_fraction, by_step_number], ids=lambda f: f.__name__)
def test_right_fractions_pass(answer, traces):
    result = check(WAIT, answer)
    assert isinstance(result, CheckResult) and "PASSED" in str(result)


def test_right_bottleneck_passes(traces):
    result = check(STALL, bottleneck)
    assert "PASSED" in str(result)
    assert any("sleeps 30 ms per batch" in label and label.endswith(": data")
               for label in result.details["labels"])
    assert any("takes 50 ms" in label and label.endswith(": compute") for label in result.details["labels"])


def test_the_real_loops_have_the_answers_they_were_built_for(traces):
    data, compute = traces
    assert data["answer"] > 0.5, data["answer"]            # the worker sleeps, the step is instant
    assert compute["answer"] < 0.10, compute["answer"]     # the batches are ready, the step sleeps
    steps = [e for e in data["events"] if e.get("name", "").startswith("ProfilerStep#")]
    assert len(steps) == 9                                 # 8 steps + the one with the start-up
    assert any("DataLoader" in e.get("name", "") and e["name"].endswith("__next__")
               for e in data["events"])


@pytest.mark.parametrize("delay_s, step_s", [(0.03, 0.0), (0.0, 0.05)], ids=["data", "compute"])
def test_a_profiled_loop_marks_every_step_s_fetch_copy_and_step(delay_s, step_s):
    # profile_loop itself, not the cached traces the checks share: 3 steps + the start-up's
    events = profile_loop(delay_s, step_s, 3)
    spans = [e for e in events if e.get("ph") == "X"]
    steps = sorted((e for e in spans if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    assert len(steps) == 4
    for name in ("fetch", "h2d copy", "step"):
        marked = [e for e in spans if e["name"] == name]
        assert len(marked) == 4, name
        assert all(any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in steps) for e in marked), name
    # lower bounds only (a sleep never ends early): the worker's 30 ms sleep is waited for in
    # each fetch after the start-up; the step's 50 ms sleep is in each step
    counted = [e for e in spans if e["name"] == ("fetch" if delay_s else "step")][1:]
    assert all(e["dur"] >= 0.8e6 * max(delay_s, step_s) for e in counted), [e["dur"] for e in counted]
    fraction = _reference_fraction(events, 1)
    assert fraction > 0.5 if delay_s else fraction < 0.5, fraction


def test_a_held_back_trace_has_the_kinds_keys_and_names_of_a_real_profile(traces):
    # what a learner's code meets in the held-back traces is what the profiler writes: each
    # event kind (ph) with a real event's keys (args included), the metadata and instant events
    # a real CPU profile names, instants scoped as a real one's; the spans on one thread
    real = traces[0]["events"]
    def kinds(events):
        out = {}
        for e in events:
            out.setdefault(e["ph"], set()).add(frozenset(e))
        return out
    real_kinds, fake = kinds(real), synthetic_cases()[0]["events"]
    for ph, keys in kinds(fake).items():
        assert ph in real_kinds and keys <= real_kinds[ph], (ph, keys, real_kinds.get(ph))
    real_names = {(e["ph"], e["name"]) for e in real if e["ph"] in "Mi"}
    for e in (e for e in fake if e["ph"] in "Mi"):
        assert (e["ph"], e["name"]) in real_names, e
        twin = next(r for r in real if (r["ph"], r["name"]) == (e["ph"], e["name"]))
        assert set(e.get("args", {})) == set(twin.get("args", {})) and e.get("s") == twin.get("s"), e
    for e in (e for e in fake if e["ph"] == "X"):
        assert set(e["args"]) <= {k for r in real if r["ph"] == "X" for k in r.get("args", {})}, e
    assert len({(e["pid"], e["tid"]) for e in fake if e["ph"] == "X"}) == 1


def test_synthetic_traces_look_like_real_ones_and_have_distinct_mistakes():
    for case in synthetic_cases():
        assert _reference_fraction(case["events"], case["warmup_steps"]) == pytest.approx(case["answer"])
        assert case["mistakes"], case["name"]
    events = synthetic_trace([(4, 1, 5, 2)] * 3)
    names = {e["name"] for e in events}
    assert {"fetch", "h2d copy", "step", NEXT_NAME, "ProfilerStep#2", "process_name"} <= names
    assert any("dur" not in e for e in events)             # metadata, instant and flow events
    assert _reference_fraction(events, 0) == pytest.approx(5 / 12)


# --- wrong fractions -------------------------------------------------------------------------

def _complete(events):
    return [e for e in events if e.get("ph") == "X"]


def _steps_by_ts(events):
    return sorted((e for e in _complete(events) if e["name"].startswith("ProfilerStep#")),
                  key=lambda e: e["ts"])


def _wait_in(events, counted, names=("fetch", "h2d copy")):
    return sum(e["dur"] for e in _complete(events) if e["name"] in names
               and any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in counted))


def ignores_warmup(events, warmup_steps=1):
    counted = _steps_by_ts(events)
    return _wait_in(events, counted) / sum(s["dur"] for s in counted)


def counts_the_step(events, warmup_steps=1):
    counted = _steps_by_ts(events)[warmup_steps:]
    return _wait_in(events, counted, ("fetch", "h2d copy", "step")) / sum(s["dur"] for s in counted)


def fetch_only(events, warmup_steps=1):
    counted = _steps_by_ts(events)[warmup_steps:]
    return _wait_in(events, counted, ("fetch",)) / sum(s["dur"] for s in counted)


def marked_spans_as_time(events, warmup_steps=1):
    counted = _steps_by_ts(events)[warmup_steps:]
    return _wait_in(events, counted) / _wait_in(events, counted, ("fetch", "h2d copy", "step"))


def counts_next_too(events, warmup_steps=1):
    counted = _steps_by_ts(events)[warmup_steps:]
    names = ("fetch", "h2d copy") + tuple(e["name"] for e in _complete(events) if "__next__" in e["name"])
    return _wait_in(events, counted, names) / sum(s["dur"] for s in counted)


def sorts_by_name(events, warmup_steps=1):
    counted = sorted((e for e in _complete(events) if e["name"].startswith("ProfilerStep#")),
                     key=lambda e: e["name"])[warmup_steps:]
    return _wait_in(events, counted) / sum(s["dur"] for s in counted)


def list_order(events, warmup_steps=1):
    counted = [e for e in _complete(events) if e["name"].startswith("ProfilerStep#")][warmup_steps:]
    return _wait_in(events, counted) / sum(s["dur"] for s in counted)


def percent(events, warmup_steps=1):
    return 100 * data_wait_fraction(events, warmup_steps)


def crashes_on_metadata(events, warmup_steps=1):
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#") or e["dur"] >= 0),
                   key=lambda e: e["ts"])
    return len(steps) / 1.0


def returns_a_string(events, warmup_steps=1):
    return f"{data_wait_fraction(events, warmup_steps):.0%}"


def wrong_signature(events):
    return data_wait_fraction(events, 1)


@pytest.mark.parametrize("answer, message", [
    (ignores_warmup, "counts the warm-up steps"),
    (counts_the_step, "counted the training step"),
    (fetch_only, "left out the copy"),
    (marked_spans_as_time, "divided by the marked spans"),
    (counts_next_too, "__next__ span as well"),
    (sorts_by_name, "sort as text"),
    (list_order, "order the trace lists them"),
    (percent, "percentage"),
    (crashes_on_metadata, "ph == 'X'"),
    (returns_a_string, "must return one number"),
    (wrong_signature, "calling your function failed"),
], ids=lambda v: getattr(v, "__name__", "msg"))
def test_wrong_fractions_fail_with_a_teaching_message(answer, message):
    with pytest.raises(ExerciseFailed) as info:
        check(WAIT, answer, real=False)
    text = str(info.value)
    assert message in text, text
    assert "hint" in text or "expected" in text


def test_a_fraction_that_ignores_warmup_fails_on_the_real_compute_bound_loop(traces):
    """The real loops catch it too: there the start-up sits inside the first step's fetch."""
    data, compute = traces
    assert _reference_fraction(compute["events"], 0) > compute["answer"]

    def right_on_synthetic_only(events, warmup_steps=1):
        synthetic = any(e.get("pid") == 4242 for e in events)     # synthetic_trace's process id
        return data_wait_fraction(events, warmup_steps) if synthetic else ignores_warmup(events)

    with pytest.raises(ExerciseFailed, match="a loop profiled here"):
        check(WAIT, right_on_synthetic_only)


# --- wrong bottlenecks ---------------------------------------------------------------------------

def inverted(events, warmup_steps=1, threshold=0.10):
    return "compute" if data_wait_fraction(events, warmup_steps) > threshold else "data"


def fixed_threshold(events, warmup_steps=1, threshold=0.10):
    return "data" if data_wait_fraction(events, warmup_steps) > 0.10 else "compute"


def warmup_counted(events, warmup_steps=1, threshold=0.10):
    return "data" if ignores_warmup(events) > threshold else "compute"


def diagnose_words(events, warmup_steps=1, threshold=0.10):
    return bottleneck(events, warmup_steps, threshold) + "-bound"


def always_data(events, warmup_steps=1, threshold=0.10):
    return "data"


@pytest.mark.parametrize("answer, message", [
    (inverted, "the wrong bottleneck"),
    (fixed_threshold, "use the `threshold` argument"),
    (warmup_counted, "skip the warm-up steps"),
    (diagnose_words, "exactly 'data' or 'compute'"),
    (always_data, "the wrong bottleneck"),
], ids=lambda v: getattr(v, "__name__", "msg"))
def test_wrong_bottlenecks_fail_with_a_teaching_message(answer, message):
    with pytest.raises(ExerciseFailed) as info:
        check(STALL, answer, real=False)
    assert message in str(info.value), str(info.value)


def test_the_stubs_are_not_done_yet():
    def stub(events, warmup_steps=1, threshold=0.10):
        raise NotImplementedError("Exercise: replace this line with your code (see the instructions above).")

    for exercise in (WAIT, STALL):
        with pytest.raises(ExerciseFailed, match="not done yet"):
            check(exercise, stub, real=False)


def test_not_a_function():
    with pytest.raises(ExerciseFailed, match="not a function"):
        check(WAIT, 0.3)


# --- the grader's reference is refused ------------------------------------------------------------

def test_the_reference_is_refused():
    with pytest.raises(ExerciseFailed) as info:
        check(WAIT, _reference_fraction, real=False)
    err = info.value
    assert "course's own `_reference_fraction` (course_utils.grading" in err.problem, str(err)
    assert "write this mechanism yourself" in err.hint


def test_hints_do_not_print_the_solution_lines():
    for answer in (ignores_warmup, counts_the_step, fetch_only, sorts_by_name):
        with pytest.raises(ExerciseFailed) as info:
            check(WAIT, answer, real=False)
        text = str(info.value)
        for line in ("[warmup_steps:]", "key=lambda e: e[\"ts\"]", "s[\"ts\"] <= e[\"ts\"]"):
            assert line not in text, text


def test_the_reference_counts_the_cpu_side_of_a_cuda_trace_once():
    # on CUDA each record_function / ProfilerStep span is recorded again as gpu_user_annotation
    events = synthetic_trace([(4.0, 1.0, 6.0, 1.0)] * 3, first=1)
    gpu_copies = [dict(e, cat="gpu_user_annotation", pid=0, tid=7, ts=e["ts"] + 30.0,
                       dur=e["dur"] * 0.5) for e in events if e.get("cat") == "user_annotation"]
    assert _reference_fraction(events + gpu_copies, 1) == pytest.approx(5 / 12)
