"""Lesson 05's harness: the augmentation checked and measured.

Equal values for the same draws (:func:`levels_difference`, in grey levels), the same
distribution of draws (:func:`draw_statistics`), a fixed number of torch calls per batch
(:func:`count_torch_calls`), and samples/s vs batch size, batched on the device vs per sample in
DataLoader workers (:func:`measure_augment_throughput`, :func:`plot_augment_throughput`). Nothing
happens at import time.
"""
from __future__ import annotations

import math
import numbers
import textwrap
import time
from typing import Any, Callable, Optional, Sequence

import cv2
import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader, Dataset

from ..augment import AugmentDraws, AugmentParams, AugmentTransform, SampleDraw, _params, augment_batch
from ..bench import measure, measure_loader
from ..config import pick
from ..data import JpegDataset
from ..device import resolve_device, synchronize
from ..machine import usable_cpus
from ..plots import figure_title
from ..threads import make_worker_init

__all__ = [
    "DecodedImages",
    "RepeatDataset",
    "levels_difference",
    "draw_statistics",
    "count_torch_calls",
    "measure_augment_throughput",
    "plot_augment_throughput",
]



# --------------------------------------------------------------------------------------------
# datasets for the measurements
# --------------------------------------------------------------------------------------------

class DecodedImages(Dataset):
    """Course photos decoded once and resized to ``side`` x ``side``, in ONE uint8 array.

    ``images`` is (n, side, side, 3) RGB (copy-on-read safe in forked workers). ``ds[i]`` returns
    ``(transform(image), label)`` with a transform, else ``(uint8 (3, side, side) tensor, label)``;
    ``label = i % 10``. ``length`` (default n) lets a loader run longer than n images (index
    modulo n), to time many batches without decoding more. :meth:`batch` stacks a uint8
    (N, 3, side, side) batch directly (for the on-device measurements).
    """

    def __init__(self, n: Optional[int] = None, side: int = 256, *, length: Optional[int] = None,
                 transform: Optional[Callable] = None, seed: int = 0,
                 images: Optional[np.ndarray] = None) -> None:
        where = "DecodedImages"
        if images is None:

            n = pick(full=256, quick=32) if n is None else n
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
                raise ValueError(f"{where}: n must be a positive int, got {n!r}.")
            if isinstance(side, bool) or not isinstance(side, numbers.Integral) or side < 8:
                raise ValueError(f"{where}: side must be an int >= 8 (pixels), got {side!r}.")
            source = JpegDataset(n=int(n), seed=seed, progress=False)
            images = np.empty((int(n), int(side), int(side), 3), dtype=np.uint8)
            for i in range(int(n)):
                img, _ = source[i]
                images[i] = cv2.resize(img, (int(side), int(side)), interpolation=cv2.INTER_AREA)
        elif not (isinstance(images, np.ndarray) and images.ndim == 4 and images.shape[3] == 3
                  and images.dtype == np.uint8 and images.shape[1] == images.shape[2]):
            raise ValueError(f"{where}: images must be a uint8 (n, side, side, 3) array.")
        self.images = images
        if length is not None and (isinstance(length, bool) or not isinstance(length, numbers.Integral)
                                   or length < 1):
            raise ValueError(f"{where}: length must be a positive int or None, got {length!r}.")
        self.length = len(images) if length is None else int(length)
        if transform is not None and not callable(transform):
            raise TypeError(f"{where}: transform must be callable or None, got {type(transform).__name__}.")
        self.transform = transform

    @property
    def side(self) -> int:
        return int(self.images.shape[1])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[Any, int]:
        if not -self.length <= i < self.length:
            raise IndexError(f"DecodedImages index {i} out of range for length {self.length}.")
        image = self.images[int(i) % len(self.images)]
        label = int(i) % 10
        if self.transform is not None:
            return self.transform(image), label
        return torch.from_numpy(image).permute(2, 0, 1).contiguous(), label

    def batch(self, n: int, start: int = 0) -> torch.Tensor:
        """A uint8 (n, 3, side, side) batch of images start, start + 1, ... (modulo n images)."""
        idx = (np.arange(start, start + int(n)) % len(self.images))
        return torch.from_numpy(self.images[idx]).permute(0, 3, 1, 2).contiguous()

    def view(self, *, transform: Optional[Callable] = None, length: Optional[int] = None) -> "DecodedImages":
        """The same images (shared, not copied) with another transform / length."""
        return DecodedImages(images=self.images, transform=transform, length=length)

    def describe(self) -> str:
        return (f"DecodedImages: {len(self.images)} course photos decoded to "
                f"{self.side}x{self.side} RGB uint8, {self.images.nbytes / 1e6:.1f} MB in one array")


class RepeatDataset(Dataset):
    """``base`` seen as ``length`` items (index modulo ``len(base)``): more batches than images.

    When ``base`` is a :class:`course_utils.data.JpegDataset` the view also offers its
    ``encoded(i)`` and ``labels`` (index modulo), so the tuned pipeline's batched fetching
    (:class:`course_utils.pipelines.BatchedJpegDataset`) reads it like the real thing.
    """

    def __init__(self, base: Dataset, length: int) -> None:
        if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 1:
            raise ValueError(f"RepeatDataset: length must be a positive int, got {length!r}.")
        if len(base) < 1:  # type: ignore[arg-type]
            raise ValueError("RepeatDataset: base is empty.")
        self.base, self.length = base, int(length)
        if hasattr(base, "labels"):
            self.labels = np.asarray(base.labels)[np.arange(self.length) % len(base)]  # type: ignore[arg-type]

    def encoded(self, i: int) -> Any:
        """The base's encoded bytes of item ``i`` (modulo its length); JpegDataset bases only."""
        if not hasattr(self.base, "encoded"):
            raise TypeError(f"RepeatDataset.encoded: the base ({type(self.base).__name__}) has no "
                            f"encoded bytes; use a JpegDataset.")
        return self.base.encoded(int(i) % len(self.base))  # type: ignore[attr-defined,arg-type]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.length:
            raise IndexError(f"RepeatDataset index {i} out of range for length {self.length}.")
        return self.base[i % len(self.base)]  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# comparing the two versions
# --------------------------------------------------------------------------------------------

def levels_difference(a: torch.Tensor, b: torch.Tensor, params: Optional[AugmentParams] = None) -> dict:
    """Difference of two normalised outputs in grey levels (``(a - b) * 255 * std``).

    Returns {"max_abs": ..., "mean_abs": ..., "mean": ...} (floats, grey levels).
    """
    p = _params(params, "levels_difference")
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
        raise ValueError(f"levels_difference: a and b must be tensors of the same shape, got "
                         f"{getattr(a, 'shape', type(a).__name__)} and {getattr(b, 'shape', type(b).__name__)}.")
    std = torch.tensor(p.std, dtype=torch.float64).view(3, 1, 1) * 255.0
    d = (a.detach().to("cpu", torch.float64) - b.detach().to("cpu", torch.float64)) * std
    return {"max_abs": float(d.abs().max()), "mean_abs": float(d.abs().mean()), "mean": float(d.mean())}


def draw_statistics(draws: AugmentDraws | Sequence[SampleDraw], height: int, width: int) -> dict[str, np.ndarray]:
    """Per-sample quantities of a set of draws, as NumPy arrays (for histograms and tests).

    area_fraction (box area / image area), aspect (box width / height), top_fraction and
    left_fraction (position / free room, 0.5 when there is none), flip (0/1), brightness, contrast.
    """
    if isinstance(draws, AugmentDraws):
        d = draws.to("cpu")
        t, l, h, w = (getattr(d, f).numpy().astype(np.float64) for f in ("top", "left", "height", "width"))
        flip = d.flip.numpy().astype(np.float64)
        bright, contrast = d.brightness.numpy().astype(np.float64), d.contrast.numpy().astype(np.float64)
    else:
        rows = list(draws)
        if not rows:
            raise ValueError("draw_statistics: no draws given.")
        t, l, h, w = (np.array([getattr(r, f) for r in rows], np.float64) for f in ("top", "left", "height", "width"))
        flip = np.array([r.flip for r in rows], np.float64)
        bright = np.array([r.brightness for r in rows], np.float64)
        contrast = np.array([r.contrast for r in rows], np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        top_f = np.where(height - h > 0, t / np.maximum(height - h, 1), 0.5)
        left_f = np.where(width - w > 0, l / np.maximum(width - w, 1), 0.5)
    return {"area_fraction": h * w / (height * width), "aspect": w / h, "top_fraction": top_f,
            "left_fraction": left_f, "flip": flip, "brightness": bright, "contrast": contrast}


# --------------------------------------------------------------------------------------------
# counting torch calls (batched or a Python loop?) and synchronising
# --------------------------------------------------------------------------------------------

def count_torch_calls(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Run ``fn(*args, **kwargs)`` and count the torch functions and tensor methods it called.

    Uses ``torch.overrides.TorchFunctionMode``: every ``torch.*`` function, ``F.*`` function and
    Tensor method or operator called from Python counts once. A batched implementation makes
    the same number of calls whatever the batch size; a Python loop over samples makes more
    calls for a bigger batch (on a GPU, each call is at least one kernel launch). Returns
    ``(result, calls)``.
    """
    if not callable(fn):
        raise TypeError(f"count_torch_calls: fn must be callable, got {type(fn).__name__}.")

    class _Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            _Count.calls += 1
            return func(*args, **(kwargs or {}))

    _Count.calls = 0
    with _Count():
        result = fn(*args, **kwargs)
    return result, int(_Count.calls)


# --------------------------------------------------------------------------------------------
# measurements
# --------------------------------------------------------------------------------------------

def _generator_for(device: torch.device, seed: int) -> Optional[torch.Generator]:
    if device.type in ("cpu", "cuda"):
        return torch.Generator(device=device).manual_seed(seed)
    return None  # MPS: torch's default generator (seeded by torch.manual_seed)


def _time_device_augment(batch: torch.Tensor, p: AugmentParams, device: torch.device, *,
                         repeats: int, target_s: float) -> Any:
    """Measurement of augment_batch on a resident batch; calls grouped so a repeat lasts ~target_s."""

    g = _generator_for(device, 0)
    augment_batch(batch, p, generator=g)
    synchronize(device)
    t0 = time.perf_counter()
    augment_batch(batch, p, generator=g)
    synchronize(device)
    once = max(time.perf_counter() - t0, 1e-6)
    calls = int(min(1000, max(1, target_s // once)))

    def run() -> None:
        for _ in range(calls):
            augment_batch(batch, p, generator=g)

    return measure(run, items=calls * int(batch.shape[0]), warmup=1, repeats=repeats, device=device,
                   label=f"batched on {device.type}, batch {batch.shape[0]}")


def measure_augment_throughput(images: DecodedImages, batch_sizes: Sequence[int], *,
                               params: Optional[AugmentParams] = None, device: Any = "cpu",
                               num_workers: Optional[int] = None, repeats: Optional[int] = None,
                               worker_samples: Optional[int] = None, target_s: Optional[float] = None,
                               progress: bool = True, deadline: Optional[float] = None) -> dict:
    """Samples/s of the augmentation vs batch size: batched on ``device`` vs per sample in workers.

    * **batched on the device**: :func:`augment_batch` on a uint8 batch already on ``device``
      (the copy to the device is not included), timed with :func:`course_utils.bench.measure`
      (synchronised on CUDA/MPS), calls grouped so each repeat lasts about ``target_s`` seconds;
    * **per sample in workers**: a DataLoader with ``num_workers`` (default: all usable CPUs)
      running :class:`AugmentTransform` on the same decoded images, worker pools limited to one
      thread, timed with :func:`course_utils.bench.measure_loader` (about ``worker_samples``
      samples per repeat, after a warm-up of one batch per worker).

    Returns a JSON-able dict: batch_sizes, device_samples_per_s, cpu_workers_samples_per_s,
    cpu_workers_cpu_ms_per_sample, num_workers, device, input_side, output_side, params. A
    point not measured (``deadline``, a ``time.perf_counter()`` value, reached) is None.
    """

    if not isinstance(images, DecodedImages):
        raise TypeError(f"images must be a DecodedImages, got {type(images).__name__}.")
    sizes = [int(b) for b in batch_sizes]
    if not sizes or any(b < 1 for b in sizes):
        raise ValueError(f"batch_sizes must be a non-empty list of positive ints, got {batch_sizes!r}.")
    p = _params(params, "measure_augment_throughput")
    dev = resolve_device(device)
    workers = usable_cpus() if num_workers is None else int(num_workers)
    if workers < 1:
        raise ValueError(f"num_workers must be >= 1 (the per-sample side runs in workers), got {num_workers!r}.")
    repeats = pick(full=3, quick=2) if repeats is None else int(repeats)
    worker_samples = pick(full=1024, quick=96) if worker_samples is None else int(worker_samples)
    target_s = pick(full=0.2, quick=0.03) if target_s is None else float(target_s)

    out: dict[str, Any] = {"batch_sizes": sizes, "device": str(dev), "num_workers": workers,
                           "input_side": images.side, "output_side": p.size, "params": p.to_dict(),
                           "device_samples_per_s": [], "cpu_workers_samples_per_s": [],
                           "cpu_workers_cpu_ms_per_sample": [], "device_cpu_ms_per_sample": []}
    transform = AugmentTransform(p)
    bar = None
    if progress:
        from tqdm.auto import tqdm  # lazy: DataLoader workers import this module
        bar = tqdm(total=len(sizes), desc="augmentation vs batch size", leave=False)
    try:
        last_s = 0.0   # how long the previous point took: the next (bigger) one takes about as long or more
        for b in sizes:
            if deadline is not None and time.perf_counter() + 1.5 * last_s > deadline:
                for key in ("device_samples_per_s", "cpu_workers_samples_per_s",
                            "cpu_workers_cpu_ms_per_sample", "device_cpu_ms_per_sample"):
                    out[key].append(None)
                continue
            t_point = time.perf_counter()
            batch = images.batch(b).to(dev)
            m = _time_device_augment(batch, p, dev, repeats=repeats, target_s=target_s)
            del batch
            out["device_samples_per_s"].append(m.samples_per_s)
            out["device_cpu_ms_per_sample"].append(None if m.cpu_s_per_sample is None else m.cpu_s_per_sample * 1e3)
            timed = max(2, math.ceil(worker_samples / b))
            length = (timed + workers) * b
            loader = DataLoader(images.view(transform=transform, length=length), batch_size=b,
                                num_workers=workers, worker_init_fn=make_worker_init(1), timeout=300)
            mw = measure_loader(loader, batches=timed, warmup_batches=workers, repeats=repeats,
                                progress=False, label=f"per sample in {workers} workers, batch {b}")
            out["cpu_workers_samples_per_s"].append(mw.samples_per_s)
            out["cpu_workers_cpu_ms_per_sample"].append(
                None if mw.cpu_s_per_sample is None else mw.cpu_s_per_sample * 1e3)
            last_s = time.perf_counter() - t_point
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    ratios = [None if (d is None or c is None or c <= 0) else d / c
              for d, c in zip(out["device_samples_per_s"], out["cpu_workers_samples_per_s"])]
    out["ratio"] = ratios
    best_d = max((v for v in out["device_samples_per_s"] if v is not None), default=None)
    best_c = max((v for v in out["cpu_workers_samples_per_s"] if v is not None), default=None)
    out["best_device_samples_per_s"] = best_d
    out["best_cpu_workers_samples_per_s"] = best_c
    out["best_ratio"] = None if (best_d is None or not best_c) else best_d / best_c
    return out


# --------------------------------------------------------------------------------------------
# plots (work on the dicts above, so they draw this machine's results and reference results alike)
# --------------------------------------------------------------------------------------------

def _axes(ax: Any, figsize: tuple[float, float]) -> Any:
    if ax is None:
        import matplotlib.pyplot as plt  # lazy: DataLoader workers import this module
        _, ax = plt.subplots(figsize=figsize)
    return ax


def _plot_title(title: str, machine: Optional[str], settings: Optional[dict]) -> str:
    if machine is None:
        return figure_title(title, settings)
    lines = [title, machine]
    if settings:
        lines += textwrap.wrap(", ".join(f"{k}={v}" for k, v in settings.items()), width=90)
    return "\n".join(lines)


def plot_augment_throughput(result: dict, ax: Any = None, *, title: str = "Augmentation throughput vs batch size",
                            machine: Optional[str] = None) -> Any:
    """Samples/s vs batch size (log-log) from :func:`measure_augment_throughput`'s dict.

    ``machine``: the line naming where it was measured (default: this machine's summary; pass
    the reference file's machine summary for reference results). Returns the Axes.
    """
    ax = _axes(ax, (7, 4.2))
    xs = result["batch_sizes"]
    dev = str(result.get("device", "device"))
    series = {f"batched on {dev} (one call per batch)": result["device_samples_per_s"],
              f"per sample on the CPU, {result['num_workers']} workers": result["cpu_workers_samples_per_s"]}
    for (label, ys), style in zip(series.items(), ("o-", "s--")):
        v = np.array([np.nan if y is None else y for y in ys], dtype=float)
        ax.plot(xs, v, style, label=label)
    # lazy: DataLoader workers import this module
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0, 7.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("batch size")
    ax.set_ylabel("samples per second (log; higher is better)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    settings = {"input": f"{result['input_side']}px", "output": f"{result['output_side']}px"}
    ax.set_title(_plot_title(title, machine, settings), fontsize=9, loc="left")
    return ax
