"""The course's reference preprocessing pipeline, written three ways: NumPy, OpenCV, torch (CPU):
decoded RGB uint8 -> resize (shorter side to params.resize, half-pixel bilinear, no antialiasing)
-> centre crop (params.crop, torchvision's box) -> [flip] -> normalise ((x / 255 - mean) / std)
-> contiguous CHW tensor. Lesson 01 writes it by hand first. Decode is shared (NumPy has none).
The three differ only in rounding resized pixels to uint8: every value is within
:data:`MAX_DIFF_LEVELS` grey levels of :func:`exact_pipeline` and the mean within
:data:`MEAN_DIFF_LEVELS` (truncating shifts it ~0.5)."""
from __future__ import annotations

import functools
import numbers
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from .checks import check_int
from .device import constants_on
from .image_ops import (IMAGENET_MEAN, IMAGENET_STD, center_crop, check_hwc, crop_box, numpy_hflip,
                        numpy_normalize, numpy_resize, numpy_to_chw, opencv_hflip, opencv_normalize,
                        opencv_resize, opencv_to_chw, resized_hw, rgb_triple, torch_center_crop,
                        torch_from_image, torch_hflip, torch_normalize, torch_resize,
                        torch_scale_shift, torch_to_chw)

__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "BACKENDS", "MAX_DIFF_LEVELS", "MEAN_DIFF_LEVELS",
    "PipelineParams", "resized_hw", "crop_box", "numpy_resize", "opencv_resize", "torch_resize",
    "center_crop", "torch_center_crop", "numpy_hflip", "opencv_hflip", "torch_hflip",
    "numpy_normalize", "opencv_normalize", "torch_normalize", "numpy_to_chw", "opencv_to_chw",
    "torch_to_chw", "torch_from_image", "Stage", "pipeline_stages", "run_pipeline",
    "numpy_pipeline", "opencv_pipeline", "torch_pipeline", "exact_pipeline", "OutputDifference",
    "output_difference", "normalize_batch", "ReferenceTransform", "Uint8Transform", "ToFloat32",
]

#: The three implementations, by name.
BACKENDS: tuple[str, ...] = ("numpy", "opencv", "torch")

#: Largest allowed |difference| between an implementation and :func:`exact_pipeline`, in grey levels.
MAX_DIFF_LEVELS = 1.0
#: Largest allowed |mean signed difference| over an image, in grey levels (catches a bias).
MEAN_DIFF_LEVELS = 0.25

ImageOrTensor = Union[np.ndarray, torch.Tensor]


@dataclass(frozen=True)
class PipelineParams:
    """Settings of the reference pipeline: resize (the shorter side after resizing) and crop (<=
    resize) in pixels; mean, std per (R, G, B) channel on the [0, 1] scale; flip_p a probability."""

    resize: int = 256
    crop: int = 224
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    flip_p: float = 0.5

    def __post_init__(self) -> None:
        where = "PipelineParams"
        set_ = functools.partial(object.__setattr__, self)
        for name in ("resize", "crop"):
            set_(name, check_int(name, getattr(self, name), 1, where, " It is a size in pixels."))
        if self.crop > self.resize:
            raise ValueError(f"{where}: crop={self.crop} is larger than resize={self.resize}; the "
                             f"crop is taken from the resized image, so pass crop <= resize.")
        set_("mean", rgb_triple("mean", self.mean, where, positive=False))
        set_("std", rgb_triple("std", self.std, where, positive=True))
        p = self.flip_p
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"{where}: flip_p={p!r} must be a probability between 0 and 1 "
                             f"(0.5 flips half of the images).")
        set_("flip_p", float(p))

    def resized_hw(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the resize stage, for an input of ``height`` x ``width`` pixels."""
        return resized_hw(height, width, self.resize)

    def crop_box(self, height: int, width: int) -> tuple[int, int]:
        """(top, left) of the centre crop in an image of ``height`` x ``width`` pixels."""
        return crop_box(height, width, self.crop)


_DEFAULT = PipelineParams()


def _params(params: Optional[PipelineParams], where: str) -> PipelineParams:
    if params is None:
        return _DEFAULT
    if not isinstance(params, PipelineParams):
        raise TypeError(f"{where}: params must be a PipelineParams (or None for the defaults), "
                        f"got {type(params).__name__}; e.g. params=PipelineParams(resize=256, crop=224).")
    return params


_OPS: dict[str, dict[str, Callable]] = {
    "numpy": {"resize": numpy_resize, "crop": center_crop, "flip": numpy_hflip,
              "normalize": numpy_normalize, "to CHW": numpy_to_chw},
    "opencv": {"resize": opencv_resize, "crop": center_crop, "flip": opencv_hflip,
               "normalize": opencv_normalize, "to CHW": opencv_to_chw},
    "torch": {"resize": torch_resize, "crop": torch_center_crop, "flip": torch_hflip,
              "normalize": torch_normalize, "to CHW": torch_to_chw},
}


def _backend(backend: Any, where: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"{where}: backend={backend!r} is not known; use one of "
                         f"{', '.join(repr(b) for b in BACKENDS)}.")
    return backend


class Stage:
    """One pipeline stage of one backend, as a picklable callable ``stage(x) -> x``; sizes come
    from the input's shape and ``params`` at call time."""

    def __init__(self, backend: str, name: str, params: Optional[PipelineParams] = None) -> None:
        self.backend = _backend(backend, "Stage")
        names = ("to tensor",) * (backend == "torch") + tuple(_OPS[self.backend])
        if name not in names:
            raise ValueError(f"Stage: name={name!r} is not a {backend} stage; use one of {names}.")
        self.name = name
        self.params = _params(params, "Stage")

    def __call__(self, x: ImageOrTensor) -> ImageOrTensor:
        p, op = self.params, _OPS[self.backend].get(self.name, torch_from_image)
        if self.name == "resize":
            return op(x, p.resized_hw(*(x.shape[-2:] if isinstance(x, torch.Tensor) else x.shape[:2])))
        if self.name in ("crop", "normalize"):
            return op(x, p.crop) if self.name == "crop" else op(x, p.mean, p.std)
        return op(x)  # to tensor, flip, to CHW

    def __repr__(self) -> str:
        return f"Stage({self.backend!r}, {self.name!r})"


def pipeline_stages(backend: str, params: Optional[PipelineParams] = None, *, flip: bool = False,
                    normalize: bool = True) -> list[tuple[str, Stage]]:
    """The stages of ``backend``'s pipeline after decoding, in order, as (name, callable) pairs
    (torch starts with a zero-copy "to tensor"); ``normalize=False`` leaves the output uint8."""
    backend = _backend(backend, "pipeline_stages")
    params = _params(params, "pipeline_stages")
    names = ["resize", "crop"] + (["flip"] if flip else []) + (["normalize"] if normalize else []) + ["to CHW"]
    if backend == "torch":
        names.insert(0, "to tensor")
    return [(name, Stage(backend, name, params)) for name in names]


def run_pipeline(backend: str, image: np.ndarray, flip: bool = False,
                 params: Optional[PipelineParams] = None, *, normalize: bool = True) -> torch.Tensor:
    """Run ``backend``'s pipeline on a decoded (H, W, 3) uint8 RGB image -> contiguous (3, crop,
    crop) tensor; ``flip`` is the flip decision (the random draw is the transforms' job)."""
    x: Any = check_hwc(image, f"run_pipeline({backend!r})", uint8_only=True)
    for _, stage in pipeline_stages(backend, params, flip=bool(flip), normalize=normalize):
        x = stage(x)
    return x


def numpy_pipeline(image: np.ndarray, flip: bool = False,
                   params: Optional[PipelineParams] = None) -> torch.Tensor:
    """The reference pipeline in NumPy (the tensor made at the end, without a copy)."""
    return run_pipeline("numpy", image, flip, params)


def opencv_pipeline(image: np.ndarray, flip: bool = False,
                    params: Optional[PipelineParams] = None) -> torch.Tensor:
    """The reference pipeline in OpenCV calls (the crop a NumPy slice: OpenCV's ROI)."""
    return run_pipeline("opencv", image, flip, params)


def torch_pipeline(image: np.ndarray, flip: bool = False,
                   params: Optional[PipelineParams] = None) -> torch.Tensor:
    """The reference pipeline in torch on CPU tensors (from a zero-copy view)."""
    return run_pipeline("torch", image, flip, params)


def exact_pipeline(image: np.ndarray, flip: bool = False,
                   params: Optional[PipelineParams] = None) -> torch.Tensor:
    """The pipeline in float32 throughout, without rounding the resized pixels to uint8: what
    every implementation is compared with."""
    image = check_hwc(image, "exact_pipeline", uint8_only=True)
    params = _params(params, "exact_pipeline")
    x = numpy_resize(image.astype(np.float32), params.resized_hw(*image.shape[:2]))
    x = center_crop(x, params.crop)
    if flip:
        x = numpy_hflip(x)
    return numpy_to_chw(numpy_normalize(x, params.mean, params.std))


@dataclass(frozen=True)
class OutputDifference:
    """How far one normalised output is from another, in grey levels (1 level = 1/255);
    mean_levels is the signed mean difference (a bias)."""

    max_abs_levels: float
    mean_levels: float
    mean_abs_levels: float
    max_allowed: float = MAX_DIFF_LEVELS
    mean_allowed: float = MEAN_DIFF_LEVELS

    @property
    def within_tolerance(self) -> bool:
        # a float32 hair over 1 level (rounding of the float reference itself) is allowed
        return (self.max_abs_levels <= self.max_allowed + 1e-3
                and abs(self.mean_levels) <= self.mean_allowed)

    def __str__(self) -> str:
        verdict = "within tolerance" if self.within_tolerance else "OUT OF TOLERANCE"
        return (f"max |diff| {self.max_abs_levels:.3f} levels, mean diff {self.mean_levels:+.3f}, "
                f"mean |diff| {self.mean_abs_levels:.3f} ({verdict}: max <= {self.max_allowed:g}, "
                f"|mean| <= {self.mean_allowed:g})")


def _as_float_tensor(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"output_difference: {name} must be a tensor or array of normalised "
                        f"values, got {type(x).__name__}.")
    return x.detach().to("cpu", torch.float64)


def output_difference(a: Any, b: Any, params: Optional[PipelineParams] = None) -> OutputDifference:
    """Compare two normalised outputs, (3, H, W) or (N, 3, H, W), in grey levels of ``a - b``
    (the difference times ``255 * std`` of its channel)."""
    params = _params(params, "output_difference")
    ta, tb = _as_float_tensor(a, "a"), _as_float_tensor(b, "b")
    if ta.shape != tb.shape:
        raise ValueError(f"output_difference: a has shape {tuple(ta.shape)} but b has "
                         f"{tuple(tb.shape)}; compare outputs of the same pipeline settings.")
    if ta.dim() not in (3, 4) or ta.shape[-3] != 3:
        raise ValueError(f"output_difference: outputs must be (3, H, W) or (N, 3, H, W), got "
                         f"{tuple(ta.shape)}.")
    std = torch.tensor(params.std, dtype=torch.float64).view(3, 1, 1) * 255.0
    d = (ta - tb) * std
    if d.numel() == 0:
        return OutputDifference(0.0, 0.0, 0.0)
    return OutputDifference(max_abs_levels=float(d.abs().max()), mean_levels=float(d.mean()),
                            mean_abs_levels=float(d.abs().mean()))


def _normalize_constants(params: PipelineParams, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(shift, scale), each (3, 1, 1) float32 on ``device``; made once per device and params."""
    return constants_on(device, ("normalize", tuple(params.mean), tuple(params.std)),
                        lambda: torch_scale_shift(params.mean, params.std))


def normalize_batch(batch: torch.Tensor, params: Optional[PipelineParams] = None) -> torch.Tensor:
    """(N, 3, H, W) uint8 batch -> float32 ``(x / 255 - mean) / std``, on the batch's device: the
    last stage of "uint8 until the GPU". The constants are cached per device, so a call never
    waits for the device."""
    params = _params(params, "normalize_batch")
    if not isinstance(batch, torch.Tensor) or batch.dim() != 4 or batch.shape[1] != 3:
        raise TypeError(f"normalize_batch: batch must be an (N, 3, H, W) tensor, got "
                        f"{getattr(batch, 'shape', type(batch).__name__)}.")
    shift, scale = _normalize_constants(params, batch.device)
    return batch.to(torch.float32).sub_(shift).mul_(scale)


class PerProcessRandom:
    """Base for picklable transforms that draw random numbers in DataLoader workers.

    The NumPy generator is made lazily in each process and never pickled, so every worker gets
    its own stream: seeded from ``torch.initial_seed()`` (different per worker and epoch) when
    ``seed`` is None, else from ``s`` in the main process and ``(s, worker seed)`` in a worker.
    """

    def __init__(self, seed: Optional[int], *, owner: str = "transform") -> None:
        self.seed = check_int("seed", seed, 0, owner, allow_none=True)
        self._pid: Optional[int] = None
        self._rng: Optional[np.random.Generator] = None

    def _generator(self) -> np.random.Generator:
        pid = os.getpid()
        if self._rng is None or self._pid != pid:
            info = torch.utils.data.get_worker_info()
            if self.seed is None:
                entropy: list[int] = [torch.initial_seed()]
            elif info is None:
                entropy = [self.seed]
            else:
                entropy = [self.seed, int(info.seed) % 2**63]
            self._rng = np.random.default_rng(entropy)
            self._pid = pid
        return self._rng

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_rng": None, "_pid": None}


class ReferenceTransform(PerProcessRandom):
    """The reference pipeline as a picklable DataLoader transform: decoded image -> (3, crop,
    crop) float32, with a per-process random flip (:class:`PerProcessRandom`)."""

    normalize = True

    def __init__(self, backend: str = "opencv", params: Optional[PipelineParams] = None,
                 seed: Optional[int] = None) -> None:
        where = type(self).__name__
        super().__init__(seed, owner=where)
        self.backend = _backend(backend, where)
        self.params = _params(params, where)

    def draw_flip(self) -> bool:
        """The next random flip decision of this process (no draw when flip_p is 0 or 1)."""
        p = self.params.flip_p
        return p >= 1.0 or (p > 0.0 and bool(self._generator().random() < p))

    def apply(self, image: np.ndarray, flip: bool) -> torch.Tensor:
        """Run the pipeline with the flip decision ``flip``."""
        return run_pipeline(self.backend, image, flip, self.params, normalize=self.normalize)

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        return self.apply(image, self.draw_flip())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(backend={self.backend!r}, params={self.params!r}, seed={self.seed!r})"


class Uint8Transform(ReferenceTransform):
    """The pipeline without normalising: decoded image -> (3, crop, crop) **uint8** tensor, one
    byte per value across to the main process; :func:`normalize_batch` converts the batch."""

    normalize = False


class ToFloat32:
    """Per-sample ``x.float() / 255`` on a uint8 tensor (what ``ToTensor()`` does first), to
    measure what converting to float in the worker costs."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"ToFloat32: x must be a torch.Tensor, got {type(x).__name__}.")
        return x.to(torch.float32).div_(255.0)

    def __repr__(self) -> str:
        return "ToFloat32()"
