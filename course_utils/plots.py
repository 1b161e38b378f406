"""Plots with the machine and settings always in the title; each draws on the Axes you pass (or
a new figure's), returns it and never calls ``plt.show()``."""
from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .machine import machine_summary
from .measurement import METRICS, Comparison, Measurement, compare

__all__ = ["figure_title", "plot_measurements", "plot_curve"]

_METRIC_TEXT = {  # metric -> (title, axis label)
    "samples_per_s": ("Throughput", "samples per second (higher is better)"),
    "median_s": ("Time per repeat", "seconds per repeat, median (lower is better)"),
    "cpu_s_per_sample": ("CPU cost per sample",
                         "CPU milliseconds per sample, whole process tree (lower is better)"),
    "involuntary_ctx_switches": ("Involuntary context switches",
                                 "involuntary context switches (lower is better)"),
    "peak_uss_bytes": ("Peak private memory (USS)", "peak USS, MB (lower is better)"),
    "peak_pss_bytes": ("Peak proportional memory (PSS)", "peak PSS, MB (lower is better)"),
}
# displayed value = stored value * scale
_METRIC_SCALE = {"cpu_s_per_sample": 1e3, "peak_uss_bytes": 1e-6, "peak_pss_bytes": 1e-6}


def figure_title(title: str, settings: Mapping | None = None) -> str:
    """``title``, then the one-line machine summary, then ``k=v, ...`` for ``settings``, wrapped."""
    if not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}.")
    if settings is not None and not isinstance(settings, Mapping):
        raise TypeError(f"settings must be a dict of names to values (or None), got "
                        f"{type(settings).__name__}.")
    lines = [title, machine_summary()]
    if settings:
        text = ", ".join(f"{k}={v}" for k, v in settings.items())
        lines += textwrap.wrap(text, width=100)
    return "\n".join(lines)


def _title(title: str, settings: Mapping | None) -> str:
    # a title already made by figure_title is used as it is
    return title if machine_summary() in title else figure_title(title, settings)


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
    """Horizontal bar chart of ``metric`` for each Measurement (or a :class:`Comparison`'s rows).

    Samples/s and time per repeat get an error bar over the repeats' IQR (the other metrics are
    single totals). Values are written by the bars, with the ratio to row ``baseline`` when
    given; the title holds the settings shared by all bars.
    """
    if isinstance(measurements, Comparison):
        baseline = measurements.baseline if baseline is None else baseline
        measurements = measurements.rows
    rows = compare([measurements] if isinstance(measurements, Measurement) else measurements).rows
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
    ax.set_xlabel(_METRIC_TEXT[metric][1])
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
    headline = title if title is not None else _METRIC_TEXT[metric][0]
    ax.set_title(_title(headline, _common_settings(rows)), fontsize=10, loc="left")
    return ax


def plot_curve(x: Sequence[float], ys: Mapping[str, Sequence[float | None]], *, xlabel: str,
               ylabel: str, title: str, ax: Any = None, logx: bool = False,
               settings: Mapping | None = None) -> Any:
    """One line with markers per entry of ``ys`` (name -> values at ``x``; ``None`` = not
    measured); ``logx=True`` uses a log2 x axis."""
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
