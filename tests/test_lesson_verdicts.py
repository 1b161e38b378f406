"""Each lesson's "common advice, checked" verdicts are small functions in a %%writefile
``lessonNN_verdicts.py`` the notebook writes; here each is tried just inside and just outside
its threshold, so a verdict can only follow from the measured figures. (Lesson 08's are in
tests/test_lesson08_trace.py; lesson 02's env_limit_verdict in tests/test_env_inheritance.py.)"""
from __future__ import annotations

import pytest

from course_authoring.notebook_modules import notebook_module


@pytest.fixture(scope="module")
def l00():
    return notebook_module("00_measure_first.ipynb", "lesson00_verdicts")


@pytest.fixture(scope="module")
def l01():
    return notebook_module("01_numpy_torch_opencv.ipynb", "lesson01_verdicts")


@pytest.fixture(scope="module")
def l02():
    return notebook_module("02_threads.ipynb", "lesson02_verdicts")


@pytest.fixture(scope="module")
def l03():
    return notebook_module("03_num_workers.ipynb", "lesson03_verdicts")


@pytest.fixture(scope="module")
def l04():
    return notebook_module("04_host_to_device.ipynb", "lesson04_verdicts")


@pytest.fixture(scope="module")
def l05():
    return notebook_module("05_gpu_augmentation.ipynb", "lesson05_verdicts")


@pytest.fixture(scope="module")
def l06():
    return notebook_module("06_tune_your_pipeline.ipynb", "lesson06_verdicts")


@pytest.fixture(scope="module")
def l07():
    return notebook_module("07_scaling_out.ipynb", "lesson07_verdicts")


@pytest.fixture(scope="module")
def l08():
    return notebook_module("08_find_the_stall.ipynb", "lesson08_verdicts")


@pytest.fixture(scope="module")
def l09():
    return notebook_module("09_when_the_loader_breaks.ipynb", "lesson09_verdicts")


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


def test_lesson01_centred_on_zero_within_a_share_of_the_tolerance(l01):
    from course_utils.transforms import MEAN_DIFF_LEVELS
    assert l01.MEAN_DIFF_LEVELS is MEAN_DIFF_LEVELS                 # one source for the tolerance
    edge = l01.CENTRED_SHARE * MEAN_DIFF_LEVELS
    for sign in (1, -1):
        assert l01.centred_on_zero(sign * (edge - 1e-6)) and not l01.centred_on_zero(sign * edge)
    assert l01.within_half_level(l01.HALF_LEVEL) and not l01.within_half_level(l01.HALF_LEVEL + 1e-6)
    assert l01.within_half_level(0.5)


def test_lesson01_a_change_compared_with_another_takes_three_words(l01):
    assert l01.compared_with(l01.LESS_THAN * 10 - 0.01, 10) == "less than"
    assert l01.compared_with(l01.LESS_THAN * 10, 10) == "about as much as"
    assert l01.compared_with(l01.ABOUT_AS_MUCH * 10, 10) == "about as much as"
    assert l01.compared_with(l01.ABOUT_AS_MUCH * 10 + 0.01, 10) == "more than"


def test_lesson01_threads_that_worked_and_what_they_bought(l01):
    share = l01.WORKED_SHARE
    assert l01.did_work(share * 2.0, 2.0) and not l01.did_work(share * 2.0 - 1e-6, 2.0)
    n = l01.MULTI_THREADED
    assert l01.multi_threaded(n) and not l01.multi_threaded(n - 1)
    assert l01.threads_slowed_it(l01.SLOWER - 0.001) and not l01.threads_slowed_it(l01.SLOWER)


def test_lesson01_faster_or_slower_says_which_and_by_how_much(l01):
    assert l01.faster_or_slower(1.0, 2.1) == "2.10x faster" and l01.faster_or_slower(1.3, 1.0) == "1.30x slower"
    assert l01.faster_or_slower(1.0, 1.0) == "1.00x faster"


def test_lesson02_pools_above_one_thread(l02):
    one = l02.ONE_THREAD
    assert l02.above_one_thread({"opencv": one + 1, "blas": one, "omp": 0}) == {"opencv": one + 1}
    assert l02.above_one_thread({"blas": one}) == {}


def test_lesson02_an_opencv_pool_left_behind_by_fork(l02):
    one = l02.ONE_THREAD
    assert l02.pool_left_behind(4, 1) and l02.pool_left_behind(4, None) and l02.pool_left_behind(4, 3)
    assert not l02.pool_left_behind(4, 4)                           # the pool's threads are there
    assert not l02.pool_left_behind(one, 0) and not l02.pool_left_behind(None, 1)
    assert l02.pool_left_behind(one + 1, one)


def test_lesson02_oversubscribed_when_threads_exceed_the_cpus(l02):
    assert l02.oversubscribed(3, 3, 8) and not l02.oversubscribed(2, 4, 8) and not l02.oversubscribed(1, 1, 8)


def test_lesson02_what_one_torch_thread_did(l02):
    clear = l02.CLEAR_CHANGE
    assert l02.one_thread_kind(5.0, 1) == "nothing to compare"
    assert l02.one_thread_kind(1 + clear + 0.001, 8) == "slower"
    assert l02.one_thread_kind(1 + clear, 8) == "no clear difference"
    assert l02.one_thread_kind(1.0, 8) == "no clear difference"
    assert l02.one_thread_kind(1 - clear, 8) == "no clear difference"
    assert l02.one_thread_kind(1 - clear - 0.001, 8) == "faster"


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


def test_lesson04_noise_is_the_measurement_module_s(l04):
    from course_utils.measurement import NOISY_IQR_FRACTION
    assert l04.NOISY_IQR_FRACTION is NOISY_IQR_FRACTION
    assert l04.noisy_point(10.0, 10.0 + NOISY_IQR_FRACTION * 10 + 0.01, 10)
    assert not l04.noisy_point(10.0, 10.0 + NOISY_IQR_FRACTION * 10, 10)


def test_lesson04_the_size_of_half_the_best(l04):
    best = 10.0
    edge = l04.HALF_OF_BEST * best
    assert l04.first_at_half([1, 2, 4], [None, edge, best], best) == 2
    assert l04.first_at_half([1, 2, 4], [edge - 0.01, edge + 1, best], best) == 2
    assert l04.first_at_half([1, 2], [edge - 0.01, None], best) is None


def test_lesson04_copy_thresholds(l04):
    assert l04.pinning_skips_staging(l04.PIN_GAIN + 0.001) and not l04.pinning_skips_staging(l04.PIN_GAIN)
    assert l04.pinned_fastest(l04.PINNED_WINS) and not l04.pinned_fastest(l04.PINNED_WINS - 0.001)
    assert l04.naive_mismeasured(True, l04.NAIVE_TOO_SHORT + 0.01)
    assert not l04.naive_mismeasured(True, l04.NAIVE_TOO_SHORT)
    assert not l04.naive_mismeasured(False, 100.0)                 # a synchronous copy cannot be
    assert l04.uint8_faster(1.0) and not l04.uint8_faster(0.999)
    assert l04.prefetch_overlapped(l04.PREFETCH_GAIN + 0.001) and not l04.prefetch_overlapped(l04.PREFETCH_GAIN)


def test_lesson04_overlap_thresholds(l04):
    gain, most, order = l04.NB_GAIN, l04.MOST, l04.IN_ORDER
    assert l04.compute_starts_at_once(gain + 0.001) and not l04.compute_starts_at_once(gain)
    assert l04.most(most + 0.001) and not l04.most(most)
    assert l04.ran_beside([most + 0.001, 0.9]) and not l04.ran_beside([most, 0.9])
    assert l04.ran_in_order([0.0, order - 0.001]) and not l04.ran_in_order([0.0, order])
    assert l04.only_from_pinned(most + 0.001, most) and l04.only_from_pinned(0.9, 0.0)
    assert not l04.only_from_pinned(most, 0.0)                      # pinned did not hide most of it
    assert not l04.only_from_pinned(0.9, most + 0.001)              # pageable hid most of it too


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


def test_lesson06_thresholds_are_the_tuner_s(l06):
    from course_utils.tools.tune import search
    assert (l06.PROBE_THRESHOLD, l06.LADDER_FALL_FRACTION, l06.LADDER_FALLS) == (
        search.PROBE_THRESHOLD, search.LADDER_FALL_FRACTION, search.LADDER_FALLS)


def test_lesson06_the_loop_s_decisions(l06):
    best = 1000.0
    probe, fall = l06.PROBE_THRESHOLD * best, l06.LADDER_FALL_FRACTION * best
    assert l06.probe_clearly_slower(probe - 0.01, best) and not l06.probe_clearly_slower(probe, best)
    assert not l06.probe_clearly_slower(0.0, 0.0)                   # the first rung is always timed
    assert l06.rung_falls(fall - 0.01, best) and not l06.rung_falls(fall, best)
    assert l06.new_best(True, best + 0.01, best) and not l06.new_best(True, best, best)
    assert not l06.new_best(False, 2 * best, best)                  # a stopped probe never is the best
    assert l06.ladder_stops(l06.LADDER_FALLS) and not l06.ladder_stops(l06.LADDER_FALLS - 1)


def test_lesson07_verdicts(l07):
    assert l07.faster(l07.FASTER + 0.001) and not l07.faster(l07.FASTER)
    assert l07.set_epoch_optional(False) and not l07.set_epoch_optional(True)
    assert l07.each_sample_once([]) and not l07.each_sample_once([3])
    assert l07.torchrun_limits_threads(1, "1")
    assert not l07.torchrun_limits_threads(2, "1") and not l07.torchrun_limits_threads(1, None)


def test_lesson09_in_flight_is_workers_x_prefetch_then_the_main_process_s_share(l09):
    batch, ahead, slack, main = 100, 2 * 4, l09.SLACK_BATCHES, l09.HELD_BY_MAIN
    at = lambda batches: l09.in_flight(batches * batch, batch, 2, 4)          # noqa: E731
    assert at(ahead) is True and at(ahead + slack) is True and at(ahead - slack) is True
    assert at(ahead + slack + 0.01) == "half right" and at(ahead + main + slack) == "half right"
    assert at(ahead + main + slack + 0.01) is False and at(ahead - slack - 0.01) is False


def test_lesson09_shared_memory_thresholds(l09):
    assert l09.shrinks(l09.SHRINK * 1000 - 1, 1000) and not l09.shrinks(l09.SHRINK * 1000, 1000)
    assert l09.uint8_pays(l09.UINT8_GAIN * 100, 100) and not l09.uint8_pays(l09.UINT8_GAIN * 100 - 1, 100)
    assert l09.all_predicted([True, True]) and not l09.all_predicted([True, False])


def test_lesson09_descriptors_killed_workers_and_hangs(l09):
    assert l09.only_ulimit([11, 29], 30) and l09.only_ulimit([], 30) and not l09.only_ulimit([11, 30], 30)
    assert l09.nothing_left(0) and not l09.nothing_left(1)
    assert l09.killed_worker_hangs(l09.NOTICE_S + 0.01) and not l09.killed_worker_hangs(l09.NOTICE_S)
    assert l09.killed_worker_hangs(None)                             # never raised: that is the hang
    assert l09.next_epoch_runs("ran all its batches") and not l09.next_epoch_runs("failed: DataLoader worker ...")
    timeout = 3
    assert l09.timeout_ends_a_hang(timeout + l09.TIMEOUT_SLACK_S, timeout)
    assert not l09.timeout_ends_a_hang(timeout + l09.TIMEOUT_SLACK_S + 0.01, timeout)
    assert not l09.timeout_ends_a_hang(None, timeout)                # no error: the timeout did nothing
