"""Lesson 05: augmentation on the device, batched, with per-sample randomness.

One augmentation, written twice with the same parameterisation:

* :func:`augment_batch` — batched, in plain torch ops that run on any device (CUDA, MPS, CPU,
  even ``meta``): a uint8 (N, 3, H, W) batch in, a float32 normalised (N, 3, size, size)
  batch out, every sample with its own random crop, flip, brightness and contrast. A handful
  of kernels per *batch*, whatever N is.
* :class:`AugmentTransform` — per sample, on the CPU, with OpenCV: what a DataLoader worker
  runs for every image (picklable; works under fork, forkserver and spawn).

The augmentation, in the order it runs (the same in both):

1. **random resized crop** — a box of ``area_fraction`` in ``params.scale`` of the image and
   aspect ratio (w/h) log-uniform in ``params.ratio`` (torchvision's ``RandomResizedCrop``
   sampling: up to ``params.attempts`` tries, then a centre crop), with integer ``top, left,
   height, width``; the box is resized to ``size`` x ``size`` with bilinear interpolation,
   half-pixel centres, clamped at the box's edges (``cv2.resize(INTER_LINEAR)`` of the crop;
   ``F.grid_sample(align_corners=False)`` with a per-sample sampling grid in the batch);
2. **horizontal flip** with probability ``params.flip_p`` (in the batch: the sampling grid is
   mirrored, so the flip costs nothing);
3. **brightness** — multiply by a factor uniform in ``[max(0, 1 - b), 1 + b]``, clamp to 0..255;
4. **contrast** — blend with the image's mean grey level ``m`` (0.2989 R + 0.587 G + 0.114 B):
   ``(x - m) * c + m``, ``c`` uniform in ``[max(0, 1 - c), 1 + c]``, clamp to 0..255;
5. **normalise** — float32 ``(x / 255 - mean) / std`` per channel.

The random parameters of a sample are a :class:`SampleDraw`; of a batch, an
:class:`AugmentDraws` (one tensor per parameter). :func:`draw_batch` draws a batch's with a
handful of tensor ops (no Python loop over samples); :func:`draw_sample` draws one sample's
with a Python loop over the attempts, as torchvision does. They are two implementations of the
same distribution (tests/test_augment.py checks it statistically), and for the *same* draws the
two augmentations give the same values within :data:`AGREE_MAX_LEVELS` grey levels (the CPU
version rounds the resized crop to uint8, as a fast worker does; with ``exact=True`` it keeps
float32 and agrees within :data:`EXACT_MAX_LEVELS`).

The rest of the module measures it: :func:`measure_augment_throughput` (samples/s vs batch
size: batched on the device vs per sample in DataLoader workers), :func:`compare_training`
(a small CNN's training loop: step time and data-wait fraction for the common recipe, the
tuned CPU pipeline and the GPU pipeline), and :func:`run_gpu_benchmarks`, which the gpu-check
command runs on a CUDA machine to produce the reference results lesson 05 shows.

Nothing happens at import time.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

import cv2
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from .device import synchronize
from .transforms import IMAGENET_MEAN, IMAGENET_STD, PerProcessRandom

__all__ = [
    "GRAY_WEIGHTS",
    "AGREE_MAX_LEVELS",
    "AGREE_MEAN_LEVELS",
    "EXACT_MAX_LEVELS",
    "AugmentParams",
    "SampleDraw",
    "AugmentDraws",
    "draw_batch",
    "draw_sample",
    "crop_grid",
    "augment_batch",
    "augment_sample",
    "AugmentTransform",
    "DecodedImages",
    "RepeatDataset",
    "levels_difference",
    "draw_statistics",
    "count_torch_calls",
    "SmallCNN",
    "TrainStep",
    "PIPELINES",
    "measure_augment_throughput",
    "compare_training",
    "plot_augment_throughput",
    "plot_training",
    "run_gpu_benchmarks",
]

#: Weights of R, G, B in the grey level the contrast blends with (ITU-R 601, as torchvision).
GRAY_WEIGHTS: tuple[float, float, float] = (0.2989, 0.587, 0.114)

#: For the same draws, |per-sample CPU - batched| <= this many grey levels (1 level = 1/255).
#: The CPU version rounds the resized crop to uint8 (<= 0.5 level, plus OpenCV's fixed-point
#: weights, <= 1 level in all, lesson 01), and brightness and contrast can each stretch that
#: difference by up to their factor (1.4 x 1.4 with the defaults): 2 levels in all.
AGREE_MAX_LEVELS = 2.0
#: ... and the mean |difference| over a batch stays under this (no bias, rare worst cases).
AGREE_MEAN_LEVELS = 0.5
#: With ``exact=True`` (float32 resize, no rounding) the two agree to float32 precision.
EXACT_MAX_LEVELS = 0.05

#: The three pipelines of the training-loop comparison, in plotting order.
PIPELINES: tuple[str, ...] = ("common recipe", "tuned CPU pipeline", "GPU pipeline")


# --------------------------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------------------------

def _range(name: str, value: Any, *, lo: float, where: str) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must be a pair (low, high) of numbers, got {value!r}.") from None
    if not (math.isfinite(a) and math.isfinite(b)) or a <= lo or a > b:
        raise ValueError(f"{where}: {name}={value!r} must be (low, high) with {lo} < low <= high.")
    return a, b


def _unit(name: str, value: Any, where: str, *, hi: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= hi:
        raise ValueError(f"{where}: {name}={value!r} must be a number between 0 and {hi:g}.")
    return float(value)


@dataclass(frozen=True)
class AugmentParams:
    """Settings of the lesson-05 augmentation (immutable, hashable, picklable).

    size: output side in pixels. scale: (low, high) fraction of the image's area the crop box
    covers. ratio: (low, high) aspect ratio (width / height) of the box, drawn log-uniformly.
    attempts: tries to find a box that fits before falling back to a centre crop. flip_p:
    probability of a horizontal flip. brightness, contrast: the factors are drawn uniformly in
    [max(0, 1 - value), 1 + value] (0 switches the step off). mean, std: per channel (R, G, B)
    on the [0, 1] scale, for the final normalisation.
    """

    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    attempts: int = 10
    flip_p: float = 0.5
    brightness: float = 0.4
    contrast: float = 0.4
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        where = "AugmentParams"
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        for name in ("size", "attempts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{where}: {name} must be a positive int, got {v!r}.")
            set_(name, int(v))
        scale = _range("scale", self.scale, lo=0.0, where=where)
        if scale[1] > 1.0:
            raise ValueError(f"{where}: scale={self.scale!r}: the crop cannot cover more than the "
                             f"whole image; use a high value <= 1.0.")
        set_("scale", scale)
        set_("ratio", _range("ratio", self.ratio, lo=0.0, where=where))
        set_("flip_p", _unit("flip_p", self.flip_p, where))
        set_("brightness", _unit("brightness", self.brightness, where, hi=10.0))
        set_("contrast", _unit("contrast", self.contrast, where, hi=10.0))
        for name in ("mean", "std"):
            try:
                triple = tuple(float(v) for v in getattr(self, name))
            except (TypeError, ValueError):
                triple = ()
            if len(triple) != 3 or (name == "std" and min(triple) <= 0):
                raise ValueError(f"{where}: {name} must be three numbers (R, G, B)"
                                 f"{', all > 0' if name == 'std' else ''}, got {getattr(self, name)!r}.")
            set_(name, triple)

    @property
    def brightness_range(self) -> tuple[float, float]:
        """(low, high) of the brightness factor."""
        return max(0.0, 1.0 - self.brightness), 1.0 + self.brightness

    @property
    def contrast_range(self) -> tuple[float, float]:
        """(low, high) of the contrast factor."""
        return max(0.0, 1.0 - self.contrast), 1.0 + self.contrast

    def fallback_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(top, left, h, w) of the centre crop used when no attempt fits (torchvision's rule)."""
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h, w = height, int(round(height * self.ratio[1]))
        else:
            w, h = width, height
        h, w = min(max(h, 1), height), min(max(w, 1), width)
        return (height - h) // 2, (width - w) // 2, h, w

    def to_dict(self) -> dict:
        return asdict(self)


def _params(params: Any, where: str) -> AugmentParams:
    if params is None:
        return AugmentParams()
    if not isinstance(params, AugmentParams):
        raise TypeError(f"{where}: params must be an AugmentParams (or None for the defaults), "
                        f"got {type(params).__name__}.")
    return params


# --------------------------------------------------------------------------------------------
# random draws
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SampleDraw:
    """The random parameters of one sample: crop box (integer pixels), flip, factors."""

    top: int
    left: int
    height: int
    width: int
    flip: bool
    brightness: float
    contrast: float


@dataclass
class AugmentDraws:
    """The random parameters of a batch, one 1-D tensor of length N per parameter.

    top, left, height, width: int64 crop boxes; flip: bool; brightness, contrast: float32.
    All on one device (:meth:`to` moves them).
    """

    top: torch.Tensor
    left: torch.Tensor
    height: torch.Tensor
    width: torch.Tensor
    flip: torch.Tensor
    brightness: torch.Tensor
    contrast: torch.Tensor

    _FIELDS = ("top", "left", "height", "width", "flip", "brightness", "contrast")

    def __len__(self) -> int:
        return int(self.top.shape[0])

    @property
    def device(self) -> torch.device:
        return self.top.device

    def to(self, device: Any) -> "AugmentDraws":
        return AugmentDraws(*(getattr(self, f).to(device) for f in self._FIELDS))

    def sample(self, i: int) -> SampleDraw:
        """Sample ``i``'s parameters as plain Python values (copies them to the host)."""
        return SampleDraw(int(self.top[i]), int(self.left[i]), int(self.height[i]),
                          int(self.width[i]), bool(self.flip[i]), float(self.brightness[i]),
                          float(self.contrast[i]))

    def samples(self) -> list[SampleDraw]:
        cpu = self.to("cpu")
        return [cpu.sample(i) for i in range(len(cpu))]

    @classmethod
    def from_samples(cls, draws: Sequence[SampleDraw], device: Any = "cpu") -> "AugmentDraws":
        """Stack per-sample draws into a batch's (to augment a batch with given parameters)."""
        if not draws:
            raise ValueError("AugmentDraws.from_samples: draws is empty; give one SampleDraw per sample.")
        col = lambda f, dt: torch.tensor([getattr(d, f) for d in draws], dtype=dt, device=device)  # noqa: E731
        return cls(col("top", torch.int64), col("left", torch.int64), col("height", torch.int64),
                   col("width", torch.int64), col("flip", torch.bool),
                   col("brightness", torch.float32), col("contrast", torch.float32))


def _check_hw(height: Any, width: Any, where: str) -> tuple[int, int]:
    for name, v in (("height", height), ("width", width)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{where}: {name} must be a positive int (pixels), got {v!r}.")
    return int(height), int(width)


def draw_batch(n: int, height: int, width: int, params: Optional[AugmentParams] = None, *,
               generator: Optional[torch.Generator] = None, device: Any = None) -> AugmentDraws:
    """Draw the random parameters of ``n`` samples of ``height`` x ``width`` pixels, batched.

    One ``torch.rand`` of shape (n, 2 * attempts + 5) and a few tensor ops: every attempt of
    every sample at once; each sample keeps its first box that fits (``argmax`` over a boolean
    mask), else the centre crop. No Python loop over samples, no copy to the host, so on a GPU
    it queues a handful of kernels and returns.

    The numbers are drawn with ``generator`` on its device (reproducible: the same seed gives
    the same draws on every device when the generator is a CPU one), else with torch's default
    generator on ``device``; the result is moved to ``device`` (default: where it was drawn).
    """
    where = "draw_batch"
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"{where}: n must be a positive int (samples), got {n!r}.")
    height, width = _check_hw(height, width, where)
    p = _params(params, where)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{where}: generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__}.")
    draw_on = generator.device if generator is not None else torch.device(device or "cpu")
    k = p.attempts
    u = torch.rand(int(n), 2 * k + 5, generator=generator, device=draw_on)
    area = (height * width) * (p.scale[0] + (p.scale[1] - p.scale[0]) * u[:, :k])
    lo, hi = math.log(p.ratio[0]), math.log(p.ratio[1])
    aspect = torch.exp(lo + (hi - lo) * u[:, k:2 * k])
    w = torch.round(torch.sqrt(area * aspect))
    h = torch.round(torch.sqrt(area / aspect))
    fits = (w >= 1) & (w <= width) & (h >= 1) & (h <= height)
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first attempt that fits
    found = fits.any(dim=1)
    f_top, f_left, f_h, f_w = p.fallback_box(height, width)
    w = torch.where(found, w.gather(1, first)[:, 0], torch.full_like(w[:, 0], f_w))
    h = torch.where(found, h.gather(1, first)[:, 0], torch.full_like(h[:, 0], f_h))
    # uniform integer positions: floor(u * (count)), count = size - box + 1
    top = torch.minimum(torch.floor(u[:, 2 * k] * (height - h + 1)), height - h)
    left = torch.minimum(torch.floor(u[:, 2 * k + 1] * (width - w + 1)), width - w)
    top = torch.where(found, top, torch.full_like(top, f_top))
    left = torch.where(found, left, torch.full_like(left, f_left))
    flip = u[:, 2 * k + 2] < p.flip_p
    b0, b1 = p.brightness_range
    c0, c1 = p.contrast_range
    bright = b0 + (b1 - b0) * u[:, 2 * k + 3]
    contrast = c0 + (c1 - c0) * u[:, 2 * k + 4]
    draws = AugmentDraws(top.long(), left.long(), h.long(), w.long(), flip, bright, contrast)
    return draws if device is None else draws.to(device)


def draw_sample(height: int, width: int, params: Optional[AugmentParams] = None,
                rng: Optional[np.random.Generator] = None) -> SampleDraw:
    """Draw one sample's random parameters on the CPU, the way a per-sample transform does.

    A Python loop over up to ``params.attempts`` tries (torchvision's ``RandomResizedCrop``
    sampling), then the flip and the two factors, from the NumPy generator ``rng`` (default: a
    fresh unseeded one). Same distribution as :func:`draw_batch`.
    """
    where = "draw_sample"
    height, width = _check_hw(height, width, where)
    p = _params(params, where)
    if rng is None:
        rng = np.random.default_rng()
    elif not isinstance(rng, np.random.Generator):
        raise TypeError(f"{where}: rng must be a numpy.random.Generator (np.random.default_rng(seed)) "
                        f"or None, got {type(rng).__name__}.")
    area = height * width
    lo, hi = math.log(p.ratio[0]), math.log(p.ratio[1])
    for _ in range(p.attempts):
        target = area * rng.uniform(p.scale[0], p.scale[1])
        aspect = math.exp(rng.uniform(lo, hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            break
    else:
        top, left, h, w = p.fallback_box(height, width)
    flip = bool(rng.random() < p.flip_p)
    return SampleDraw(top, left, h, w, flip, float(rng.uniform(*p.brightness_range)),
                      float(rng.uniform(*p.contrast_range)))


# --------------------------------------------------------------------------------------------
# the batched augmentation (any device)
# --------------------------------------------------------------------------------------------

def crop_grid(draws: AugmentDraws, height: int, width: int, size: int) -> torch.Tensor:
    """The (N, size, size, 2) sampling grid of ``F.grid_sample`` for every sample's crop box.

    Output pixel ``j`` of a box starting at ``left`` with width ``w`` reads input position
    ``left + (j + 0.5) * w / size - 0.5`` (half-pixel centres), clamped to the box (as
    ``cv2.resize`` of the cropped box clamps at its edges); rows likewise. A flipped sample
    reads its columns in reverse order. Positions are converted to grid_sample's [-1, 1]
    coordinates for ``align_corners=False``: ``(2 * x + 1) / width - 1``.
    """
    height, width = _check_hw(height, width, "crop_grid")
    j = (torch.arange(size, device=draws.device, dtype=torch.float32) + 0.5) / size

    def axis(start: torch.Tensor, length: torch.Tensor, limit: int) -> torch.Tensor:
        start = start.to(torch.float32)[:, None]
        length = length.to(torch.float32)[:, None]
        src = start + j[None, :] * length - 0.5
        src = torch.minimum(torch.maximum(src, start), start + length - 1)
        return (2 * src + 1) / limit - 1

    gx = axis(draws.left, draws.width, width)
    gx = torch.where(draws.flip[:, None], gx.flip(1), gx)       # a flip is a mirrored grid
    gy = axis(draws.top, draws.height, height)
    n = len(draws)
    return torch.stack((gx[:, None, :].expand(n, size, size), gy[:, :, None].expand(n, size, size)), dim=-1)


def _check_batch(batch: Any, where: str) -> torch.Tensor:
    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"{where}: batch must be a torch.Tensor (N, 3, H, W) uint8, got "
                        f"{type(batch).__name__}.")
    if batch.dim() != 4 or batch.shape[1] != 3:
        raise ValueError(f"{where}: batch must be (N, 3, H, W) (channels first, RGB), got shape "
                         f"{tuple(batch.shape)}; a channels-last batch needs .permute(0, 3, 1, 2).")
    if batch.dtype != torch.uint8:
        raise TypeError(f"{where}: batch must be uint8 pixels (0..255), got {batch.dtype}; the "
                        f"augmentation converts to float32 itself, once per batch.")
    if batch.shape[0] == 0:
        raise ValueError(f"{where}: batch is empty (N = 0).")
    return batch


def _channel_affine(p: AugmentParams, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) per channel with (x / 255 - mean) / std == x * scale + shift."""
    std = torch.tensor(p.std, dtype=torch.float64)
    mean = torch.tensor(p.mean, dtype=torch.float64)
    scale = (1.0 / (255.0 * std)).to(torch.float32)
    shift = (-mean / std).to(torch.float32)
    return scale.to(device), shift.to(device)


# Small per-channel constants, kept on each device once: ``torch.tensor(..., device='cuda')``
# or ``cpu_tensor.to('cuda')`` is a blocking copy from pageable memory, which would make every
# call wait for the GPU to finish its queue.
_CONSTANTS: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _constants(p: AugmentParams, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scale (1, 3, 1, 1), shift (1, 3, 1, 1), grey weights (3,)) on ``device``, cached."""
    key = (str(device), p.mean, p.std)
    hit = _CONSTANTS.get(key)
    if hit is None:
        if len(_CONSTANTS) > 16:
            _CONSTANTS.clear()
        scale, shift = _channel_affine(p, "cpu")
        gray = torch.tensor(GRAY_WEIGHTS, dtype=torch.float32)
        hit = (scale.view(1, 3, 1, 1).to(device), shift.view(1, 3, 1, 1).to(device), gray.to(device))
        _CONSTANTS[key] = hit
    return hit


def augment_batch(batch: torch.Tensor, params: Optional[AugmentParams] = None, *,
                  generator: Optional[torch.Generator] = None,
                  draws: Optional[AugmentDraws] = None) -> torch.Tensor:
    """Augment a uint8 (N, 3, H, W) batch on its own device -> float32 (N, 3, size, size).

    Random resized crop + flip (one ``F.grid_sample`` with a per-sample grid), brightness and
    contrast (per-sample factors broadcast over (N, 1, 1, 1)), normalise. The random
    parameters come from :func:`draw_batch` with ``generator`` (pass a seeded
    ``torch.Generator`` for reproducible output; on CUDA a CUDA generator avoids a host copy),
    or are given as ``draws``. The output is on ``batch.device``; nothing is copied to the host.
    """
    where = "augment_batch"
    batch = _check_batch(batch, where)
    p = _params(params, where)
    n, _, height, width = batch.shape
    if draws is None:
        draws = draw_batch(n, height, width, p, generator=generator, device=batch.device)
    elif not isinstance(draws, AugmentDraws):
        raise TypeError(f"{where}: draws must be an AugmentDraws or None, got {type(draws).__name__}.")
    elif len(draws) != n:
        raise ValueError(f"{where}: draws holds {len(draws)} samples but the batch has {n}; "
                         f"give one draw per sample.")
    else:
        draws = draws.to(batch.device)
    x = batch.to(torch.float32)                                            # 0..255
    grid = crop_grid(draws, height, width, p.size)
    x = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    if p.brightness > 0:
        x.mul_(draws.brightness.view(-1, 1, 1, 1)).clamp_(0.0, 255.0)
    scale, shift, gray = _constants(p, x.device)
    if p.contrast > 0:
        m = (x.mean(dim=(2, 3)) * gray).sum(dim=1).view(-1, 1, 1, 1)        # (N, 1, 1, 1) grey means
        c = draws.contrast.view(-1, 1, 1, 1)
        x.mul_(c).add_(m * (1 - c)).clamp_(0.0, 255.0)
    return x.mul_(scale).add_(shift)                                       # (x / 255 - mean) / std


# --------------------------------------------------------------------------------------------
# the per-sample CPU version (DataLoader workers)
# --------------------------------------------------------------------------------------------

def _check_image(image: Any, where: str) -> np.ndarray:
    if isinstance(image, torch.Tensor):
        raise TypeError(f"{where}: image must be a NumPy (H, W, 3) uint8 RGB array (as the course "
                        f"datasets return), got a torch.Tensor; use a dataset without a "
                        f"to-tensor transform.")
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"{where}: image must be a (H, W, 3) array, got "
                         f"{getattr(image, 'shape', type(image).__name__)}.")
    if image.dtype != np.uint8:
        raise TypeError(f"{where}: image must be uint8, got {image.dtype}.")
    return image


def augment_sample(image: np.ndarray, draw: SampleDraw, params: Optional[AugmentParams] = None,
                   *, exact: bool = False) -> torch.Tensor:
    """Augment one (H, W, 3) uint8 RGB image with the given parameters -> float32 (3, size, size).

    What a worker runs per sample: crop (a view), ``cv2.resize`` of the box (uint8, rounded;
    with ``exact=True`` in float32), ``cv2.flip``, then brightness, contrast and normalise in
    float32 NumPy, and a CHW tensor. Same steps, order and formulas as :func:`augment_batch`.
    """
    where = "augment_sample"
    image = _check_image(image, where)
    p = _params(params, where)
    if not isinstance(draw, SampleDraw):
        raise TypeError(f"{where}: draw must be a SampleDraw (see draw_sample), got {type(draw).__name__}.")
    t, l, h, w = draw.top, draw.left, draw.height, draw.width
    if not (0 <= t and 0 <= l and h >= 1 and w >= 1 and t + h <= image.shape[0] and l + w <= image.shape[1]):
        raise ValueError(f"{where}: the crop box (top={t}, left={l}, height={h}, width={w}) does not "
                         f"fit in an image of {image.shape[0]}x{image.shape[1]} pixels; draw it for "
                         f"this image's size.")
    box = image[t:t + h, l:l + w]
    if exact:
        box = box.astype(np.float32)
    x = cv2.resize(box, (p.size, p.size), interpolation=cv2.INTER_LINEAR)
    if draw.flip:
        x = cv2.flip(x, 1)
    x = x.astype(np.float32, copy=False)       # uint8 -> a new float32 array; float32 stays
    if p.brightness > 0:
        x *= np.float32(draw.brightness)
        np.clip(x, 0.0, 255.0, out=x)
    if p.contrast > 0:
        c = np.float32(draw.contrast)
        r, g, b = cv2.mean(x)[:3]                  # per-channel means (cv2: fast, double sums)
        m = np.float32(GRAY_WEIGHTS[0] * r + GRAY_WEIGHTS[1] * g + GRAY_WEIGHTS[2] * b)
        x *= c
        x += m * (np.float32(1) - c)
        np.clip(x, 0.0, 255.0, out=x)
    scale, shift = (t.numpy() for t in _channel_affine(p, "cpu"))
    x *= scale
    x += shift
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


class AugmentTransform(PerProcessRandom):
    """The per-sample augmentation as a DataLoader transform: (H, W, 3) uint8 -> float32 (3, size, size).

    Picklable (fork, forkserver, spawn). Each call draws a :class:`SampleDraw` with
    :func:`draw_sample` and runs :func:`augment_sample`. The NumPy generator is made lazily in
    each process and never pickled, so every worker has its own stream: ``seed=None`` seeds it
    from ``torch.initial_seed()`` (which the DataLoader sets differently in every worker and
    epoch; ``torch.manual_seed`` in the main process makes runs reproducible); ``seed=s`` seeds
    it from ``s`` in the main process and from ``(s, worker seed)`` in a worker.
    """

    def __init__(self, params: Optional[AugmentParams] = None, seed: Optional[int] = None, *,
                 exact: bool = False) -> None:
        self.params = _params(params, "AugmentTransform")
        super().__init__(seed, owner="AugmentTransform")
        self.exact = bool(exact)

    def draw(self, height: int, width: int) -> SampleDraw:
        """The next random parameters of this process, for an image of that size."""
        return draw_sample(height, width, self.params, self._generator())

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        image = _check_image(image, "AugmentTransform")
        return augment_sample(image, self.draw(*image.shape[:2]), self.params, exact=self.exact)

    def __repr__(self) -> str:
        return f"AugmentTransform(params={self.params!r}, seed={self.seed!r}, exact={self.exact})"


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
            from .config import pick
            from .data import JpegDataset

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
    from torch.overrides import TorchFunctionMode

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
# a small CNN and its training step
# --------------------------------------------------------------------------------------------

class SmallCNN(nn.Module):
    """A small real CNN: 4 stages of (3x3 conv stride 2 + 3x3 conv), BatchNorm, ReLU; global
    average pooling; a linear classifier. Channels: width, 2 width, 4 width, 8 width.

    Forward cost: about 0.6 GFLOP per 224x224 image at width 16; it grows with width**2 and
    with the number of pixels (width 32: about 2.3 GFLOP; 64x64 images: 1/12 of that).
    """

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        if isinstance(width, bool) or not isinstance(width, numbers.Integral) or width < 1:
            raise ValueError(f"SmallCNN: width must be a positive int (channels of the first stage), got {width!r}.")
        if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
            raise ValueError(f"SmallCNN: num_classes must be a positive int, got {num_classes!r}.")
        layers: list[nn.Module] = []
        c_in = 3
        for stage in range(4):
            c = int(width) * 2 ** stage
            layers += [nn.Conv2d(c_in, c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                       nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
            c_in = c
        self.width = int(width)
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, int(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class TrainStep:
    """One plain-SGD training step of ``model`` on a batch ``(images, labels)`` already on the device.

    ``prepare(images)`` turns what the loader delivered into the model's input (identity for
    the common recipe's float batches, a normalisation for the tuned pipeline's uint8 batches,
    :func:`augment_batch` for the GPU pipeline's). Forward, cross-entropy, backward, then
    ``p -= lr * p.grad`` for every parameter (written out rather than ``torch.optim.SGD``,
    whose first use imports ``torch._dynamo``: seconds on a small machine, for nothing here).
    Returns the loss tensor (no ``.item()``: no host sync of its own).
    """

    def __init__(self, model: nn.Module, prepare: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 *, lr: float = 0.05) -> None:
        self.model = model
        self.prepare = prepare
        self.lr = float(lr)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def __call__(self, batch: Any) -> torch.Tensor:
        images, labels = batch
        x = images if self.prepare is None else self.prepare(images)
        loss = F.cross_entropy(self.model(x), labels)
        loss.backward()
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-self.lr)
                    p.grad = None
        return loss.detach()


# --------------------------------------------------------------------------------------------
# measurements
# --------------------------------------------------------------------------------------------

def _device(device: Any) -> torch.device:
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as exc:
        raise ValueError(f"device={device!r} is not a device torch understands: use 'cpu', 'cuda' or 'mps'.") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asks for CUDA but torch.cuda.is_available() is False on "
                         f"this machine; use device='cpu' (or course_utils.default_device()).")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device={device!r} asks for Apple MPS, which is not available here; use 'cpu'.")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={device!r}: measurements run on 'cpu', 'cuda' or 'mps'.")
    return dev


def _generator_for(device: torch.device, seed: int) -> Optional[torch.Generator]:
    if device.type in ("cpu", "cuda"):
        return torch.Generator(device=device).manual_seed(seed)
    return None  # MPS: torch's default generator (seeded by torch.manual_seed)


def _time_device_augment(batch: torch.Tensor, p: AugmentParams, device: torch.device, *,
                         repeats: int, target_s: float) -> Any:
    """Measurement of augment_batch on a resident batch; calls grouped so a repeat lasts ~target_s."""
    from .bench import measure

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
    from .bench import measure_loader
    from .config import pick
    from .machine import usable_cpus
    from .threads import make_worker_init

    if not isinstance(images, DecodedImages):
        raise TypeError(f"images must be a DecodedImages, got {type(images).__name__}.")
    sizes = [int(b) for b in batch_sizes]
    if not sizes or any(b < 1 for b in sizes):
        raise ValueError(f"batch_sizes must be a non-empty list of positive ints, got {batch_sizes!r}.")
    p = _params(params, "measure_augment_throughput")
    dev = _device(device)
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
        from tqdm.auto import tqdm
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


def _pipeline_loader(name: str, base: Dataset, *, batch_size: int, image_side: int, input_side: int,
                     num_workers: Optional[int]) -> DataLoader:
    from .pipelines import common_recipe_loader, tuned_loader

    if name == "common recipe":
        return common_recipe_loader(base, batch_size=batch_size, size=image_side)
    if name == "tuned CPU pipeline":
        return tuned_loader(base, batch_size=batch_size, size=image_side, num_workers=num_workers)
    if name == "GPU pipeline":
        return tuned_loader(base, batch_size=batch_size, size=input_side, num_workers=num_workers)
    raise ValueError(f"pipeline {name!r} is not known; use one of {PIPELINES}.")


class _Normalize:
    """uint8 batch on the device -> float32 normalised (the tuned pipeline's last step)."""

    def __init__(self, p: AugmentParams) -> None:
        self.p = p

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        scale, shift, _ = _constants(self.p, images.device)
        return images.to(torch.float32).mul_(scale).add_(shift)


class _Augment:
    def __init__(self, p: AugmentParams, device: torch.device) -> None:
        self.p, self.g = p, _generator_for(device, 0)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return augment_batch(images, self.p, generator=self.g)


def compare_training(base: Optional[Dataset] = None, *, device: Any = "cpu",
                     pipelines: Sequence[str] = PIPELINES, batch_size: Optional[int] = None,
                     steps: Optional[int] = None, image_side: Optional[int] = None,
                     input_side: Optional[int] = None, width: Optional[int] = None,
                     num_workers: Optional[int] = None, recipe_settings: bool = True,
                     main_threads: Optional[int] = None, progress: bool = True,
                     deadline: Optional[float] = None) -> dict:
    """A small CNN's training loop fed by each pipeline: step time and data-wait fraction.

    For every pipeline a fresh :class:`SmallCNN` (same seed) is trained for ``warm-up + steps``
    steps with :func:`course_utils.bench.measure_data_wait`: the wait is the time blocked on the
    loader plus the copy to ``device``; the step is the whole iteration. The pipelines:

    * ``"common recipe"``: :func:`course_utils.pipelines.common_recipe_loader` (4 workers,
      per-sample float32, pin_memory) with its process-wide settings (``torch.set_num_threads(1)``
      and the thread variables, undone afterwards) unless ``recipe_settings=False``;
    * ``"tuned CPU pipeline"``: :func:`course_utils.pipelines.tuned_loader` (uint8, limited
      pools, usable CPUs) + normalise on the device;
    * ``"GPU pipeline"``: the same uint8 loader at ``input_side`` + :func:`augment_batch`
      on the device (random resized crop to ``image_side``, flip, brightness, contrast, normalise).

    Also measured: ``compute_only``, the same training step on a batch already on the device
    (what the model alone needs per step; a step much longer than that was waiting for data).

    ``main_threads``: torch/BLAS threads of this process while measuring. Default: 1 when
    ``device`` is the CPU — the model then trains on the very cores the workers decode on, and a
    multi-threaded (OpenMP) step next to busy workers is oversubscribed (lesson 02), which would
    swamp every other difference — and unchanged on a GPU, where the step runs on the device.
    Returns a JSON-able dict (seconds; fractions 0..1). A pipeline not measured because
    ``deadline`` passed is left out and named in ``skipped``.
    """
    from .config import pick
    from .data import JpegDataset
    from .threads import limit_threads

    dev = _device(device)
    batch_size = pick(full=32, quick=16) if batch_size is None else int(batch_size)
    steps = pick(full=8, quick=5) if steps is None else int(steps)
    image_side = pick(full=224, quick=64) if image_side is None else int(image_side)
    input_side = pick(full=256, quick=80) if input_side is None else int(input_side)
    width = pick(full=8, quick=8) if width is None else int(width)
    for name, v in (("batch_size", batch_size), ("steps", steps), ("image_side", image_side),
                    ("input_side", input_side), ("width", width)):
        if v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}.")
    unknown = [p for p in pipelines if p not in PIPELINES]
    if unknown or not pipelines:
        raise ValueError(f"pipelines must name some of {PIPELINES}, got {list(pipelines)!r}.")
    if base is None:
        base = JpegDataset(n=pick(full=512, quick=64), progress=False)
    p = AugmentParams(size=image_side)
    prepare: dict[str, Optional[Callable]] = {"common recipe": None, "tuned CPU pipeline": _Normalize(p),
                                              "GPU pipeline": _Augment(p, dev)}
    threads = (1 if dev.type == "cpu" else None) if main_threads is None else int(main_threads)
    if threads is not None and threads < 1:
        raise ValueError(f"main_threads must be a positive int or None, got {main_threads!r}.")
    out: dict[str, Any] = {"device": str(dev), "batch_size": batch_size, "steps": steps,
                           "image_side": image_side, "input_side": input_side,
                           "model": f"SmallCNN(width={width})", "pipelines": {}, "skipped": [],
                           "recipe_settings": bool(recipe_settings)}
    with (limit_threads(threads) if threads else contextlib.nullcontext()):
        out["main_threads"] = torch.get_num_threads()
        _compare_training(out, base, dev, pipelines, prepare, batch_size=batch_size, steps=steps,
                          image_side=image_side, input_side=input_side, width=width,
                          num_workers=num_workers, recipe_settings=recipe_settings,
                          progress=progress, deadline=deadline)
    return out


def _compare_training(out: dict, base: Dataset, dev: torch.device, pipelines: Sequence[str],
                      prepare: dict, *, batch_size: int, steps: int, image_side: int, input_side: int,
                      width: int, num_workers: Optional[int], recipe_settings: bool, progress: bool,
                      deadline: Optional[float]) -> None:
    from .bench import measure, measure_data_wait
    from .machine import usable_cpus
    from .pipelines import common_recipe_process_settings

    def new_step(prep: Optional[Callable]) -> TrainStep:
        torch.manual_seed(0)
        return TrainStep(SmallCNN(width=width).to(dev), prep)

    # the model alone, on a batch already on the device (repeats bounded by the deadline)
    step = new_step(None)
    x = torch.randn(batch_size, 3, image_side, image_side, device=dev)
    y = torch.randint(0, 10, (batch_size,), device=dev)
    step((x, y))
    synchronize(dev)
    t0 = time.perf_counter()
    step((x, y))
    synchronize(dev)
    one_step = time.perf_counter() - t0
    repeats = max(3, steps)
    if deadline is not None:
        repeats = max(3, min(repeats, int(0.1 * (deadline - time.perf_counter()) / max(one_step, 1e-6))))
    m = measure(lambda: step((x, y)), items=batch_size, warmup=3, repeats=repeats, device=dev,
                label="compute only")
    out["compute_only"] = {"median_step_s": m.median_s, "samples_per_s": m.samples_per_s}
    del step, x, y

    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(pipelines), desc="training loop", leave=False)
    try:
        for name in pipelines:
            if deadline is not None and time.perf_counter() > deadline:
                out["skipped"].append(name)
                continue
            workers = 4 if name == "common recipe" else (usable_cpus() if num_workers is None else num_workers)
            warmup = max(2, int(workers))
            estimate = 1.5 * (warmup + steps) * out["compute_only"]["median_step_s"] + 2.0
            if deadline is not None and time.perf_counter() + estimate > deadline:
                out["skipped"].append(name)
                continue
            step = new_step(prepare[name])
            with warnings.catch_warnings():
                # the common recipe's 4 workers on a small machine, and its pin_memory=True without
                # a GPU, make DataLoader warn; that is the recipe, measured as it is
                warnings.filterwarnings("ignore", message=".*worker processes in total.*")
                warnings.filterwarnings("ignore", message=".*pin_memory.*")
                loader = _pipeline_loader(name, RepeatDataset(base, (warmup + steps + 1) * batch_size),
                                          batch_size=batch_size, image_side=image_side,
                                          input_side=input_side, num_workers=num_workers)
                if loader.num_workers:
                    loader.timeout = 300          # never hang: a stuck worker raises instead
                if name == "common recipe" and recipe_settings:
                    with common_recipe_process_settings():
                        wait = measure_data_wait(loader, step, steps=steps, warmup_steps=warmup, device=dev)
                else:
                    wait = measure_data_wait(loader, step, steps=steps, warmup_steps=warmup, device=dev)
            out["pipelines"][name] = {
                "median_step_s": wait.median_step_s, "median_wait_s": wait.median_wait_s,
                "wait_fraction": wait.wait_fraction,
                "samples_per_s": batch_size * wait.steps / sum(wait.step_s),
                "steps": wait.steps, "num_workers": int(loader.num_workers or 0)}
            del loader, step
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()


# --------------------------------------------------------------------------------------------
# plots (work on the dicts above, so they draw this machine's results and reference results alike)
# --------------------------------------------------------------------------------------------

def _axes(ax: Any, figsize: tuple[float, float]) -> Any:
    if ax is None:
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(figsize=figsize)
    return ax


def _plot_title(title: str, machine: Optional[str], settings: Optional[dict]) -> str:
    if machine is None:
        from .plots import figure_title
        return figure_title(title, settings)
    import textwrap
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


def plot_training(result: dict, ax: Any = None, *, title: str = "Training step: waiting for data vs computing",
                  machine: Optional[str] = None) -> Any:
    """Stacked bars per pipeline from :func:`compare_training`'s dict: median wait and the rest
    of the step (ms), the data-wait fraction written on each bar, and the model-alone step time
    as a dashed line. Returns the Axes."""
    ax = _axes(ax, (7, 4.0))
    names = [n for n in PIPELINES if n in result["pipelines"]]
    waits = np.array([result["pipelines"][n]["median_wait_s"] * 1e3 for n in names])
    steps = np.array([result["pipelines"][n]["median_step_s"] * 1e3 for n in names])
    rest = np.maximum(steps - waits, 0)
    y = np.arange(len(names))
    ax.barh(y, waits, color="tab:red", label="waiting for data (median)")
    ax.barh(y, rest, left=waits, color="tab:blue", label="rest of the step: prepare + forward + backward")
    for i, n in enumerate(names):
        frac = result["pipelines"][n]["wait_fraction"]
        ax.text(steps[i], y[i], f"  {frac:.0%} waiting", va="center", fontsize=8)
    compute = result.get("compute_only", {}).get("median_step_s")
    if compute:
        ax.axvline(compute * 1e3, color="k", linestyle="--", linewidth=1,
                   label=f"model alone, data already on the device: {compute * 1e3:.1f} ms")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per training step (median; lower is better)")
    ax.set_xlim(0, max(steps.max() if len(steps) else 1, (compute or 0) * 1e3) * 1.35)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    settings = {"model": result.get("model"), "batch": result.get("batch_size"),
                "image": f"{result.get('image_side')}px", "device": result.get("device"),
                "training threads": result.get("main_threads")}
    ax.set_title(_plot_title(title, machine, settings), fontsize=9, loc="left")
    return ax


# --------------------------------------------------------------------------------------------
# the GPU check
# --------------------------------------------------------------------------------------------

#: Targets of issue 4 measured by :func:`run_gpu_benchmarks`.
AUGMENT_SPEEDUP_TARGET = 10.0
DATA_WAIT_TARGET = 0.05


def run_gpu_benchmarks(budget_s: float = 300, *, device: Any = "cuda", quick: Optional[bool] = None,
                       progress: bool = False) -> dict:
    """Lesson 05's GPU measurements, for the gpu-check command; returns a JSON-able dict.

    Measured side by side in one run on ``device`` (CUDA; ``device='cpu'`` with ``quick=True``
    runs every code path on a CPU-only machine, for tests):

    1. augmentation throughput vs batch size (:func:`measure_augment_throughput`): batched on the
       GPU vs per sample in DataLoader workers using all usable CPUs. Target: the best GPU
       samples/s >= 10x the best per-sample CPU samples/s;
    2. the training loop (:func:`compare_training`) with the common recipe, the tuned CPU
       pipeline and the GPU pipeline. Target: the tuned pipeline waits for data < 5% of the step.

    Full sizes unless ``quick`` (default: full, whatever quick mode says). Each part checks the
    time left: what would not fit in ``budget_s`` seconds is skipped and listed in ``skipped``
    (its target reads ``met: None``). Keys: name, mode, device, machine, budget_s, elapsed_s,
    augmentation, training, targets, skipped.
    """
    from .reference import LESSON05, describe_machine

    if isinstance(budget_s, bool) or not isinstance(budget_s, numbers.Real) or budget_s <= 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}.")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("run_gpu_benchmarks needs a CUDA GPU (torch.cuda.is_available() is False). "
                           "Run `python -m course_utils gpu-check` on a machine with an NVIDIA GPU; "
                           "on this machine, lesson 05 measures the CPU instead.")
    dev = _device(dev)
    quick = False if quick is None else bool(quick)
    start = time.perf_counter()
    deadline = start + float(budget_s)
    if quick:
        plan = dict(n_images=8, input_side=48, output=32, batch_sizes=[4, 8], repeats=1,
                    worker_samples=16, target_s=0.01, n_jpeg=24, train_batch=4, steps=2, width=2,
                    num_workers=min(2, os.cpu_count() or 1))
    else:
        plan = dict(n_images=256, input_side=256, output=224, batch_sizes=[16, 32, 64, 128, 256],
                    repeats=3, worker_samples=2048, target_s=0.2, n_jpeg=1000, train_batch=64,
                    steps=30, width=32, num_workers=None)
    result: dict[str, Any] = {"name": LESSON05, "mode": "quick" if quick else "full",
                              "device": str(dev), "machine": describe_machine(), "budget_s": float(budget_s),
                              "plan": {k: v for k, v in plan.items()}, "augmentation": None, "training": None,
                              "skipped": []}
    if dev.type == "cuda":
        result["machine"]["cuda_device"] = torch.cuda.get_device_name(dev)

    # 1. throughput (keep about 55% of the budget for the training loop)
    params = AugmentParams(size=plan["output"])
    images = DecodedImages(n=plan["n_images"], side=plan["input_side"])
    aug_deadline = start + 0.45 * float(budget_s)
    result["augmentation"] = measure_augment_throughput(
        images, plan["batch_sizes"], params=params, device=dev, num_workers=plan["num_workers"],
        repeats=plan["repeats"], worker_samples=plan["worker_samples"], target_s=plan["target_s"],
        progress=progress, deadline=aug_deadline)
    missing = [b for b, v in zip(plan["batch_sizes"], result["augmentation"]["device_samples_per_s"]) if v is None]
    if missing:
        result["skipped"].append(f"augmentation at batch sizes {missing} (budget)")
    del images

    # 2. training loop (a dataset of real JPEGs first: a few seconds to encode)
    if time.perf_counter() < deadline - 20:
        from .data import JpegDataset
        base = JpegDataset(n=plan["n_jpeg"], progress=progress)
        result["training"] = compare_training(
            base, device=dev, batch_size=plan["train_batch"], steps=plan["steps"],
            image_side=plan["output"], input_side=plan["input_side"], width=plan["width"],
            num_workers=plan["num_workers"], progress=progress, deadline=deadline - 5)
        result["skipped"] += [f"training loop: {n} (budget)" for n in result["training"]["skipped"]]
    else:
        result["skipped"].append("training loop (budget)")

    aug = result["augmentation"]
    ratio = aug.get("best_ratio") if aug else None
    tuned = (result["training"] or {}).get("pipelines", {}).get("tuned CPU pipeline")
    wait = None if tuned is None else tuned["wait_fraction"]
    result["targets"] = {
        "augment_speedup": {
            "description": "best samples/s of batched on-device augmentation / best samples/s of "
                           "per-sample CPU augmentation in DataLoader workers using all usable CPUs",
            "value": ratio, "target": f">= {AUGMENT_SPEEDUP_TARGET:g}",
            "met": None if ratio is None else bool(ratio >= AUGMENT_SPEEDUP_TARGET),
            "detail": (f"(batch sizes {missing} not measured: budget)" if missing and ratio is not None else "")},
        "tuned_data_wait": {
            "description": "data-wait fraction of the training step, tuned CPU pipeline "
                           f"({(result['training'] or {}).get('model')}, batch {plan['train_batch']})",
            "value": wait, "target": f"< {DATA_WAIT_TARGET:g}",
            "met": None if wait is None else bool(wait < DATA_WAIT_TARGET),
            "detail": ("" if tuned is None else f"(step {tuned['median_step_s'] * 1e3:.1f} ms, model alone "
                       f"{result['training']['compute_only']['median_step_s'] * 1e3:.1f} ms)")},
    }
    result["elapsed_s"] = time.perf_counter() - start
    return result
