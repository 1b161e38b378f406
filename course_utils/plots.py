"""Plots of results, the machine and the settings always in the title; each draws on the Axes
you pass (or a new figure's), returns it and never calls ``plt.show()``."""
from __future__ import annotations

import contextlib
import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .config import QUICK_STAMP, quick_mode
from .machine import machine_summary
from .measurement import Comparison, Measurement, compare

__all__ = ["figure_title", "plot_measurements", "plot_curve"]

_METRIC_TEXT = {  # metric -> (title, axis label, displayed value per stored unit)
    "samples_per_s": ("Throughput", "samples per second (higher is better)", 1.0),
    "median_s": ("Time per repeat", "seconds per repeat, median (lower is better)", 1.0),
    "cpu_s_per_sample": ("CPU cost per sample",
                         "CPU milliseconds per sample, whole process tree (lower is better)", 1e3),
    "involuntary_ctx_switches": ("Involuntary context switches",
                                 "involuntary context switches (lower is better)", 1.0),
    "peak_uss_bytes": ("Peak private memory (USS)", "peak USS, MB (lower is better)", 1e-6),
    "peak_pss_bytes": ("Peak proportional memory (PSS)", "peak PSS, MB (lower is better)", 1e-6),
}


def figure_title(title: str, settings: Mapping | None = None) -> str:
    """``title`` (stamped in quick mode), the one-line machine summary, ``k=v, ...`` for ``settings``."""
    if not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}.")
    if settings is not None and not isinstance(settings, Mapping):
        raise TypeError(f"settings must be a dict of names to values (or None), got "
                        f"{type(settings).__name__}.")
    if machine_summary() in title:                     # already made by figure_title
        return title
    text = ", ".join(f"{k}={v}" for k, v in (settings or {}).items())
    stamp = [QUICK_STAMP] if quick_mode() else []
    return "\n".join([title, *stamp, machine_summary(), *textwrap.wrap(text, width=100)])


def _axes(ax: Any, figsize: tuple[float, float]) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt  # lazy: kept out of `import course_utils` (workers)

    return plt.subplots(figsize=figsize, layout="constrained")[1]


def _common_settings(rows: Sequence[Measurement]) -> dict:
    """Settings with the same value in every row (the rest differ between bars)."""
    common = {}
    for k, v in rows[0].settings.items():
        with contextlib.suppress(Exception):  # values that cannot be compared
            if all(k in m.settings and m.settings[k] == v for m in rows[1:]):
                common[k] = v
    return common


def plot_measurements(measurements: Sequence[Measurement] | Comparison, *,
                      metric: str = "samples_per_s", ax: Any = None, title: str | None = None,
                      baseline: int | None = None) -> Any:
    """Horizontal bars of ``metric`` per Measurement (or a :class:`Comparison`'s rows, with its
    baseline). Samples/s and time per repeat get an error bar over the repeats' IQR; each bar is
    labelled with its value and, given ``baseline``, the ratio to that row; the title holds the
    settings every bar shares."""
    if isinstance(measurements, Comparison):
        baseline = measurements.baseline if baseline is None else baseline
        measurements = measurements.rows
    rows = compare([measurements] if isinstance(measurements, Measurement) else measurements,
                   baseline=baseline or 0).rows
    values = np.array([np.nan if m.metric(metric) is None else m.metric(metric) for m in rows],
                      dtype=float) * _METRIC_TEXT[metric][2]
    low, high = np.zeros(len(rows)), np.zeros(len(rows))
    has_spread = metric in ("samples_per_s", "median_s")
    if has_spread:
        for i, m in enumerate(rows):
            q25, q75 = m.quartiles_s
            if metric == "samples_per_s":   # the slower quartile gives the lower rate
                q25, q75 = (m.items_per_repeat / q if q > 0 else values[i] for q in (q75, q25))
            low[i], high[i] = max(0.0, values[i] - q25), max(0.0, q75 - values[i])

    ax = _axes(ax, (8, 1.2 + 0.5 * len(rows)))
    y = np.arange(len(rows))
    base = None if baseline is None else baseline % len(rows)
    ax.barh(y, np.nan_to_num(values), color=["tab:gray" if i == base else "tab:blue" for i in y],
            xerr=np.vstack([low, high]) if has_spread else None,
            capsize=4 if has_spread else 0, error_kw={"elinewidth": 1})
    ax.set_yticks(y, [m.label for m in rows])
    ax.invert_yaxis()  # first measurement on top
    ax.set_xlabel(_METRIC_TEXT[metric][1])
    finite = np.isfinite(values)
    right = float(np.max(values[finite] + high[finite])) if finite.any() else 1.0
    ax.set_xlim(0, right * 1.3 if right > 0 else 1.0)
    base_value = None if base is None else values[base]
    for i, v in enumerate(values):
        text, x = "not measured", 0.0
        if math.isfinite(v):
            text, x = (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"), v + high[i]
            if base_value is not None and math.isfinite(base_value) and base_value > 0:
                text += f"  ({v / base_value:.2f}x)"
        ax.text(x + right * 0.01, i, text, va="center", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(figure_title(_METRIC_TEXT[metric][0] if title is None else title,
                        _common_settings(rows)), fontsize=10, loc="left")
    return ax


def plot_curve(x: Sequence[float], ys: Mapping[str, Sequence[float | None]], *, xlabel: str,
               ylabel: str, title: str, ax: Any = None, logx: bool = False,
               settings: Mapping | None = None) -> Any:
    """One line with markers per entry of ``ys`` (name -> values at ``x``; None: not measured,
    a gap); ``logx=True`` draws a log2 x axis."""
    xs = np.asarray(list(x), dtype=float)
    ax = _axes(ax, (7, 4.2))
    for name, values in ys.items():
        ax.plot(xs, np.array([np.nan if v is None else v for v in values], dtype=float),
                marker="o", label=str(name))
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
    ax.set_title(figure_title(title, settings), fontsize=10, loc="left")
    return ax
