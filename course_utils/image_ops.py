"""The reference pipeline's operations, one function per stage and backend (NumPy, OpenCV, torch),
so lesson 01 can time each on its own; :mod:`course_utils.transforms` states their conventions,
chains them and is where the lessons import them from. Each op checks its image (the lesson's
entry point); sizes and constants come checked from ``PipelineParams``."""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import cv2
import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "resized_hw", "crop_box",
    "numpy_resize", "opencv_resize", "torch_resize", "center_crop", "torch_center_crop",
    "numpy_hflip", "opencv_hflip", "torch_hflip", "numpy_normalize", "opencv_normalize",
    "torch_normalize", "numpy_to_chw", "opencv_to_chw", "torch_to_chw", "torch_from_image",
]

#: ImageNet channel means and standard deviations (RGB, on the [0, 1] scale).
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


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
        raise ValueError(f"{where}: image must have shape (H, W, 3) (channels last), got {image.shape}.")
    if image.dtype not in ((np.uint8,) if uint8_only else (np.uint8, np.float32)):
        raise ValueError(f"{where}: image must be {'uint8' if uint8_only else 'uint8 or float32'}, "
                         f"got {image.dtype}; keep the decoded uint8 (or .astype(np.float32)).")
    return image


def _check_chw(x: Any, where: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: x must be a (3, H, W) torch.Tensor (see torch_from_image), got "
                        f"{type(x).__name__}.")
    if x.dim() != 3 or x.shape[0] != 3 or x.dtype not in (torch.uint8, torch.float32):
        raise ValueError(f"{where}: x must have shape (3, H, W) (channels first), uint8 or float32, "
                         f"got {tuple(x.shape)} {x.dtype}.")
    return x


def resized_hw(height: int, width: int, shorter: int) -> tuple[int, int]:
    """Output (height, width) when the shorter side becomes ``shorter`` pixels (the longer side
    truncated, as torchvision does)."""
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
    (half-pixel centres, as cv2.INTER_LINEAR and align_corners=False)."""
    src = np.clip((np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5, 0.0, n_in - 1)
    i0 = np.floor(src).astype(np.intp)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w = (src - i0).astype(np.float32)
    for a in (i0, i1, w):
        a.flags.writeable = False
    return i0, i1, w


def numpy_resize(image: np.ndarray, size_hw: Sequence[int]) -> np.ndarray:
    """Bilinear resize of an (H, W, 3) image to ``size_hw`` = (height, width) in NumPy, rows then
    columns, as ``cv2.INTER_LINEAR`` (lesson 01 writes it by hand); uint8 rounds half up."""
    image = check_hwc(image, "numpy_resize")
    y0, y1, wy = _bilinear_axis(image.shape[0], size_hw[0])
    x0, x1, wx = _bilinear_axis(image.shape[1], size_hw[1])
    top = image[y0].astype(np.float32, copy=False)
    rows = top + (image[y1].astype(np.float32, copy=False) - top) * wy[:, None, None]   # (h, W, 3)
    left = rows[:, x0]
    out = left + (rows[:, x1] - left) * wx[None, :, None]                               # (h, w, 3)
    if image.dtype == np.uint8:
        # a blend of 0..255 stays in 0..255 (float error far below 0.5): no clip needed
        out += 0.5
        return np.floor(out, out=out).astype(np.uint8)
    return out


def opencv_resize(image: np.ndarray, size_hw: Sequence[int]) -> np.ndarray:
    """``cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)`` (OpenCV takes
    (width, height)); uint8 stays uint8 (fixed-point weights), float32 stays float32."""
    image = check_hwc(image, "opencv_resize")
    return cv2.resize(image, (int(size_hw[1]), int(size_hw[0])), interpolation=cv2.INTER_LINEAR)


def torch_resize(x: torch.Tensor, size_hw: Sequence[int]) -> torch.Tensor:
    """Bilinear resize of a (3, H, W) uint8 or float32 tensor with ``F.interpolate``; a view of
    HWC memory (:func:`torch_from_image`) takes torch's channels-last kernel and stays so."""
    x = _check_chw(x, "torch_resize")
    return F.interpolate(x[None], size=tuple(size_hw), mode="bilinear", align_corners=False,
                         antialias=False)[0]


def center_crop(image: np.ndarray, size: int) -> np.ndarray:
    """Centre ``size`` x ``size`` crop of an (H, W, 3) array: a view, for NumPy and OpenCV alike
    (an OpenCV ROI is this slice)."""
    image = check_hwc(image, "center_crop")
    top, left = crop_box(image.shape[0], image.shape[1], size)
    return image[top:top + size, left:left + size]


def torch_center_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    """Centre ``size`` x ``size`` crop of a (3, H, W) tensor: a view (no copy)."""
    x = _check_chw(x, "torch_center_crop")
    top, left = crop_box(x.shape[1], x.shape[2], size)
    return x[:, top:top + size, left:left + size]


def numpy_hflip(image: np.ndarray) -> np.ndarray:
    """Left-right mirror of an (H, W, 3) array, copied (the view ``image[:, ::-1]`` would move
    the cost to the next reader), so every backend's flip does the same work."""
    return np.ascontiguousarray(check_hwc(image, "numpy_hflip")[:, ::-1])


def opencv_hflip(image: np.ndarray) -> np.ndarray:
    """``cv2.flip(image, 1)``: left-right mirror."""
    return cv2.flip(check_hwc(image, "opencv_hflip"), 1)


def torch_hflip(x: torch.Tensor) -> torch.Tensor:
    """``torch.flip(x, dims=(-1,))``: left-right mirror of a (3, H, W) tensor (copies)."""
    return torch.flip(_check_chw(x, "torch_hflip"), dims=(-1,))


@functools.lru_cache(maxsize=32)
def _scale_shift(mean: tuple, std: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(255 * mean, 1 / (255 * std)) as float32 arrays: normalised = (x - shift) * scale."""
    shift = (np.asarray(mean, dtype=np.float64) * 255.0).astype(np.float32)
    scale = (1.0 / (np.asarray(std, dtype=np.float64) * 255.0)).astype(np.float32)
    shift.flags.writeable = scale.flags.writeable = False
    return shift, scale


@functools.lru_cache(maxsize=32)
def torch_scale_shift(mean: tuple, std: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The (shift, scale) of :func:`_scale_shift` as (3, 1, 1) float32 CPU tensors."""
    return tuple(torch.tensor(a.tolist(), dtype=torch.float32).view(3, 1, 1)  # type: ignore[return-value]
                 for a in _scale_shift(mean, std))


def numpy_normalize(image: np.ndarray, mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD) -> np.ndarray:
    """(H, W, 3) uint8 (or float32 0..255) -> float32 ``(x / 255 - mean) / std``, channels last,
    as ``(x - 255 * mean) * (1 / (255 * std))``."""
    shift, scale = _scale_shift(tuple(mean), tuple(std))
    out = check_hwc(image, "numpy_normalize").astype(np.float32)
    out -= shift
    out *= scale
    return out


def opencv_normalize(image: np.ndarray, mean: Sequence[float] = IMAGENET_MEAN,
                     std: Sequence[float] = IMAGENET_STD) -> np.ndarray:
    """:func:`numpy_normalize` with OpenCV's SIMD arithmetic: ``cv2.subtract`` of a per-channel
    scalar straight to float32 (``dtype=cv2.CV_32F``), then ``cv2.multiply``."""
    shift, scale = _scale_shift(tuple(mean), tuple(std))
    out = cv2.subtract(check_hwc(image, "opencv_normalize"), (*shift.tolist(), 0.0), dtype=cv2.CV_32F)
    return cv2.multiply(out, (*scale.tolist(), 0.0))


def torch_normalize(x: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """(3, H, W) uint8 (or float32 0..255) tensor -> float32 ``(x / 255 - mean) / std``, keeping
    the memory layout of ``x``."""
    shift, scale = torch_scale_shift(tuple(mean), tuple(std))
    return _check_chw(x, "torch_normalize").to(torch.float32, copy=True).sub_(shift).mul_(scale)


def numpy_to_chw(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) array -> contiguous (3, H, W) tensor: ``np.ascontiguousarray(transpose)``, then
    ``torch.from_numpy`` (which shares the memory)."""
    return torch.from_numpy(np.ascontiguousarray(check_hwc(image, "numpy_to_chw").transpose(2, 0, 1)))


def opencv_to_chw(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) float32 array -> contiguous (3, H, W) tensor with ``cv2.dnn.blobFromImage``;
    uint8 (blobFromImage returns float32) or an OpenCV without dnn uses :func:`numpy_to_chw`."""
    dnn = getattr(cv2, "dnn", None)   # every opencv-python wheel has it; some custom builds don't
    if check_hwc(image, "opencv_to_chw").dtype != np.float32 or dnn is None:
        return numpy_to_chw(image)
    return torch.from_numpy(dnn.blobFromImage(image)[0])


def torch_to_chw(x: torch.Tensor) -> torch.Tensor:
    """``x.contiguous()``: lays a (3, H, W) tensor out channels-first in memory (a copy when it
    was a channels-last view, as after :func:`torch_from_image`)."""
    return _check_chw(x, "torch_to_chw").contiguous()


def torch_from_image(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) array -> (3, H, W) tensor *view* of the same memory (no copy):
    ``torch.from_numpy(image).permute(2, 0, 1)``."""
    image = check_hwc(image, "torch_from_image")
    if any(s < 0 for s in image.strides):
        image = np.ascontiguousarray(image)  # torch.from_numpy refuses negative strides
    return torch.from_numpy(image).permute(2, 0, 1)
