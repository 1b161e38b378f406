"""The reference pipeline's operations, one function per stage and backend (NumPy, OpenCV, torch),
so lesson 01 can time each on its own; :mod:`course_utils.transforms` states their conventions,
chains them and is where the lessons import them from."""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from .checks import check_int

__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "resized_hw", "crop_box",
    "numpy_resize", "opencv_resize", "torch_resize", "center_crop", "torch_center_crop",
    "numpy_hflip", "opencv_hflip", "torch_hflip", "numpy_normalize", "opencv_normalize",
    "torch_normalize", "numpy_to_chw", "opencv_to_chw", "torch_to_chw", "torch_from_image",
]

#: ImageNet channel means and standard deviations (RGB, on the [0, 1] scale).
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


def positive_int(name: str, value: Any, where: str) -> int:
    """``value`` as an int >= 1 (a size in pixels), or a ValueError naming ``name``."""
    return check_int(name, value, 1, where, f" It is a size in pixels, e.g. {name}=224.")


def rgb_triple(name: str, value: Any, where: str, *, positive: bool) -> tuple[float, float, float]:
    """``value`` as three finite floats (R, G, B), all > 0 with ``positive`` (a std divides)."""
    try:
        values = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise TypeError(f"{where}: {name} must be three numbers (R, G, B) on the [0, 1] scale, got "
                        f"{value!r}; e.g. {name}={IMAGENET_MEAN if name == 'mean' else IMAGENET_STD}.") from None
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"{where}: {name} must be three finite numbers (R, G, B), got {value!r}.")
    if positive and min(values) <= 0:
        raise ValueError(f"{where}: {name}={value!r} must be > 0 for every channel (it divides).")
    return values  # type: ignore[return-value]


def check_hwc(image: Any, where: str, *, uint8_only: bool = False) -> np.ndarray:
    """``image`` if it is an (H, W, 3) uint8 (or float32, unless ``uint8_only``) array."""
    if not isinstance(image, np.ndarray):
        raise TypeError(f"{where}: image must be an (H, W, 3) NumPy array (as decode_jpeg returns), "
                        f"got {type(image).__name__}.")
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"{where}: image must have shape (H, W, 3) (channels last), got "
                         f"{image.shape}.")
    if uint8_only and image.dtype != np.uint8:
        raise ValueError(f"{where}: image must be uint8, got {image.dtype}.")
    if image.dtype not in (np.uint8, np.float32):
        raise ValueError(f"{where}: image must be uint8 or float32, got {image.dtype}; convert "
                         f"with image.astype(np.float32) or keep the decoded uint8.")
    return image


def _check_chw(x: Any, where: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: x must be a (3, H, W) torch.Tensor (see torch_from_image), got "
                        f"{type(x).__name__}.")
    if x.dim() != 3 or x.shape[0] != 3:
        raise ValueError(f"{where}: x must have shape (3, H, W) (channels first), got "
                         f"{tuple(x.shape)}.")
    if x.dtype not in (torch.uint8, torch.float32):
        raise ValueError(f"{where}: x must be uint8 or float32, got {x.dtype}.")
    return x


def _check_size_hw(size_hw: Any, where: str) -> tuple[int, int]:
    try:
        h, w = size_hw
    except (TypeError, ValueError):
        raise TypeError(f"{where}: size_hw must be (height, width) in pixels, got {size_hw!r}.") from None
    return positive_int("height", h, where), positive_int("width", w, where)


def resized_hw(height: int, width: int, shorter: int) -> tuple[int, int]:
    """Output (height, width) when the shorter side becomes ``shorter`` pixels (the longer side
    truncated, as torchvision does)."""
    height = positive_int("height", height, "resized_hw")
    width = positive_int("width", width, "resized_hw")
    shorter = positive_int("shorter", shorter, "resized_hw")
    if height <= width:
        return shorter, max(1, int(shorter * width / height))
    return max(1, int(shorter * height / width)), shorter


def crop_box(height: int, width: int, size: int) -> tuple[int, int]:
    """(top, left) of the centre ``size`` x ``size`` crop of a ``height`` x ``width`` image."""
    if size > height or size > width:
        raise ValueError(f"crop_box: the crop size={size} is larger than the image "
                         f"({height}x{width}); resize first so both sides are >= {size}.")
    return int(round((height - size) / 2.0)), int(round((width - size) / 2.0))


@functools.lru_cache(maxsize=256)
def _bilinear_axis(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source indices (i0, i1) and weights w of one axis: out[d] = (1 - w) * in[i0] + w * in[i1]
    (half-pixel convention, as cv2.INTER_LINEAR and align_corners=False)."""
    src = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
    src = np.clip(src, 0.0, n_in - 1)
    i0 = np.floor(src).astype(np.intp)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w = (src - i0).astype(np.float32)
    for a in (i0, i1, w):
        a.flags.writeable = False
    return i0, i1, w


def numpy_resize(image: np.ndarray, size_hw: Sequence[int]) -> np.ndarray:
    """Bilinear resize of an (H, W, 3) image to ``size_hw`` = (height, width), in NumPy: rows,
    then columns, as ``cv2.INTER_LINEAR`` (lesson 01 writes it by hand); uint8 rounds half up."""
    image = check_hwc(image, "numpy_resize")
    h, w = _check_size_hw(size_hw, "numpy_resize")
    y0, y1, wy = _bilinear_axis(image.shape[0], h)
    x0, x1, wx = _bilinear_axis(image.shape[1], w)
    top = image[y0].astype(np.float32, copy=False)
    bottom = image[y1].astype(np.float32, copy=False)
    rows = top + (bottom - top) * wy[:, None, None]            # (h, W, 3) float32
    left = rows[:, x0]
    out = left + (rows[:, x1] - left) * wx[None, :, None]       # (h, w, 3) float32
    if image.dtype == np.uint8:
        # a blend of values in 0..255 stays in 0..255 (up to float rounding, far below 0.5), so
        # rounding half up cannot leave the uint8 range: no clip needed
        out += 0.5
        np.floor(out, out=out)
        return out.astype(np.uint8)
    return out


def opencv_resize(image: np.ndarray, size_hw: Sequence[int]) -> np.ndarray:
    """``cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)`` (note: OpenCV
    takes the size as (width, height)). uint8 stays uint8 (fixed-point), float32 stays float32."""
    image = check_hwc(image, "opencv_resize")
    h, w = _check_size_hw(size_hw, "opencv_resize")
    return cv2.resize(image, (w, h), interpolation=cv2.INTER_LINEAR)


def torch_resize(x: torch.Tensor, size_hw: Sequence[int]) -> torch.Tensor:
    """Bilinear resize of a (3, H, W) uint8 or float32 tensor with ``F.interpolate``; a view of
    HWC memory (:func:`torch_from_image`) takes torch's channels-last kernel and stays so."""
    x = _check_chw(x, "torch_resize")
    h, w = _check_size_hw(size_hw, "torch_resize")
    return F.interpolate(x[None], size=(h, w), mode="bilinear", align_corners=False,
                         antialias=False)[0]


def center_crop(image: np.ndarray, size: int) -> np.ndarray:
    """Centre ``size`` x ``size`` crop of an (H, W, C) array: a view, for NumPy and OpenCV alike
    (an OpenCV ROI is this slice)."""
    image = check_hwc(image, "center_crop")
    size = positive_int("size", size, "center_crop")
    top, left = crop_box(image.shape[0], image.shape[1], size)
    return image[top:top + size, left:left + size]


def torch_center_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    """Centre ``size`` x ``size`` crop of a (3, H, W) tensor: a view (no copy)."""
    x = _check_chw(x, "torch_center_crop")
    size = positive_int("size", size, "torch_center_crop")
    top, left = crop_box(x.shape[1], x.shape[2], size)
    return x[:, top:top + size, left:left + size]


def numpy_hflip(image: np.ndarray) -> np.ndarray:
    """Left-right mirror of an (H, W, C) array, copied: ``image[:, ::-1]`` alone is a free view
    whose cost moves to the next reader, so every backend's flip does the same work."""
    image = check_hwc(image, "numpy_hflip")
    return np.ascontiguousarray(image[:, ::-1])


def opencv_hflip(image: np.ndarray) -> np.ndarray:
    """``cv2.flip(image, 1)``: left-right mirror."""
    image = check_hwc(image, "opencv_hflip")
    return cv2.flip(image, 1)


def torch_hflip(x: torch.Tensor) -> torch.Tensor:
    """``torch.flip(x, dims=(-1,))``: left-right mirror of a (3, H, W) tensor (copies)."""
    x = _check_chw(x, "torch_hflip")
    return torch.flip(x, dims=(-1,))


@functools.lru_cache(maxsize=32)
def _scale_shift(mean: tuple, std: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(255 * mean, 1 / (255 * std)) as float32 arrays: out = (x - shift) * scale."""
    shift = (np.asarray(mean, dtype=np.float64) * 255.0).astype(np.float32)
    scale = (1.0 / (np.asarray(std, dtype=np.float64) * 255.0)).astype(np.float32)
    shift.flags.writeable = False
    scale.flags.writeable = False
    return shift, scale


@functools.lru_cache(maxsize=32)
def torch_scale_shift(mean: tuple, std: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The (shift, scale) of :func:`_scale_shift` as (3, 1, 1) float32 CPU tensors."""
    shift, scale = _scale_shift(mean, std)
    return (torch.tensor(shift.tolist(), dtype=torch.float32).view(3, 1, 1),
            torch.tensor(scale.tolist(), dtype=torch.float32).view(3, 1, 1))


def _mean_std(mean: Any, std: Any, where: str) -> tuple[tuple, tuple]:
    return rgb_triple("mean", mean, where, positive=False), rgb_triple("std", std, where, positive=True)


def numpy_normalize(image: np.ndarray, mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD) -> np.ndarray:
    """(H, W, 3) uint8 (or float32 0..255) -> float32 ``(x / 255 - mean) / std``, channels last,
    as ``(x - 255 * mean) * (1 / (255 * std))``."""
    image = check_hwc(image, "numpy_normalize")
    shift, scale = _scale_shift(*_mean_std(mean, std, "numpy_normalize"))
    out = image.astype(np.float32)
    out -= shift
    out *= scale
    return out


def opencv_normalize(image: np.ndarray, mean: Sequence[float] = IMAGENET_MEAN,
                     std: Sequence[float] = IMAGENET_STD) -> np.ndarray:
    """Like :func:`numpy_normalize`, with OpenCV's SIMD arithmetic: ``cv2.subtract`` with a
    per-channel scalar straight to float32 (``dtype=cv2.CV_32F``), then ``cv2.multiply``."""
    image = check_hwc(image, "opencv_normalize")
    shift, scale = _scale_shift(*_mean_std(mean, std, "opencv_normalize"))
    out = cv2.subtract(image, (*shift.tolist(), 0.0), dtype=cv2.CV_32F)
    return cv2.multiply(out, (*scale.tolist(), 0.0))


def torch_normalize(x: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """(3, H, W) uint8 (or float32 0..255) tensor -> float32 ``(x / 255 - mean) / std``, keeping
    the memory layout of ``x``."""
    x = _check_chw(x, "torch_normalize")
    shift, scale = torch_scale_shift(*_mean_std(mean, std, "torch_normalize"))
    out = x.to(torch.float32, copy=True)
    return out.sub_(shift).mul_(scale)


def numpy_to_chw(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) array -> contiguous (3, H, W) tensor: ``np.ascontiguousarray(transpose)``, then
    ``torch.from_numpy`` (which shares the memory, no copy)."""
    image = check_hwc(image, "numpy_to_chw")
    return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))


def opencv_to_chw(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) float32 array -> contiguous (3, H, W) tensor with ``cv2.dnn.blobFromImage``;
    uint8 (blobFromImage returns float32) or an OpenCV without dnn uses :func:`numpy_to_chw`."""
    image = check_hwc(image, "opencv_to_chw")
    dnn = getattr(cv2, "dnn", None)   # every opencv-python wheel has it; some custom builds don't
    if image.dtype != np.float32 or dnn is None:
        return numpy_to_chw(image)
    return torch.from_numpy(dnn.blobFromImage(image)[0])


def torch_to_chw(x: torch.Tensor) -> torch.Tensor:
    """``x.contiguous()``: lays a (3, H, W) tensor out channels-first in memory (a copy when it
    was a channels-last view, as after :func:`torch_from_image`)."""
    x = _check_chw(x, "torch_to_chw")
    return x.contiguous()


def torch_from_image(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) array -> (3, H, W) tensor *view* of the same memory (no copy):
    ``torch.from_numpy(image).permute(2, 0, 1)``."""
    image = check_hwc(image, "torch_from_image")
    if any(s < 0 for s in image.strides):
        image = np.ascontiguousarray(image)  # torch.from_numpy refuses negative strides
    return torch.from_numpy(image).permute(2, 0, 1)
