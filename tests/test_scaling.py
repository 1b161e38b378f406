"""course_utils.scaling: worker counts, the knee and the curve's shape, the workers sweep and its
plot: behaviour, structure and bad input, never speed claims."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

from course_utils import compare
from course_utils.measurement import Measurement
from course_utils.scaling import (CurveShape, WorkerSweep, default_worker_counts, describe_curve,
                                  find_knee, plot_sweeps, sweep_workers)

from _helpers import TinyDataset

pytestmark = pytest.mark.timeout(120)


# ---- worker counts ---------------------------------------------------------------------------

def test_default_worker_counts_small_machines_list_every_count():
    assert default_worker_counts(4) == [0, 1, 2, 3, 4]
    assert default_worker_counts(0) == [0]


def test_default_worker_counts_default_is_twice_usable_capped(monkeypatch):
    import course_utils.scaling as scaling

    monkeypatch.setattr(scaling, "usable_cpus", lambda: 2)
    assert default_worker_counts() == [0, 1, 2, 3, 4]
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 64)
    counts = default_worker_counts()
    assert counts[0] == 0 and counts[-1] == 32 and counts == sorted(set(counts))
    assert len(counts) <= 12
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 10)
    counts = default_worker_counts()
    assert counts[-1] == 20 and 10 in counts


@pytest.mark.parametrize("kwargs, error", [({"max_workers": -1}, ValueError),
                                           ({"max_workers": 2.5}, TypeError),
                                           ({"cap": 0}, ValueError)])
def test_default_worker_counts_bad_input(kwargs, error):
    with pytest.raises(error, match="default_worker_counts"):
        default_worker_counts(**kwargs)


# ---- the knee -------------------------------------------------------------------------------

def test_find_knee_smallest_count_within_tolerance():
    workers = [0, 1, 2, 3, 4, 5, 6]
    rates = [100, 95, 190, 280, 300, 310, 305]
    assert find_knee(workers, rates) == 3          # 280 >= 0.9 * 310
    assert find_knee(workers, rates, tolerance=0.95) == 4
    assert find_knee(workers, rates, tolerance=1.0) == 5  # the best itself


def test_find_knee_accepts_unsorted_numpy_and_grids():
    workers = np.array([8, 0, 2, 1, 4])
    rates = np.array([400.0, 100.0, 200.0, 100.0, 390.0])
    assert find_knee(workers, rates) == 4
    assert isinstance(find_knee(workers, rates), int)


def test_find_knee_flat_curve_gives_fewest_workers():
    assert find_knee([0, 1, 2], [1000, 600, 700]) == 0


@pytest.mark.parametrize("workers, rates", [
    ([], []), ([0, 1], [1.0]), ([0, 0], [1.0, 2.0]), ([-1, 1], [1.0, 2.0]), ([0.5, 1], [1.0, 2.0]),
    ([True, 2], [1.0, 2.0]), ([0, 1], [1.0, float("nan")]), ([0, 1], [1.0, float("inf")]),
    ([0, 1], [1.0, -2.0]), ([0, 1], [0.0, 0.0]), ([0, 1], [1.0, "2"]),
])
def test_find_knee_bad_curves_are_clear_errors(workers, rates):
    with pytest.raises(ValueError, match=r"find_knee: pass distinct worker counts .* got workers="):
        find_knee(workers, rates)
    with pytest.raises(ValueError, match="describe_curve: pass distinct"):
        describe_curve(workers, rates)


@pytest.mark.parametrize("tolerance", [0.0, 1.5, "high"])
def test_find_knee_tolerance_is_a_fraction(tolerance):
    with pytest.raises(ValueError, match="tolerance"):
        find_knee([0, 1], [1.0, 2.0], tolerance)


def test_find_knee_type_errors_name_the_arguments():
    with pytest.raises(TypeError, match="workers and rates must be sequences"):
        find_knee([0, 1], 5)


@pytest.mark.parametrize("rates, kind", [
    ([100, 95, 190, 200, 205], "plateau"),
    ([100, 95, 190, 280, 380], "rising"),
    ([1000, 400, 500, 520, 510], "flat"),
    ([100, 95, 190, 280, 150], "peaked"),
])
def test_describe_curve_kinds(rates, kind):
    shape = describe_curve([0, 1, 2, 3, 4], rates)
    assert isinstance(shape, CurveShape)
    assert shape.kind == kind
    assert shape.knee == find_knee([0, 1, 2, 3, 4], rates)
    assert shape.best_rate == max(rates)
    assert kind.split()[0] in str(shape) or "knee" in str(shape)


def test_describe_curve_numbers():
    shape = describe_curve([0, 1, 2, 3], [100, 90, 200, 150])
    assert shape.kind == "peaked" and shape.knee == 2 and shape.best_workers == 2
    assert shape.speedup_at_knee == pytest.approx(2.0)
    assert "75%" in str(shape)


# ---- sweeping ---------------------------------------------------------------------------------

def test_sweep_workers_structure():
    sweep = sweep_workers(TinyDataset(64), [1, 0], batch_size=4, batches=4, repeats=1, progress=False,
                          label="tiny", prefetch_factor=2)
    assert isinstance(sweep, WorkerSweep)
    assert sweep.workers == [0, 1] and len(sweep) == 2
    assert all(isinstance(m, Measurement) for m in sweep)
    assert sweep.at(1) is sweep[1]
    assert sweep[0].settings["num_workers"] == 0 and sweep[1].settings["num_workers"] == 1
    assert sweep[1].settings["prefetch_factor"] == 2
    assert sweep.knee() in (0, 1)
    assert sweep.speedups()[0] == pytest.approx(1.0)
    assert compare(sweep).rows == sweep.measurements
    with pytest.raises(ValueError, match="were not measured"):
        sweep.at(7)


def test_a_sweep_prints_the_comparison_table_and_its_shape():
    rows = [Measurement.from_times(f"tiny, {w} workers", [1.0, 1.0, 1.0], n, machine="m")
            for w, n in ((0, 100), (1, 190), (2, 200))]
    text = str(WorkerSweep("tiny", [0, 1, 2], rows))
    assert text.startswith("tiny: samples/s vs num_workers\n")
    assert str(compare(rows)) in text                     # the core's table, ratios to 0 workers
    assert "1.90x" in text and text.endswith(str(describe_curve([0, 1, 2], [100, 190, 200])))


def test_sweep_workers_warms_up_every_batch_in_flight(monkeypatch):
    import course_utils.scaling as scaling

    asked = []
    real = scaling.measure_loader

    def spy(loader, **kwargs):
        asked.append((loader.num_workers, kwargs["warmup_batches"], kwargs["batches"]))
        return real(loader, **kwargs)

    monkeypatch.setattr(scaling, "measure_loader", spy)
    sweep_workers(TinyDataset(120), [0, 3], batch_size=2, batches=4, repeats=1, progress=False,
                  prefetch_factor=3)
    # default_warmup: max(2, workers x prefetch_factor); 4 timed rounded up to whole rounds of 3
    assert asked == [(0, 2, 4), (3, 9, 6)]


def test_sweep_workers_rounds_timed_batches_to_whole_rounds():
    sweep = sweep_workers(TinyDataset(200), [3], batch_size=4, batches=4, repeats=1, progress=False)
    assert sweep[0].items_per_repeat == 6 * 4  # 4 rounded up to 2 rounds of 3 workers


@pytest.mark.parametrize("kwargs, error, message", [
    ({"worker_counts": []}, ValueError, "each count once"),
    ({"worker_counts": [1, 1]}, ValueError, "each count once"),
    ({"worker_counts": [-1]}, ValueError, "worker_counts"),
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"warmup_batches": -1}, ValueError, "warmup_batches"),
    ({"num_workers": 2}, ValueError, "num_workers"),
    ({"timeout_s": 0}, ValueError, "timeout_s"),
])
def test_sweep_workers_bad_input(kwargs, error, message):
    kwargs.setdefault("worker_counts", [0])
    with pytest.raises(error, match=message):
        sweep_workers(TinyDataset(32), progress=False, **kwargs)


def test_sweep_workers_rejects_non_datasets_and_tiny_epochs():
    with pytest.raises(TypeError, match="map-style Dataset"):
        sweep_workers(iter(range(3)), [0], progress=False)
    with pytest.raises(ValueError, match="bigger dataset"):
        sweep_workers(TinyDataset(8), [4], batch_size=4, progress=False)


def test_plot_sweeps_draws_each_curve_and_stars_its_knee():
    import matplotlib.pyplot as plt

    rows = [Measurement.from_times(f"{w} workers", [1.0] * 3, n, machine="m")
            for w, n in ((0, 100), (1, 300), (2, 310))]
    sweep = WorkerSweep("tiny", [0, 1, 2], rows, {"batch_size": 4})
    for metric, ys in (("speedup", [1.0, 3.0, 3.1]), ("samples_per_s", [100, 300, 310]),
                       ("cpu_s_per_sample", [np.nan] * 3)):
        ax = plot_sweeps([sweep], metric=metric)
        curve, star = ax.get_lines()[:2]
        assert np.allclose(curve.get_ydata(), ys, equal_nan=True)
        assert list(star.get_xdata()) == [1] and star.get_marker() == "*"    # 300 >= 0.9 x 310
        assert ax.get_xlabel() == "num_workers" and "batch_size=4" in ax.get_title(loc="left")
        plt.close(ax.figure)
    with pytest.raises(ValueError, match="metric"):
        plot_sweeps([sweep], metric="speed")
    with pytest.raises(TypeError, match="WorkerSweep"):
        plot_sweeps([1, 2])
    with pytest.raises(TypeError, match="same worker counts"):
        plot_sweeps([sweep, WorkerSweep("other", [0, 1], rows[:2])])
