"""Lesson 04's harness: host-to-device copies, measured honestly.

What is measured, and in what unit:

* **copy bandwidth** (GB/s, decimal: 1 GB = 1e9 bytes) = bytes copied / seconds per copy, for
  sizes from 1 KiB up to about 1 GiB (capped by the RAM and device memory available, and to
  16 MiB in quick mode). Three sources are copied into the same preallocated device buffer:
  *pageable* host memory (an ordinary tensor), *pinned* (page-locked) host memory, and
  another device buffer (device-to-device, the scale the link is compared with).
* **time per copy** (seconds): on CUDA with CUDA events recorded on the stream the copy runs
  on (``torch.cuda.Event(enable_timing=True)``), which time the GPU's work, not the time
  Python took to queue it; elsewhere with ``time.perf_counter`` after synchronising the device
  before and after. Small copies are repeated ``inner`` times inside one timing so the timer's
  resolution does not dominate; the time reported is per copy.
* **overlap fraction** = (copy alone + compute alone - both issued together) / the shorter
  of the two: 1 means the copy was completely hidden behind the compute, 0 that they ran one
  after the other.

On a machine without an accelerator the "device" is the CPU: a "host-to-device copy" is then a
host memcpy into a second buffer (``.to('cpu')`` itself would return the same tensor and copy
nothing), pinned memory does not exist (``pin_memory()`` raises), and there are no streams to
overlap on. Every function here still runs there and says what it measured; the figures a real
GPU gives are shipped as reference results (:mod:`course_utils.reference`), produced by
``python -m course_authoring gpu-check`` on a CUDA machine.

Nothing happens at import time.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..checks import check_int
from ..config import pick
from ..data import ram_budget_bytes
from ..device import ALLOWED_DEVICES, resolve_device, synchronize, try_pin
from ..machine import machine_summary
from ..measurement import _fmt_time
from ..plots import figure_title

__all__ = [
    "MODES",
    "what_is_measured",
    "time_op",
    "max_transfer_bytes",
    "sweep_sizes",
    "BandwidthSweep",
    "bandwidth_sweep",
    "TimingDemo",
    "mismeasured_copy",
    "plot_sweeps",
]


KIB, MIB, GIB = 1024, 1024**2, 1024**3
#: The three copy sources of the bandwidth sweep.
MODES = ("pageable", "pinned", "device")


# --------------------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------------------

def what_is_measured(device: Any = None) -> str:
    """One paragraph saying what a 'host-to-device copy' is on ``device``."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        return (f"CUDA device {name}: host-to-device copies cross the PCIe/NVLink link to the GPU's "
                f"memory; timed with CUDA events, pinned copies issued with non_blocking=True.")
    if dev.type == "mps":
        return ("Apple MPS: CPU and GPU share one memory, so a 'host-to-device' copy is a copy "
                "between two buffers of the same RAM, timed with perf_counter after "
                "torch.mps.synchronize(); there are no user CUDA streams to overlap on.")
    return ("No GPU here, so the 'device' is the CPU: a host-to-device copy is measured as a host "
            "memcpy into a second buffer (tensor.to('cpu') itself would copy nothing), pinned memory "
            "does not exist without an accelerator, and copies cannot overlap compute on streams. "
            "These figures describe this CPU's memory bandwidth, not a GPU link.")


# --------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------

def time_op(fn: Callable[[], Any], *, device: Any, repeats: int = 5, warmup: int = 1,
            inner: int = 1) -> list[float]:
    """Seconds per call of ``fn``, one figure per repeat (``fn`` runs ``inner`` times per repeat).

    CUDA: a CUDA event is recorded on ``device``'s current stream
    (``torch.cuda.current_stream(device)``, not the current device's) before and after the
    ``inner`` calls, and the time between them is read after the end event completes
    (``event.synchronize()``): the GPU's time, whatever Python was doing. ``device`` is
    synchronised after the warm-up. Other devices: ``time.perf_counter`` with the device
    synchronised before the clock starts and before it stops.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments, got {type(fn).__name__}.")
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    check_int("inner", inner, 1)
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(dev)
    stream = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
    times = []
    for _ in range(repeats):
        if stream is not None:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(inner):
                fn()
            end.record(stream)
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds
        else:
            synchronize(dev)
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            synchronize(dev)
            seconds = time.perf_counter() - t0
        times.append(seconds / inner)
    return times


def _median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64)))


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{int(n)} B"




# --------------------------------------------------------------------------------------
# bandwidth sweep
# --------------------------------------------------------------------------------------

def max_transfer_bytes(device: Any = None, *, host_buffers: int | None = None,
                       device_buffers: int = 2) -> int:
    """The largest transfer size the sweep uses here (a power of two, in bytes).

    At most 1 GiB (16 MiB in quick mode), at most the RAM budget
    (:func:`course_utils.data.ram_budget_bytes`) divided among the host buffers, and on CUDA at
    most a quarter of the free device memory divided among the device buffers.
    """

    dev = resolve_device(device)
    if host_buffers is None:
        host_buffers = 2 if dev.type != "cpu" else 2 + device_buffers
    cap = pick(full=GIB, quick=16 * MIB)
    cap = min(cap, ram_budget_bytes(0.5) // max(1, host_buffers))
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        cap = min(cap, free // (2 * max(1, device_buffers)))
    if cap < KIB:
        raise MemoryError(f"not even 1 KiB can be allocated for a transfer here "
                          f"(cap {cap} bytes): free some memory.")
    return 1 << int(math.floor(math.log2(cap)))


def sweep_sizes(max_bytes: int | None = None, *, min_bytes: int = KIB, factor: int = 4,
                device: Any = None) -> list[int]:
    """Log-spaced transfer sizes in bytes: min_bytes, min_bytes*factor, ... <= max_bytes.

    ``max_bytes`` defaults to :func:`max_transfer_bytes` for ``device``; the largest size is
    always included.
    """
    if max_bytes is None:
        max_bytes = max_transfer_bytes(device)
    check_int("max_bytes", max_bytes, 1)
    check_int("min_bytes", min_bytes, 1)
    check_int("factor", factor, 2)
    if min_bytes > max_bytes:
        raise ValueError(f"min_bytes={min_bytes} is larger than max_bytes={max_bytes}: "
                         f"pass a smaller min_bytes or a larger max_bytes.")
    sizes = []
    n = min_bytes
    while n <= max_bytes:
        sizes.append(int(n))
        n *= factor
    if sizes[-1] != max_bytes:
        sizes.append(int(max_bytes))
    return sizes


def _labels(kind: str) -> dict[str, str]:
    if kind == "cuda":
        return {"pageable": "pageable host -> GPU", "pinned": "pinned host -> GPU",
                "device": "GPU -> GPU"}
    if kind == "mps":
        return {"pageable": "pageable host -> MPS", "pinned": "pinned host -> MPS",
                "device": "MPS -> MPS"}
    return {"pageable": "host memcpy (a 'host -> device' copy when the device is the CPU)",
            "pinned": "pinned host -> device (needs an accelerator)",
            "device": "device -> device (on CPU: the same memcpy)"}


@dataclass
class BandwidthSweep:
    """Copy bandwidth per source and size, measured side by side in one run.

    ``gbps[mode][i]`` is GB/s (1e9 bytes/s) at ``sizes_bytes[i]``; ``seconds[mode][i]`` the
    median time per copy; None where the mode was not measured (``notes[mode]`` says why).
    """

    device: str
    sizes_bytes: list[int]
    gbps: dict[str, list[float | None]]
    seconds: dict[str, list[float | None]]
    labels: dict[str, str]
    notes: dict[str, str] = field(default_factory=dict)
    measured: str = ""
    timing: str = ""
    machine: str = ""
    settings: dict = field(default_factory=dict)
    #: [low, high] GB/s per point: the bandwidth at the 75th and 25th percentile of the times
    gbps_range: dict[str, list] = field(default_factory=dict)

    def noisy_points(self, limit: float = 0.10) -> list[tuple[str, int]]:
        """(mode, size) of points whose interquartile range is more than ``limit`` of the value."""
        out = []
        for mode, ranges in self.gbps_range.items():
            for size, value, rng in zip(self.sizes_bytes, self.gbps.get(mode, []), ranges):
                if value and rng and rng[0] and rng[1] and (rng[1] - rng[0]) / value > limit:
                    out.append((mode, size))
        return out

    def measured_modes(self) -> list[str]:
        """Modes with at least one figure."""
        return [m for m in MODES if any(v is not None for v in self.gbps.get(m, []))]

    def best(self, mode: str) -> tuple[int, float] | None:
        """(size in bytes, GB/s) of the fastest copy of ``mode``, or None if not measured."""
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not one of {', '.join(MODES)}.")
        pairs = [(s, v) for s, v in zip(self.sizes_bytes, self.gbps.get(mode, [])) if v is not None]
        return max(pairs, key=lambda p: p[1]) if pairs else None

    def best_h2d(self) -> tuple[str, int, float] | None:
        """(mode, size, GB/s) of the fastest host-to-device copy measured (pageable or pinned)."""
        found = [(m, *b) for m in ("pageable", "pinned") if (b := self.best(m)) is not None]
        return max(found, key=lambda t: t[2]) if found else None

    def pinned_fraction_of_best(self) -> float | None:
        """Best pinned GB/s / best host-to-device GB/s measured (the issue's >= 0.9 target).

        None when pinned copies could not be measured (no accelerator).
        """
        pinned, best = self.best("pinned"), self.best_h2d()
        if pinned is None or best is None or best[2] <= 0:
            return None
        return pinned[1] / best[2]

    def at(self, mode: str, size: int) -> float | None:
        """GB/s of ``mode`` at ``size`` bytes (None where not measured)."""
        if size not in self.sizes_bytes:
            raise ValueError(f"size={size} was not measured; sizes: {self.sizes_bytes}.")
        return self.gbps.get(mode, [None] * len(self.sizes_bytes))[self.sizes_bytes.index(size)]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "BandwidthSweep":
        """Rebuild a sweep saved with :meth:`to_dict` (e.g. from reference results)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"data must be a dict made by BandwidthSweep.to_dict(), got "
                            f"{type(data).__name__}.")
        missing = [k for k in ("device", "sizes_bytes", "gbps") if k not in data]
        if missing:
            raise ValueError(f"data lacks {missing}: pass a dict made by BandwidthSweep.to_dict().")
        names = cls.__dataclass_fields__
        kwargs = {k: data[k] for k in names if k in data}
        kwargs.setdefault("seconds", {m: [None] * len(data["sizes_bytes"]) for m in data["gbps"]})
        kwargs.setdefault("labels", _labels(torch.device(str(data["device"])).type
                                            if str(data["device"]).split(":")[0] in ALLOWED_DEVICES
                                            else "cuda"))
        return cls(**kwargs)

    def plot(self, ax: Any = None, *, title: str | None = None) -> Any:
        """GB/s against transfer size (log-log), one line per measured source."""
        import matplotlib.pyplot as plt  # lazy: workers import this module (via l04_workers)

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 4), layout="constrained")
        styles = {"pageable": ("tab:orange", "o"), "pinned": ("tab:blue", "s"),
                  "device": ("tab:grey", "^")}
        for mode in self.measured_modes():
            xs = [s for s, v in zip(self.sizes_bytes, self.gbps[mode]) if v is not None]
            ys = [v for v in self.gbps[mode] if v is not None]
            color, marker = styles[mode]
            ax.plot(xs, ys, marker=marker, color=color, label=self.labels.get(mode, mode),
                    linestyle="--" if mode == "device" else "-")
            ranges = [r for r, v in zip(self.gbps_range.get(mode, []), self.gbps[mode]) if v is not None]
            if len(ranges) == len(xs) and all(r and r[0] and r[1] for r in ranges):
                ax.fill_between(xs, [r[0] for r in ranges], [r[1] for r in ranges], color=color,
                                alpha=0.2, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = [s for s in self.sizes_bytes if s in (KIB, 16 * KIB, 256 * KIB, 4 * MIB,
                                                     64 * MIB, GIB) or s == self.sizes_bytes[-1]]
        ax.set_xticks(ticks)
        ax.set_xticklabels([_fmt_bytes(s) for s in ticks])
        ax.set_xlabel("bytes per copy")
        ax.set_ylabel("GB/s (1e9 bytes/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(title or figure_title(f"Copy bandwidth on {self.device}", self.settings),
                     fontsize=8)
        return ax

    def __str__(self) -> str:
        modes = self.measured_modes()
        head = f"{'size':>9} " + " ".join(f"{m + ' GB/s':>15}" for m in modes)
        lines = [f"copy bandwidth on {self.device} ({self.timing})", head]
        for i, size in enumerate(self.sizes_bytes):
            cells = []
            for m in modes:
                v = self.gbps[m][i]
                cells.append(f"{'n/a' if v is None else f'{v:.3g}':>15}")
            lines.append(f"{_fmt_bytes(size):>9} " + " ".join(cells))
        for mode, note in self.notes.items():
            lines.append(f"{mode}: {note}")
        frac = self.pinned_fraction_of_best()
        if frac is not None:
            lines.append(f"best pinned copy = {frac:.0%} of the best host-to-device copy measured")
        noisy = self.noisy_points()
        if noisy:
            lines.append(f"WARNING: {len(noisy)} of {len(self.sizes_bytes) * len(modes)} points are noisy "
                         f"(interquartile range > 10% of the value; shaded in the plot): the machine "
                         f"was busy; run again, or with more repeats, before trusting a dip.")
        return "\n".join(lines)


def bandwidth_sweep(sizes: Sequence[int] | None = None, *, device: Any = None,
                    repeats: int | None = None, modes: Sequence[str] = MODES,
                    target_bytes: int | None = None, progress: bool = True) -> BandwidthSweep:
    """Measure copy bandwidth (GB/s) for each source in ``modes`` and each size, side by side.

    One buffer of the largest size is allocated per source (filled, so its pages are real) and
    one destination buffer on the device; each size copies a slice of them, so no allocation
    happens inside a timing. At every size the modes are measured one after the other, so a
    drift of a shared machine hits them alike. Small copies are repeated until about
    ``target_bytes`` move per timing (default 64 MiB, 4 MiB in quick mode).
    ``repeats`` timings per point (default 5, 3 in quick mode); the median is reported.
    """
    dev = resolve_device(device)
    repeats = pick(full=5, quick=3) if repeats is None else repeats
    check_int("repeats", repeats, 1)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes={list(modes)!r}: choose from {', '.join(MODES)}.")
    if sizes is None:
        sizes = sweep_sizes(device=dev)
    sizes = [int(s) for s in sizes]
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"sizes must be a non-empty list of byte counts >= 1, got {sizes}.")
    target_bytes = pick(full=64 * MIB, quick=4 * MIB) if target_bytes is None else target_bytes
    check_int("target_bytes", target_bytes, 1)
    biggest = max(sizes)

    notes: dict[str, str] = {}
    sources: dict[str, torch.Tensor] = {}
    host = torch.empty(biggest, dtype=torch.uint8)
    host.fill_(7)
    dst = torch.empty(biggest, dtype=torch.uint8, device=dev)
    dst.fill_(0)
    if "pageable" in modes:
        sources["pageable"] = host
    if "pinned" in modes:
        pinned, why = try_pin(host, dev)
        if pinned is None:
            notes["pinned"] = f"not measured: {why}"
        else:
            sources["pinned"] = pinned
    if "device" in modes:
        if dev.type == "cpu":
            notes["device"] = ("not measured separately: with the CPU as the device it is the "
                               "same host memcpy as the 'pageable' line")
        else:
            dsrc = torch.empty(biggest, dtype=torch.uint8, device=dev)
            dsrc.fill_(3)
            sources["device"] = dsrc

    from tqdm.auto import tqdm  # lazy: workers import this module (via l04_workers)

    gbps: dict[str, list[float | None]] = {m: [None] * len(sizes) for m in MODES}
    secs: dict[str, list[float | None]] = {m: [None] * len(sizes) for m in MODES}
    spans: dict[str, list] = {m: [None] * len(sizes) for m in MODES}
    bar = tqdm(total=len(sizes) * len(sources), disable=not progress, desc="copy sweep",
               unit="point", leave=False)
    try:
        for i, n in enumerate(sizes):
            out = dst[:n]
            inner = int(min(256, max(1, target_bytes // n)))
            for mode, src in sources.items():
                view = src[:n]
                non_blocking = mode == "pinned"

                def copy(out: torch.Tensor = out, view: torch.Tensor = view,
                         non_blocking: bool = non_blocking) -> None:
                    out.copy_(view, non_blocking=non_blocking)

                times = time_op(copy, device=dev, repeats=repeats, warmup=1, inner=inner)
                t = _median(times)
                q25, q75 = (float(q) for q in np.percentile(times, [25, 75]))
                secs[mode][i] = t
                gbps[mode][i] = n / t / 1e9 if t > 0 else None
                spans[mode][i] = [n / q75 / 1e9, n / q25 / 1e9] if q25 > 0 else None
                bar.update(1)
    finally:
        bar.close()
        del sources, host, dst
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    return BandwidthSweep(
        device=str(dev), sizes_bytes=sizes,
        gbps={m: v for m, v in gbps.items() if m in modes},
        seconds={m: v for m, v in secs.items() if m in modes},
        labels=_labels(dev.type), notes=notes, measured=what_is_measured(dev),
        timing="CUDA events" if dev.type == "cuda" else "perf_counter + synchronize",
        machine=machine_summary(),
        settings={"repeats": repeats, "max_size": _fmt_bytes(biggest)},
        gbps_range={m: v for m, v in spans.items() if m in modes})


# --------------------------------------------------------------------------------------
# the classic mismeasurement
# --------------------------------------------------------------------------------------

@dataclass
class TimingDemo:
    """The same non_blocking copy timed twice: naively (perf_counter, no synchronisation) and
    honestly (CUDA events / synchronize). Times are median seconds per copy, rates GB/s."""

    device: str
    nbytes: int
    pinned: bool
    naive_s: float
    honest_s: float
    naive_gbps: float
    honest_gbps: float
    note: str = ""

    @property
    def ratio(self) -> float:
        """honest / naive time: how many times the naive timing under-reports the copy."""
        return self.honest_s / self.naive_s if self.naive_s > 0 else math.inf

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ratio"] = self.ratio
        return out

    def __str__(self) -> str:
        return (f"{_fmt_bytes(self.nbytes)} copy to {self.device} "
                f"({'pinned' if self.pinned else 'pageable'} source, non_blocking=True)\n"
                f"  naive  (perf_counter, no sync): {_fmt_time(self.naive_s)} -> {self.naive_gbps:,.1f} GB/s\n"
                f"  honest (events / synchronize):  {_fmt_time(self.honest_s)} -> {self.honest_gbps:,.1f} GB/s\n"
                f"  honest / naive = {self.ratio:.1f}x. {self.note}")


def mismeasured_copy(nbytes: int | None = None, *, device: Any = None,
                     repeats: int | None = None) -> TimingDemo:
    """Time one ``dst.copy_(src, non_blocking=True)`` naively and honestly.

    Naive: ``perf_counter`` before and after the call, nothing else — what many benchmarks do.
    With a pinned source on CUDA the call only *queues* the copy and returns, so this measures
    the launch. Honest: CUDA events around the same call (or synchronize + perf_counter). The
    device is synchronised between repeats (outside both timings) so every repeat starts idle.
    """
    dev = resolve_device(device)
    if nbytes is None:
        nbytes = min(pick(full=256 * MIB, quick=16 * MIB), max_transfer_bytes(dev))
    check_int("nbytes", nbytes, 1)
    repeats = pick(full=10, quick=5) if repeats is None else repeats
    check_int("repeats", repeats, 1)
    host = torch.empty(nbytes, dtype=torch.uint8).fill_(5)
    pinned, why = try_pin(host, dev)
    src = pinned if pinned is not None else host
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(0)

    def copy() -> None:
        dst.copy_(src, non_blocking=True)

    copy()
    synchronize(dev)
    naive = []
    for _ in range(repeats):
        synchronize(dev)
        t0 = time.perf_counter()
        copy()
        naive.append(time.perf_counter() - t0)  # the classic mistake: no synchronisation
        synchronize(dev)
    honest = time_op(copy, device=dev, repeats=repeats, warmup=0)
    naive_s, honest_s = _median(naive), _median(honest)
    if dev.type == "cuda" and pinned is not None:
        note = ("On CUDA a non_blocking copy from pinned memory returns as soon as it is queued: "
                "the naive clock stopped before the data moved.")
    elif dev.type == "cuda":
        note = f"The source could not be pinned ({why}), so the copy was synchronous anyway."
    else:
        note = ("Here the copy runs on the CPU and has finished when the call returns, so both "
                "timings measure the same work; on a CUDA GPU the naive one measures only the "
                "launch (see the reference results).")
    is_pinned = pinned is not None
    del dst, host, src, pinned
    return TimingDemo(device=str(dev), nbytes=int(nbytes), pinned=is_pinned,
                      naive_s=naive_s, honest_s=honest_s,
                      naive_gbps=nbytes / naive_s / 1e9 if naive_s > 0 else math.inf,
                      honest_gbps=nbytes / honest_s / 1e9 if honest_s > 0 else math.inf,
                      note=note)


def _ref_title(doc: Mapping) -> str:
    machine = doc.get("machine", {})
    gpu = machine.get("gpu_name") or "GPU"
    return (f"Reference: {gpu}, measured {doc.get('measured_at', '?')}\n"
            f"{machine.get('summary', '')}")


def plot_sweeps(local: BandwidthSweep, reference: Mapping | None = None) -> Any:
    """This machine's sweep, and beside it the reference GPU's sweep when there is one.

    ``reference`` is a reference document (:func:`load_lesson04_reference`); without one (or
    without a sweep in it) only this machine's plot is drawn. Returns the Figure.
    """
    import matplotlib.pyplot as plt  # lazy: workers import this module (via l04_workers)

    ref_sweep = None
    if reference is not None and isinstance(reference.get("results", {}).get("sweep"), Mapping):
        ref_sweep = BandwidthSweep.from_dict(reference["results"]["sweep"])
    ncols = 2 if ref_sweep is not None else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.5 * ncols, 4.2), layout="constrained",
                             squeeze=False)
    local.plot(axes[0][0])
    if ref_sweep is not None:
        ref_sweep.plot(axes[0][1], title=_ref_title(reference))
        lo = min(a.get_ylim()[0] for a in axes[0])
        hi = max(a.get_ylim()[1] for a in axes[0])
        for a in axes[0]:
            a.set_ylim(lo, hi)
    return fig
