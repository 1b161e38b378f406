"""Tests for what lesson 02 keeps in the package (course_utils.lessons.l02_threads): the
OpenCV-heavy transform and the forkserver context that exercise 02's grader also uses. The grid
loop and its plot live in notebooks/02_threads.ipynb (nbval runs them). Behaviour and structure
only: no timing is asserted. Everything that starts processes has a timeout."""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest
import torch

from course_utils.lessons import l02_threads
from course_utils.lessons.l02_threads import OpenCVHeavyTransform, forkserver_context

HAS_FORKSERVER = "forkserver" in mp.get_all_start_methods()


def _image(h: int = 60, w: int = 80) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)


# ----------------------------------------------------------------------------- workload
def test_heavy_transform_output_and_pickling():
    t = OpenCVHeavyTransform(size=32, work_side=64, blur_ksize=5)
    out = t(_image())
    assert isinstance(out, torch.Tensor) and out.dtype == torch.uint8
    assert tuple(out.shape) == (3, 32, 32) and out.is_contiguous()
    assert pickle.loads(pickle.dumps(t)) == t


@pytest.mark.parametrize("kwargs, error, message", [
    ({"blur_ksize": 8}, ValueError, "blur_ksize must be odd"),
    ({"size": 0}, ValueError, "size must be >= 8"),
    ({"work_side": 2.5}, TypeError, "work_side must be an int"),
    ({"angle": "ten"}, TypeError, "angle must be a number"),
])
def test_heavy_transform_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        OpenCVHeavyTransform(**kwargs)


def test_heavy_transform_rejects_bad_image():
    with pytest.raises(ValueError, match=r"\(H, W, 3\) uint8"):
        OpenCVHeavyTransform()(np.zeros((10, 10), dtype=np.uint8))


# ----------------------------------------------------------------------------- forkserver
@pytest.mark.skipif(not HAS_FORKSERVER, reason="forkserver only")
@pytest.mark.timeout(180)
def test_forkserver_workers_really_have_the_threads_asked():
    """A worker of forkserver_context() asked for k threads reports k in every pool (the
    lesson's grid relies on it; under fork OpenCV would only read k)."""
    from course_utils.threads import make_worker_init, pools_in_workers

    context = forkserver_context()
    assert context.get_start_method() == "forkserver"
    for k in (1, 2):
        pools = pools_in_workers(make_worker_init(k), num_workers=1, multiprocessing_context=context)[0]
        assert pools.total_max == k and pools.torch_intra == k


def test_import_has_no_side_effects():
    """Re-running the module's code changes no pool and no start-method setting."""
    import importlib

    import cv2

    from course_utils.grading import ex02_worker_init

    def preload():
        try:
            import multiprocessing.forkserver as fs
        except ImportError:  # Windows
            return None
        return list(fs._forkserver._preload_modules)

    before = (torch.get_num_threads(), cv2.getNumThreads(), dict(os.environ), preload())
    importlib.reload(l02_threads)
    importlib.reload(ex02_worker_init)
    after = (torch.get_num_threads(), cv2.getNumThreads(), dict(os.environ), preload())
    assert before == after
