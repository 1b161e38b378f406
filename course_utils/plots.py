"""Plots a person would rather read than a table: machine and settings always in the title.

Every function draws on the Axes you pass (or a new figure's), returns the Axes and never calls
``plt.show()``, so it works under any backend (Jupyter inline, Agg in tests).
Nothing happens at import time.
"""
from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .machine import machine_summary
from .measurement import METRICS, Comparison, Measurement

__all__ = ["figure_title", "plot_measurements", "plot_curve"]

_METRIC_LABELS = {
    "samples_per_s": "samples per second (higher is better)",
    "median_s": "seconds per repeat, median (lower is better)",
    "cpu_s_per_sample": "CPU milliseconds per sample, whole process tree (lower is better)",
    "involuntary_ctx_switches": "involuntary context switches (lower is better)",
    "peak_uss_bytes": "peak USS, MB (lower is better)",
    "peak_pss_bytes": "peak PSS, MB (lower is better)",
}
_METRIC_TITLES = {
    "samples_per_s": "Throughput",
    "median_s": "Time per repeat",
    "cpu_s_per_sample": "CPU cost per sample",
    "involuntary_ctx_switches": "Involuntary context switches",
    "peak_uss_bytes": "Peak private memory (USS)",
    "peak_pss_bytes": "Peak proportional memory (PSS)",
}
# displayed value = stored value * scale
_METRIC_SCALE = {"cpu_s_per_sample": 1e3, "peak_uss_bytes": 1e-6, "peak_pss_bytes": 1e-6}


def _machine() -> str:
    return machine_summary()


def figure_title(title: str, settings: Mapping | None = None) -> str:
    """``title``, then the one-line machine summary, then ``k=v, ...`` for ``settings``.

    Long settings lines are wrapped so the title stays readable above a plot.
    """
    if not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}.")
    if settings is not None and not isinstance(settings, Mapping):
        raise TypeError(f"settings must be a dict of names to values (or None), got "
                        f"{type(settings).__name__}.")
    lines = [title, _machine()]
    if settings:
        text = ", ".join(f"{k}={v}" for k, v in settings.items())
        lines += textwrap.wrap(text, width=100)
    return "\n".join(lines)


def _title(title: str, settings: Mapping | None) -> str:
    # a title already made by figure_title is used as it is
    machine = _machine()
    return title if machine in title else figure_title(title, settings)


def _new_axes(ax: Any, figsize: tuple[float, float]) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt  # lazy: kept out of `import course_utils` (workers)

    _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _common_settings(measurements: Sequence[Any]) -> dict:
    """Settings with the same value in every measurement (the rest differ between bars)."""
    if not measurements:
        return {}
    first = dict(measurements[0].settings)
    common = {}
    for k, v in first.items():
        try:
            if all(k in m.settings and m.settings[k] == v for m in measurements[1:]):
                common[k] = v
        except Exception:  # values that cannot be compared
            continue
    return common


def plot_measurements(measurements: Sequence[Any], *, metric: str = "samples_per_s",
                      ax: Any = None, title: str | None = None,
                      baseline: int | None = None) -> Any:
    """Horizontal bar chart of ``metric`` for each Measurement, one bar per label.

    For samples/s and time per repeat the error bar spans the interquartile range of the
    repeats (for samples/s: ``items / q75`` to ``items / q25``); CPU time, context switches and
    memory are single totals and have no error bar. Values are written next to the bars, with
    the ratio to row ``baseline`` when one is given. The title holds ``title`` (default: the
    metric), the machine and the settings shared by all bars. Returns the Axes.
    ``measurements`` may also be a :class:`course_utils.measurement.Comparison`: its rows, with its
    baseline unless ``baseline`` is given.
    """
    if isinstance(measurements, Comparison):
        baseline = measurements.baseline if baseline is None else baseline
        measurements = measurements.rows
    if isinstance(measurements, Measurement):
        measurements = [measurements]
    rows = list(measurements)
    if not rows:
        raise ValueError("measurements is empty: pass at least one Measurement to plot.")
    for i, m in enumerate(rows):
        if not isinstance(m, Measurement):
            raise TypeError(f"measurements[{i}] is a {type(m).__name__}, not a Measurement.")
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is not known: use one of {', '.join(METRICS)}.")
    if baseline is not None and not -len(rows) <= baseline < len(rows):
        raise ValueError(f"baseline={baseline} is out of range for {len(rows)} measurements.")

    scale = _METRIC_SCALE.get(metric, 1.0)
    values = np.array([np.nan if m.metric(metric) is None else m.metric(metric) * scale
                       for m in rows], dtype=float)
    low = np.zeros(len(rows))
    high = np.zeros(len(rows))
    has_spread = metric in ("samples_per_s", "median_s")
    if has_spread:
        for i, m in enumerate(rows):
            q25, q75 = m.quartiles_s
            if metric == "samples_per_s":
                lo = m.items_per_repeat / q75 if q75 > 0 else values[i]
                hi = m.items_per_repeat / q25 if q25 > 0 else values[i]
            else:
                lo, hi = q25, q75
            low[i] = max(0.0, values[i] - lo)
            high[i] = max(0.0, hi - values[i])

    ax = _new_axes(ax, figsize=(8, 1.2 + 0.5 * len(rows)))
    y = np.arange(len(rows))
    colors = ["tab:gray" if baseline is not None and i == baseline % len(rows) else "tab:blue"
              for i in range(len(rows))]
    ax.barh(y, np.nan_to_num(values), color=colors,
            xerr=np.vstack([low, high]) if has_spread else None,
            capsize=4 if has_spread else 0, error_kw={"elinewidth": 1})
    ax.set_yticks(y, [m.label for m in rows])
    ax.invert_yaxis()  # first measurement on top
    ax.set_xlabel(_METRIC_LABELS[metric])
    finite = values[np.isfinite(values)]
    right = float(np.max(finite + high[np.isfinite(values)])) if finite.size else 1.0
    ax.set_xlim(0, right * 1.3 if right > 0 else 1.0)
    base_value = values[baseline] if baseline is not None else None
    for i, v in enumerate(values):
        if not math.isfinite(v):
            text = "not measured"
            x = 0.0
        else:
            text = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
            if base_value is not None and math.isfinite(base_value) and base_value > 0:
                text += f"  ({v / base_value:.2f}x)"
            x = v + high[i]
        ax.text(x + right * 0.01, i, text, va="center", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    headline = title if title is not None else _METRIC_TITLES[metric]
    ax.set_title(_title(headline, _common_settings(rows)), fontsize=10, loc="left")
    return ax


def plot_curve(x: Sequence[float], ys: Mapping[str, Sequence[float | None]], *, xlabel: str,
               ylabel: str, title: str, ax: Any = None, logx: bool = False,
               settings: Mapping | None = None) -> Any:
    """One line with markers per entry of ``ys`` (name -> values at ``x``; ``None`` = not measured).

    The title holds ``title``, the machine and ``settings`` (see :func:`figure_title`).
    ``logx=True`` uses a log2 x axis (natural for worker counts and sizes). Returns the Axes.
    """
    xs = np.asarray(list(x), dtype=float)
    if xs.ndim != 1 or xs.size == 0:
        raise ValueError("x must be a non-empty 1-D sequence of numbers.")
    if not isinstance(ys, Mapping) or not ys:
        raise ValueError("ys must be a non-empty dict mapping a series name to its values at x.")
    for name, values in ys.items():
        if len(values) != len(xs):
            raise ValueError(f"ys[{name!r}] has {len(values)} values but x has {len(xs)}: "
                             f"give one value per x (None where not measured).")
    if logx and np.any(xs <= 0):
        raise ValueError("logx=True needs every x > 0.")
    ax = _new_axes(ax, figsize=(7, 4.2))
    for name, values in ys.items():
        v = np.array([np.nan if val is None else val for val in values], dtype=float)
        ax.plot(xs, v, marker="o", label=str(name))
    if logx:
        ax.set_xscale("log", base=2)
        if xs.size <= 20:
            ax.set_xticks(xs, [f"{val:g}" for val in xs])
            ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if len(ys) > 1:
        ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title(_title(title, settings), fontsize=10, loc="left")
    return ax
