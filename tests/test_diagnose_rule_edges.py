"""Pins ``course_utils.tools.diagnose.rules``: the data-bound verdict and the own-pools rule on
both sides of their thresholds, exactly at them included (the rules say "more than")."""
from __future__ import annotations

from course_utils.tools.diagnose import rules
from course_utils.tools.diagnose.rules import runs_own_pools, verdict


def test_waiting_exactly_a_tenth_of_the_loop_is_not_data_bound():
    # 1.0 s waited in a 10.0 s loop is 0.1, exactly the threshold: "more than 10 %" is not met
    assert verdict(1.0 / 10.0) == "compute-bound"
    assert verdict(0.1) == "compute-bound"


def test_waiting_just_over_a_tenth_is_data_bound_and_just_under_is_not():
    assert verdict(0.1001) == "data-bound"       # 1.001 s of 10 s
    assert verdict(0.0999) == "compute-bound"    # 0.999 s of 10 s
    assert verdict(0.95) == "data-bound"
    assert verdict(0.0) == "compute-bound"


def test_the_thresholds_are_the_documented_numbers():
    # the lesson and the report print these figures: 10 %, 3 threads, 1.05x, half the time busy
    assert rules.DATA_BOUND_FRACTION == 0.10
    assert rules.POOL_THREADS == 3
    assert rules.MIN_GAIN == 1.05
    assert rules.LOAD_BUSY == 0.5


def test_own_pools_need_more_than_three_threads_in_some_worker():
    assert not runs_own_pools([3, 3, 3])          # exactly the threshold: not more than 3
    assert runs_own_pools([3, 4, 2])              # one worker over is enough (not the first one)
    assert runs_own_pools([4])
    assert not runs_own_pools([1, 2])
    assert not runs_own_pools([])                 # no worker measured: no claim
    assert runs_own_pools([2, 9]) is True and runs_own_pools([]) is False
