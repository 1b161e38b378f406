"""Results: :class:`Measurement` (one setup's raw per-repeat times and what was read beside them;
median, IQR and samples/s derived) and :class:`Comparison` (several, with ratios to a baseline),
their text and JSON. Apart from the timing engine, so plots and tools need not import it."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from .checks import check_int
from .machine import machine_summary

__all__ = ["NOISY_IQR_FRACTION", "MIN_REPEATS", "SHORT_REPEAT_S", "METRICS", "Measurement",
           "Comparison", "compare", "fmt_time", "jsonable"]

#: A measurement is noisy when its IQR is more than this fraction of its median.
NOISY_IQR_FRACTION = 0.10
#: Fewer repeats than this get a "few repeats" warning (a median and IQR need three).
MIN_REPEATS = 3
#: A median repeat shorter than this (seconds) gets a "short repeats" warning.
SHORT_REPEAT_S = 1e-3
#: Metrics that :meth:`Measurement.metric`, :meth:`Comparison.ratio` and the plots understand.
METRICS = ("samples_per_s", "median_s", "cpu_s_per_sample", "involuntary_ctx_switches",
           "peak_uss_bytes", "peak_pss_bytes")


def fmt_time(seconds: float | None) -> str:
    """Seconds as text in s, ms or us (3 significant digits); "n/a" if unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if abs(seconds) >= 1.0:
        return f"{seconds:.3g} s" if abs(seconds) < 100 else f"{seconds:.0f} s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def _fmt_rate(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _fmt_mb(n_bytes: int | None) -> str:
    return "n/a" if n_bytes is None else f"{n_bytes / 1e6:,.1f}"


def jsonable(value: Any) -> Any:
    """A JSON-friendly copy of ``value``: non-finite floats become None, arrays lists, objects with
    ``to_dict`` their dict, anything else exotic (e.g. torch.device) its str()."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "to_dict"):
        return jsonable(value.to_dict())
    return str(value)


@dataclass
class Measurement:
    """One setup, as measured: seconds per repeat (``times_s``), samples per repeat, and beside
    them CPU seconds of the process tree per sample, involuntary context switches over all timed
    windows, peak USS/PSS bytes, the settings and the machine. Every statistic is derived."""

    label: str
    times_s: list[float]
    items_per_repeat: int
    cpu_s_per_sample: float | None = None
    involuntary_ctx_switches: int | None = None
    peak_uss_bytes: int | None = None
    peak_pss_bytes: int | None = None
    settings: dict = field(default_factory=dict)
    machine: str = ""
    notes: list[str] = field(default_factory=list)   # the measuring code's own warnings

    @classmethod
    def from_times(cls, label: str, times_s: Sequence[float], items_per_repeat: int, *,
                   cpu_s_per_sample: float | None = None,
                   involuntary_ctx_switches: int | None = None,
                   peak_uss_bytes: int | None = None, peak_pss_bytes: int | None = None,
                   settings: dict | None = None, machine: str | None = None,
                   warnings: Iterable[str] = ()) -> "Measurement":
        """A checked Measurement of per-repeat times (``machine`` defaults to this one's)."""
        times = [float(t) for t in times_s]
        if not times:
            raise ValueError("times_s is empty: a Measurement needs at least one timed repeat.")
        if any(not math.isfinite(t) or t < 0 for t in times):
            raise ValueError(f"times_s must be finite, non-negative seconds, got {times}.")
        return cls(str(label), times, check_int("items_per_repeat", items_per_repeat, 1),
                   cpu_s_per_sample, involuntary_ctx_switches, peak_uss_bytes, peak_pss_bytes,
                   dict(settings or {}), machine_summary() if machine is None else machine,
                   list(warnings))

    @classmethod
    def merge(cls, parts: Sequence["Measurement"], label: str | None = None) -> "Measurement":
        """Pool the repeats of several Measurements of one setup (times scaled to the first
        part's samples per repeat; CPU weighted by samples; peaks the highest)."""
        parts = list(parts)
        if not parts or not all(isinstance(p, Measurement) for p in parts):
            raise ValueError("parts must be a non-empty list of Measurement objects.")
        first = parts[0]
        samples = [p.items_per_repeat * p.repeats for p in parts]
        known = lambda name: [getattr(p, name) for p in parts if getattr(p, name) is not None]
        cpu = ctx = None
        if len(known("cpu_s_per_sample")) == len(parts):
            cpu = sum(p.cpu_s_per_sample * n for p, n in zip(parts, samples)) / sum(samples)
        if len(known("involuntary_ctx_switches")) == len(parts):
            ctx = sum(known("involuntary_ctx_switches"))
        return cls(label or first.label,
                   [t * first.items_per_repeat / p.items_per_repeat for p in parts for t in p.times_s],
                   first.items_per_repeat, cpu, ctx, max(known("peak_uss_bytes"), default=None),
                   max(known("peak_pss_bytes"), default=None), first.settings, first.machine,
                   list(dict.fromkeys(w for p in parts for w in p.notes)))

    @property
    def repeats(self) -> int:
        return len(self.times_s)

    @property
    def median_s(self) -> float:
        """Median seconds per repeat."""
        return float(np.median(self.times_s))

    @property
    def quartiles_s(self) -> tuple[float, float]:
        """(25th, 75th) percentile of the per-repeat times, in seconds (NumPy's linear rule)."""
        q25, q75 = np.percentile(self.times_s, [25, 75])
        return float(q25), float(q75)

    @property
    def iqr_s(self) -> float:
        q25, q75 = self.quartiles_s
        return q75 - q25

    @property
    def samples_per_s(self) -> float:
        """Samples per repeat / median seconds per repeat (inf for a zero median)."""
        median = self.median_s
        return self.items_per_repeat / median if median > 0 else math.inf

    @property
    def noisy(self) -> bool:
        """True when the IQR is more than :data:`NOISY_IQR_FRACTION` of the median."""
        return self.median_s > 0 and self.iqr_s / self.median_s > NOISY_IQR_FRACTION

    @property
    def warnings(self) -> list[str]:
        """The measuring code's notes, then what the times say (noisy, few or short repeats)."""
        out = list(self.notes)
        median = self.median_s
        if self.noisy:
            out.append(f"noisy: IQR is {100 * self.iqr_s / median:.0f}% of the median "
                       f"(more repeats, a quieter machine, or longer repeats help)")
        if self.repeats < MIN_REPEATS:
            out.append(f"few repeats: {self.repeats} (use {MIN_REPEATS} or more for a meaningful "
                       f"median and IQR)")
        if median < SHORT_REPEAT_S:
            out.append(f"short repeats: the median repeat is {fmt_time(median)}; timer and "
                       f"call overhead matter at this scale, time more work per repeat")
        return out

    def metric(self, name: str) -> float | None:
        """The value of one of :data:`METRICS` (None when not measured)."""
        if name not in METRICS:
            raise ValueError(f"metric={name!r} is not known: use one of {', '.join(METRICS)}.")
        value = getattr(self, name)
        return None if value is None else float(value)

    def to_dict(self) -> dict:
        """The raw figures and the derived ones, JSON-serialisable (what reference files hold)."""
        names = ("label", "times_s", "items_per_repeat", "median_s", "iqr_s", "samples_per_s",
                 "cpu_s_per_sample", "involuntary_ctx_switches", "peak_uss_bytes",
                 "peak_pss_bytes", "settings", "machine", "warnings", "noisy")
        return {name: jsonable(getattr(self, name)) for name in names}

    def __str__(self) -> str:
        n, median, iqr = self.repeats, self.median_s, self.iqr_s
        rel = f", {100 * iqr / median:.1f}%" if median > 0 else ""
        parts = [f"{_fmt_rate(self.samples_per_s)} samples/s"]
        if self.cpu_s_per_sample is not None:
            parts.append(f"{fmt_time(self.cpu_s_per_sample)} CPU/sample")
        if self.involuntary_ctx_switches is not None:
            parts.append(f"{self.involuntary_ctx_switches:,} invol. ctx switches")
        if self.peak_uss_bytes is not None:
            parts.append(f"peak USS {_fmt_mb(self.peak_uss_bytes)} MB")
        if self.peak_pss_bytes is not None:
            parts.append(f"PSS {_fmt_mb(self.peak_pss_bytes)} MB")
        return "\n".join([self.label, f"  median {fmt_time(median)} per repeat (IQR {fmt_time(iqr)}"
                          f"{rel}), {n} repeat{'s' if n != 1 else ''} of {self.items_per_repeat} "
                          f"samples", "  " + " | ".join(parts)]
                         + [f"  WARNING: {w}" for w in self.warnings])


@dataclass
class Comparison:
    """Measurements side by side, with ratios ``value / baseline value`` to row ``baseline``."""

    rows: list[Measurement]
    baseline: int = 0

    def index(self, key: int | str) -> int:
        """Row index of a label (used by one row) or of a (possibly negative) index."""
        if isinstance(key, bool) or not isinstance(key, (int, np.integer, str)):
            raise TypeError(f"expected a row label (str) or index (int), got {key!r}.")
        if isinstance(key, str):
            hits = [i for i, m in enumerate(self.rows) if m.label == key]
            if not hits:
                labels = ", ".join(repr(m.label) for m in self.rows)
                raise ValueError(f"no measurement is labelled {key!r}; labels are: {labels}.")
            if len(hits) > 1:
                raise ValueError(f"label {key!r} is used by rows {hits}: pass an index instead, "
                                 f"or give each measurement a distinct label=.")
            return hits[0]
        n = len(self.rows)
        if not -n <= key < n:
            raise ValueError(f"index {key} is out of range for {n} measurements "
                             f"(use 0..{n - 1}, or a label).")
        return int(key) % n

    def row(self, key: int | str) -> Measurement:
        return self.rows[self.index(key)]

    def ratio(self, label: int | str, metric: str = "samples_per_s") -> float:
        """``metric`` of row ``label`` over the baseline's (2.0: twice the baseline)."""
        value = self.row(label).metric(metric)
        base = self.rows[self.baseline].metric(metric)
        if value is None or base is None:
            raise ValueError(f"{metric} was not measured for {self.row(label).label!r} or the "
                             f"baseline {self.rows[self.baseline].label!r} on this platform.")
        if base == 0:
            return math.inf if value > 0 else math.nan
        return value / base

    def _ratio_text(self, i: int, metric: str) -> str:
        try:
            r = self.ratio(i, metric)
        except ValueError:
            return "n/a"
        return f"{r:.2f}x" if math.isfinite(r) else "n/a"

    def __str__(self) -> str:
        header = ["label", "samples/s", "x base", "CPU ms/sample", "x base",
                  "invol. ctx sw.", "peak USS MB", "peak PSS MB"]
        table = []
        for i, m in enumerate(self.rows):
            name = m.label + (" *" if m.noisy else "") + (" (baseline)" if i == self.baseline else "")
            cpu = "n/a" if m.cpu_s_per_sample is None else f"{m.cpu_s_per_sample * 1e3:.3g}"
            ctx = "n/a" if m.involuntary_ctx_switches is None else f"{m.involuntary_ctx_switches:,}"
            table.append([name, _fmt_rate(m.samples_per_s), self._ratio_text(i, "samples_per_s"),
                          cpu, self._ratio_text(i, "cpu_s_per_sample"), ctx,
                          _fmt_mb(m.peak_uss_bytes), _fmt_mb(m.peak_pss_bytes)])
        widths = [max(len(r[c]) for r in [header] + table) for c in range(len(header))]
        lines = ["  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])])
                 for r in [header, ["-" * w for w in widths]] + table]
        lines.append(f"x base: ratio to {self.rows[self.baseline].label!r}; samples/s: higher is "
                     f"better, CPU ms/sample: lower is better.")
        lines.append("CPU, context switches, memory: main process + workers. USS: private to "
                     "each process, summed; PSS: total, shared pages split.")
        if any(m.noisy for m in self.rows):
            lines.append(f"* noisy: IQR above {NOISY_IQR_FRACTION:.0%} of the median.")
        machines = sorted({m.machine for m in self.rows if m.machine})
        if len(machines) == 1:
            lines.append(f"machine: {machines[0]}")
        elif machines:
            lines += ["machines differ between rows:"] + [f"  {m.label}: {m.machine}" for m in self.rows]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"baseline": self.baseline, "rows": [m.to_dict() for m in self.rows]}


def compare(measurements: Sequence[Measurement], baseline: int | str = 0) -> Comparison:
    """Measurements side by side; ``baseline`` (row index or label) is what ratios divide by."""
    if isinstance(measurements, Measurement):
        raise TypeError("measurements must be a list of Measurements, got a single Measurement: "
                        "wrap it in a list, e.g. compare([a, b]).")
    try:
        rows = list(measurements)
    except TypeError:
        raise TypeError(f"measurements must be a list of Measurements, got "
                        f"{type(measurements).__name__}.") from None
    if not rows:
        raise ValueError("measurements is empty: pass at least one Measurement to compare.")
    for i, m in enumerate(rows):
        if not isinstance(m, Measurement):
            raise TypeError(f"measurements[{i}] is a {type(m).__name__}, not a Measurement "
                            f"(made by measure() or measure_loader()).")
    comparison = Comparison(rows=rows)
    try:
        comparison.baseline = comparison.index(baseline)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"baseline: {exc}") from None
    return comparison
