"""Lesson 02's workload and worker start, kept in the package because exercise 02's grader
(:mod:`course_utils.grading.ex02_worker_init`) runs them in its workers too: an OpenCV-heavy
augmentation (:class:`OpenCVHeavyTransform`, picklable under every start method) and the
``forkserver`` context whose server preloads torch and OpenCV (:func:`forkserver_context`).
The notebook (notebooks/02_threads.ipynb) imports both and writes its grid loop and plot itself.

Also lesson 02's check of the common recipe's ``os.environ[...] = "1"`` lines where they are
meant to act, in real DataLoader workers under each start method
(:func:`env_after_import_in_workers`), and the verdict computed from those measured pools
(:func:`env_sized_pools`, :func:`env_limit_verdict`): here so that a test runs the same
measurement and holds the verdict to the pools it measured.

Why forkserver for lesson 02's grid: a forked worker inherits the parent's thread pools'
*bookkeeping* but not their threads (``cv2.getNumThreads()`` reads the parent's count while
OpenCV runs on one thread), and torch's OpenMP pool cannot grow past one thread there without
hanging. ``forkserver`` (and ``spawn``) workers start from a clean process whose pools really
have the threads they report. Nothing happens at import time.
"""
from __future__ import annotations

import json
import multiprocessing
import numbers
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import torch

from ..checks import check_int, check_seconds
from ..pipelines import RECIPE_ENV_VARS
from ..threads import THREAD_ENV_VARS, ThreadPools, is_torch_openmp, pools_in_workers, thread_pools


__all__ = ["FORKSERVER_PRELOAD", "OpenCVHeavyTransform", "forkserver_context",
           "RECIPE_ENV_VARS", "ENV_VERDICTS", "env_after_import_in_workers", "env_sized_pools",
           "env_limit_verdict", "ENV_SCRIPT"]


#: Modules the fork server imports once, so forkserver workers start fast.
FORKSERVER_PRELOAD = ("numpy", "cv2", "torch", "course_utils.threads", "course_utils.data",
                      "course_utils.lessons.l02_threads")


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


# ---- the common recipe's os.environ lines, checked in real workers ------------------------
#: What a fresh process runs for :func:`env_after_import_in_workers` with ``fresh_process=True``:
#: a training script's order - imports, the recipe's lines, then the DataLoader (so a fork
#: server starts after the lines). argv[1]: JSON [variables, value, start method, timeout_s].
ENV_SCRIPT = """import json, os, sys
import numpy, cv2, torch
from course_utils.threads import pools_in_workers, thread_pools
variables, value, method, timeout_s = json.loads(sys.argv[1])
for name in variables:                     # the recipe's lines, after the imports
    os.environ[name] = value
parent = thread_pools()
worker = pools_in_workers(num_workers=1, multiprocessing_context=method, timeout_s=timeout_s)[0]
print(json.dumps({"parent": parent.to_dict(), "worker": worker.to_dict()}))
"""

#: The verdicts :func:`env_limit_verdict` gives.
ENV_VERDICTS = ("held", "did not hold", "nothing to limit")


def _check_variables(variables: Any, value: Any) -> tuple[tuple[str, ...], str]:
    if isinstance(variables, str) or not isinstance(variables, Sequence) or not variables \
            or not all(isinstance(v, str) and v and "=" not in v for v in variables):
        raise ValueError(f"variables must be a non-empty sequence of environment variable names "
                         f"(like {RECIPE_ENV_VARS}), got {variables!r}.")
    if not isinstance(value, str) or not value.strip().isdigit():
        raise ValueError(f"value must be a number of threads as a string (like '1'), got "
                         f"{value!r}.")
    return tuple(variables), value


def env_after_import_in_workers(method: str, *, fresh_process: bool = False,
                                variables: Sequence[str] = RECIPE_ENV_VARS, value: str = "1",
                                timeout_s: float = 180) -> tuple[ThreadPools, ThreadPools]:
    """The common recipe's ``os.environ[name] = value`` lines measured where they are meant to
    act: set ``variables`` *after* numpy, OpenCV and torch are imported, start one real
    DataLoader worker with start method ``method``, and read its thread pools.

    Returns (the parent's pools after the lines, the worker's pools), in threads; each
    :class:`~course_utils.threads.ThreadPools` also holds the thread variables that process's
    ``os.environ`` had (``thread_env``: what the worker inherited).

    ``fresh_process=False``: in this process (which imported them already); ``os.environ`` is
    put back afterwards. A ``forkserver`` worker then comes from this process's fork server,
    with the environment the server had when it started - and a server not started yet starts
    now, with the variables, and keeps them. ``fresh_process=True``: in a new Python process
    running :data:`ENV_SCRIPT` (a training script's order, so its fork server starts after the
    lines); it starts with none of :data:`~course_utils.threads.THREAD_ENV_VARS` set.
    ``timeout_s``: seconds the worker (and the fresh process) may take.
    """
    methods = multiprocessing.get_all_start_methods()
    if method not in methods:
        raise ValueError(f"method={method!r} is not a start method on this platform; use one of "
                         f"{methods}.")
    names, value = _check_variables(variables, value)
    timeout_s = check_seconds("timeout_s", timeout_s, "env_after_import_in_workers", positive=True)
    if fresh_process:
        env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV_VARS}
        args = json.dumps([list(names), value, method, timeout_s])
        try:
            run = subprocess.run([sys.executable, "-c", ENV_SCRIPT, args], env=env, text=True,
                                 capture_output=True, timeout=2 * timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"env_after_import_in_workers: the fresh process ({method!r}) did "
                               f"not finish within {2 * timeout_s:g} s.") from exc
        if run.returncode != 0:
            tail = " | ".join(run.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"env_after_import_in_workers: the fresh process ({method!r}) "
                               f"exited with {run.returncode}: {tail}")
        answer = json.loads(run.stdout.strip().splitlines()[-1])
        return ThreadPools.from_dict(answer["parent"]), ThreadPools.from_dict(answer["worker"])
    saved = {k: os.environ.get(k) for k in names}
    try:
        for name in names:
            os.environ[name] = value
        parent = thread_pools()
        worker = pools_in_workers(num_workers=1, multiprocessing_context=method,
                                  timeout_s=timeout_s)[0]
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
    return parent, worker


def env_sized_pools(pools: ThreadPools) -> dict[str, int]:
    """{pool: threads} of the pools that the thread variables size and a DataLoader worker does
    not set itself: every BLAS/OpenMP runtime threadpoolctl sees, except torch's own OpenMP
    runtime (each worker's ``torch.set_num_threads(1)`` sizes that one). OpenCV's pool is not
    here: a pthreads OpenCV (the pip wheels) does not read them
    (:func:`~course_utils.threads.opencv_follows_omp_num_threads`)."""
    if not isinstance(pools, ThreadPools):
        raise TypeError(f"pools must be a ThreadPools (from thread_pools() or "
                        f"env_after_import_in_workers), got {type(pools).__name__}.")
    out: dict[str, int] = {}
    for entry in pools.blas:
        if is_torch_openmp(entry):
            continue
        name = f"{entry.get('internal_api')} ({entry.get('prefix') or entry.get('filepath')})"
        while name in out:
            name += "'"
        out[name] = int(entry.get("num_threads") or 0)
    return out


def _check_counts(name: str, counts: Any) -> dict[str, int]:
    if not isinstance(counts, Mapping):
        raise TypeError(f"{name} must be a mapping {{pool: threads}} (env_sized_pools), got "
                        f"{type(counts).__name__}.")
    for pool, n in counts.items():
        check_int(f"{name}[{pool!r}]", n, 0, "env_limit_verdict")
    return dict(counts)


def env_limit_verdict(worker: Mapping[str, int], parent: Mapping[str, int], limit: int = 1) -> str:
    """Did the thread variables (asking for ``limit`` threads) limit a worker's pools?

    ``worker``, ``parent``: {pool: threads} measured in the worker and in the process that
    started it (:func:`env_sized_pools`; the parent's are the sizes the pools have without the
    limit). "held": every worker pool at most ``limit`` while the parent ran one above it;
    "did not hold": a worker pool above ``limit``; "nothing to limit": no pool above ``limit``
    in either (e.g. one usable CPU). Raises ValueError when ``worker`` has no pool.
    """
    worker = _check_counts("worker", worker)
    parent = _check_counts("parent", parent)
    limit = check_int("limit", limit, 1, "env_limit_verdict")
    if not worker:
        raise ValueError("env_limit_verdict: worker has no pool to judge (no BLAS/OpenMP library "
                         "was loaded there); measure it with env_sized_pools(worker_pools).")
    if any(n > limit for n in worker.values()):
        return "did not hold"
    if any(n > limit for n in parent.values()):
        return "held"
    return "nothing to limit"
