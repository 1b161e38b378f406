"""Lesson 02's workload and worker start, kept in the package because exercise 02's grader
(:mod:`course_utils.graders.ex02_worker_init`) runs them in its workers too: an OpenCV-heavy
augmentation (:class:`OpenCVHeavyTransform`, picklable under every start method) and the
``forkserver`` context whose server preloads torch and OpenCV (:func:`forkserver_context`).
The notebook (notebooks/02_threads.ipynb) imports both and writes its grid loop and plot itself.

Why forkserver for lesson 02's grid: a forked worker inherits the parent's thread pools'
*bookkeeping* but not their threads (``cv2.getNumThreads()`` reads the parent's count while
OpenCV runs on one thread), and torch's OpenMP pool cannot grow past one thread there without
hanging. ``forkserver`` (and ``spawn``) workers start from a clean process whose pools really
have the threads they report. Nothing happens at import time.
"""
from __future__ import annotations

import multiprocessing
import numbers
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import torch

from ..checks import check_int


__all__ = ["FORKSERVER_PRELOAD", "OpenCVHeavyTransform", "forkserver_context"]


#: Modules the fork server imports once, so forkserver workers start fast.
FORKSERVER_PRELOAD = ("numpy", "cv2", "torch", "course_utils.threads", "course_utils.data",
                      "course_utils.lessons.l02_workload")


@dataclass(frozen=True)
class OpenCVHeavyTransform:
    """An augmentation chain that spends its time in OpenCV's thread pool.

    On a decoded (H, W, 3) uint8 image: ``cv2.resize`` to ``work_side`` x ``work_side``
    (bicubic), ``cv2.GaussianBlur`` (``blur_ksize``), a rotation by ``angle`` degrees
    (``cv2.warpAffine``), RGB -> HSV -> RGB (``cv2.cvtColor``, a colour-jitter stand-in), then
    ``cv2.resize`` down to ``size`` x ``size`` (area). Returns a (3, size, size) uint8 tensor.
    Every step can run on OpenCV's pool, which is why OpenCV's threads per worker matter.
    """

    size: int = 224
    work_side: int = 512
    blur_ksize: int = 9
    angle: float = 10.0

    def __post_init__(self) -> None:
        where = "OpenCVHeavyTransform"
        object.__setattr__(self, "size", check_int("size", self.size, 8, where))
        object.__setattr__(self, "work_side",
                           check_int("work_side", self.work_side, 16, where))
        k = check_int("blur_ksize", self.blur_ksize, 1, where)
        if k % 2 == 0:
            raise ValueError(f"{where}: blur_ksize must be odd (a Gaussian kernel has a centre "
                             f"pixel), got {k}; use e.g. 9.")
        if isinstance(self.angle, bool) or not isinstance(self.angle, numbers.Real):
            raise TypeError(f"{where}: angle must be a number of degrees, got {self.angle!r}.")

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 \
                or image.dtype != np.uint8:
            raise ValueError(f"OpenCVHeavyTransform: image must be an (H, W, 3) uint8 array, got "
                             f"{getattr(image, 'shape', None)} {getattr(image, 'dtype', type(image))}.")
        s = self.work_side
        x = cv2.resize(image, (s, s), interpolation=cv2.INTER_CUBIC)
        x = cv2.GaussianBlur(x, (self.blur_ksize, self.blur_ksize), 0)
        rotation = cv2.getRotationMatrix2D((s / 2, s / 2), float(self.angle), 1.0)
        x = cv2.warpAffine(x, rotation, (s, s), flags=cv2.INTER_LINEAR,
                           borderMode=cv2.BORDER_REFLECT)
        x = cv2.cvtColor(cv2.cvtColor(x, cv2.COLOR_RGB2HSV), cv2.COLOR_HSV2RGB)
        x = cv2.resize(x, (self.size, self.size), interpolation=cv2.INTER_AREA)
        return torch.from_numpy(x).permute(2, 0, 1).contiguous()


def forkserver_context(preload: bool = True) -> Any:
    """The ``forkserver`` multiprocessing context, with torch and OpenCV preloaded in the server.

    With ``preload`` the fork server imports :data:`FORKSERVER_PRELOAD` once (it never runs a
    parallel region, so its children start clean pools), and each worker starts in about a
    tenth of a second instead of importing torch again. The preload applies only if this
    process's fork server has not started yet. Raises ValueError where forkserver does not
    exist (Windows): use ``'spawn'`` there.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        raise ValueError("forkserver is not available on this platform "
                         f"(start methods: {multiprocessing.get_all_start_methods()}); use "
                         f"multiprocessing_context='spawn' instead.")
    ctx = multiprocessing.get_context("forkserver")
    if preload:
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx
