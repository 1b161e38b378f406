"""Tests for course_utils.plots: what is drawn, with which numbers, and bad input."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # this test module only: no display needed

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from course_utils.measurement import Measurement  # noqa: E402
from course_utils.machine import machine_summary  # noqa: E402
from course_utils.config import QUICK_ENV, QUICK_STAMP  # noqa: E402
from course_utils.plots import figure_title, plot_curve, plot_measurements  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _m(label, times, items=6, settings=None, **kw):
    return Measurement.from_times(label, times, items, settings=settings, machine="test", **kw)


def test_figure_title_has_title_machine_and_settings(monkeypatch):
    monkeypatch.setenv(QUICK_ENV, "0")
    text = figure_title("Throughput", {"num_workers": 2, "pin_memory": True})
    lines = text.splitlines()
    assert lines[0] == "Throughput"
    assert lines[1] == machine_summary()
    assert "num_workers=2, pin_memory=True" in lines[2]
    assert figure_title("T").splitlines() == ["T", machine_summary()]
    assert figure_title(text) == text                       # a made title is kept as it is
    with pytest.raises(TypeError, match="settings"):
        figure_title("T", settings=[("a", 1)])
    with pytest.raises(TypeError, match="title"):
        figure_title(None)


def test_quick_mode_is_stamped_on_every_title_once_and_only_in_quick_mode(monkeypatch):
    monkeypatch.setenv(QUICK_ENV, "1")
    quick = figure_title("T", {"a": 1})
    assert quick.splitlines() == ["T", QUICK_STAMP, machine_summary(), "a=1"]
    assert figure_title(quick) == quick and quick.count(QUICK_STAMP) == 1
    ax = plot_curve([1, 3], {"x": [1.0, 2.0]}, xlabel="w", ylabel="r", title="Curve")
    assert QUICK_STAMP in ax.get_title(loc="left")
    ax = plot_measurements([_m("a", [1.0, 2.0])])
    assert QUICK_STAMP in ax.get_title(loc="left")
    monkeypatch.setenv(QUICK_ENV, "0")
    assert QUICK_STAMP not in figure_title("T") and "QUICK" not in figure_title("T")
    ax = plot_curve([1, 3], {"x": [1.0, 2.0]}, xlabel="w", ylabel="r", title="Curve")
    assert "QUICK" not in ax.get_title(loc="left")


def test_plot_measurements_bars_and_iqr_spread_in_samples_per_s():
    # times 1, 2, 3 s for 6 samples: median 2 s -> 3 samples/s; quartiles 1.5 / 2.5 s
    # -> spread from 6/2.5 = 2.4 to 6/1.5 = 4 samples/s
    a = _m("a", [1.0, 2.0, 3.0], settings={"num_workers": 0, "batch_size": 8})
    b = _m("b", [1.0, 1.0, 1.0], settings={"num_workers": 2, "batch_size": 8})
    ax = plot_measurements([a, b])
    assert isinstance(ax, Axes)
    widths = [p.get_width() for p in ax.patches]
    assert widths == pytest.approx([3.0, 6.0])
    from matplotlib.container import BarContainer

    bars = next(c for c in ax.containers if isinstance(c, BarContainer))
    segments = bars.errorbar.lines[2][0].get_segments()
    xs = sorted(segments[0][:, 0])
    assert xs == pytest.approx([2.4, 4.0])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    title = ax.get_title(loc="left")
    assert title.startswith("Throughput") and machine_summary() in title
    assert "batch_size=8" in title and "num_workers" not in title  # only shared settings
    assert "samples per second" in ax.get_xlabel()


def test_plot_measurements_other_metrics_and_baseline():
    a = _m("slow", [2.0] * 3, cpu_s_per_sample=0.004)
    b = _m("fast", [1.0] * 3, cpu_s_per_sample=0.001)
    ax = plot_measurements([a, b], baseline=0, title="My pipeline")
    labels = " ".join(t.get_text() for t in ax.texts)
    assert "2.00x" in labels and "1.00x" in labels
    assert ax.get_title(loc="left").startswith("My pipeline")
    ax = plot_measurements([a, b], metric="cpu_s_per_sample")
    assert [p.get_width() for p in ax.patches] == pytest.approx([4.0, 1.0])  # in ms
    ax = plot_measurements([a, b], metric="median_s")
    assert [p.get_width() for p in ax.patches] == pytest.approx([2.0, 1.0])
    # a metric nobody measured is drawn as "not measured", not as a crash
    ax = plot_measurements([a], metric="peak_uss_bytes")
    assert "not measured" in " ".join(t.get_text() for t in ax.texts)


def test_plot_measurements_draws_on_a_given_axes():
    fig, axes = plt.subplots(1, 2)
    out = plot_measurements([_m("a", [1.0] * 3)], ax=axes[1])
    assert out is axes[1] and len(axes[0].patches) == 0


@pytest.mark.parametrize("args, kwargs, exc, word", [
    (([],), {}, ValueError, "empty"),
    ((["x"],), {}, TypeError, "Measurement"),
    (([_m("a", [1.0] * 3)],), {"metric": "speed"}, ValueError, "metric"),
    (([_m("a", [1.0] * 3)],), {"baseline": 3}, ValueError, "baseline"),
])
def test_plot_measurements_bad_input(args, kwargs, exc, word):
    with pytest.raises(exc, match=word):
        plot_measurements(*args, **kwargs)


def test_plot_curve_lines_labels_and_title():
    x = [0, 1, 2, 4]
    ys = {"cpu heavy": [10, 19, 35, 36], "latency bound": [5, 10, 20, None]}
    ax = plot_curve(x, ys, xlabel="num_workers", ylabel="samples/s", title="Scaling",
                    settings={"batch_size": 32})
    assert isinstance(ax, Axes)
    assert [line.get_label() for line in ax.lines] == ["cpu heavy", "latency bound"]
    assert list(ax.lines[0].get_xdata()) == x
    assert np.isnan(ax.lines[1].get_ydata()[-1])  # None -> a gap, not a zero
    assert ax.get_xlabel() == "num_workers" and ax.get_ylabel() == "samples/s"
    title = ax.get_title(loc="left")
    assert title.startswith("Scaling") and machine_summary() in title and "batch_size=32" in title
    assert ax.get_legend() is not None


def test_plot_curve_log_axis_and_prebuilt_title():
    made = figure_title("Copy bandwidth", {"pinned": True})
    ax = plot_curve([1, 2, 4, 8], {"GB/s": [1, 2, 3, 3]}, xlabel="MB", ylabel="GB/s",
                    title=made, logx=True)
    assert ax.get_xscale() == "log"
    assert ax.get_title(loc="left") == made  # not wrapped twice
    assert ax.get_legend() is None  # a single series needs no legend
