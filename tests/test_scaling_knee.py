"""course_utils.scaling: the worker grid (default_worker_counts), the knee (find_knee), the curve's
shape (describe_curve, CurveShape) and a WorkerSweep's read-outs, pinned on hand-worked values over
non-contiguous worker grids (an index is never its worker count) and on both sides of every
threshold. No timing: rates are made up."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

import course_utils.scaling as scaling
from course_utils.scaling import WorkerSweep, default_worker_counts, describe_curve, find_knee


def fake_sweep(workers, rates, label="fake"):
    """A WorkerSweep over stand-in measurements that only carry a samples/s."""
    return WorkerSweep(label, list(workers), [SimpleNamespace(samples_per_s=r) for r in rates])


# ---- default_worker_counts ---------------------------------------------------------------------

def test_default_grid_is_twice_the_usable_cpus_when_below_the_cap(monkeypatch):
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 3)
    assert default_worker_counts() == [0, 1, 2, 3, 4, 5, 6]           # top = 2 x 3 = 6


def test_default_grid_above_eight_keeps_the_usable_count_and_the_top(monkeypatch):
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 5)
    # top = 10: {0,1,2,3,4,6,8,10} + usable 5 + grid steps 8, 12 (12 > 10 dropped)
    counts = default_worker_counts()
    assert counts == [0, 1, 2, 3, 4, 5, 6, 8, 10]
    assert all(type(c) is int for c in counts)


def test_default_grid_is_capped_and_leaves_out_a_usable_count_above_the_cap(monkeypatch):
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 64)
    # top = min(128, 20) = 20; usable 64 > 20 left out; steps 8, 12, 16, 24 (> 20 dropped)
    assert default_worker_counts(cap=20) == [0, 1, 2, 3, 4, 6, 8, 12, 16, 20]
    # top = min(128, 32) = 32: steps 8, 12, 16, 24, 32 (48 dropped)
    counts = default_worker_counts()
    assert counts == [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert all(type(c) is int for c in counts)


def test_a_cap_of_one_is_allowed_and_gives_zero_and_one_worker(monkeypatch):
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 4)
    assert default_worker_counts(cap=1) == [0, 1]


def test_eight_workers_lists_every_count_nine_switches_to_the_grid(monkeypatch):
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 2)
    assert default_worker_counts(8) == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert default_worker_counts(9) == [0, 1, 2, 3, 4, 6, 8, 9]       # 5 and 7 skipped, usable 2 kept


def test_an_explicit_top_ignores_the_cap(monkeypatch):
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 2)
    assert default_worker_counts(3, cap=1) == [0, 1, 2, 3]


# ---- find_knee ---------------------------------------------------------------------------------

def test_knee_reports_the_worker_count_not_its_position():
    # grid 1, 3, 6, 12: 0.9 x 400 = 360; 3 workers give 200, 6 give 370 -> knee 6 (index 2)
    assert find_knee([1, 3, 6, 12], [100, 200, 370, 400]) == 6


def test_knee_sorts_an_unsorted_grid_with_its_rates():
    # sorted: 1 -> 100, 3 -> 380, 6 -> 400: 380 >= 360 -> 3
    assert find_knee([6, 1, 3], [400, 100, 380]) == 3


def test_knee_counts_a_rate_exactly_at_the_tolerance_as_reaching_it():
    # 0.5 x 100 = 50 exactly: 50 reaches it, 49 does not
    assert find_knee([1, 3, 6], [10, 50, 100], tolerance=0.5) == 3
    assert find_knee([1, 3, 6], [10, 49, 100], tolerance=0.5) == 6


def test_knee_uses_the_tolerance_given():
    rates = [100, 200, 300, 400]
    assert find_knee([2, 4, 8, 16], rates, tolerance=0.5) == 4    # 200 >= 200
    assert find_knee([2, 4, 8, 16], rates, tolerance=0.7) == 8    # 300 >= 280
    assert find_knee([2, 4, 8, 16], rates) == 16                 # 0.9: 300 < 360


def test_a_zero_rate_is_a_valid_point():
    # one point at 0 samples/s (a loader that stalled) is allowed while another is above 0
    assert find_knee([0, 2], [0.0, 5.0]) == 2


# ---- describe_curve and CurveShape --------------------------------------------------------------

def test_shape_numbers_on_a_non_contiguous_grid():
    # sorted grid 1, 3, 6, 12 -> 40, 100, 120, 90; best 120 at 6; 0.75 x 120 = 90:
    # knee = 3 (100 >= 90); last 90 is not below 90 -> plateau
    shape = describe_curve([12, 1, 6, 3], [90, 40, 120, 100], tolerance=0.75)
    assert (shape.kind, shape.knee, shape.knee_rate) == ("plateau", 3, 100.0)
    assert (shape.best_workers, shape.best_rate) == (6, 120.0)
    assert (shape.first_workers, shape.first_rate) == (1, 40.0)
    assert (shape.last_workers, shape.last_rate) == (12, 90.0)
    assert shape.tolerance == 0.75
    assert shape.speedup_at_knee == pytest.approx(2.5)            # 100 / 40, not 40 / 100


def test_peaked_and_plateau_sit_either_side_of_the_tolerance():
    # knee 3 (100 >= 0.5 x 100), best 100 at 3; the last point decides: 50 = 0.5 x 100 -> plateau
    assert describe_curve([1, 3, 6], [10, 100, 50], tolerance=0.5).kind == "plateau"
    assert describe_curve([1, 3, 6], [10, 100, 49], tolerance=0.5).kind == "peaked"


def test_peaked_is_judged_against_the_best_not_the_knee():
    # 0.9: best 200 at 6, knee 3 (190 >= 180). Last 175: below 0.9 x best (180) -> peaked, though
    # not below 0.9 x the knee's 190 (171); last 185 is above both -> plateau
    assert describe_curve([1, 3, 6, 12], [50, 190, 200, 175]).kind == "peaked"
    assert describe_curve([1, 3, 6, 12], [50, 190, 200, 185]).kind == "plateau"


def test_flat_when_the_fewest_workers_already_reach_the_tolerance():
    shape = describe_curve([2, 5, 7], [95, 100, 60])
    assert shape.kind == "flat" and shape.knee == 2
    assert "flat: 2 workers already give 95 samples/s" in str(shape)


def test_rising_when_only_the_most_workers_reach_it():
    shape = describe_curve([2, 5, 7], [10, 50, 100])
    assert shape.kind == "rising" and shape.knee == 7
    assert "only 7 workers" in str(shape)


def test_a_single_point_is_neither_flat_nor_rising():
    shape = describe_curve([4], [100])
    assert shape.kind == "plateau" and shape.knee == 4 and shape.speedup_at_knee == 1.0


def test_the_best_is_the_first_of_equal_best_rates():
    shape = describe_curve([1, 3, 6, 12], [10, 100, 100, 20])
    assert shape.best_workers == 3 and shape.kind == "peaked"


def test_speedup_at_knee_with_no_rate_at_the_fewest_workers_is_infinite():
    shape = describe_curve([0, 3, 6], [0.0, 100.0, 80.0])
    assert shape.knee == 3 and shape.speedup_at_knee == math.inf


def test_the_printed_shape_carries_the_hand_worked_figures():
    peaked = describe_curve([1, 3, 6, 12], [40, 100, 120, 30], tolerance=0.75)
    # knee 3: 100 / 40 = 2.50x; last 30 / best 120 = 25%
    assert str(peaked) == ("peaked: knee at 3 workers (100 samples/s, 2.50x 1 workers); best 120 "
                           "at 6, then falls to 30 at 12 workers (25% of the best)")
    plateau = describe_curve([1, 3, 6], [40, 100, 110], tolerance=0.75)
    assert str(plateau) == ("plateau: knee at 3 workers (100 samples/s, 2.50x 1 workers); best 110 "
                            "at 6; 6 workers give 110")
    flat = describe_curve([1, 3], [1900, 2000])
    assert str(flat) == ("flat: 1 workers already give 1,900 samples/s, within 90% of the best "
                         "(2,000 at 3); more workers do not help")
    rising = describe_curve([1, 3], [1000, 2000])
    assert str(rising) == ("still rising: only 3 workers (the most measured) reach 90% of the best "
                           "(2,000 samples/s); measure more workers")


# ---- WorkerSweep read-outs ---------------------------------------------------------------------

def test_a_sweep_reads_its_points_by_worker_count():
    sweep = fake_sweep([1, 3, 6], [40, 100, 90])
    assert sweep.at(3) is sweep.measurements[1] and sweep.at(6) is sweep[2]
    assert len(sweep) == 3 and list(sweep) == sweep.measurements
    assert sweep.samples_per_s == [40, 100, 90]
    with pytest.raises(ValueError, match="2 workers were not measured"):
        sweep.at(2)


def test_a_sweep_speedups_are_over_its_first_point():
    sweep = fake_sweep([1, 3, 6], [40, 100, 90])
    assert sweep.speedups() == pytest.approx([1.0, 2.5, 2.25])     # 100/40, 90/40


def test_a_sweep_with_no_rate_at_its_first_point_has_no_speedups():
    speedups = fake_sweep([0, 3], [0.0, 100.0]).speedups()
    assert all(math.isnan(s) for s in speedups)


def test_a_sweep_passes_its_tolerance_to_the_knee_and_shape():
    sweep = fake_sweep([1, 3, 6], [10, 50, 100])
    assert sweep.knee() == 6 and sweep.knee(0.5) == 3
    assert sweep.shape().kind == "rising"
    shape = sweep.shape(0.5)
    assert shape.kind == "plateau" and shape.knee == 3 and shape.tolerance == 0.5


# ---- added after the first mutation run: thresholds just inside, and who is named in errors ----

def test_rates_below_one_sample_per_second_are_a_curve():
    # a slow pipeline: 0.2 and 0.5 samples/s; 0.9 x 0.5 = 0.45 -> knee 3
    assert find_knee([1, 3], [0.2, 0.5]) == 3


def test_describe_curve_counts_a_rate_exactly_at_the_tolerance_as_the_knee():
    # 0.5 x 100 = 50 exactly: the knee is 3, not 6
    assert describe_curve([1, 3, 6], [10, 50, 100], tolerance=0.5).knee == 3


def test_speedups_over_a_first_rate_below_one():
    assert fake_sweep([1, 3], [0.5, 2.0]).speedups() == pytest.approx([1.0, 4.0])   # 2 / 0.5


@pytest.mark.parametrize("call, message", [
    (lambda: find_knee([0, 1], [1.0, 2.0], 1.5), "^find_knee: tolerance"),
    (lambda: describe_curve([0, 1], [1.0, 2.0], 0.0), "^describe_curve: tolerance"),
    (lambda: default_worker_counts(cap=0), "^default_worker_counts: cap=0"),
    (lambda: default_worker_counts(-2), "^default_worker_counts: max_workers=-2"),
])
def test_bad_arguments_are_named_with_their_function(call, message):
    with pytest.raises(ValueError, match=message):
        call()
