"""The lessons' verdict modules (``lessonNN_verdicts.py``, written by the notebooks' %%writefile
cells) on hand-worked numbers: every threshold the lesson's text states (80 % of the ceiling,
1.15x, 5 %, 10 %, ...) tried just inside and just outside with literal values, so a changed
threshold, a comparison one step off, an index for a value or a one-sided rule changes a verdict.
(tests/test_lesson_verdicts.py tries the same functions against the modules' own constants.)"""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from test_lesson_verdicts import l00, l01, l02, l03, l04, l05, l06, l07, l08, l09  # noqa: F401 - fixtures


# ---- lesson 00 ------------------------------------------------------------------------------

def test_lesson00_the_ceiling_is_the_smaller_of_workers_and_cores(l00):
    assert l00.ceiling(3, 8) == 3           # 3 workers on 8 cores: 3x at most
    assert l00.ceiling(8, 3) == 3           # 8 workers on 3 cores: 3x at most


def test_lesson00_a_speedup_is_an_error_only_above_1_15_times_its_ceiling(l00):
    # ceiling 2: 1.15 * 2 = 2.3
    assert not l00.above_ceiling(2.3, 2) and l00.above_ceiling(2.31, 2)
    assert not l00.above_ceiling(2.0, 2)


def test_lesson00_a_good_default_lies_between_80_percent_and_1_15_times_the_ceiling(l00):
    # ceiling 4: lower edge 0.8 * 4 = 3.2, upper edge 1.15 * 4 = 4.6; both edges belong to it
    assert l00.good_default(3.2, 4) and not l00.good_default(3.19, 4)
    assert l00.good_default(4.6, 4) and not l00.good_default(4.61, 4)
    assert l00.good_default(4.0, 4)


def test_lesson00_pinning_must_load_5_percent_more_per_second(l00):
    # 4 batches/s unpinned: 1.05 * 4 = 4.2 pinned is just enough
    assert l00.pinning_loads_faster(4.2, 4) and not l00.pinning_loads_faster(4.19, 4)
    assert not l00.pinning_loads_faster(4.0, 4.2)          # the ratio the right way up


# ---- lesson 01 ------------------------------------------------------------------------------

def test_lesson01_less_than_below_0_8_and_about_as_much_up_to_1_25_of_the_reference(l01):
    # reference 4: 0.8 * 4 = 3.2 and 1.25 * 4 = 5.0
    assert l01.compared_with(3.19, 4) == "less than"
    assert l01.compared_with(3.2, 4) == "about as much as"
    assert l01.compared_with(5.0, 4) == "about as much as"
    assert l01.compared_with(5.01, 4) == "more than"


def test_lesson01_faster_or_slower_puts_the_ratio_the_right_way_up(l01):
    assert l01.faster_or_slower(2.0, 5.0) == "2.50x faster"        # 5 / 2
    assert l01.faster_or_slower(5.0, 2.0) == "2.50x slower"        # 5 / 2


def test_lesson01_centred_within_a_tenth_of_the_quarter_level_tolerance_on_both_sides(l01):
    # MEAN_DIFF_LEVELS is 0.25 grey level: 0.1 * 0.25 = 0.025, strictly inside
    for sign in (1, -1):
        assert l01.centred_on_zero(sign * 0.0249)
        assert not l01.centred_on_zero(sign * 0.025)
    assert not l01.centred_on_zero(-0.2)


def test_lesson01_within_half_a_level_is_0_501_at_most(l01):
    assert l01.within_half_level(0.501) and not l01.within_half_level(0.502)


def test_lesson01_a_thread_did_work_from_a_tenth_of_the_process_cpu(l01):
    # process 2 s of CPU: 0.1 * 2 = 0.2 s
    assert l01.did_work(0.2, 2.0) and not l01.did_work(0.19, 2.0)
    assert not l01.did_work(2.0, 40.0)                     # 2 s of 40 s is 5 %


def test_lesson01_two_threads_at_work_make_a_call_multi_threaded(l01):
    assert l01.multi_threaded(2) and l01.multi_threaded(3) and not l01.multi_threaded(1)


def test_lesson01_threads_slowed_a_call_below_0_95_times_one_thread_s_speed(l01):
    assert l01.threads_slowed_it(0.949) and not l01.threads_slowed_it(0.95)
    assert not l01.threads_slowed_it(1.5)


# ---- lesson 02 ------------------------------------------------------------------------------

def test_lesson02_a_pool_of_two_threads_is_above_one(l02):
    assert l02.above_one_thread({"opencv": 2, "blas": 1, "omp": 3}) == {"opencv": 2, "omp": 3}


def test_lesson02_a_pool_is_left_behind_when_the_worker_has_fewer_threads_than_it_reads(l02):
    assert l02.pool_left_behind(2, 1)                      # reads 2, one thread there
    assert not l02.pool_left_behind(1, 0)                  # one thread asked: nothing left behind
    assert not l02.pool_left_behind(3, 5)                  # more threads than the pool
    assert not l02.pool_left_behind(0, None)


def test_lesson02_oversubscribed_when_workers_times_threads_exceed_the_cpus(l02):
    assert l02.oversubscribed(2, 3, 5)                     # 2 * 3 = 6 > 5
    assert not l02.oversubscribed(2, 3, 6)                 # 6 threads on 6 CPUs: not over
    assert not l02.oversubscribed(6, 1, 7)


def test_lesson02_which_process_ran_the_top_level_from_four_different_pids(l02):
    seen = {"pid": 11, "parent_pid": 22, "script_pid": 33}
    assert l02.top_level_ran_in({**seen, "top_level_pid": 11}) == "the worker itself"
    assert l02.top_level_ran_in({**seen, "top_level_pid": 33}) == "the script's process"
    assert l02.top_level_ran_in({**seen, "top_level_pid": 22}) == "the fork server"
    assert l02.top_level_ran_in({**seen, "top_level_pid": 44}) == "no process we know"
    for answer in ("the worker itself", "the script's process", "the fork server",
                   "no process we know"):
        assert answer in l02.TOP_LEVEL_MEANS


def _blas(api, threads, prefix=None, path="/usr/lib/x.so", user_api="blas"):
    return {"internal_api": api, "num_threads": threads, "prefix": prefix, "filepath": path,
            "user_api": user_api}


def test_lesson02_env_sized_pools_names_each_pool_and_keeps_duplicates_apart(l02):
    torch_omp = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    pools = SimpleNamespace(blas=[
        _blas("openblas", 3, prefix="libopenblas", path="/opt/a/libopenblas.so"),
        _blas("openmp", 5, path=torch_omp, user_api="openmp"),       # torch's own: left out
        _blas("mkl", None, path="/opt/mkl.so"),                      # no figure: 0 threads
        _blas("openmp", 2, prefix="libgomp", path="/usr/lib/libgomp.so", user_api="openmp"),
        _blas("openmp", 4, prefix="libgomp", path="/usr/lib/libgomp.so", user_api="openmp"),
        _blas("openmp", 6, prefix="libgomp", path="/usr/lib/libgomp.so", user_api="openmp"),
    ])
    assert l02.env_sized_pools(pools) == {
        "openblas (libopenblas)": 3, "mkl (/opt/mkl.so)": 0,
        "openmp (libgomp)": 2, "openmp (libgomp)'": 4, "openmp (libgomp)''": 6}


def test_lesson02_env_limit_verdict_on_both_sides_of_the_limit(l02):
    assert l02.env_limit_verdict({"a": 2}, {"a": 4}) == "did not hold"      # default limit 1
    assert l02.env_limit_verdict({"a": 1, "b": 0}, {"a": 2}) == "held"
    assert l02.env_limit_verdict({"a": 1}, {"a": 1}) == "nothing to limit"
    assert l02.env_limit_verdict({"a": 3}, {"a": 8}, limit=3) == "held"
    assert l02.env_limit_verdict({"a": 4}, {"a": 8}, limit=3) == "did not hold"
    assert l02.env_limit_verdict({"a": 3}, {"a": 3}, limit=3) == "nothing to limit"


def test_lesson02_one_torch_thread_clearly_changed_the_time_beyond_10_percent(l02):
    assert l02.one_thread_kind(1.11, 2) == "slower"
    assert l02.one_thread_kind(1.1, 2) == "no clear difference"
    assert l02.one_thread_kind(0.9, 2) == "no clear difference"
    assert l02.one_thread_kind(0.89, 2) == "faster"
    assert l02.one_thread_kind(0.5, 1) == "nothing to compare"


# ---- lesson 03 ------------------------------------------------------------------------------

def test_lesson03_a_knee_within_one_worker_of_the_cores_on_either_side(l03):
    assert l03.knee_at_cores(7, 6, "knee") and l03.knee_at_cores(5, 6, "knee")
    assert not l03.knee_at_cores(8, 6, "knee") and not l03.knee_at_cores(4, 6, "knee")
    assert not l03.knee_at_cores(6, 6, "flat") and l03.knee_at_cores(6, 6, "plateau")


def test_lesson03_never_slower_reads_the_lowest_share_against_90_percent(l03):
    assert l03.never_slower([1.0, 0.95, 0.9]) and not l03.never_slower([1.0, 0.89, 0.95])
    assert not l03.never_slower([0.5, 1.0])


def test_lesson03_more_prefetch_helps_when_the_wait_drops_by_3_points(l03):
    # wait 0.5 at prefetch 2: 0.5 - 0.03 = 0.47
    assert l03.more_prefetch_helps(0.5, 0.469) and not l03.more_prefetch_helps(0.5, 0.47)
    assert not l03.more_prefetch_helps(0.5, 0.6)


def test_lesson03_freeze_fixes_when_growth_is_below_half(l03):
    assert l03.freeze_fixes(4.99, 10) and not l03.freeze_fixes(5.0, 10)   # 0.5 * 10


def test_lesson03_out_of_order_is_faster_at_5_percent_less_time(l03):
    assert l03.out_of_order_faster(1.89, 2) and not l03.out_of_order_faster(1.9, 2)   # 0.95 * 2


# ---- lesson 04 ------------------------------------------------------------------------------

def test_lesson04_single_thresholds_on_literal_values(l04):
    assert l04.pinning_skips_staging(1.101) and not l04.pinning_skips_staging(1.1)
    assert l04.prefetch_overlapped(1.051) and not l04.prefetch_overlapped(1.05)
    assert l04.pinned_fastest(0.9) and not l04.pinned_fastest(0.899)
    assert l04.naive_mismeasured(True, 2.01) and not l04.naive_mismeasured(True, 2)
    assert l04.compute_starts_at_once(0.251) and not l04.compute_starts_at_once(0.25)
    assert l04.most(0.501) and not l04.most(0.5)


def test_lesson04_a_noisy_point_s_iqr_is_over_a_tenth_of_its_value(l04):
    # IQR 10.0 - 9.0 = 1.0 over the value 10: 0.1, not more
    assert not l04.noisy_point(9.0, 10.0, 10.0)
    assert l04.noisy_point(9.0, 10.01, 10.0)               # 1.01 / 10
    assert not l04.noisy_point(30.0, 31.0, 40.0)           # 1 / 40


def test_lesson04_first_at_half_returns_the_size_not_its_position(l04):
    # best 10: half is 5.0, reached first at the second size, 4 (index 1)
    assert l04.first_at_half([1, 4, 16], [4.9, 5.0, 10.0], 10.0) == 4
    assert l04.first_at_half([1, 4, 16], [None, 4.99, 6.0], 10.0) == 16
    assert l04.first_at_half([1, 4], [1.0, 2.0], 10.0) is None


def test_lesson04_overlap_shares_are_read_at_their_minimum_or_maximum(l04):
    assert l04.ran_beside([0.9, 0.51]) and not l04.ran_beside([0.9, 0.5])
    assert l04.ran_in_order([0.24, 0.0]) and not l04.ran_in_order([0.1, 0.25])
    assert l04.only_from_pinned(0.51, 0.5) and not l04.only_from_pinned(0.51, 0.51)
    assert not l04.only_from_pinned(0.5, 0.0)


def test_lesson04_uint8_is_faster_from_a_speedup_of_one(l04):
    assert l04.uint8_faster(1.0) and l04.uint8_faster(1.2) and not l04.uint8_faster(0.99)


# ---- lessons 05 to 08 -----------------------------------------------------------------------

def test_lesson05_faster_above_1_1_and_keeps_up_under_5_percent(l05):
    assert l05.faster(1.101) and not l05.faster(1.1)
    assert l05.keeps_up(0.049) and not l05.keeps_up(0.05)


def test_lesson05_needs_a_loop_reads_the_largest_ks_distance(l05):
    ok = dict(calls_small=12, calls_big=12, agree=True, ks_distances=[0.02, 0.01], ks_limit=0.05)
    assert not l05.needs_a_loop(**ok)
    assert l05.needs_a_loop(**{**ok, "ks_distances": [0.06, 0.01]})     # the largest decides
    assert l05.needs_a_loop(**{**ok, "calls_small": 11})


def test_lesson06_the_tuner_s_decisions_on_literal_rates(l06):
    # best 1000 samples/s: a probe below 0.8 * 1000 = 800 is clearly slower; a rung below
    # 0.95 * 1000 = 950 falls; two falls in a row stop the ladder
    assert l06.probe_clearly_slower(799.0, 1000.0) and not l06.probe_clearly_slower(800.0, 1000.0)
    assert l06.rung_falls(949.0, 1000.0) and not l06.rung_falls(950.0, 1000.0)
    assert l06.new_best(True, 1001.0, 1000.0) and not l06.new_best(True, 999.0, 1000.0)
    assert l06.ladder_stops(2) and l06.ladder_stops(3) and not l06.ladder_stops(1)


def test_lesson07_faster_above_1_1_and_threads_at_most_one(l07):
    assert l07.faster(1.101) and not l07.faster(1.1)
    assert l07.torchrun_limits_threads(0, "4") and l07.torchrun_limits_threads(1, "")
    assert not l07.torchrun_limits_threads(2, "1")


def test_lesson08_data_bound_above_a_tenth_and_spikes_over_half_a_step(l08):
    assert l08.bound(0.11) == "data-bound" and l08.bound(0.1) == "compute-bound"
    assert l08.average_tells_all(5.0, 10.0) and not l08.average_tells_all(5.01, 10.0)
    assert not l08.average_tells_all(10.0, 5.0)            # p99 over the step, not under it


# ---- lesson 09 ------------------------------------------------------------------------------

def test_lesson09_2_workers_x_prefetch_4_hold_8_batches_and_the_main_process_up_to_2_more(l09):
    # batches of 1 MB: 8.5 and 7.5 are 8 within half a batch; 10.5 is 8 + 2 held by the main process + half
    assert l09.in_flight(8_500_000, 1_000_000, 2, 4) is True and l09.in_flight(7_500_000, 1_000_000, 2, 4) is True
    assert l09.in_flight(8_510_000, 1_000_000, 2, 4) == "half right"
    assert l09.in_flight(10_500_000, 1_000_000, 2, 4) == "half right"
    assert l09.in_flight(10_510_000, 1_000_000, 2, 4) is False and l09.in_flight(7_490_000, 1_000_000, 2, 4) is False
    assert l09.in_flight(3_000_000, 1_000_000, 1, 2) == "half right"          # 1 worker x 2, and 1 held


def test_lesson09_a_fix_must_keep_under_80_percent_and_uint8_3_times_less(l09):
    assert l09.shrinks(799, 1000) and not l09.shrinks(800, 1000)
    assert not l09.shrinks(1000, 800)                                # the ratio the right way up
    assert l09.uint8_pays(300, 100) and not l09.uint8_pays(299, 100) and not l09.uint8_pays(100, 300)


def test_lesson09_a_dead_worker_reported_within_10_s_is_no_hang_and_a_3_s_timeout_may_take_5(l09):
    assert not l09.killed_worker_hangs(10.0) and l09.killed_worker_hangs(10.01)
    assert not l09.killed_worker_hangs(0.01)                         # fork: at once
    assert l09.timeout_ends_a_hang(5.0, 3) and not l09.timeout_ends_a_hang(5.01, 3)
    assert l09.only_ulimit([12, 29], 30) and not l09.only_ulimit([29, 30], 30)
