"""Lesson 04's harness: a copy overlapping compute on streams, and uint8 vs float32 transfers.

* **overlap fraction** = (copy alone + compute alone - both issued together) / the shorter of
  the two: 1 means the copy was completely hidden behind the compute, 0 that they ran one after
  the other (:func:`measure_overlap`);
* seconds per batch for a float32 copy vs a uint8 copy normalised on the device
  (:func:`uint8_vs_float32`).

Nothing happens at import time.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Callable

import matplotlib.pyplot as plt
import torch

from ..checks import check_int
from ..config import pick
from ..device import resolve_device, synchronize, try_pin
from ..machine import machine_summary
from ..measurement import _fmt_time
from ..plots import figure_title
from ..transforms import normalize_batch
from .l04_copies import MIB, _fmt_bytes, _median, max_transfer_bytes, time_op

__all__ = [
    "OverlapResult",
    "measure_overlap",
    "DtypeTransfer",
    "uint8_vs_float32",
]


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
    check_int("copy_bytes", copy_bytes, 1)
    repeats = pick(full=7, quick=3) if repeats is None else repeats
    check_int("repeats", repeats, 1)
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

    dev = resolve_device(device)
    batch_size = pick(full=256, quick=32) if batch_size is None else batch_size
    check_int("batch_size", batch_size, 1)
    repeats = pick(full=10, quick=3) if repeats is None else repeats
    check_int("repeats", repeats, 1)
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
