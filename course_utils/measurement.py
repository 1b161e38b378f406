"""What a measurement is, once made: :class:`Measurement` (one setup) and :class:`Comparison`
(several side by side, with ratios to a baseline), their text and JSON form. Apart from the timing
engine (:mod:`course_utils.timing`), so shipped results, plots and the tuner need not import it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from .checks import check_int
from .machine import machine_summary

__all__ = ["NOISY_IQR_FRACTION", "MIN_REPEATS", "SHORT_REPEAT_S", "METRICS", "Measurement",
           "Comparison", "compare"]

#: A measurement is called noisy when its IQR is more than this fraction of its median.
NOISY_IQR_FRACTION = 0.10
#: Fewer repeats than this get a "few repeats" warning (a median and IQR need three).
MIN_REPEATS = 3
#: A median repeat shorter than this (seconds) gets a "short repeats" warning.
SHORT_REPEAT_S = 1e-3

#: Metrics that :meth:`Measurement.metric`, :meth:`Comparison.ratio` and the plots understand.
METRICS = ("samples_per_s", "median_s", "cpu_s_per_sample", "involuntary_ctx_switches",
           "peak_uss_bytes", "peak_pss_bytes")


def fmt_time(seconds: float) -> str:
    """A duration in seconds as text, in s, ms or us (3 significant digits); "n/a" if unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if abs(seconds) >= 1.0:
        return f"{seconds:.3g} s" if abs(seconds) < 100 else f"{seconds:.0f} s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def _fmt_rate(x: float | None) -> str:
    """A rate (samples per second) as text: thousands separated above 100."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _fmt_mb(n_bytes: int | None) -> str:
    """Bytes as megabytes (1e6 bytes) with one decimal."""
    return "n/a" if n_bytes is None else f"{n_bytes / 1e6:,.1f}"


def jsonable(value: Any) -> Any:
    """A JSON-friendly copy of ``value``: non-finite floats become None, arrays lists, objects with
    ``to_dict`` their dict, anything else exotic (e.g. torch.device) its str()."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if hasattr(value, "to_dict"):
        return jsonable(value.to_dict())
    return str(value)


@dataclass
class Measurement:
    """The result of :func:`~course_utils.timing.measure` or :func:`~.timing.measure_loader`.

    Times are seconds per repeat (``samples_per_s`` uses the median); ``cpu_s_per_sample`` is
    CPU seconds of the whole process tree per sample; context switches are a total over all
    timed windows; memory peaks are bytes.
    """

    label: str
    times_s: list[float]
    items_per_repeat: int
    median_s: float
    iqr_s: float
    samples_per_s: float
    cpu_s_per_sample: float | None = None
    involuntary_ctx_switches: int | None = None
    peak_uss_bytes: int | None = None
    peak_pss_bytes: int | None = None
    settings: dict = field(default_factory=dict)
    machine: str = ""
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def from_times(cls, label: str, times_s: Sequence[float], items_per_repeat: int, *,
                   cpu_s_per_sample: float | None = None,
                   involuntary_ctx_switches: int | None = None,
                   peak_uss_bytes: int | None = None, peak_pss_bytes: int | None = None,
                   settings: dict | None = None, machine: str | None = None,
                   warnings: Iterable[str] = ()) -> "Measurement":
        """Compute median, IQR, samples/s and the standard warnings from per-repeat times."""
        times = [float(t) for t in times_s]
        if not times:
            raise ValueError("times_s is empty: a Measurement needs at least one timed repeat.")
        if any(not math.isfinite(t) or t < 0 for t in times):
            raise ValueError(f"times_s must be finite, non-negative seconds, got {times}.")
        check_int("items_per_repeat", items_per_repeat, 1)
        median = float(np.median(times))
        q25, q75 = (float(q) for q in np.percentile(times, [25, 75]))
        rate = items_per_repeat / median if median > 0 else math.inf
        notes = list(warnings)
        if median > 0 and (q75 - q25) / median > NOISY_IQR_FRACTION:
            notes.append(f"noisy: IQR is {100 * (q75 - q25) / median:.0f}% of the median "
                         f"(more repeats, a quieter machine, or longer repeats help)")
        if len(times) < MIN_REPEATS:
            notes.append(f"few repeats: {len(times)} (use {MIN_REPEATS} or more for a meaningful "
                         f"median and IQR)")
        if median < SHORT_REPEAT_S:
            notes.append(f"short repeats: the median repeat is {fmt_time(median)}; timer and "
                         f"call overhead matter at this scale, time more work per repeat")
        return cls(label=str(label), times_s=times, items_per_repeat=int(items_per_repeat),
                   median_s=median, iqr_s=q75 - q25, samples_per_s=rate,
                   cpu_s_per_sample=cpu_s_per_sample,
                   involuntary_ctx_switches=involuntary_ctx_switches,
                   peak_uss_bytes=peak_uss_bytes, peak_pss_bytes=peak_pss_bytes,
                   settings=dict(settings or {}),
                   machine=machine_summary() if machine is None else machine,
                   warnings=notes)

    @classmethod
    def merge(cls, parts: Sequence["Measurement"], label: str | None = None) -> "Measurement":
        """Pool the repeats of several Measurements of the same setup into one (repeats of two
        setups are interleaved, A, B, A, B, so that a drift of a shared machine hits both alike)."""
        parts = list(parts)
        if not parts or not all(isinstance(p, Measurement) for p in parts):
            raise ValueError("parts must be a non-empty list of Measurement objects.")
        items = parts[0].items_per_repeat
        times = [t * items / p.items_per_repeat for p in parts for t in p.times_s]
        samples = [p.items_per_repeat * len(p.times_s) for p in parts]
        cpu = None
        if all(p.cpu_s_per_sample is not None for p in parts):
            cpu = sum(p.cpu_s_per_sample * n for p, n in zip(parts, samples)) / sum(samples)
        ctx = (sum(p.involuntary_ctx_switches for p in parts)
               if all(p.involuntary_ctx_switches is not None for p in parts) else None)

        def peak(name: str) -> int | None:
            values = [getattr(p, name) for p in parts if getattr(p, name) is not None]
            return max(values) if values else None

        inherited = [w for p in parts for w in p.warnings
                     if not w.startswith(("noisy:", "few repeats:", "short repeats:"))]
        return cls.from_times(label or parts[0].label, times, items, cpu_s_per_sample=cpu,
                              involuntary_ctx_switches=ctx, peak_uss_bytes=peak("peak_uss_bytes"),
                              peak_pss_bytes=peak("peak_pss_bytes"), settings=parts[0].settings,
                              machine=parts[0].machine, warnings=list(dict.fromkeys(inherited)))

    @classmethod
    def from_dict(cls, data: Mapping) -> "Measurement":
        """Rebuild a Measurement saved with :meth:`to_dict` (e.g. results shipped as JSON)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"data must be a dict made by Measurement.to_dict(), got "
                            f"{type(data).__name__}.")
        names = [f for f in cls.__dataclass_fields__]
        missing = [n for n in ("label", "times_s", "items_per_repeat") if n not in data]
        if missing:
            raise ValueError(f"data is missing {missing}: pass a dict made by Measurement.to_dict().")
        kwargs = {n: data[n] for n in names if n in data}
        if "median_s" not in kwargs:
            m = cls.from_times(data["label"], data["times_s"], data["items_per_repeat"],
                               machine=data.get("machine", ""))
            for name in ("median_s", "iqr_s", "samples_per_s"):
                kwargs.setdefault(name, getattr(m, name))
        return cls(**kwargs)

    # -- derived -----------------------------------------------------------------------
    @property
    def noisy(self) -> bool:
        """True when the IQR is more than :data:`NOISY_IQR_FRACTION` of the median."""
        return self.median_s > 0 and self.iqr_s / self.median_s > NOISY_IQR_FRACTION

    @property
    def repeats(self) -> int:
        return len(self.times_s)

    @property
    def quartiles_s(self) -> tuple[float, float]:
        """(25th, 75th) percentile of the per-repeat times, in seconds."""
        q25, q75 = np.percentile(self.times_s, [25, 75])
        return float(q25), float(q75)

    def metric(self, name: str) -> float | None:
        """The value of one of :data:`METRICS` (``None`` when not measured)."""
        if name not in METRICS:
            raise ValueError(f"metric={name!r} is not known: use one of {', '.join(METRICS)}.")
        value = getattr(self, name)
        return None if value is None else float(value)

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (``json.dumps`` works on it); :meth:`from_dict` reads it."""
        out = {name: jsonable(getattr(self, name)) for name in self.__dataclass_fields__}
        out["noisy"] = self.noisy
        return out

    def __str__(self) -> str:
        n = self.repeats
        rel = f", {100 * self.iqr_s / self.median_s:.1f}%" if self.median_s > 0 else ""
        lines = [
            self.label,
            f"  median {fmt_time(self.median_s)} per repeat (IQR {fmt_time(self.iqr_s)}{rel}), "
            f"{n} repeat{'s' if n != 1 else ''} of {self.items_per_repeat} samples",
        ]
        parts = [f"{_fmt_rate(self.samples_per_s)} samples/s"]
        if self.cpu_s_per_sample is not None:
            parts.append(f"{fmt_time(self.cpu_s_per_sample)} CPU/sample")
        if self.involuntary_ctx_switches is not None:
            parts.append(f"{self.involuntary_ctx_switches:,} invol. ctx switches")
        if self.peak_uss_bytes is not None:
            parts.append(f"peak USS {_fmt_mb(self.peak_uss_bytes)} MB")
        if self.peak_pss_bytes is not None:
            parts.append(f"PSS {_fmt_mb(self.peak_pss_bytes)} MB")
        lines.append("  " + " | ".join(parts))
        for w in self.warnings:
            lines.append(f"  WARNING: {w}")
        return "\n".join(lines)


@dataclass
class Comparison:
    """Several Measurements side by side, with ratios ``value / baseline value`` to a baseline row."""

    rows: list[Measurement]
    baseline: int = 0

    def index(self, key: int | str) -> int:
        """Row index of a label (must be unique) or a (possibly negative) index."""
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
        """``metric`` of the row ``label`` divided by the baseline's (e.g. 2.0 = twice the baseline)."""
        value = self.row(label).metric(metric)
        base = self.rows[self.baseline].metric(metric)
        if value is None or base is None:
            raise ValueError(f"{metric} was not measured for {self.row(label).label!r} or the "
                             f"baseline {self.rows[self.baseline].label!r} on this platform.")
        if base == 0:
            return math.inf if value > 0 else math.nan
        return value / base

    def best(self, metric: str = "samples_per_s") -> Measurement:
        """The best row for ``metric`` (highest samples/s; lowest for every other metric)."""
        rows = [m for m in self.rows if m.metric(metric) is not None]
        if not rows:
            raise ValueError(f"{metric} was not measured for any row.")
        if metric == "samples_per_s":
            return max(rows, key=lambda m: m.metric(metric))
        return min(rows, key=lambda m: m.metric(metric))

    def _ratio_text(self, i: int, metric: str) -> str:
        try:
            r = self.ratio(i, metric)
        except ValueError:
            return "n/a"
        return f"{r:.2f}x" if math.isfinite(r) else "n/a"

    def __str__(self) -> str:
        base = self.rows[self.baseline]
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

        def fmt(r: list[str]) -> str:
            return "  ".join([r[0].ljust(widths[0])] +
                             [r[c].rjust(widths[c]) for c in range(1, len(r))])

        lines = [fmt(header), "  ".join("-" * w for w in widths)] + [fmt(r) for r in table]
        lines.append(f"x base: ratio to {base.label!r}; samples/s: higher is better, "
                     f"CPU ms/sample: lower is better.")
        lines.append("CPU, context switches, memory: main process + workers. USS: private to "
                     "each process, summed; PSS: total, shared pages split.")
        if any(m.noisy for m in self.rows):
            lines.append(f"* noisy: IQR above {NOISY_IQR_FRACTION:.0%} of the median.")
        machines = sorted({m.machine for m in self.rows if m.machine})
        if len(machines) == 1:
            lines.append(f"machine: {machines[0]}")
        elif machines:
            lines.append("machines differ between rows:")
            lines += [f"  {m.label}: {m.machine}" for m in self.rows]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"baseline": self.baseline, "rows": [m.to_dict() for m in self.rows]}


def compare(measurements: Sequence[Measurement], baseline: int | str = 0) -> Comparison:
    """Put Measurements side by side; ``baseline`` is the row index or label that ratios use."""
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
    comparison = Comparison(rows=rows, baseline=0)
    try:
        comparison.baseline = comparison.index(baseline)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"baseline: {exc}") from None
    return comparison
