"""Lesson 02's workload and worker start, which exercise 02's grader runs in its workers too:
:class:`OpenCVHeavyTransform` (picklable under every start method) and :func:`forkserver_context`,
whose server preloads torch and OpenCV. Forkserver, because a forked worker copies its parent's
pools' bookkeeping but not their threads (and torch's OpenMP pool cannot grow there without
hanging), while forkserver workers report the threads they run."""
from __future__ import annotations

import multiprocessing
import numbers
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import torch

from ..checks import check_int
from ..image_ops import check_hwc

__all__ = ["FORKSERVER_PRELOAD", "OpenCVHeavyTransform", "forkserver_context"]

#: Modules the fork server imports once, so forkserver workers start fast.
FORKSERVER_PRELOAD = ("numpy", "cv2", "torch", "course_utils.threads", "course_utils.data",
                      "course_utils.lessons.l02_threads")


@dataclass(frozen=True)
class OpenCVHeavyTransform:
    """An augmentation that spends its time in OpenCV's thread pool, on an (H, W, 3) uint8 image:
    bicubic resize to ``work_side`` squared, ``GaussianBlur`` (``blur_ksize``), a rotation by
    ``angle`` degrees (``warpAffine``), RGB -> HSV -> RGB, area resize to ``size`` squared; a
    (3, size, size) uint8 tensor."""

    size: int = 224
    work_side: int = 512
    blur_ksize: int = 9
    angle: float = 10.0

    def __post_init__(self) -> None:
        where = "OpenCVHeavyTransform"
        object.__setattr__(self, "size", check_int("size", self.size, 8, where))
        object.__setattr__(self, "work_side", check_int("work_side", self.work_side, 16, where))
        if check_int("blur_ksize", self.blur_ksize, 1, where) % 2 == 0:
            raise ValueError(f"{where}: blur_ksize must be odd (a Gaussian kernel has a centre "
                             f"pixel), got {self.blur_ksize}; use e.g. 9.")
        if isinstance(self.angle, bool) or not isinstance(self.angle, numbers.Real):
            raise TypeError(f"{where}: angle must be a number of degrees, got {self.angle!r}.")

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        s = self.work_side
        x = cv2.resize(check_hwc(image, "OpenCVHeavyTransform", uint8_only=True), (s, s),
                       interpolation=cv2.INTER_CUBIC)
        x = cv2.GaussianBlur(x, (self.blur_ksize, self.blur_ksize), 0)
        rotation = cv2.getRotationMatrix2D((s / 2, s / 2), float(self.angle), 1.0)
        x = cv2.warpAffine(x, rotation, (s, s), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
        x = cv2.cvtColor(cv2.cvtColor(x, cv2.COLOR_RGB2HSV), cv2.COLOR_HSV2RGB)
        x = cv2.resize(x, (self.size, self.size), interpolation=cv2.INTER_AREA)
        return torch.from_numpy(x).permute(2, 0, 1).contiguous()


def forkserver_context(preload: bool = True) -> Any:
    """The ``forkserver`` multiprocessing context; with ``preload`` its server imports
    :data:`FORKSERVER_PRELOAD` once (if it has not started yet), so each worker starts in about a
    tenth of a second instead of importing torch again. ValueError where forkserver does not exist
    (Windows: use ``'spawn'``)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        raise ValueError(f"forkserver is not available on this platform (start methods: "
                         f"{multiprocessing.get_all_start_methods()}); use "
                         f"multiprocessing_context='spawn' instead.")
    ctx = multiprocessing.get_context("forkserver")
    if preload:
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx
