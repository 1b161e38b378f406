"""course_utils.scaling: what sweep_workers asks of each measure_loader window (its loader's
options, warm-up, timed batches rounded to whole rounds and cut to the epoch) and what plot_sweeps
draws (values, scale, knee stars, usable-CPU line). measure_loader is replaced by a recorder, so
no loader is iterated and nothing is timed."""
from __future__ import annotations

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest

import course_utils.scaling as scaling
from course_utils.measurement import Measurement
from course_utils.scaling import WorkerSweep, _timed_batches, plot_sweeps, sweep_workers

from _helpers import TinyDataset


@pytest.fixture
def windows(monkeypatch):
    """Every measure_loader call sweep_workers makes, as (loader, keyword arguments)."""
    calls = []

    def record(loader, **kwargs):
        calls.append((loader, kwargs))
        return SimpleNamespace(samples_per_s=100.0 * (len(calls)), label=kwargs["label"])

    monkeypatch.setattr(scaling, "measure_loader", record)
    return calls


# ---- _timed_batches ----------------------------------------------------------------------------

def test_timed_batches_round_up_to_whole_rounds_of_workers():
    assert _timed_batches(5, 3, 100, 2) == 6       # ceil(5 / 3) = 2 rounds of 3
    assert _timed_batches(6, 3, 100, 2) == 6       # already whole
    assert _timed_batches(7, 6, 100, 0) == 12      # 2 rounds of 6


def test_timed_batches_without_workers_or_with_one_are_the_target():
    assert _timed_batches(5, 0, 100, 2) == 5
    assert _timed_batches(5, 1, 100, 2) == 5


def test_timed_batches_are_cut_to_whole_rounds_of_what_the_epoch_leaves():
    # 12 wanted, 3 workers; 14 batches - 2 warm-up = 12 left: all fit
    assert _timed_batches(12, 3, 14, 2) == 12
    # 13 batches - 2 = 11 left: 12 does not fit, 11 // 3 = 3 rounds = 9
    assert _timed_batches(12, 3, 13, 2) == 9
    # the warm-up counts: 14 - 4 = 10 left -> 3 rounds = 9
    assert _timed_batches(12, 3, 14, 4) == 9


def test_one_timed_batch_is_enough_none_is_refused():
    assert _timed_batches(1, 1, 3, 2) == 1          # 3 - 2 = 1 left: one round of 1
    assert _timed_batches(1, 0, 3, 2) == 1
    with pytest.raises(ValueError, match="with 2 workers the epoch has 3 batches; a warm-up of 2 "
                                         "leaves not one round of 2"):
        _timed_batches(1, 2, 3, 2)


# ---- sweep_workers: the windows it asks for ---------------------------------------------------

def test_sweep_measures_the_counts_in_order_with_their_own_rounds(windows):
    sweep = sweep_workers(TinyDataset(400), [6, 1, 3], batch_size=2, batches=5, warmup_batches=1,
                          repeats=4, progress=False, label="tiny")
    assert sweep.workers == [1, 3, 6]
    asked = [(loader.num_workers, kw["batches"], kw["warmup_batches"], kw["repeats"], kw["label"],
              kw["progress"]) for loader, kw in windows]
    assert asked == [(1, 5, 1, 4, "tiny, 1 workers", False),       # 5 rounds of 1
                     (3, 6, 1, 4, "tiny, 3 workers", False),       # 2 rounds of 3
                     (6, 6, 1, 4, "tiny, 6 workers", False)]       # 1 round of 6
    assert sweep.label == "tiny"
    assert sweep.settings == {"batch_size": 2, "repeats": 4, "batches": 5}
    assert sweep.at(3) is sweep.measurements[1] and sweep.at(3).samples_per_s == 200.0


def test_sweep_labels_by_the_dataset_class_without_a_label(windows):
    sweep = sweep_workers(TinyDataset(40), [0], batch_size=2, batches=3, repeats=1, progress=True)
    assert sweep.label == "TinyDataset"
    assert windows[0][1]["label"] == "TinyDataset, 0 workers" and windows[0][1]["progress"] is True


def test_sweep_cuts_the_window_to_the_epoch_with_and_without_drop_last(windows):
    # 22 samples in batches of 4: 6 batches (the last short), 5 with drop_last; 1 warm-up
    sweep_workers(TinyDataset(22), [0], batch_size=4, batches=8, warmup_batches=1, repeats=1,
                  progress=False)
    sweep_workers(TinyDataset(22), [0], batch_size=4, batches=8, warmup_batches=1, repeats=1,
                  progress=False, drop_last=True)
    assert [kw["batches"] for _, kw in windows] == [5, 4]
    assert windows[1][0].drop_last is True and windows[1][0].batch_size == 4


def test_sweep_warm_up_default_is_the_batches_in_flight_and_zero_is_kept(windows):
    sweep_workers(TinyDataset(400), [0, 3], batch_size=2, batches=6, repeats=1, progress=False,
                  prefetch_factor=3)
    sweep_workers(TinyDataset(400), [3], batch_size=2, batches=6, warmup_batches=0, repeats=1,
                  progress=False)
    # default: max(2, workers x prefetch_factor) -> 2 at 0 workers, 9 at 3; an explicit 0 stays 0
    assert [kw["warmup_batches"] for _, kw in windows] == [2, 9, 0]


def test_sweep_gives_workers_a_timeout_and_their_options_and_drops_them_at_zero(windows):
    sweep_workers(TinyDataset(400), [0, 2], batch_size=2, batches=4, repeats=1, progress=False,
                  timeout_s=7.5, prefetch_factor=4, persistent_workers=True,
                  multiprocessing_context="spawn", pin_memory=False)
    (zero, _), (two, _) = windows
    assert two.timeout == 7.5 and two.prefetch_factor == 4 and two.persistent_workers is True
    assert two.multiprocessing_context is not None
    assert zero.timeout == 0 and zero.prefetch_factor is None and zero.persistent_workers is False
    assert zero.multiprocessing_context is None


def test_sweep_defaults_follow_quick_mode(windows, monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "0")
    full = sweep_workers(TinyDataset(4000), [0], batch_size=2, warmup_batches=0, progress=False)
    monkeypatch.setenv("COURSE_QUICK", "1")
    quick = sweep_workers(TinyDataset(4000), [0], batch_size=2, warmup_batches=0, progress=False)
    assert [(kw["batches"], kw["repeats"]) for _, kw in windows] == [(48, 3), (16, 2)]
    assert full.settings == {"batch_size": 2, "repeats": 3, "batches": 48}
    assert quick.settings == {"batch_size": 2, "repeats": 2, "batches": 16}


def test_sweep_default_counts_come_from_the_usable_cpus(windows, monkeypatch):
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 1)
    sweep = sweep_workers(TinyDataset(400), batch_size=2, batches=2, repeats=1, progress=False)
    assert sweep.workers == [0, 1, 2]                                 # 0 .. 2 x 1


def test_sweep_accepts_the_smallest_settings(windows):
    sweep = sweep_workers(TinyDataset(3), [1], batch_size=1, batches=1, warmup_batches=0,
                          repeats=1, progress=False)
    assert windows[0][1]["batches"] == 1 and windows[0][0].batch_size == 1 and len(sweep) == 1


@pytest.mark.parametrize("option", ["num_workers", "timeout"])
def test_sweep_refuses_loader_options_it_sets_itself(windows, option):
    with pytest.raises(ValueError, match=f"pass {option} through its own argument"):
        sweep_workers(TinyDataset(40), [0], progress=False, **{option: 1})
    assert windows == []


@pytest.mark.parametrize("kwargs, message", [({"batches": 0}, "batches"),
                                             ({"timeout_s": -1}, "timeout_s")])
def test_sweep_refuses_bad_sizes(windows, kwargs, message):
    with pytest.raises(ValueError, match=message):
        sweep_workers(TinyDataset(40), [0], progress=False, **kwargs)


# ---- plot_sweeps -------------------------------------------------------------------------------

def _rows(rates, cpu=None):
    """Measurements of 1 s each with ``rate`` samples, at a CPU cost of ``cpu`` s/sample."""
    return [Measurement.from_times(f"{r}", [1.0, 1.0, 1.0], r, machine="m",
                                   cpu_s_per_sample=None if cpu is None else cpu[i])
            for i, r in enumerate(rates)]


def test_plot_stars_each_knee_at_its_worker_count_and_value(monkeypatch):
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 5)
    a = WorkerSweep("a", [1, 3, 6], _rows([40, 100, 120]))      # 0.9 x 120 = 108: knee 6
    b = WorkerSweep("b", [1, 3, 6], _rows([50, 200, 210]))      # 0.9 x 210 = 189: knee 3
    ax = plot_sweeps([a, b], metric="samples_per_s")
    line_a, line_b, star_a, star_b = ax.get_lines()[:4]
    assert list(star_a.get_xdata()) == [6] and list(star_a.get_ydata()) == [120]
    assert list(star_b.get_xdata()) == [3] and list(star_b.get_ydata()) == [200]
    assert star_a.get_color() == line_a.get_color() and star_b.get_color() == line_b.get_color()
    vline = ax.get_lines()[4]
    assert list(vline.get_xdata()) == [5, 5] and vline.get_label() == "5 usable CPUs"
    assert list(ax.get_xticks()) == [1, 3, 6]
    assert ax.get_legend().get_title().get_text() == "star: knee (90% of best)"
    plt.close(ax.figure)


def test_plot_uses_the_tolerance_given_for_its_stars():
    sweep = WorkerSweep("a", [1, 3, 6], _rows([40, 100, 120]))
    ax = plot_sweeps(sweep, tolerance=0.8)                       # 0.8 x 120 = 96: knee 3
    star = ax.get_lines()[1]
    assert list(star.get_xdata()) == [3] and list(star.get_ydata()) == [2.5]    # 100 / 40
    assert ax.get_legend().get_title().get_text() == "star: knee (80% of best)"
    plt.close(ax.figure)


def test_plot_cpu_per_sample_in_milliseconds_with_gaps_where_unmeasured():
    measured = WorkerSweep("a", [1, 3, 6], _rows([40, 100, 120], cpu=[0.002, 0.004, 0.0005]))
    ax = plot_sweeps(measured, metric="cpu_s_per_sample")
    assert np.allclose(ax.get_lines()[0].get_ydata(), [2.0, 4.0, 0.5])    # s -> ms: x 1000
    assert "CPU ms per sample" in ax.get_ylabel()
    plt.close(ax.figure)
    ax = plot_sweeps(WorkerSweep("b", [1, 3], _rows([40, 100])), metric="cpu_s_per_sample")
    assert np.isnan(ax.get_lines()[0].get_ydata()).all()
    plt.close(ax.figure)


def test_plot_draws_on_the_axes_given_with_its_title():
    fig, ax = plt.subplots()
    out = plot_sweeps([WorkerSweep("a", [1, 3], _rows([40, 100]))], ax=ax, title="mine")
    assert out is ax and ax.get_title(loc="left").startswith("mine")
    plt.close(fig)
    ax = plot_sweeps([WorkerSweep("a", [1, 3], _rows([40, 100]))])
    assert ax.get_title(loc="left").startswith("Throughput vs num_workers")
    plt.close(ax.figure)


# ---- added after the first mutation run --------------------------------------------------------

def test_sweep_defaults_batch_size_timeout_and_progress(windows, monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    sweep_workers(TinyDataset(4000), [0, 2], batches=2, warmup_batches=0, repeats=1)
    (_, zero), (two, two_kw) = windows
    assert two.batch_size == 32 and two.timeout == 120.0 and two_kw["progress"] is True


def test_sweep_cut_to_a_short_epoch_is_a_whole_number_of_batches(windows):
    sweep_workers(TinyDataset(22), [0], batch_size=4, batches=8, warmup_batches=1, repeats=1,
                  progress=False, drop_last=True)
    assert type(windows[0][1]["batches"]) is int


def test_sweep_needs_both_len_and_getitem(windows):
    class OnlyLen:
        def __len__(self):
            return 10

    with pytest.raises(TypeError, match="map-style Dataset"):
        sweep_workers(OnlyLen(), [0], progress=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"worker_counts": [0, -1]}, r"^sweep_workers: worker_counts\[i\]=-1"),
    ({"batch_size": 0}, "^sweep_workers: batch_size=0"),
    ({"timeout_s": 0}, "^sweep_workers: timeout_s"),
    ({"batches": 0}, "^sweep_workers: batches=0"),
    ({"warmup_batches": -1}, "^sweep_workers: warmup_batches=-1"),
])
def test_sweep_names_itself_and_the_argument_before_measuring(windows, kwargs, message):
    kwargs.setdefault("worker_counts", [0])
    with pytest.raises(ValueError, match=message):
        sweep_workers(TinyDataset(40), progress=False, **kwargs)
    assert windows == []


def test_sweep_progress_bar_is_named_after_the_dataset_and_cleared(windows, monkeypatch):
    import tqdm.auto

    bars = []

    def bar(iterable, **kwargs):
        bars.append(kwargs)
        return iter(iterable)

    monkeypatch.setattr(tqdm.auto, "tqdm", bar)
    sweep_workers(TinyDataset(40), [0], batch_size=2, batches=2, repeats=1, progress=False,
                  label="a dataset with a very long name, longer than forty")
    sweep_workers(TinyDataset(40), [0], batch_size=2, batches=2, repeats=1)
    long_name, default = bars
    # "<label> sweep" cut to 40 characters; one bar point per worker count; left on screen: no
    assert long_name == {"desc": "a dataset with a very long name, longer ", "unit": "point",
                         "disable": True, "leave": False}
    assert default == {"desc": "TinyDataset sweep", "unit": "point", "disable": False,
                       "leave": False}


def test_sweep_hides_only_torchs_too_many_workers_warning(monkeypatch):
    import warnings

    def warn(loader, **kwargs):
        warnings.warn("This DataLoader will create 64 worker processes in total.", UserWarning)
        warnings.warn("a window of 2 batches is too short", UserWarning)
        return SimpleNamespace(samples_per_s=1.0)

    monkeypatch.setattr(scaling, "measure_loader", warn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sweep_workers(TinyDataset(40), [0], batch_size=2, batches=2, repeats=1, progress=False)
    assert [str(w.message) for w in caught] == ["a window of 2 batches is too short"]


def test_plot_draws_the_stars_and_the_cpu_line_as_its_legend_says(monkeypatch):
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 3)
    ax = plot_sweeps(WorkerSweep("a", [1, 3, 6], _rows([40, 100, 120])))
    curve, star, vline = ax.get_lines()[:3]
    assert (star.get_marker(), star.get_markersize(), star.get_linestyle()) == ("*", 16, "None")
    assert star.get_markeredgecolor() == "black" and star.get_color() == curve.get_color()
    assert (vline.get_color(), vline.get_linestyle(), vline.get_linewidth()) == ("gray", "--", 1)
    legend = ax.get_legend()
    assert legend.get_title().get_fontsize() == 8 and legend.get_texts()[0].get_fontsize() == 8
    plt.close(ax.figure)
