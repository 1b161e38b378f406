"""Lesson 08's trace helpers (``lesson08_trace.py``, written by the notebook's %%writefile cell; the
union and gaps of intervals in ``lesson08_gpu.py``, written by its deep dive on the GPU's trace).

With ``ProfilerActivity.CUDA`` a ``record_function`` span or ``ProfilerStep#N`` is on the CPU's
thread (``user_annotation``) and, for each (device, stream) that ran GPU work inside it, as a copy
on that stream's timeline (``gpu_user_annotation``, the same name, another pid/tid;
pytorch/pytorch#144613): none for a span without GPU work, several for one on several streams.
Selected by name alone, a wait or step counts once per copy too; ``spans`` leaves the GPU-side
copies out unless ``cats`` asks for them.
"""
from __future__ import annotations

import copy
import json

import pytest

from course_authoring.notebook_modules import notebook_module
from course_utils.grading.ex08_find_the_stall import synthetic_trace

#: (fetch, copy, step, other) ms per recorded step
STEPS = [(4.0, 1.0, 10.0, 1.0), (0.5, 1.0, 10.0, 0.5), (8.0, 2.0, 9.0, 1.0), (2.0, 0.5, 11.0, 0.5)]
WAIT_FRACTION = sum(f + c for f, c, _, _ in STEPS) / sum(sum(r) for r in STEPS)    # 19 / 62
STEP_SHARE = sum(s for _, _, s, _ in STEPS) / sum(sum(r) for r in STEPS)            # 40 / 62
GPU_PID, GPU_TID, SHIFT_US = 0, 7, 35.0


@pytest.fixture(scope="module")
def trace():
    return notebook_module("08_find_the_stall.ipynb", "lesson08_trace")


@pytest.fixture(scope="module")
def gpu():
    return notebook_module("08_find_the_stall.ipynb", "lesson08_gpu")


@pytest.fixture(scope="module")
def cpu_events():
    return synthetic_trace(STEPS, shuffle_seed=8)


def cuda_shaped(events, gpu_share=1.0):
    """`events` plus, for every user_annotation span, its GPU-side copy as a CUDA trace has it:
    cat gpu_user_annotation, the GPU's pid/tid, a little later; a ProfilerStep# copy as long as
    the step, the others `gpu_share` of their span (the GPU's view lasts as its kernels do)."""
    out = copy.deepcopy(events)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "user_annotation":
            share = 1.0 if e["name"].startswith("ProfilerStep#") else gpu_share
            out.append(dict(copy.deepcopy(e), cat="gpu_user_annotation", pid=GPU_PID, tid=GPU_TID,
                            ts=e["ts"] + SHIFT_US, dur=e["dur"] * share))
    return out


def wait_fraction(spans, events):
    """The notebook's profiler_wait (cell "(c)"): fetch + h2d copy over the ProfilerStep spans."""
    wait = sum(e - s for s, e in spans(events, name="fetch") + spans(events, name="h2d copy"))
    return wait / sum(e - s for s, e in spans(events, prefix="ProfilerStep#"))


def by_name_only(events, name=None, prefix=None):
    """The selection lesson 08 had before: by name, whatever the category (the defect)."""
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X"
                  and (name is None or e.get("name") == name)
                  and (prefix is None or str(e.get("name", "")).startswith(prefix)))


def test_the_modules_are_the_notebooks(trace, gpu):
    assert "08_find_the_stall.ipynb" in trace.__doc__ and "08_find_the_stall.ipynb" in gpu.__doc__
    for name in ("load_events", "spans", "cpu_side"):
        assert callable(getattr(trace, name)), name
    for name in ("merged", "idle_between"):
        assert callable(getattr(gpu, name)), name


@pytest.mark.parametrize("gpu_share", [1.0, 0.25])
def test_spans_by_name_are_the_cpu_side_ones_on_a_cuda_trace(trace, cpu_events, gpu_share):
    cuda_events = cuda_shaped(cpu_events, gpu_share)
    for name in ("fetch", "h2d copy", "step"):
        cpu = trace.spans(cpu_events, name=name)
        assert len(cpu) == len(STEPS)
        assert trace.spans(cuda_events, name=name) == cpu, name
    steps = trace.spans(cpu_events, prefix="ProfilerStep#")
    assert len(steps) == len(STEPS)
    assert trace.spans(cuda_events, prefix="ProfilerStep#") == steps
    assert trace.cpu_side(cuda_events) == trace.cpu_side(cpu_events) == cpu_events


@pytest.mark.parametrize("gpu_share", [1.0, 0.25])
def test_the_wait_fraction_is_the_hand_computed_one_on_both_traces(trace, gpu, cpu_events, gpu_share):
    cuda_events = cuda_shaped(cpu_events, gpu_share)
    assert wait_fraction(trace.spans, cpu_events) == pytest.approx(WAIT_FRACTION, abs=1e-6)
    assert wait_fraction(trace.spans, cuda_events) == pytest.approx(WAIT_FRACTION, abs=1e-6)
    # on the CPU the device is busy in the step spans: idle is everything else in the steps
    for events in (cpu_events, cuda_events):
        window = trace.spans(events, prefix="ProfilerStep#")
        t0, t1 = window[0][0], window[-1][1]
        idle = gpu.idle_between(gpu.merged(trace.spans(events, name="step")), t0, t1)
        assert sum(e - s for s, e in idle) / (t1 - t0) == pytest.approx(1 - STEP_SHARE, abs=1e-6)


def test_selected_by_name_only_the_gpu_copies_double_the_waits(cpu_events):
    """The defect the default selection fixes: by name alone the copies count a second time."""
    waits = ("fetch", "h2d copy")
    cpu_wait = sum(e - s for n in waits for s, e in by_name_only(cpu_events, name=n))
    doubled = sum(e - s for n in waits for s, e in by_name_only(cuda_shaped(cpu_events), name=n))
    assert doubled == pytest.approx(2 * cpu_wait)
    assert len(by_name_only(cuda_shaped(cpu_events), prefix="ProfilerStep#")) == 2 * len(STEPS)
    # where the GPU's view of a span is shorter than the CPU's, the fraction itself goes wrong
    wrong = wait_fraction(by_name_only, cuda_shaped(cpu_events, 0.25))
    assert wrong != pytest.approx(WAIT_FRACTION, abs=1e-3)


def test_the_gpu_side_copies_when_asked_for_by_category(trace, cpu_events):
    cuda_events = cuda_shaped(cpu_events, 0.25)
    gpu = trace.spans(cuda_events, name="fetch", cats=("gpu_user_annotation",))
    expected = [(s + SHIFT_US, s + SHIFT_US + 0.25 * (e - s))
                for s, e in trace.spans(cpu_events, name="fetch")]
    assert len(gpu) == len(STEPS)
    flat = [t for span in expected for t in span]
    assert [t for span in gpu for t in span] == pytest.approx(flat, abs=1e-3)    # µs near 1.7e12
    both = trace.spans(cuda_events, prefix="ProfilerStep#",
                       cats=("user_annotation", "gpu_user_annotation"))
    assert len(both) == 2 * len(STEPS)
    assert trace.spans(cpu_events, cats=("gpu_user_annotation",)) == []
    assert {(e["pid"], e["tid"]) for e in cuda_events if e.get("cat") == "gpu_user_annotation"} \
        == {(GPU_PID, GPU_TID)}


def test_load_events_reads_an_exported_trace(trace, cpu_events, tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": cuda_shaped(cpu_events)}), encoding="utf-8")
    events = trace.load_events(path)
    assert trace.spans(events, name="step") == trace.spans(cpu_events, name="step")


def test_merged_and_idle_between(gpu):
    assert gpu.merged([(5, 7), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 7)]
    assert gpu.idle_between([(0, 4), (5, 7)], -1, 10) == [(-1, 0), (4, 5), (7, 10)]
    assert gpu.idle_between([(0, 4)], 1, 3) == []


# ---- the common advice's verdicts (lesson08_verdicts.py; the deep dive's in lesson08_clocks.py) --

@pytest.fixture(scope="module")
def verdicts():
    return notebook_module("08_find_the_stall.ipynb", "lesson08_verdicts")


@pytest.fixture(scope="module")
def clocks():
    return notebook_module("08_find_the_stall.ipynb", "lesson08_clocks")


def test_the_bound_rule_is_diagnose_s_own(verdicts):
    from course_utils.tools.diagnose import DATA_BOUND_FRACTION
    assert verdicts.DATA_BOUND_FRACTION is DATA_BOUND_FRACTION
    assert verdicts.bound(DATA_BOUND_FRACTION + 1e-6) == "data-bound"
    assert verdicts.bound(DATA_BOUND_FRACTION) == "compute-bound"


def test_the_profiler_distorts_only_beyond_the_noise(clocks):
    same = clocks.SAME_WITHIN
    assert not clocks.profiler_distorts(0.30, 0.30 + same * 0.99, 0.0)     # within SAME_WITHIN
    assert clocks.profiler_distorts(0.30, 0.30 + same * 1.01, 0.0)
    assert not clocks.profiler_distorts(0.30, 0.379, 0.04)                  # within twice the noise
    assert clocks.profiler_distorts(0.30, 0.381, 0.04)


def test_the_clock_verdict_cannot_hold_by_default_on_a_cpu(clocks, verdicts):
    same = clocks.SAME_WITHIN
    assert clocks.clock_is_the_wait("cpu", 0.1, 0.9) is None                # not checkable
    assert clocks.clock_is_the_wait("cuda", 0.20, 0.20 + same * 0.99) is True
    assert clocks.clock_is_the_wait("cuda", 0.20, 0.20 + same * 1.01) is False
    assert verdicts.held(None) == "cannot be checked on this device"
    assert (verdicts.held(True), verdicts.held(False)) == ("held", "did not hold")


def test_a_small_average_holds_only_without_long_tails(verdicts):
    share = verdicts.SPIKE_SHARE
    assert verdicts.average_tells_all(share * 10.0, 10.0)
    assert not verdicts.average_tells_all(share * 10.0 + 0.01, 10.0)
