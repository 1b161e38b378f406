"""Each lesson's "common advice, checked" verdicts are small functions in a %%writefile
``lessonNN_verdicts.py`` the notebook writes; here each is tried just inside and just outside
its threshold, so a verdict can only follow from the measured figures. (Lesson 08's are in
tests/test_lesson08_trace.py.)"""
from __future__ import annotations

import pytest

from course_authoring.notebook_modules import notebook_module


@pytest.fixture(scope="module")
def l00():
    return notebook_module("00_measure_first.ipynb", "lesson00_verdicts")


@pytest.fixture(scope="module")
def l03():
    return notebook_module("03_num_workers.ipynb", "lesson03_verdicts")


@pytest.fixture(scope="module")
def l05():
    return notebook_module("05_gpu_augmentation.ipynb", "lesson05_verdicts")


@pytest.fixture(scope="module")
def l07():
    return notebook_module("07_scaling_out.ipynb", "lesson07_verdicts")


def test_lesson00_the_ceiling_is_one_core_per_worker(l00):
    assert l00.ceiling(4, 2) == 2 and l00.ceiling(4, 16) == 4 and l00.ceiling(4, 4) == 4


def test_lesson00_a_speedup_above_the_ceiling_is_a_measurement_error(l00):
    """Lesson 00's quick run once read 3.90x with 2 CPUs: an error to report, never 'held'."""
    slack = l00.CEILING_SLACK
    assert l00.above_ceiling(2 * slack + 0.01, 2) and not l00.above_ceiling(2 * slack, 2)
    assert not l00.good_default(2 * slack + 0.01, 2) and not l00.good_default(3.9, 2)


def test_lesson00_four_workers_are_a_good_default_from_the_measured_share(l00):
    share = l00.GOOD_SHARE
    assert l00.good_default(share * 4, 4) and not l00.good_default(share * 4 - 0.01, 4)
    assert l00.good_default(2.0, 2) and l00.good_default(2 * l00.CEILING_SLACK, 2)


def test_lesson00_pinning_loads_faster_only_past_its_gain(l00):
    gain = l00.PIN_GAIN
    assert l00.pinning_loads_faster(gain * 1000, 1000) and not l00.pinning_loads_faster(gain * 1000 - 1, 1000)
    assert l00.held(True) == "held" and l00.held(False) == "did not hold"


def test_lesson03_knee_at_the_cores(l03):
    near = l03.NEAR_CORES
    assert l03.knee_at_cores(8 + near, 8, "knee") and l03.knee_at_cores(8 - near, 8, "knee")
    assert not l03.knee_at_cores(8 + near + 1, 8, "knee")
    assert not l03.knee_at_cores(8, 8, "flat")


def test_lesson03_thresholds(l03):
    assert l03.never_slower([1.0, l03.NEVER_SLOWER]) and not l03.never_slower([1.0, l03.NEVER_SLOWER - 0.01])
    gain = l03.PREFETCH_GAIN
    assert l03.more_prefetch_helps(0.50, 0.50 - gain - 0.001)
    assert not l03.more_prefetch_helps(0.50, 0.50 - gain + 0.001)
    assert l03.freeze_fixes(l03.FREEZE_SHARE * 10 - 0.01, 10) and not l03.freeze_fixes(l03.FREEZE_SHARE * 10, 10)
    assert l03.out_of_order_faster(l03.ORDER_GAIN * 2 - 0.001, 2)
    assert not l03.out_of_order_faster(l03.ORDER_GAIN * 2, 2)


def test_lesson05_thresholds(l05):
    assert l05.faster(l05.FASTER + 0.001) and not l05.faster(l05.FASTER)
    assert l05.keeps_up(l05.KEEPS_UP - 0.001) and not l05.keeps_up(l05.KEEPS_UP)


def test_lesson05_a_loop_is_needed_unless_every_check_says_otherwise(l05):
    ok = dict(calls_small=40, calls_big=40, agree=True, ks_distances=[0.01, 0.02], ks_limit=0.05)
    assert not l05.needs_a_loop(**ok)                       # the claim did not hold
    assert l05.needs_a_loop(**{**ok, "calls_big": 41})      # more calls for more samples: a loop
    assert l05.needs_a_loop(**{**ok, "agree": False})
    assert l05.needs_a_loop(**{**ok, "ks_distances": [0.01, 0.05]})
    assert l05.held(False) == "did not hold" and l05.held(True) == "held"


def test_lesson07_verdicts(l07):
    assert l07.faster(l07.FASTER + 0.001) and not l07.faster(l07.FASTER)
    assert l07.set_epoch_optional(False) and not l07.set_epoch_optional(True)
    assert l07.each_sample_once([]) and not l07.each_sample_once([3])
    assert l07.torchrun_limits_threads(1, "1")
    assert not l07.torchrun_limits_threads(2, "1") and not l07.torchrun_limits_threads(1, None)
