"""Lesson 05: augmentation on the device, batched, with per-sample randomness. One augmentation
twice: :func:`augment_batch` (a few torch kernels per batch, any device) and
:class:`AugmentTransform` (per sample, OpenCV, in a worker): random resized crop (torchvision's
sampling, bilinear, half-pixel), flip, brightness, contrast, normalise. :func:`draw_batch` and
:func:`draw_sample` draw the same distribution; for the same draws the two agree within
:data:`AGREE_MAX_LEVELS` grey levels (``exact=True``: :data:`EXACT_MAX_LEVELS`)."""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from .checks import check_int
from .device import constants_on
from .image_ops import IMAGENET_MEAN, IMAGENET_STD, check_hwc, numpy_normalize, rgb_triple, torch_scale_shift
from .transforms import PerProcessRandom

__all__ = ["GRAY_WEIGHTS", "AGREE_MAX_LEVELS", "AGREE_MEAN_LEVELS", "EXACT_MAX_LEVELS", "AugmentParams",
           "SampleDraw", "AugmentDraws", "draw_batch", "draw_sample", "crop_grid", "augment_batch",
           "augment_sample", "AugmentTransform"]


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
    """Settings of the lesson-05 augmentation: size in pixels; scale, the (low, high) share of the
    area the crop covers; ratio, its width / height (log-uniform); attempts before the centre
    crop; brightness, contrast: factors in [max(0, 1 - value), 1 + value], 0 switches them off."""

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
            set_(name, check_int(name, getattr(self, name), 1, where))
        scale = _range("scale", self.scale, lo=0.0, where=where)
        if scale[1] > 1.0:
            raise ValueError(f"{where}: scale={self.scale!r}: the crop cannot cover more than the "
                             f"whole image; use a high value <= 1.0.")
        set_("scale", scale)
        set_("ratio", _range("ratio", self.ratio, lo=0.0, where=where))
        set_("flip_p", _unit("flip_p", self.flip_p, where))
        set_("brightness", _unit("brightness", self.brightness, where, hi=10.0))
        set_("contrast", _unit("contrast", self.contrast, where, hi=10.0))
        set_("mean", rgb_triple("mean", self.mean, where, positive=False))
        set_("std", rgb_triple("std", self.std, where, positive=True))

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
    """The random parameters of a batch, one 1-D tensor of length N per parameter, on one
    device."""

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


def draw_batch(n: int, height: int, width: int, params: Optional[AugmentParams] = None, *,
               generator: Optional[torch.Generator] = None, device: Any = None) -> AugmentDraws:
    """Draw the random parameters of ``n`` samples of ``height`` x ``width`` pixels, batched.

    One ``torch.rand`` covers every attempt of every sample; each keeps its first box that fits
    (``argmax`` over a mask), else the centre crop: no Python loop, no copy to the host. Drawn
    with ``generator`` on its device (a CPU one gives the same draws for every device), else on
    ``device``; the result is moved to ``device``.
    """
    where = "draw_batch"
    n, height, width = (check_int(k, v, 1, where) for k, v in (("n", n), ("height", height), ("width", width)))
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
    """Draw one sample's random parameters on the CPU with ``rng`` (default unseeded), looping
    over the attempts as torchvision's ``RandomResizedCrop`` does."""
    where = "draw_sample"
    height, width = check_int("height", height, 1, where), check_int("width", width, 1, where)
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


def crop_grid(draws: AugmentDraws, height: int, width: int, size: int) -> torch.Tensor:
    """The (N, size, size, 2) sampling grid of ``F.grid_sample`` for every sample's crop box:
    half-pixel centres clamped to the box (as ``cv2.resize`` of the crop), a flip mirrored."""
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


def _constants(p: AugmentParams, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(shift, scale) of the normalisation ((x - shift) * scale, each (3, 1, 1)) and the grey
    weights (3,), on ``device``, made once per device."""
    return constants_on(device, ("augment", p.mean, p.std), lambda: (
        *torch_scale_shift(p.mean, p.std), torch.tensor(GRAY_WEIGHTS, dtype=torch.float32)))


def augment_batch(batch: torch.Tensor, params: Optional[AugmentParams] = None, *,
                  generator: Optional[torch.Generator] = None,
                  draws: Optional[AugmentDraws] = None) -> torch.Tensor:
    """Augment a uint8 (N, 3, H, W) batch on its own device -> float32 (N, 3, size, size), with
    :func:`draw_batch` (``generator``: a seeded one for reproducible output) or given ``draws``;
    nothing is copied to the host."""
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
    shift, scale, gray = _constants(p, x.device)
    if p.contrast > 0:
        m = (x.mean(dim=(2, 3)) * gray).sum(dim=1).view(-1, 1, 1, 1)        # (N, 1, 1, 1) grey means
        c = draws.contrast.view(-1, 1, 1, 1)
        x.mul_(c).add_(m * (1 - c)).clamp_(0.0, 255.0)
    return x.sub_(shift).mul_(scale)                                       # (x / 255 - mean) / std


def augment_sample(image: np.ndarray, draw: SampleDraw, params: Optional[AugmentParams] = None,
                   *, exact: bool = False) -> torch.Tensor:
    """Augment one (H, W, 3) uint8 RGB image with the given parameters -> float32 (3, size,
    size), as :func:`augment_batch` does; ``exact=True`` resizes in float32, not uint8."""
    where = "augment_sample"
    image = check_hwc(image, where, uint8_only=True)
    p = _params(params, where)
    if not isinstance(draw, SampleDraw):
        raise TypeError(f"{where}: draw must be a SampleDraw (see draw_sample), got {type(draw).__name__}.")
    t, l, h, w = draw.top, draw.left, draw.height, draw.width
    if not (0 <= t and 0 <= l and h >= 1 and w >= 1 and t + h <= image.shape[0] and l + w <= image.shape[1]):
        raise ValueError(f"{where}: the crop box (top={t}, left={l}, height={h}, width={w}) does not "
                         f"fit in this {image.shape[0]}x{image.shape[1]} image; draw it for its size.")
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
    return torch.from_numpy(np.ascontiguousarray(numpy_normalize(x, p.mean, p.std).transpose(2, 0, 1)))


class AugmentTransform(PerProcessRandom):
    """The per-sample augmentation as a picklable DataLoader transform: (H, W, 3) uint8 ->
    float32 (3, size, size), drawing per process as :class:`PerProcessRandom` says."""

    def __init__(self, params: Optional[AugmentParams] = None, seed: Optional[int] = None, *,
                 exact: bool = False) -> None:
        self.params = _params(params, "AugmentTransform")
        super().__init__(seed, owner="AugmentTransform")
        self.exact = bool(exact)

    def draw(self, height: int, width: int) -> SampleDraw:
        """The next random parameters of this process, for an image of that size."""
        return draw_sample(height, width, self.params, self._generator())

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        return augment_sample(image, self.draw(*np.shape(image)[:2]), self.params, exact=self.exact)

    def __repr__(self) -> str:
        return f"AugmentTransform(params={self.params!r}, seed={self.seed!r}, exact={self.exact})"
