"""Thread pools (torch's, OpenCV's, every BLAS/OpenMP runtime threadpoolctl sees), in threads:
look at them (:func:`thread_pools`, :func:`pools_in_workers`), limit them (:class:`limit_threads`)
and limit them inside DataLoader workers (:func:`make_worker_init`; lesson 02 shows it in full).
A worker calls ``torch.set_num_threads(1)``, no more: a fork copies its parent's other pool sizes,
a spawn worker (or forkserver, unless its server loaded them) loads them afresh. Why each limit
is made the way it is: :mod:`course_utils.fork_safety`.
"""
from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import pickle
import random
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import cv2
import numpy as np
import threadpoolctl
import torch
from torch.utils.data import DataLoader, get_worker_info

from .checks import check_int, check_seconds
from .fork_safety import count_os_threads, is_fork_child, refuse_unsafe_fork, watch_forks
from .process_tree import stop_workers
from .start_methods import resolve_context, worker_timeout

__all__ = ["ThreadPools", "thread_pools", "limit_threads", "WorkerThreadLimiter",
           "make_worker_init", "pools_in_workers", "THREAD_ENV_VARS", "is_torch_openmp",
           "opencv_parallel_framework", "opencv_follows_omp_num_threads"]

#: Variables that size the pools of libraries loaded after they are set (never a running pool).
#: A spawn worker gets this process's current ``os.environ``; a forkserver worker its server's.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "OPENCV_FOR_THREADS_NUM")
_HINT = " It is a number of threads: 1 makes every pool sequential."


def _set_opencv_threads(n: int) -> None:
    """Ask OpenCV for ``n`` threads; ``n <= 1`` as 0, "sequential" (1 joins the pool's threads,
    which hangs in a fork), and not at all when it reads 1 already."""
    if not (n <= 1 and int(cv2.getNumThreads()) <= 1):
        cv2.setNumThreads(0 if n <= 1 else int(n))


def opencv_parallel_framework(build_information: str | None = None) -> str | None:
    """The framework OpenCV's pool runs on ("pthreads", "OpenMP", "TBB (ver ...)", ...): the
    "Parallel framework:" line of ``build_information`` (default: ``cv2.getBuildInformation()``);
    None without such a line."""
    for line in (build_information or cv2.getBuildInformation()).splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == "parallel framework":
            return value.strip() or None
    return None


def opencv_follows_omp_num_threads(framework: str | None) -> bool | None:
    """Whether ``OMP_NUM_THREADS`` sizes an OpenCV on ``framework``: True for OpenMP, False for
    pthreads (the pip wheels), TBB, GCD... (sized by ``OPENCV_FOR_THREADS_NUM``); None: unknown."""
    return None if framework is None else framework.strip().lower().startswith("openmp")


def is_torch_openmp(entry: dict) -> bool:
    """True for the OpenMP runtime shipped inside torch (sized by ``torch.set_num_threads``)."""
    path = os.path.realpath(str(entry.get("filepath") or ""))
    torch_dir = os.path.realpath(os.path.dirname(torch.__file__))
    return entry.get("user_api") == "openmp" and path.startswith(torch_dir + os.sep)


@dataclass
class ThreadPools:
    """The thread pools of one process, in threads (a snapshot). ``opencv``: None without
    OpenCV; ``blas``: one dict per library threadpoolctl sees; ``worker_id``: None outside a
    DataLoader worker; ``os_threads``: OS threads (None where unknown); ``thread_env``: the
    :data:`THREAD_ENV_VARS` in the process's ``os.environ`` when read."""

    torch_intra: int
    torch_interop: int
    opencv: int | None
    blas: list[dict] = field(default_factory=list)
    pid: int = 0
    worker_id: int | None = None
    os_threads: int | None = None
    thread_env: dict[str, str] = field(default_factory=dict)

    @property
    def pools(self) -> dict[str, int]:
        """Threads of every pool a data-loading call can fan out to, by a readable name (not the
        inter-op pool: data loading does not use it)."""
        out: dict[str, int] = {"torch intra-op": int(self.torch_intra)}
        if self.opencv is not None:
            out["OpenCV"] = int(self.opencv)
        for entry in self.blas:
            prefix = entry.get("prefix") or os.path.basename(str(entry.get("filepath") or "?"))
            name = f"{entry.get('internal_api')} ({prefix}{', torch' if is_torch_openmp(entry) else ''})"
            while name in out:
                name += "'"
            out[name] = int(entry.get("num_threads") or 0)
        return out

    @property
    def total_max(self) -> int:
        """The most threads any one pool may run (1: everything limited)."""
        return max(self.pools.values())

    def limited_to(self, n: int) -> bool:
        return self.total_max <= n

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ThreadPools":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**{**known, "blas": [dict(e) for e in known.get("blas", [])],
                      "thread_env": dict(known.get("thread_env") or {})})

    def __str__(self) -> str:
        pools = ", ".join(f"{name} {n}" for name, n in self.pools.items())
        where = f"pid {self.pid}" + (f", worker {self.worker_id}" if self.worker_id is not None else "")
        return f"[{where}] {pools}; torch inter-op {self.torch_interop}"


def thread_pools() -> ThreadPools:
    """This process's (or DataLoader worker's) thread pools; changes nothing."""
    watch_forks()
    info = get_worker_info()
    keys = ("user_api", "internal_api", "num_threads", "filepath", "prefix", "version")
    return ThreadPools(torch_intra=int(torch.get_num_threads()),
                       torch_interop=int(torch.get_num_interop_threads()), opencv=int(cv2.getNumThreads()),
                       blas=[{k: lib.get(k) for k in keys} for lib in threadpoolctl.threadpool_info()],
                       pid=os.getpid(), worker_id=None if info is None else int(info.id),
                       os_threads=count_os_threads(),
                       thread_env={k: os.environ[k] for k in THREAD_ENV_VARS if k in os.environ})


class limit_threads(contextlib.ContextDecorator):
    """Limit torch intra-op, every BLAS/OpenMP pool (threadpoolctl) and OpenCV to ``n`` threads,
    as a context manager or a decorator (``with limit_threads(1): ...``, ``@limit_threads(2)``);
    the previous sizes come back on exit. Nothing happens at construction. In a fork of a parent
    with running pools, ``n > 1`` is refused (:mod:`course_utils.fork_safety`)."""

    def __init__(self, n: int = 1) -> None:
        self.n = check_int("n", n, 1, hint=_HINT)
        self._saved: tuple | None = None

    def _recreate_cm(self) -> "limit_threads":
        # a fresh object per decorated call, so recursion and threads do not share state
        return type(self)(self.n)

    def __enter__(self) -> "limit_threads":
        if self._saved is not None:
            raise RuntimeError("this limit_threads object is already active; create a new one for "
                               "each with-block (e.g. `with limit_threads(1):`).")
        watch_forks()
        refuse_unsafe_fork(self.n, f"limit_threads({self.n})")
        saved = (torch.get_num_threads(), int(cv2.getNumThreads()))
        _set_opencv_threads(self.n)  # first, as in WorkerThreadLimiter (before BLAS threads)
        self._saved = (*saved, threadpoolctl.threadpool_limits(limits=self.n))
        torch.set_num_threads(self.n)
        return self

    def __exit__(self, *exc: object) -> bool:
        if self._saved is not None:
            saved_torch, saved_opencv, blas = self._saved
            self._saved = None
            # threadpoolctl first (it also resets torch's OpenMP runtime), then torch's own
            blas.restore_original_limits()
            torch.set_num_threads(saved_torch)
            _set_opencv_threads(saved_opencv)
        return False


_worker_limits: list = []   # a worker's threadpoolctl limits, kept (never restored by the GC)

#: Seconds :class:`WorkerThreadLimiter` may take in a forked worker before its watchdog prints
#: the worker's stacks and ends it (normally well under a second).
WORKER_INIT_WATCHDOG_S = 120.0


@contextlib.contextmanager
def _init_watchdog(enabled: bool):
    """Print every stack and end the process if the block takes WORKER_INIT_WATCHDOG_S."""
    armed = False
    if enabled:
        with contextlib.suppress(Exception):  # no usable stderr: no watchdog
            faulthandler.dump_traceback_later(WORKER_INIT_WATCHDOG_S, exit=True, file=sys.__stderr__)
            armed = True
    try:
        yield
    finally:
        if armed:
            faulthandler.cancel_dump_traceback_later()


class WorkerThreadLimiter:
    """A picklable DataLoader ``worker_init_fn`` limiting every pool in the worker to
    ``n_threads`` for its life. ``set_env``: also set :data:`THREAD_ENV_VARS`, for processes the
    worker starts; ``seed``: seed ``random`` and NumPy with ``seed + worker_id``."""

    def __init__(self, n_threads: int = 1, seed: int | None = None, *, set_env: bool = True) -> None:
        self.n_threads = check_int("n_threads", n_threads, 1, hint=_HINT)
        self.seed = check_int("seed", seed, 0, "WorkerThreadLimiter", allow_none=True,
                              hint=" Each worker is seeded with seed + worker_id.")
        self.set_env = bool(set_env)
        watch_forks()

    def __call__(self, worker_id: int) -> None:
        """Limit this worker's pools; in a worker forked from a busy parent (one once hung here
        for good) in this order, each step measured: ``gc.freeze()`` (no finalizer of inherited
        garbage runs), no import the parent had not made, OpenCV while the worker has one thread
        (``setNumThreads(0)``: two stores once :func:`~course_utils.fork_safety.prepare_opencv_for_fork`
        ran in the parent), then threadpoolctl and torch; a ``faulthandler`` watchdog ends a worker
        stuck for :data:`WORKER_INIT_WATCHDOG_S`, so the DataLoader reports a dead worker."""
        n = self.n_threads
        refuse_unsafe_fork(n, f"make_worker_init(n_threads={n})")
        forked = is_fork_child()
        with _init_watchdog(forked):
            if forked:
                gc.freeze()
            if self.set_env:
                os.environ.update({var: str(n) for var in THREAD_ENV_VARS})
            _set_opencv_threads(n)
            _worker_limits.append(threadpoolctl.threadpool_limits(limits=n))
            torch.set_num_threads(n)
        if self.seed is not None:
            random.seed(self.seed + worker_id)
            np.random.seed((self.seed + worker_id) % 2**32)

    def __repr__(self) -> str:
        return f"WorkerThreadLimiter(n_threads={self.n_threads}, seed={self.seed})"


def make_worker_init(n_threads: int = 1, seed: int | None = None, *, set_env: bool = True) -> WorkerThreadLimiter:
    """A :class:`WorkerThreadLimiter`: the worker_init_fn lesson 02 writes in full."""
    return WorkerThreadLimiter(n_threads, seed, set_env=set_env)


class _PoolProbe(list):
    """A dataset whose every item is the fetching worker's :class:`ThreadPools` as a dict."""

    def __getitem__(self, index: int) -> dict:
        return thread_pools().to_dict()


def _check_sendable(worker_init_fn: Callable, method: str) -> None:
    """Under spawn/forkserver the worker_init_fn is pickled: fail early and clearly."""
    module_name = getattr(worker_init_fn, "__module__", None) or type(worker_init_fn).__module__
    if module_name == "__main__" and not getattr(sys.modules.get("__main__"), "__file__", None):
        raise TypeError(f"worker_init_fn={worker_init_fn!r} is defined in the notebook "
                        f"(__main__); workers started with {method!r} cannot import it. Put it in "
                        f"an importable module (like course_utils.make_worker_init) or use "
                        f"multiprocessing_context='fork' where available.")
    try:
        pickle.dumps(worker_init_fn)
    except Exception as exc:
        raise TypeError(f"worker_init_fn={worker_init_fn!r} cannot be pickled ({exc}), so workers "
                        f"started with {method!r} cannot receive it. Use a class with __call__ "
                        f"defined in an importable module (like course_utils.make_worker_init), "
                        f"not a lambda or closure.") from exc


def pools_in_workers(worker_init_fn: Callable[[int], None] | None = None, num_workers: int = 2,
                     multiprocessing_context: Any = None,
                     timeout_s: float = 60) -> list[ThreadPools]:
    """The thread pools each worker of a real DataLoader sees, by worker id (workers run as in
    training: ``torch.set_num_threads(1)``, then ``worker_init_fn``). A worker that does not
    answer within ``timeout_s`` seconds raises RuntimeError (fork only: :func:`worker_timeout`)."""
    num_workers = check_int("num_workers", num_workers, 1, "pools_in_workers",
                            " With num_workers=0 there are no workers: call thread_pools() instead.")
    timeout_s = check_seconds("timeout_s", timeout_s, "pools_in_workers", positive=True)
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise TypeError(f"worker_init_fn must be None or a callable taking worker_id, got "
                        f"{worker_init_fn!r}.")
    context, method = resolve_context(multiprocessing_context)
    if worker_init_fn is not None and method != "fork":
        _check_sendable(worker_init_fn, method)
    watch_forks()
    loader = DataLoader(_PoolProbe(range(num_workers)), batch_size=None, num_workers=num_workers,
                        worker_init_fn=worker_init_fn, multiprocessing_context=context,
                        timeout=worker_timeout(timeout_s, context))
    iterator = iter(loader)
    try:   # the DataLoader hands index i to worker i % num_workers: one item per worker
        answers = [ThreadPools.from_dict(item) for item in iterator]
    except RuntimeError as exc:
        why = ("did not answer within timeout_s={timeout_s} s: stuck in worker_init_fn (a pool "
               "resized in a forked worker can hang) or still starting. Try multiprocessing_context="
               "'forkserver' or 'spawn', a simpler worker_init_fn or a larger timeout_s" if "timed out"
               in str(exc) else "died: under 'spawn'/'forkserver' it could not import or unpickle the "
               "dataset or worker_init_fn (its error is printed above)" if "exited unexpectedly"
               in str(exc) else None)
        if why is None:
            raise
        raise RuntimeError(f"pools_in_workers: a DataLoader worker (start method {method!r}) "
                           f"{why.format(timeout_s=timeout_s)}. Original error: {exc}") from exc
    finally:
        stop_workers(iterator)
    answers.sort(key=lambda p: -1 if p.worker_id is None else p.worker_id)
    seen = sorted(p.worker_id for p in answers if p.worker_id is not None)
    if seen != list(range(num_workers)):
        raise RuntimeError(f"pools_in_workers: expected one answer from each of workers "
                           f"0..{num_workers - 1}, got worker ids {seen}.")
    return answers
