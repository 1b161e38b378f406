"""Host-to-device copies, measured honestly (lesson 04).

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
``python -m course_utils gpu-check`` on a CUDA machine.

Nothing happens at import time.
"""
from __future__ import annotations

import ast
import inspect
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .bench import _fmt_time
from .config import pick
from .device import (ALLOWED_DEVICES, move_to_device, resolve_device, synchronize, tensors_of,
                     try_pin)

__all__ = [
    "MODES",
    "what_is_measured",
    "time_op",
    "sweep_sizes",
    "max_transfer_bytes",
    "BandwidthSweep",
    "bandwidth_sweep",
    "TimingDemo",
    "mismeasured_copy",
    "OverlapResult",
    "measure_overlap",
    "DtypeTransfer",
    "uint8_vs_float32",
    "PinCost",
    "pin_memory_cost",
    "ForkedCudaDemo",
    "cuda_in_forked_worker",
    "torch_fork_error_message",
    "CudaTouchingDataset",
    "HostTensorDataset",
    "DevicePrefetcher",
    "PrefetchTiming",
    "compare_prefetch",
    "run_gpu_benchmarks",
    "load_lesson04_reference",
    "plot_sweeps",
    "reference_summary",
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

def _check_int(name: str, value: Any, minimum: int, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {minimum}{' or None' if allow_none else ''}, "
                        f"got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")


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
    _check_int("repeats", repeats, 1)
    _check_int("warmup", warmup, 0)
    _check_int("inner", inner, 1)
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
    from .data import ram_budget_bytes

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
    _check_int("max_bytes", max_bytes, 1)
    _check_int("min_bytes", min_bytes, 1)
    _check_int("factor", factor, 2)
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
        import matplotlib.pyplot as plt

        from .plots import figure_title

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
    _check_int("repeats", repeats, 1)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes={list(modes)!r}: choose from {', '.join(MODES)}.")
    if sizes is None:
        sizes = sweep_sizes(device=dev)
    sizes = [int(s) for s in sizes]
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"sizes must be a non-empty list of byte counts >= 1, got {sizes}.")
    target_bytes = pick(full=64 * MIB, quick=4 * MIB) if target_bytes is None else target_bytes
    _check_int("target_bytes", target_bytes, 1)
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

    from tqdm.auto import tqdm

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

    from .machine import machine_summary

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
    _check_int("nbytes", nbytes, 1)
    repeats = pick(full=10, quick=5) if repeats is None else repeats
    _check_int("repeats", repeats, 1)
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


# --------------------------------------------------------------------------------------
# overlap of a copy with compute
# --------------------------------------------------------------------------------------

class _MatmulChain:
    """``k`` matrix products of two n x n float32 matrices on ``device``: a compute kernel whose
    length we can dial."""

    def __init__(self, device: torch.device, n: int, k: int = 1) -> None:
        gen = torch.Generator().manual_seed(0)
        self.a = torch.randn(n, n, generator=gen).to(device)
        self.b = torch.randn(n, n, generator=gen).to(device) / math.sqrt(n)
        self.c = torch.empty(n, n, device=device)
        self.n, self.k = n, k

    def __call__(self) -> torch.Tensor:
        for _ in range(self.k):
            torch.mm(self.a, self.b, out=self.c)
        return self.c

    def describe(self) -> str:
        return f"{self.k} x matmul({self.n}x{self.n}, float32)"


def _wall_times(fn: Callable[[], Any], dev: torch.device, repeats: int, warmup: int = 1) -> list[float]:
    """perf_counter times with a device-wide synchronize before and after (covers all streams)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(dev)
        t0 = time.perf_counter()
        fn()
        synchronize(dev)
        times.append(time.perf_counter() - t0)
    return times


def _calibrated_compute(dev: torch.device, target_s: float, n: int | None = None,
                        max_k: int = 4000) -> _MatmulChain:
    """A matmul chain taking about ``target_s`` seconds on ``dev``."""
    if n is None:
        n = 2048 if dev.type == "cuda" else 256
    chain = _MatmulChain(dev, n, 1)
    one = _median(_wall_times(chain, dev, repeats=5, warmup=2))
    chain.k = int(min(max_k, max(1, round(target_s / max(one, 1e-7)))))
    return chain


@dataclass
class OverlapResult:
    """A copy and a compute kernel, alone and issued together (median seconds per variant).

    ``overlap[v]`` = (copy alone + compute alone - time of v) / min(copy alone, compute alone),
    unclipped (noise can push it slightly below 0 or above 1); :meth:`fraction` clips to [0, 1].
    """

    device: str
    copy_bytes: int
    compute: str
    times_s: dict[str, float]
    overlap: dict[str, float]
    streams: bool
    note: str = ""
    machine: str = ""

    def fraction(self, variant: str) -> float:
        if variant not in self.overlap:
            raise ValueError(f"variant={variant!r}: measured variants are {list(self.overlap)}.")
        return float(min(1.0, max(0.0, self.overlap[variant])))

    def noise(self, variant: str) -> float:
        """(time of ``variant`` - copy alone - compute alone) / (copy alone + compute alone):
        on a device without streams this is pure noise around 0."""
        alone = self.times_s["copy alone"] + self.times_s["compute alone"]
        return (self.times_s[variant] - alone) / alone if alone > 0 else 0.0

    def best_variant(self) -> str:
        return max(self.overlap, key=lambda v: self.overlap[v])

    def to_dict(self) -> dict:
        return asdict(self)

    def plot(self, ax: Any = None, *, title: str | None = None) -> Any:
        """Horizontal bars: copy alone, compute alone, their sum, and each variant."""
        import matplotlib.pyplot as plt

        from .plots import figure_title

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 3), layout="constrained")
        names = list(self.times_s)
        copy_s, comp_s = self.times_s["copy alone"], self.times_s["compute alone"]
        names.insert(2, "copy + compute (if serial)")
        values = [self.times_s.get(n, copy_s + comp_s) * 1e3 for n in names]
        colors = ["tab:blue", "tab:green", "lightgrey"] + [
            "tab:purple" if self.streams and self.overlap.get(n, 0) > 0.5 else "tab:red"
            for n in names[3:]]
        ax.barh(names[::-1], values[::-1], color=colors[::-1])
        for i, n in enumerate(names[::-1]):
            if n in self.overlap:
                text = (f"  overlap {self.fraction(n):.0%}" if self.streams
                        else "  no streams: nothing can overlap")
                ax.text(values[::-1][i], i, text, va="center", fontsize=8)
        ax.set_xlabel("milliseconds (median)")
        ax.set_title(title or figure_title(f"Copy {_fmt_bytes(self.copy_bytes)} while computing on "
                                           f"{self.device}", {"compute": self.compute}), fontsize=8)
        ax.set_xlim(0, max(values) * (1.35 if self.streams else 1.75))
        return ax

    def __str__(self) -> str:
        lines = [f"copy of {_fmt_bytes(self.copy_bytes)} and {self.compute} on {self.device}"]
        for name, t in self.times_s.items():
            extra = ""
            if name in self.overlap:
                extra = (f"   overlap {self.fraction(name):.0%}" if self.streams else
                         f"   {self.noise(name):+.0%} vs the two alone (noise: nothing can overlap)")
            lines.append(f"  {name:<34} {_fmt_time(t):>10}{extra}")
        if self.note:
            lines.append("  " + self.note)
        return "\n".join(lines)


def measure_overlap(copy_bytes: int | None = None, *, device: Any = None,
                    repeats: int | None = None, matmul_n: int | None = None) -> OverlapResult:
    """Measure how much of a host-to-device copy hides behind a compute kernel.

    CUDA: the copy is ``dst.copy_(pinned_src, non_blocking=True)``; the compute is a chain of
    matrix products calibrated to take about as long as the copy. Variants: both on the
    default stream (they serialise), the copy on a side stream (``torch.cuda.Stream``) while
    the compute runs on the default stream (they can overlap), and the same with a pageable
    source (the copy must be staged by the CPU, so it cannot overlap well). Each variant is
    timed with ``perf_counter`` and a device-wide ``torch.cuda.synchronize()``, which covers
    every stream (CUDA events on one stream would miss the other).
    Elsewhere there are no streams: copy and compute run one after the other, and the overlap
    measured is about 0; the function says so.
    """
    dev = resolve_device(device)
    if copy_bytes is None:
        copy_bytes = min(pick(full=256 * MIB, quick=8 * MIB), max_transfer_bytes(dev))
    _check_int("copy_bytes", copy_bytes, 1)
    repeats = pick(full=7, quick=3) if repeats is None else repeats
    _check_int("repeats", repeats, 1)
    host = torch.empty(copy_bytes, dtype=torch.uint8).fill_(9)
    pinned, why = try_pin(host, dev)
    dst = torch.empty(copy_bytes, dtype=torch.uint8, device=dev).fill_(0)
    src = pinned if pinned is not None else host

    def copy() -> None:
        dst.copy_(src, non_blocking=True)

    copy_s = _median(_wall_times(copy, dev, repeats))
    compute = _calibrated_compute(dev, copy_s, n=matmul_n)
    times: dict[str, float] = {"copy alone": copy_s,
                               "compute alone": _median(_wall_times(compute, dev, repeats))}
    streams = dev.type == "cuda"
    if streams:
        side = torch.cuda.Stream(dev)

        def same_stream() -> None:
            dst.copy_(src, non_blocking=True)
            compute()

        def side_stream() -> None:
            with torch.cuda.stream(side):
                dst.copy_(src, non_blocking=True)
            compute()

        def side_pageable() -> None:
            with torch.cuda.stream(side):
                dst.copy_(host, non_blocking=True)
            compute()

        variants = {"same stream (copy, then compute)": same_stream,
                    "copy on a side stream": side_stream,
                    "side stream, pageable source": side_pageable}
        note = ("side stream: torch.cuda.Stream(); the copy is queued there with "
                "non_blocking=True from pinned memory, the compute on the default stream.")
        if pinned is None:
            note += f" The source could not be pinned ({why})."
    else:
        def serial() -> None:
            copy()
            compute()

        variants = {"copy, then compute (no streams here)": serial}
        note = ("No CUDA streams on this device: the copy and the compute run one after the other, "
                "so there is nothing to overlap (any difference from the sum of the two is noise). "
                "On a GPU the copy engine and the compute cores work at the same time.")
    for name, fn in variants.items():
        times[name] = _median(_wall_times(fn, dev, repeats))
    shorter = min(times["copy alone"], times["compute alone"])
    overlap = {name: (times["copy alone"] + times["compute alone"] - times[name]) / shorter
               for name in variants} if shorter > 0 else {name: 0.0 for name in variants}
    desc = compute.describe()
    del dst, host, src, pinned, compute
    from .machine import machine_summary
    return OverlapResult(device=str(dev), copy_bytes=int(copy_bytes), compute=desc,
                         times_s=times, overlap=overlap, streams=streams, note=note,
                         machine=machine_summary())


# --------------------------------------------------------------------------------------
# uint8 vs float32
# --------------------------------------------------------------------------------------

@dataclass
class DtypeTransfer:
    """One batch of images moved as float32, or as uint8 and converted on the device.

    times_s: median seconds per batch for "float32 copy", "uint8 copy" and "uint8 copy +
    normalise on device"; max_abs_diff: largest difference between the two results (float32
    units) — the same values either way.
    """

    device: str
    batch_shape: list[int]
    bytes_uint8: int
    bytes_float32: int
    pinned: bool
    times_s: dict[str, float]
    max_abs_diff: float
    note: str = ""

    @property
    def speedup(self) -> float:
        """float32 copy time / (uint8 copy + convert) time."""
        t = self.times_s["uint8 copy + normalise on device"]
        return self.times_s["float32 copy"] / t if t > 0 else math.inf

    def to_dict(self) -> dict:
        out = asdict(self)
        out["speedup"] = self.speedup
        return out

    def __str__(self) -> str:
        lines = [f"batch {tuple(self.batch_shape)} to {self.device} "
                 f"({'pinned' if self.pinned else 'pageable'} source)",
                 f"  bytes: uint8 {self.bytes_uint8 / 1e6:.1f} MB, float32 {self.bytes_float32 / 1e6:.1f} MB"]
        for name, t in self.times_s.items():
            lines.append(f"  {name:<34} {_fmt_time(t):>10}")
        verdict = (f"{self.speedup:.2f}x faster than" if self.speedup >= 1
                   else f"{1 / self.speedup:.2f}x slower than")
        lines.append(f"  uint8 copy + normalise on the device was {verdict} the float32 copy; "
                     f"results differ by at most {self.max_abs_diff:.2g}")
        if self.note:
            lines.append("  " + self.note)
        return "\n".join(lines)


def uint8_vs_float32(batch_size: int | None = None, *, image_shape: Sequence[int] = (3, 224, 224),
                     device: Any = None, repeats: int | None = None) -> DtypeTransfer:
    """Copy a batch as float32 vs as uint8 followed by normalising on the device.

    The float32 batch is what the common recipe's workers produce (already normalised); the
    uint8 batch is the same images before conversion, normalised with
    :func:`course_utils.transforms.normalize_batch` after the copy. Sources are pinned where
    the device allows, copies go into preallocated device buffers. Times are medians per batch
    (CUDA events on CUDA; synchronize + perf_counter elsewhere).
    """
    from .transforms import normalize_batch

    dev = resolve_device(device)
    batch_size = pick(full=256, quick=32) if batch_size is None else batch_size
    _check_int("batch_size", batch_size, 1)
    repeats = pick(full=10, quick=3) if repeats is None else repeats
    _check_int("repeats", repeats, 1)
    shape = tuple(int(s) for s in image_shape)
    if len(shape) != 3 or shape[0] != 3 or min(shape) < 1:
        raise ValueError(f"image_shape must be (3, H, W) with H, W >= 1, got {image_shape!r}.")
    gen = torch.Generator().manual_seed(0)
    u8 = torch.randint(0, 256, (batch_size, *shape), dtype=torch.uint8, generator=gen)
    f32 = normalize_batch(u8)
    pu8, why = try_pin(u8, dev)
    pf32, _ = try_pin(f32, dev)
    pinned = pu8 is not None and pf32 is not None
    src_u8, src_f32 = (pu8, pf32) if pinned else (u8, f32)
    dst_u8 = torch.empty(u8.shape, dtype=torch.uint8, device=dev)
    dst_f32 = torch.empty(f32.shape, dtype=torch.float32, device=dev)

    def copy_f32() -> None:
        dst_f32.copy_(src_f32, non_blocking=pinned)

    def copy_u8() -> None:
        dst_u8.copy_(src_u8, non_blocking=pinned)

    def copy_convert() -> torch.Tensor:
        dst_u8.copy_(src_u8, non_blocking=pinned)
        return normalize_batch(dst_u8)

    times = {}
    for name, fn in (("float32 copy", copy_f32), ("uint8 copy", copy_u8),
                     ("uint8 copy + normalise on device", copy_convert)):
        times[name] = _median(time_op(fn, device=dev, repeats=repeats, warmup=1))
    copy_f32()
    diff = float((copy_convert() - dst_f32).abs().max().item())
    note = "" if dev.type != "cpu" else (
        "On CPU the 'copy' is a host memcpy and the conversion runs on the CPU too; on a GPU the "
        "copy crosses the link (4x fewer bytes for uint8) and the conversion is one fast kernel.")
    return DtypeTransfer(device=str(dev), batch_shape=[batch_size, *shape],
                         bytes_uint8=int(u8.nbytes), bytes_float32=int(f32.nbytes),
                         pinned=pinned, times_s=times, max_abs_diff=diff,
                         note=note if pinned or dev.type == "cpu" else f"not pinned: {why}")


# --------------------------------------------------------------------------------------
# moving batches
# --------------------------------------------------------------------------------------

class _CopyingLoader:
    """Iterates ``loader`` and moves each batch to ``device``, synchronised, so that a loader
    timing includes the copy. Forwards the DataLoader settings measure_loader reports."""

    def __init__(self, loader: Any, device: torch.device) -> None:
        self.loader, self.device = loader, device
        for name in ("num_workers", "batch_size", "pin_memory", "persistent_workers",
                     "prefetch_factor", "multiprocessing_context"):
            if hasattr(loader, name):
                setattr(self, name, getattr(loader, name))

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            moved = move_to_device(batch, self.device, non_blocking=True)
            synchronize(self.device)
            yield moved


# --------------------------------------------------------------------------------------
# pin_memory=True in a DataLoader
# --------------------------------------------------------------------------------------

@dataclass
class PinCost:
    """pin_memory=False vs True in a DataLoader, each batch copied to the device.

    ``measurements``: :meth:`course_utils.bench.Measurement.to_dict` of each loader (samples/s
    including the synchronised copy; CPU-s/sample of the whole process tree, pin thread
    included). ``memcpy_s_per_batch``: a host memcpy of one batch's bytes — the least that
    pinning a batch costs the pin thread (it copies the batch into page-locked memory).
    ``meaningful`` is False without CUDA: then pin_memory=True does nothing.
    """

    device: str
    meaningful: bool
    batch_size: int
    batch_bytes: int
    num_workers: int
    measurements: list[dict]
    memcpy_s_per_batch: float
    note: str = ""

    def measurement(self, pin_memory: bool) -> Any:
        from .bench import Measurement
        for m in self.measurements:
            if m.get("settings", {}).get("pin_memory") == pin_memory:
                return Measurement.from_dict(m)
        return None

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        lines = [f"pin_memory in a DataLoader ({self.num_workers} workers, batches of "
                 f"{self.batch_size} = {self.batch_bytes / 1e6:.1f} MB), copied to {self.device}"]
        for pin in (False, True):
            m = self.measurement(pin)
            if m is not None:
                cpu = m.cpu_s_per_sample
                lines.append(f"  pin_memory={str(pin):<5} {m.samples_per_s:10,.0f} samples/s   "
                             f"{'n/a' if cpu is None else f'{cpu * 1e3:.3f} ms'} CPU per sample")
        lines.append(f"  a host memcpy of one batch (the least pinning it costs): "
                     f"{_fmt_time(self.memcpy_s_per_batch)}")
        if self.note:
            lines.append("  " + self.note)
        return "\n".join(lines)


def pin_memory_cost(dataset: Dataset | None = None, *, batch_size: int | None = None,
                    num_workers: int | None = None, batches: int | None = None,
                    repeats: int | None = None, device: Any = None,
                    progress: bool = True) -> PinCost:
    """What ``pin_memory=True`` costs and buys in a DataLoader.

    The dataset defaults to an in-memory :class:`course_utils.data.ArrayDataset` of uint8
    3x224x224 images (little work per sample, so the pin thread's cost is visible). Each loader
    is timed with :func:`course_utils.bench.measure_loader` while every batch is copied to the
    device and synchronised (pinned batches with ``non_blocking=True``). On CUDA both
    ``pin_memory=False`` and ``True`` are measured; elsewhere only ``False`` (PyTorch skips
    pinning without an accelerator), and the result says it is not meaningful here.
    """
    from .bench import measure_loader
    from .data import ArrayDataset
    from .machine import usable_cpus

    dev = resolve_device(device)
    batch_size = pick(full=128, quick=32) if batch_size is None else batch_size
    _check_int("batch_size", batch_size, 1)
    num_workers = min(4, usable_cpus()) if num_workers is None else num_workers
    _check_int("num_workers", num_workers, 0)
    batches = pick(full=40, quick=6) if batches is None else batches
    _check_int("batches", batches, 1)
    repeats = pick(full=3, quick=2) if repeats is None else repeats
    _check_int("repeats", repeats, 1)
    warmup = max(2, num_workers)
    if dataset is None:
        dataset = ArrayDataset(n=batch_size * (batches + warmup + 1), shape=(3, 224, 224))
    if len(dataset) < batch_size * (batches + warmup):
        raise ValueError(f"dataset has {len(dataset)} samples, fewer than batch_size={batch_size} x "
                         f"(batches={batches} + {warmup} warm-up): pass fewer batches or a bigger dataset.")
    sample, _ = dataset[0]
    batch_bytes = int(sample.numel() * sample.element_size()) * batch_size
    buf_src = torch.empty(batch_bytes, dtype=torch.uint8).fill_(1)
    buf_dst = torch.empty(batch_bytes, dtype=torch.uint8)
    memcpy = _median(time_op(lambda: buf_dst.copy_(buf_src), device="cpu",
                             repeats=pick(full=9, quick=5), warmup=1))
    del buf_src, buf_dst
    meaningful = dev.type == "cuda"
    pins = (False, True) if meaningful else (False,)
    results = []
    for pin in pins:
        kwargs: dict = dict(batch_size=batch_size, num_workers=num_workers, pin_memory=pin,
                            shuffle=False)
        if num_workers:
            kwargs.update(timeout=120, persistent_workers=False)
        loader = DataLoader(dataset, **kwargs)
        m = measure_loader(_CopyingLoader(loader, dev), batches=batches, warmup_batches=warmup,
                           repeats=repeats, label=f"pin_memory={pin}",
                           settings={"pin_memory": pin, "device": str(dev)}, progress=progress)
        results.append(m.to_dict())
        del loader
    if meaningful:
        note = ("pin_memory=True: a thread in the main process copies every batch into page-locked "
                "memory (CPU time, counted in CPU per sample); the copy to the GPU then runs by DMA "
                "and can be non_blocking.")
    else:
        note = (f"Not meaningful on {dev.type}: without CUDA, pin_memory=True does nothing "
                f"(PyTorch warns and skips it), so only pin_memory=False was measured. Pinning a "
                f"batch is at least a copy of its bytes: the memcpy above is that lower bound on "
                f"this CPU.")
    return PinCost(device=str(dev), meaningful=meaningful, batch_size=batch_size,
                   batch_bytes=batch_bytes, num_workers=num_workers, measurements=results,
                   memcpy_s_per_batch=memcpy, note=note)


# --------------------------------------------------------------------------------------
# CUDA in a forked worker
# --------------------------------------------------------------------------------------

class CudaTouchingDataset(Dataset):
    """The mistake: ``__getitem__`` moves each sample to CUDA inside the worker."""

    def __init__(self, n: int = 8) -> None:
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = torch.full((3, 8, 8), i % 256, dtype=torch.uint8)
        return x.to("cuda"), i


class HostTensorDataset(Dataset):
    """The right pattern: workers return CPU (uint8) tensors; the main process moves batches."""

    def __init__(self, n: int = 8) -> None:
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, 8, 8), i % 256, dtype=torch.uint8), i


def torch_fork_error_message() -> str | None:
    """The 'forked subprocess' error message as written in the installed torch's source.

    Read from ``torch.cuda._lazy_init`` with :mod:`inspect` (None if this torch's source is
    not available or is written differently). This is *quoted from the source*, not produced
    by running anything.
    """
    try:
        source = inspect.getsource(torch.cuda._lazy_init)
    except (OSError, TypeError, AttributeError):
        return None
    match = re.search(r"_is_in_bad_fork\(\)\s*:\s*raise\s+RuntimeError\(\s*((?:(?:\"[^\"]*\"|'[^']*')\s*)+)\)",
                      source)
    if not match:
        return None
    try:
        return str(ast.literal_eval("(" + match.group(1) + ")"))
    except (ValueError, SyntaxError):
        return None


_FORK_SCRIPT = r'''
import json, os, sys, threading, time, traceback, warnings
out = {"fork": hasattr(os, "fork")}
import torch
from torch.utils.data import DataLoader
from course_utils.transfer import CudaTouchingDataset, HostTensorDataset
out["cuda_build"] = torch.version.cuda
cuda = torch.cuda.is_available()           # a CUDA build initialises the driver here, GPU or not
out["cuda"] = cuda
if cuda:
    torch.zeros(1, device="cuda")          # the training script uses CUDA first, as usual
out["parent_used_cuda"] = cuda
if out["fork"]:
    try:
        loader = DataLoader(CudaTouchingDataset(4), batch_size=2, num_workers=1,
                            multiprocessing_context="fork", timeout=30)
        next(iter(loader))
        out["wrong_error"] = None
    except Exception as exc:
        out["wrong_error"] = type(exc).__name__ + ": " + str(exc)
    try:
        loader = DataLoader(HostTensorDataset(8), batch_size=4, num_workers=2,
                            multiprocessing_context="fork", pin_memory=cuda, timeout=30)
        device = "cuda" if cuda else "cpu"
        seen = []
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            seen += y.tolist()
        out["right_ok"] = seen == list(range(8))
        out["right_text"] = ("2 forked workers returned CPU uint8 tensors; the main process moved "
                             "8 samples to " + device + " in order")
    except Exception as exc:
        out["right_ok"] = False
        out["right_text"] = type(exc).__name__ + ": " + str(exc)
    # the mechanism, with no GPU needed: a lock held by a thread at fork time
    lock = threading.Lock()
    started = threading.Event()
    def holder():
        with lock:
            started.set()
            time.sleep(1.5)
    t = threading.Thread(target=holder, daemon=True)
    t.start()
    started.wait()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pid = os.fork()
    if pid == 0:
        ok = lock.acquire(timeout=0.5)
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8
    out["lock_held_in_child"] = code == 3
    out["fork_warning"] = str(caught[0].message) if caught else None
    t.join()
print("@@RESULT@@" + json.dumps(out))
'''


@dataclass
class ForkedCudaDemo:
    """What happens when a forked DataLoader worker touches CUDA, run in a subprocess.

    ``worker_error``: the last line of the error the forked worker raised on THIS machine
    (exact text); on a CUDA machine it is torch's "Cannot re-initialize CUDA in forked
    subprocess" error, elsewhere whatever touching CUDA says here (e.g. "Torch not compiled
    with CUDA enabled"). ``torch_message``: the CUDA error as written in the installed torch's
    source (quoted, not produced). ``lock_held_in_child``: the mechanism reproduced without a
    GPU — a lock held by a parent thread at fork time stays held in the child, where no thread
    will ever release it.
    """

    cuda_available: bool
    fork_available: bool
    parent_used_cuda: bool
    worker_error: str | None
    worker_error_full: str | None
    torch_message: str | None
    torch_message_source: str
    right_pattern_ok: bool
    right_pattern_text: str
    lock_held_in_child: bool | None
    fork_warning: str | None
    timed_out: bool = False
    stderr_tail: str = ""
    cuda_build: str | None = None

    @property
    def reproduced_cuda_error(self) -> bool:
        """True when this run produced torch's forked-CUDA error for real."""
        return bool(self.worker_error and "Cannot re-initialize CUDA in forked subprocess"
                    in self.worker_error)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["reproduced_cuda_error"] = self.reproduced_cuda_error
        return out

    def __str__(self) -> str:
        lines = []
        if self.timed_out:
            return ("The forked-worker demo did not finish within its timeout and was stopped "
                    f"(nothing hangs): {self.stderr_tail}")
        if not self.fork_available:
            return ("This platform has no fork (e.g. Windows): DataLoader workers are spawned, "
                    "each imports torch afresh and may initialise CUDA itself, so the forked-CUDA "
                    "error cannot happen here.")
        if self.reproduced_cuda_error and self.parent_used_cuda:
            lines.append("Measured here (CUDA): the parent used CUDA, then a forked DataLoader "
                         "worker touched CUDA and raised:")
            lines.append(f"    {self.worker_error}")
        elif self.reproduced_cuda_error:
            lines.append(f"Measured here: the parent never used CUDA (this machine has no usable "
                         f"GPU); it only called torch.cuda.is_available(). With this CUDA "
                         f"{self.cuda_build} build of torch that call already initialises the CUDA "
                         f"driver, so a forked DataLoader worker that touched CUDA raised:")
            lines.append(f"    {self.worker_error}")
            lines.append("So with the default (CUDA) torch on Linux, even a GPU-less laptop hits "
                         "this error: keep CUDA out of forked workers everywhere.")
        else:
            what = ("This torch is a CPU-only build" if not self.cuda_build else
                    "This run did not produce torch's forked-CUDA error")
            lines.append(f"{what}, so the forked worker could not fail the way it does on a GPU "
                         "machine. What a forked worker that touches CUDA raised here (real, "
                         "from this run):")
            lines.append(f"    {self.worker_error}")
            if self.torch_message:
                lines.append(f"On a CUDA machine, the worker raises this instead — QUOTED FROM "
                             f"{self.torch_message_source}, not produced here:")
                lines.append(f"    RuntimeError: {self.torch_message}")
        if self.lock_held_in_child is not None:
            lines.append("The mechanism, reproduced here without a GPU: a thread held a lock when "
                         "the process forked; in the child the lock was "
                         + ("still held, with no thread left to release it (acquire(timeout=0.5) "
                            "failed: without the timeout the child would wait forever)."
                            if self.lock_held_in_child else "free (this run did not show it)."))
            if self.fork_warning:
                lines.append(f"    Python itself warned at fork: {self.fork_warning}")
            lines.append("A CUDA context is driver state with threads, locks and device handles "
                         "like that lock; a forked copy of it is unusable, so torch refuses "
                         "(it marks the child 'in bad fork') instead of hanging.")
        lines.append(f"The right pattern: {self.right_pattern_text} "
                     f"({'worked' if self.right_pattern_ok else 'FAILED'}). Workers return CPU "
                     f"tensors; pin_memory=True; the main process copies with "
                     f".to(device, non_blocking=True) (or a DevicePrefetcher). Only if workers "
                     f"must run CUDA code: multiprocessing_context='spawn' (each worker then "
                     f"starts its own CUDA context: slow start-up, memory per worker).")
        return "\n".join(lines)


def cuda_in_forked_worker(timeout_s: float = 60.0) -> ForkedCudaDemo:
    """Run the forked-worker CUDA demo in a fresh Python subprocess (killed after ``timeout_s``).

    In the subprocess: the parent uses CUDA when it can, then a DataLoader with one *forked*
    worker runs :class:`CudaTouchingDataset` (which calls ``.to('cuda')`` in the worker), and
    the exact error is captured; then the right pattern (:class:`HostTensorDataset`, CPU
    tensors from workers, copy in the main process) runs; then the lock-across-fork mechanism.
    A subprocess keeps this process's CUDA state and workers untouched.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONWARNINGS", "ignore::UserWarning")
    source = f"torch/cuda/__init__.py, _lazy_init (torch {torch.__version__})"
    message = torch_fork_error_message()
    try:
        proc = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], capture_output=True,
                              text=True, timeout=timeout_s, env=env, cwd=root)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-500:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return ForkedCudaDemo(False, hasattr(os, "fork"), False, None, None, message, source,
                              False, "not run (timeout)", None, None, timed_out=True,
                              stderr_tail=f"timed out after {timeout_s:g} s. {tail}")
    lines = [l for l in proc.stdout.splitlines() if l.startswith("@@RESULT@@")]
    if not lines:
        raise RuntimeError(f"the forked-worker demo subprocess failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-2000:]}")
    out = json.loads(lines[-1][len("@@RESULT@@"):])
    full = out.get("wrong_error")
    last = None
    if full:
        text_lines = [l.strip() for l in full.strip().splitlines() if l.strip()]
        last = text_lines[-1] if text_lines else full
    return ForkedCudaDemo(
        cuda_available=bool(out.get("cuda")), fork_available=bool(out.get("fork")),
        parent_used_cuda=bool(out.get("parent_used_cuda")), worker_error=last,
        worker_error_full=full, torch_message=message, torch_message_source=source,
        right_pattern_ok=bool(out.get("right_ok")),
        right_pattern_text=str(out.get("right_text", "not run (no fork on this platform)")),
        lock_held_in_child=out.get("lock_held_in_child"), fork_warning=out.get("fork_warning"),
        stderr_tail=proc.stderr[-500:] if proc.returncode else "", cuda_build=out.get("cuda_build"))


# --------------------------------------------------------------------------------------
# the double-buffered device prefetcher
# --------------------------------------------------------------------------------------

class DevicePrefetcher:
    """Iterate over ``loader`` with every batch already on ``device``; batch k+1 is copied
    while batch k is being used (double buffering).

    On CUDA each copy is queued on a side stream (``torch.cuda.Stream``) with
    ``non_blocking=True`` — asynchronous when the loader pins memory (``pin_memory=True``) —
    so it runs on the copy engine while the compute of the previous batch runs on the default
    stream. Before a batch is handed out, the current stream waits for the side stream
    (``wait_stream``: no kernel reads a half-copied batch), and every tensor of it is marked as
    used by the current stream (``record_stream``: the caching allocator will not reuse its
    memory while compute still reads it). Two batches are on the device at a time: the one in
    use and the one being copied.

    On other devices (CPU, MPS) there is no side stream: the same loop runs with plain
    synchronous copies (on CPU ``.to('cpu')`` is free), so it behaves as a plain iterator with
    the same interface and the same order.

    dtypes are kept: a uint8 batch arrives uint8 (convert on the device, after the copy).
    Each ``iter()`` starts a fresh pass over ``loader`` (one epoch).
    """

    def __init__(self, loader: Iterable, device: Any = None, *, non_blocking: bool = True) -> None:
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"loader must be iterable (e.g. a DataLoader), got {type(loader).__name__}.")
        self.loader = loader
        self.device = resolve_device(device, allow_meta=True)
        self.non_blocking = bool(non_blocking)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self.device.type == "cuda":
            return self._iter_cuda()
        return self._iter_plain()

    def _iter_plain(self) -> Iterator[Any]:
        it = iter(self.loader)
        end = object()
        nxt = next(it, end)
        nxt = end if nxt is end else move_to_device(nxt, self.device, non_blocking=False)
        while nxt is not end:
            batch = nxt
            nxt = next(it, end)                                   # fetch k+1 before k is used
            if nxt is not end:
                nxt = move_to_device(nxt, self.device, non_blocking=False)
            yield batch

    def _iter_cuda(self) -> Iterator[Any]:
        stream = torch.cuda.Stream(self.device)
        it = iter(self.loader)
        end = object()

        def preload() -> Any:
            batch = next(it, end)
            if batch is end:
                return end
            with torch.cuda.stream(stream):
                return move_to_device(batch, self.device, non_blocking=self.non_blocking)

        nxt = preload()
        while nxt is not end:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(stream)                  # the copy of this batch is done first
            batch = nxt
            for t in tensors_of(batch):
                if t.device.type == "cuda":
                    t.record_stream(current)             # memory in use by the current stream
            nxt = preload()                              # queue the copy of batch k+1 ...
            yield batch                                  # ... while batch k is used


@dataclass
class PrefetchTiming:
    """Seconds per training step (median over repeats) with a plain loop vs DevicePrefetcher.

    The plain loop moves each batch with ``.to(device, non_blocking=True)`` on the default
    stream, right before its step. Only the end of each repeat is synchronised, as in real
    training, so the GPU can run ahead of Python.
    """

    device: str
    steps: int
    plain_s_per_step: float
    prefetch_s_per_step: float
    copy_s_per_batch: float | None = None
    step_s: float | None = None
    note: str = ""

    @property
    def speedup(self) -> float:
        return self.plain_s_per_step / self.prefetch_s_per_step if self.prefetch_s_per_step > 0 else math.inf

    def to_dict(self) -> dict:
        out = asdict(self)
        out["speedup"] = self.speedup
        return out

    def __str__(self) -> str:
        text = (f"{self.steps} steps on {self.device}: plain loop {_fmt_time(self.plain_s_per_step)}/step, "
                f"DevicePrefetcher {_fmt_time(self.prefetch_s_per_step)}/step ({self.speedup:.2f}x)")
        if self.copy_s_per_batch is not None and self.step_s is not None:
            text += (f"\n  alone: copy {_fmt_time(self.copy_s_per_batch)}/batch, compute "
                     f"{_fmt_time(self.step_s)}/step")
        if self.note:
            text += "\n  " + self.note
        return text


def compare_prefetch(loader: Iterable, step_fn: Callable[[Any], Any], *, device: Any = None,
                     repeats: int | None = None) -> PrefetchTiming:
    """Time one pass over ``loader`` (step_fn on every batch) plainly and with DevicePrefetcher.

    Each repeat runs a whole pass for both, alternating (plain, prefetch, plain, ...), after
    one warm-up pass each; seconds per step are medians over repeats.
    """
    dev = resolve_device(device)
    if not callable(step_fn):
        raise TypeError(f"step_fn must be a callable taking one batch, got {type(step_fn).__name__}.")
    repeats = pick(full=5, quick=2) if repeats is None else repeats
    _check_int("repeats", repeats, 1)

    def plain() -> int:
        n = 0
        for batch in loader:
            step_fn(move_to_device(batch, dev, non_blocking=True))
            n += 1
        return n

    def prefetched() -> int:
        n = 0
        for batch in DevicePrefetcher(loader, dev):
            step_fn(batch)
            n += 1
        return n

    steps = plain()
    prefetched()
    if steps == 0:
        raise ValueError("loader yielded no batches: pass a loader with at least one batch.")
    t_plain, t_pref = [], []
    for _ in range(repeats):
        for fn, out in ((plain, t_plain), (prefetched, t_pref)):
            synchronize(dev)
            t0 = time.perf_counter()
            fn()
            synchronize(dev)
            out.append((time.perf_counter() - t0) / steps)
    note = "" if dev.type == "cuda" else (
        "No CUDA streams here: both loops copy and compute one after the other, so they should "
        "take the same time (any difference is noise).")
    return PrefetchTiming(device=str(dev), steps=steps, plain_s_per_step=_median(t_plain),
                          prefetch_s_per_step=_median(t_pref), note=note)


class _PinnedBatches:
    """An iterable over ``n`` batches cycling through a few pinned (images, labels) pairs."""

    def __init__(self, batches: list, n: int) -> None:
        self.batches, self.n = batches, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.n):
            yield self.batches[i % len(self.batches)]


class _NormalizeAndCompute:
    """A training-step stand-in: normalise the uint8 batch on the device, then a matmul chain."""

    def __init__(self, chain: _MatmulChain) -> None:
        self.chain = chain

    def __call__(self, batch: Any) -> Any:
        from .transforms import normalize_batch
        images, _ = batch
        x = normalize_batch(images)
        self.chain()
        return x


# --------------------------------------------------------------------------------------
# the lesson's GPU benchmarks (for the gpu-check command)
# --------------------------------------------------------------------------------------

def run_gpu_benchmarks(budget_s: float = 180.0, *, progress: bool = False) -> dict:
    """Run lesson 04's measurements on CUDA and return them as a JSON-friendly dict.

    Sections (each skipped, with the reason recorded, when the budget is spent): the bandwidth
    sweep (pageable / pinned / device-to-device), the naive vs honest timing, copy/compute
    overlap, uint8 vs float32, the DevicePrefetcher against a plain loop, pin_memory in a
    DataLoader, and the forked-worker error. Sizes follow the mode (full unless quick mode
    is on; the gpu-check command runs in full mode). ``targets["pinned_h2d"]`` holds the issue
    target: the best pinned copy >= 90% of the best host-to-device copy measured.
    Raises RuntimeError without CUDA: these are GPU reference results.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("run_gpu_benchmarks needs a CUDA GPU (torch.cuda.is_available() is "
                           "False): these results are the reference a CPU-only learner is shown.")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or budget_s <= 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}.")
    from .config import quick_mode

    dev = torch.device("cuda")
    start = time.perf_counter()
    results: dict[str, Any] = {"mode": "quick" if quick_mode() else "full", "device": str(dev),
                               "device_name": torch.cuda.get_device_name(dev), "skipped": {},
                               "seconds": {}}

    def left() -> float:
        return budget_s - (time.perf_counter() - start)

    def run(name: str, need_s: float, fn: Callable[[], Any]) -> Any:
        if left() < need_s:
            results["skipped"][name] = f"budget: {left():.0f} s left, about {need_s:.0f} s needed"
            return None
        t0 = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # record and go on: one failed section must not lose the rest
            results["skipped"][name] = f"failed: {type(exc).__name__}: {exc}"
            return None
        results["seconds"][name] = time.perf_counter() - t0
        results[name] = value.to_dict() if hasattr(value, "to_dict") else value
        return value

    sweep = run("sweep", 10, lambda: bandwidth_sweep(device=dev, progress=progress))
    run("mismeasure", 3, lambda: mismeasured_copy(device=dev))
    run("overlap", 5, lambda: measure_overlap(device=dev))
    run("dtype", 3, lambda: uint8_vs_float32(device=dev))

    def prefetch() -> PrefetchTiming:
        batch = pick(full=256, quick=32)
        pinned = [(torch.randint(0, 256, (batch, 3, 224, 224), dtype=torch.uint8).pin_memory(),
                   torch.arange(batch).pin_memory()) for _ in range(2)]
        loader = _PinnedBatches(pinned, pick(full=40, quick=8))
        dst = torch.empty(pinned[0][0].shape, dtype=torch.uint8, device=dev)
        copy_s = _median(time_op(lambda: dst.copy_(pinned[0][0], non_blocking=True), device=dev,
                                 repeats=5))
        step = _NormalizeAndCompute(_calibrated_compute(dev, copy_s))
        step_s = _median(time_op(lambda: step((dst, None)), device=dev, repeats=5))
        timing = compare_prefetch(loader, step, device=dev)
        timing.copy_s_per_batch, timing.step_s = copy_s, step_s
        timing.note = (f"batches of {batch} uint8 3x224x224 from pinned memory; the step "
                       f"(normalise + {step.chain.describe()}) is calibrated to about the copy time, "
                       f"so perfect overlap would be close to 2x.")
        return timing

    run("prefetch", 5, prefetch)
    run("pin_cost", 20, lambda: pin_memory_cost(device=dev, progress=progress))
    run("forked_worker", 15, lambda: cuda_in_forked_worker(timeout_s=max(15.0, min(60.0, left()))))

    targets: dict[str, Any] = {}
    if sweep is not None:
        frac = sweep.pinned_fraction_of_best()
        best = sweep.best_h2d()
        pinned = sweep.best("pinned")
        targets["pinned_h2d"] = {
            "description": "pinned host-to-device >= 90% of the best host-to-device figure measured",
            "value": frac, "target": ">= 0.9", "unit": "fraction of the best H2D GB/s",
            "met": None if frac is None else bool(frac >= 0.9),
            "detail": (f"best pinned {pinned[1]:.1f} GB/s at {_fmt_bytes(pinned[0])}; best H2D "
                       f"{best[2]:.1f} GB/s ({best[0]} at {_fmt_bytes(best[1])})"
                       if pinned and best else "pinned copies not measured"),
        }
    results["targets"] = targets
    results["total_s"] = time.perf_counter() - start
    return results


# --------------------------------------------------------------------------------------
# showing the reference results beside this machine's
# --------------------------------------------------------------------------------------

def load_lesson04_reference() -> dict | None:
    """The lesson-04 reference document measured on a CUDA GPU, or None if none was measured.

    ``{"name", "measured_at", "machine", "results"}``; ``results`` is what
    :func:`run_gpu_benchmarks` returned. See :mod:`course_utils.reference`.
    """
    from .reference import LESSON04, load_reference
    return load_reference(LESSON04)


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
    import matplotlib.pyplot as plt

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


def reference_summary(reference: Mapping | None) -> str:
    """What the reference GPU measured, in a few lines (or how to produce it when absent)."""
    from .reference import LESSON04, missing_reference_text

    if reference is None:
        return missing_reference_text(LESSON04)
    res = reference.get("results", {})
    machine = reference.get("machine", {})
    lines = [f"Reference results: {machine.get('gpu_name')} (torch {machine.get('torch_version')}, "
             f"CUDA {machine.get('cuda_version')}), measured {reference.get('measured_at')} "
             f"by gpu-check in {res.get('mode', '?')} mode."]
    if isinstance(res.get("sweep"), Mapping):
        sweep = BandwidthSweep.from_dict(res["sweep"])
        for mode in ("pageable", "pinned", "device"):
            best = sweep.best(mode)
            if best:
                lines.append(f"  best {sweep.labels.get(mode, mode)}: {best[1]:.1f} GB/s at "
                             f"{_fmt_bytes(best[0])}")
        frac = sweep.pinned_fraction_of_best()
        if frac is not None:
            lines.append(f"  best pinned copy = {frac:.0%} of the best host-to-device copy")
    demo = res.get("mismeasure")
    if isinstance(demo, Mapping):
        lines.append(f"  unsynchronised non_blocking copy of {_fmt_bytes(demo['nbytes'])}: naive "
                     f"{_fmt_time(demo['naive_s'])} vs honest {_fmt_time(demo['honest_s'])} "
                     f"({demo['honest_s'] / demo['naive_s']:.0f}x too short)")
    ov = res.get("overlap")
    if isinstance(ov, Mapping):
        for name, value in ov.get("overlap", {}).items():
            lines.append(f"  overlap, {name}: {min(1.0, max(0.0, value)):.0%}")
    dt = res.get("dtype")
    if isinstance(dt, Mapping):
        t = dt["times_s"]
        lines.append(f"  batch {tuple(dt['batch_shape'])}: float32 copy {_fmt_time(t['float32 copy'])}, "
                     f"uint8 copy + normalise {_fmt_time(t['uint8 copy + normalise on device'])}")
    pf = res.get("prefetch")
    if isinstance(pf, Mapping):
        lines.append(f"  DevicePrefetcher: {_fmt_time(pf['prefetch_s_per_step'])}/step vs plain loop "
                     f"{_fmt_time(pf['plain_s_per_step'])}/step")
    fork = res.get("forked_worker")
    if isinstance(fork, Mapping) and fork.get("worker_error"):
        lines.append(f"  a forked DataLoader worker touching CUDA raised: {fork['worker_error']}")
    for name, why in res.get("skipped", {}).items():
        lines.append(f"  (not measured: {name}: {why})")
    return "\n".join(lines)
