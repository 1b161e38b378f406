"""Lesson 02's harness: what stays in the package (course_utils.lessons.l02_threads, the
OpenCV-heavy transform and the forkserver context exercise 02's grader also uses) and the
notebook's environment-lines check (``lesson02_env``, ``lesson02_verdicts``: its %%writefile
modules), in real workers. No timing is asserted; everything that starts processes has a timeout."""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest
import torch

from _helpers import needs_its_own_process
from course_authoring.notebook_modules import notebook_module
from course_utils.lessons import l02_threads
from course_utils.pipelines import RECIPE_ENV_VARS
from course_utils.threads import ThreadPools
from course_utils.lessons.l02_threads import OpenCVHeavyTransform, forkserver_context

HAS_FORKSERVER = "forkserver" in mp.get_all_start_methods()


def _image(h: int = 60, w: int = 80) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)


# ----------------------------------------------------------------------------- workload
def test_heavy_transform_output_and_pickling():
    # through the module: the import test below reloads it (a class object of before would not
    # pickle when the suite runs twice in one process, as make mutation runs it)
    t = l02_threads.OpenCVHeavyTransform(size=32, work_side=64, blur_ksize=5)
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
    with pytest.raises(ValueError, match=r"OpenCVHeavyTransform: image must have shape \(H, W, 3\)"):
        OpenCVHeavyTransform()(np.zeros((10, 10), dtype=np.uint8))


# ----------------------------------------------------------------------------- forkserver
@pytest.mark.skipif(not HAS_FORKSERVER, reason="forkserver only")
@pytest.mark.timeout(180)
def test_forkserver_workers_really_have_the_threads_asked():
    """A worker of forkserver_context() asked for k threads reports k in every pool (the
    lesson's grid relies on it; under fork OpenCV would only read k)."""
    needs_its_own_process()
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


# ----------------------------------------------------------------------------- the recipe's env lines
@pytest.fixture(scope="module")
def verdicts():
    return notebook_module("02_threads.ipynb", "lesson02_verdicts")


def _pools(openblas: int = 2, torch_omp: int = 2, opencv: int = 2) -> ThreadPools:
    gomp = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    return ThreadPools(torch_intra=1, torch_interop=1, opencv=opencv, pid=1, blas=[
        {"user_api": "blas", "internal_api": "openblas", "num_threads": openblas,
         "filepath": "/x/numpy.libs/libscipy_openblas64_.so", "prefix": "libscipy_openblas"},
        {"user_api": "openmp", "internal_api": "openmp", "num_threads": torch_omp,
         "filepath": gomp, "prefix": "libgomp"}])


@pytest.mark.parametrize("worker, parent, limit, expected", [
    ({"a": 1, "b": 1}, {"a": 2, "b": 1}, 1, "held"),            # every pool at the limit
    ({"a": 1, "b": 2}, {"a": 2, "b": 2}, 1, "did not hold"),    # one pool just above it
    ({"a": 2}, {"a": 2}, 1, "did not hold"),                    # fork: the parent's pool, as is
    ({"a": 1}, {"a": 1}, 1, "nothing to limit"),                # one CPU: nothing was above 1
    ({"a": 2}, {"a": 4}, 2, "held"),                            # just inside a limit of 2
    ({"a": 3}, {"a": 4}, 2, "did not hold"),                    # just outside it
    ({"a": 2}, {"a": 2}, 2, "nothing to limit"),
])
def test_env_limit_verdict_follows_the_measured_pools(verdicts, worker, parent, limit, expected):
    assert verdicts.env_limit_verdict(worker, parent, limit) == expected


def test_env_sized_pools_leaves_out_torchs_openmp_and_opencv(verdicts):
    assert verdicts.env_sized_pools(_pools(openblas=3, torch_omp=5, opencv=7)) == {
        "openblas (libscipy_openblas)": 3}
    parent = verdicts.env_sized_pools(_pools(openblas=2))        # the pools decide, not the method
    assert verdicts.env_limit_verdict(verdicts.env_sized_pools(_pools(1, 1)), parent) == "held"
    assert verdicts.env_limit_verdict(verdicts.env_sized_pools(_pools(2, 1)), parent) == "did not hold"


@pytest.mark.timeout(120)
@pytest.mark.skipif(not {"fork", "spawn"} <= set(mp.get_all_start_methods()), reason="needs fork and spawn")
def test_variables_set_after_import_reach_spawn_workers_pools_but_not_forked_ones(verdicts):
    """This process has imported numpy, OpenCV and torch; the recipe's lines come after."""
    env = notebook_module("02_threads.ipynb", "lesson02_env")
    here = {k: os.environ.get(k) for k in RECIPE_ENV_VARS}
    results = {m: env.env_after_import_in_workers(m, variables=RECIPE_ENV_VARS, timeout_s=90)
               for m in ("fork", "spawn")}
    assert {k: os.environ.get(k) for k in RECIPE_ENV_VARS} == here, "os.environ was not put back"
    for method, (parent, worker) in results.items():
        # both workers got this process's current os.environ ...
        assert all(worker.thread_env.get(k) == "1" for k in RECIPE_ENV_VARS), (method, worker.thread_env)
        assert worker.worker_id == 0 and worker.pid != os.getpid()
    sized = {m: [verdicts.env_sized_pools(p) for p in pair] for m, pair in results.items()}
    above = any(n > 1 for n in sized["fork"][0].values())
    fork = verdicts.env_limit_verdict(sized["fork"][1], sized["fork"][0])
    spawn = verdicts.env_limit_verdict(sized["spawn"][1], sized["spawn"][0])
    # ... but only the spawned one loaded its libraries after them
    assert spawn == ("held" if above else "nothing to limit")
    assert fork == ("did not hold" if above else "nothing to limit")
