"""Grader 00 (course_utils/grading/ex00_measure_first.py): each wrong-unit window includes its
own edges, pinned on made-up figures where the edge is an exact ratio, so a target shifted by a
hair (e.g. 1001 ms instead of 1000 ms per second) moves an edge answer out of its window."""
from __future__ import annotations

import pytest

import course_utils.grading.ex00_measure_first as G
from course_utils.grading.checker import ExerciseFailed

# honest 1000 samples/s, batches of 8: hand-worked targets of each unit
#   batches per second: 1000 / 8 = 125;  milliseconds per sample: 1000 ms / 1000 = 1.0
HONEST, BATCH, BATCHES, WARMUP = 1000.0, 8, 12, 2


def judge(value):
    return G.judge_rate(value, HONEST, batch_size=BATCH, batches=BATCHES, warmup_batches=WARMUP,
                        startup_s=0.6, batches_per_iterator=[WARMUP + BATCHES])


@pytest.mark.parametrize("unit, value", [
    ("milliseconds per sample", 0.6),     # 0.6 x 1.0 ms: the window's lower edge
    ("milliseconds per sample", 1.6),     # 1.6 x 1.0 ms: its upper edge
    ("batches per second", 75.0),         # 0.6 x 125
    ("batches per second", 200.0),        # 1.6 x 125
], ids=["ms-low-edge", "ms-high-edge", "batches-low-edge", "batches-high-edge"])
def test_a_value_exactly_at_a_units_window_edge_is_named_that_unit(unit, value):
    with pytest.raises(ExerciseFailed) as info:
        judge(value)
    assert info.value.problem == f"wrong unit: this looks like {unit}.", str(info.value)


def test_just_below_the_millisecond_windows_lower_edge_is_too_slow_not_a_unit():
    # 0.599 ms per sample: 0.599 / 1.0 < 0.6, outside the window, and far below the honest rate
    with pytest.raises(ExerciseFailed) as info:
        judge(0.599)
    assert info.value.problem.startswith("too slow"), str(info.value)
