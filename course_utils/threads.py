"""Thread pools (torch's, OpenCV's, every BLAS/OpenMP runtime threadpoolctl sees): look at
them, limit them, and limit them inside DataLoader workers (lesson 02 shows it in full).

Every DataLoader worker calls ``torch.set_num_threads(1)``; the other pools keep the size the
worker starts with (a fork copies the parent's settings; a spawn worker, or a forkserver worker's
server, loads the libraries afresh, sized by their defaults or the thread variables in its
environment).
:func:`thread_pools` and :func:`pools_in_workers` show that; :class:`limit_threads` and
:func:`make_worker_init` fix it. Why a limit is done the way it is (OpenCV asked for 0 threads,
more than one refused in a fork of a busy parent): :mod:`course_utils.fork_safety`.
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

import numpy as np
import threadpoolctl
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from .checks import check_int, check_seconds
from .fork_safety import count_os_threads, is_fork_child, refuse_unsafe_fork, watch_forks
from .process_tree import stop_workers
from .start_methods import resolve_context

__all__ = ["ThreadPools", "thread_pools", "limit_threads", "WorkerThreadLimiter",
           "make_worker_init", "pools_in_workers", "THREAD_ENV_VARS", "is_torch_openmp",
           "opencv_parallel_framework", "opencv_follows_omp_num_threads"]

#: Environment variables that size thread pools of libraries loaded *after* they are set
#: (child processes, or libraries not yet imported). Setting them in a running process does
#: not resize pools that are already loaded. A child process sees them if they are in its
#: environment when it starts: a spawn worker gets this process's current ``os.environ``, a
#: forkserver worker the environment its server had when the server started.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "OPENCV_FOR_THREADS_NUM")

_BLAS_KEYS = ("user_api", "internal_api", "num_threads", "filepath", "prefix", "version")

# ---- small helpers -------------------------------------------------------------------
def _check_threads(n: Any, name: str) -> int:
    return check_int(name, n, 1, hint=f" It is a number of threads: {name}=1 makes every pool "
                                      f"sequential.")


def _cv2():
    try:
        import cv2  # lazy: OpenCV is imported only where asked (see _set_opencv_threads)
    except ImportError:
        return None
    return cv2


def _get_opencv_threads() -> int | None:
    cv2 = _cv2()
    return None if cv2 is None else int(cv2.getNumThreads())


def _set_opencv_threads(n: int, *, import_if_missing: bool = True) -> None:
    """Ask OpenCV for ``n`` threads; ``n <= 1`` is sent as 0 ("sequential": 1 joins the pool's
    threads, which hangs in a fork, see :mod:`course_utils.fork_safety`), and not at all when
    OpenCV reads 1 already. ``import_if_missing=False``: an OpenCV not imported yet is left to
    ``OPENCV_FOR_THREADS_NUM``."""
    cv2 = _cv2() if import_if_missing else sys.modules.get("cv2")
    if cv2 is None:
        return
    if n <= 1 and int(cv2.getNumThreads()) <= 1:
        return  # already sequential (numThreads 0 or 1): nothing to change
    cv2.setNumThreads(0 if n <= 1 else int(n))


def opencv_parallel_framework(build_information: str | None = None) -> str | None:
    """The framework OpenCV's thread pool runs on, as OpenCV names it ("pthreads", "OpenMP",
    "TBB (ver ...)", "GCD", ...): the "Parallel framework:" line of ``cv2.getBuildInformation()``
    (or of ``build_information``, that text). None when OpenCV is not installed or the text has
    no such line. Imports OpenCV when ``build_information`` is None."""
    if build_information is None:
        cv2 = _cv2()
        if cv2 is None:
            return None
        build_information = cv2.getBuildInformation()
    if not isinstance(build_information, str):
        raise TypeError(f"build_information must be the text of cv2.getBuildInformation() or "
                        f"None, got {type(build_information).__name__}.")
    for line in build_information.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == "parallel framework":
            return value.strip() or None
    return None


def opencv_follows_omp_num_threads(framework: str | None) -> bool | None:
    """Whether an OpenCV whose pool runs on ``framework`` (:func:`opencv_parallel_framework`)
    is sized by ``OMP_NUM_THREADS``: True for an OpenMP build (the OpenMP runtime reads it when
    it starts), False for pthreads (the pip wheels), TBB, GCD or Concurrency builds, which
    ignore it (``OPENCV_FOR_THREADS_NUM`` and ``cv2.setNumThreads`` size those); None when
    ``framework`` is None (unknown)."""
    if framework is None:
        return None
    if not isinstance(framework, str):
        raise TypeError(f"framework must be a name like 'pthreads' or 'OpenMP' (or None), got "
                        f"{framework!r}.")
    return framework.strip().lower().startswith("openmp")


def is_torch_openmp(entry: dict) -> bool:
    """True for the OpenMP runtime shipped inside torch (sized by ``torch.set_num_threads``)."""
    path = os.path.realpath(str(entry.get("filepath") or ""))
    torch_dir = os.path.realpath(os.path.dirname(torch.__file__))
    return entry.get("user_api") == "openmp" and path.startswith(torch_dir + os.sep)


# ---- inventory -----------------------------------------------------------------------
@dataclass
class ThreadPools:
    """The thread pools of one process, in threads (a snapshot; nothing is changed).

    opencv: None when OpenCV is not installed; blas: one dict per library
    ``threadpoolctl.threadpool_info()`` sees; worker_id: None outside a DataLoader worker;
    os_threads: OS threads of the process (None where unknown); thread_env: the
    :data:`THREAD_ENV_VARS` set in the process's ``os.environ`` when it was read (what a worker
    inherited shows here).
    """

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
        """Thread count of every pool a data-loading call can fan out to, by a readable name
        (not the inter-op pool: data loading does not use it)."""
        out: dict[str, int] = {"torch intra-op": int(self.torch_intra)}
        if self.opencv is not None:
            out["OpenCV"] = int(self.opencv)
        for entry in self.blas:
            prefix = entry.get("prefix") or os.path.basename(str(entry.get("filepath") or "?"))
            owner = ", torch" if is_torch_openmp(entry) else ""
            name = f"{entry.get('internal_api')} ({prefix}{owner})"
            while name in out:
                name += "'"
            out[name] = int(entry.get("num_threads") or 0)
        return out

    @property
    def total_max(self) -> int:
        """The most threads any one pool in this process may run (1 = everything limited)."""
        return max(self.pools.values())

    def limited_to(self, n: int) -> bool:
        """True when every pool in :attr:`pools` uses at most ``n`` threads."""
        return self.total_max <= n

    def to_dict(self) -> dict:
        """Plain dict (JSON-serialisable), the inverse of :meth:`from_dict`."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ThreadPools":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["blas"] = [dict(e) for e in known.get("blas", [])]
        known["thread_env"] = dict(known.get("thread_env") or {})
        return cls(**known)

    def __str__(self) -> str:
        pools = ", ".join(f"{name} {n}" for name, n in self.pools.items())
        where = f"pid {self.pid}" + (f", worker {self.worker_id}" if self.worker_id is not None else "")
        return f"[{where}] {pools}; torch inter-op {self.torch_interop}"


def thread_pools() -> ThreadPools:
    """Inventory of this process's (or this DataLoader worker's) thread pools. Changes nothing."""
    watch_forks()
    opencv = _get_opencv_threads()  # imports cv2 first, so threadpoolctl also sees its BLAS
    info = get_worker_info()
    return ThreadPools(torch_intra=int(torch.get_num_threads()),
                       torch_interop=int(torch.get_num_interop_threads()), opencv=opencv,
                       blas=[{k: info.get(k) for k in _BLAS_KEYS}
                             for info in threadpoolctl.threadpool_info()], pid=os.getpid(),
                       worker_id=None if info is None else int(info.id),
                       os_threads=count_os_threads(),
                       thread_env={k: os.environ[k] for k in THREAD_ENV_VARS if k in os.environ})


# ---- limiting in this process --------------------------------------------------------
class limit_threads(contextlib.ContextDecorator):
    """Limit torch intra-op, every BLAS/OpenMP pool (threadpoolctl) and OpenCV to ``n`` threads.

    Use as a context manager or a decorator; the previous sizes are restored on exit::

        with limit_threads(1):
            ...

        @limit_threads(2)
        def preprocess(...): ...

    Nothing happens at construction (decorating at import time changes no pool). In a fork
    of a parent with running pools, ``n > 1`` is refused (:mod:`course_utils.fork_safety`).
    """

    def __init__(self, n: int = 1) -> None:
        self.n = _check_threads(n, "n")
        self._saved: tuple | None = None

    def _recreate_cm(self) -> "limit_threads":
        # A fresh object per decorated call, so recursion and threads do not share state.
        return type(self)(self.n)

    def __enter__(self) -> "limit_threads":
        if self._saved is not None:
            raise RuntimeError("this limit_threads object is already active; create a new one for "
                               "each with-block (e.g. `with limit_threads(1):`).")
        watch_forks()
        refuse_unsafe_fork(self.n, f"limit_threads({self.n})")
        saved_torch = torch.get_num_threads()
        saved_opencv = _get_opencv_threads()
        _set_opencv_threads(self.n)  # first, as in WorkerThreadLimiter (before BLAS threads)
        blas = threadpoolctl.threadpool_limits(limits=self.n)
        torch.set_num_threads(self.n)
        self._saved = (saved_torch, saved_opencv, blas)
        return self

    def __exit__(self, *exc: object) -> bool:
        if self._saved is None:
            return False
        saved_torch, saved_opencv, blas = self._saved
        self._saved = None
        # threadpoolctl first (it also resets torch's OpenMP runtime), then torch, so torch's
        # own setting is the one that sticks.
        blas.restore_original_limits()
        torch.set_num_threads(saved_torch)
        if saved_opencv is not None:
            _set_opencv_threads(saved_opencv)
        return False

    def __repr__(self) -> str:
        return f"limit_threads({self.n})"


# ---- limiting inside DataLoader workers ----------------------------------------------
# threadpoolctl limit objects made in workers are kept here for the worker's life, so the
# limits stick even if a later threadpoolctl version restored them on garbage collection.
_worker_limits: list = []

#: Seconds :class:`WorkerThreadLimiter` may take in a forked worker before its watchdog prints
#: the worker's Python stacks and ends the worker (normally it takes well under a second).
WORKER_INIT_WATCHDOG_S = 120.0


@contextlib.contextmanager
def _init_watchdog(enabled: bool):
    """Print all stacks and end the process if the block takes WORKER_INIT_WATCHDOG_S."""
    armed = False
    if enabled:
        try:
            stream = sys.__stderr__
            if stream is None or stream.fileno() < 0:
                raise OSError("no stderr")
            faulthandler.dump_traceback_later(WORKER_INIT_WATCHDOG_S, exit=True, file=stream)
            armed = True
        except Exception:  # no usable stderr: run without the watchdog
            armed = False
    try:
        yield
    finally:
        if armed:
            faulthandler.cancel_dump_traceback_later()


class WorkerThreadLimiter:
    """A DataLoader ``worker_init_fn`` that limits every pool in the worker to ``n_threads``.

    Picklable (fork, forkserver and spawn); the limits last the worker's life. ``set_env``:
    also set :data:`THREAD_ENV_VARS`, for processes the worker starts. ``seed``: seed
    ``random`` and NumPy's global RNG with ``seed + worker_id`` (the same streams every epoch).
    """

    def __init__(self, n_threads: int = 1, seed: int | None = None, *, set_env: bool = True) -> None:
        self.n_threads = _check_threads(n_threads, "n_threads")
        self.seed = check_int("seed", seed, 0, "WorkerThreadLimiter", allow_none=True,
                              hint=" Each worker is seeded with seed + worker_id.")
        self.set_env = bool(set_env)
        watch_forks()

    def __call__(self, worker_id: int) -> None:
        """Limit this worker's pools so that, in a forked worker, it cannot hang: a worker
        forked from a busy parent once hung here for good (py-spy: idle on the
        ``cv2.setNumThreads(0)`` line). What guards it, each measured:

        * ``cv2.setNumThreads(0)`` cannot block once OpenCV is initialised (two stores, no lock,
          no syscall under strace); only OpenCV's first call does work, and
          :func:`~course_utils.fork_safety.prepare_opencv_for_fork` makes it in the parent.
        * ``gc.freeze()`` first: a collection in a forked child runs finalizers of garbage
          inherited from the parent, which can block on a lock a parent thread held at fork.
        * Nothing the parent had not imported is imported (a fork that imported one hung, now and
          then, on a module's import lock); an OpenCV never imported is sized by ``OPENCV_FOR_THREADS_NUM``.
        * OpenCV before threadpoolctl, while the worker has one thread (limiting OpenBLAS
          re-creates its threads in a forked child).
        * A watchdog (``faulthandler``) prints every stack and ends the worker after
          :data:`WORKER_INIT_WATCHDOG_S` seconds, so the DataLoader reports a dead worker.
        """
        n = self.n_threads
        refuse_unsafe_fork(n, f"make_worker_init(n_threads={n})")
        forked = is_fork_child()
        with _init_watchdog(forked):
            if forked:
                gc.freeze()  # no finalizer of anything inherited from the parent runs here
            if self.set_env:
                for var in THREAD_ENV_VARS:
                    os.environ[var] = str(n)
            # OpenCV first (one OS thread still); no import of OpenCV in a forked worker whose
            # parent never imported it: OPENCV_FOR_THREADS_NUM sizes it when it is imported.
            _set_opencv_threads(n, import_if_missing=not (forked and self.set_env))
            _worker_limits.append(threadpoolctl.threadpool_limits(limits=n))
            torch.set_num_threads(n)
        if self.seed is not None:
            random.seed(self.seed + worker_id)
            np.random.seed((self.seed + worker_id) % 2**32)

    def __repr__(self) -> str:
        return f"WorkerThreadLimiter(n_threads={self.n_threads}, seed={self.seed})"


def make_worker_init(n_threads: int = 1, seed: int | None = None, *, set_env: bool = True) -> WorkerThreadLimiter:
    """A picklable ``worker_init_fn`` limiting every pool in each worker to ``n_threads``
    (:class:`WorkerThreadLimiter`); lesson 02 writes the mechanism in full."""
    return WorkerThreadLimiter(n_threads, seed, set_env=set_env)


# ---- probing real workers ------------------------------------------------------------
class _PoolProbe(Dataset):
    """``num_workers`` items; each fetch returns the fetching worker's pools as a dict."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        return thread_pools().to_dict()


def _check_sendable(worker_init_fn: Callable, method: str) -> None:
    """Under spawn/forkserver the worker_init_fn is pickled: fail early and clearly."""
    if method == "fork":
        return
    module_name = getattr(worker_init_fn, "__module__", None) or type(worker_init_fn).__module__
    main = sys.modules.get("__main__")
    if module_name == "__main__" and not getattr(main, "__file__", None):
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
    """Start a real DataLoader and return the thread pools each worker sees, by worker id
    (workers run as in training: ``torch.set_num_threads(1)``, then ``worker_init_fn``).
    ``timeout_s``: seconds to wait for each worker; a stuck one raises RuntimeError."""
    num_workers = check_int("num_workers", num_workers, 1, "pools_in_workers",
                            " With num_workers=0 there are no workers: call thread_pools() instead.")
    timeout_s = check_seconds("timeout_s", timeout_s, "pools_in_workers", positive=True)
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise TypeError(f"worker_init_fn must be None or a callable taking worker_id, got "
                        f"{worker_init_fn!r}.")
    context, method = resolve_context(multiprocessing_context)
    if worker_init_fn is not None:
        _check_sendable(worker_init_fn, method)
    watch_forks()
    loader = DataLoader(_PoolProbe(num_workers), batch_size=None, num_workers=num_workers,
                        worker_init_fn=worker_init_fn, multiprocessing_context=context,
                        timeout=float(timeout_s))
    iterator = iter(loader)
    try:
        try:
            # The DataLoader hands index i to worker i % num_workers: one item per worker.
            answers = [ThreadPools.from_dict(item) for item in iterator]
        except RuntimeError as exc:
            if "timed out" in str(exc):
                raise RuntimeError(f"pools_in_workers: a DataLoader worker (start method "
                                   f"{method!r}) did not answer within timeout_s={timeout_s} s. "
                                   f"It is stuck in worker_init_fn (a thread pool resized in a "
                                   f"forked worker can hang) or still starting up. Try "
                                   f"multiprocessing_context='forkserver' or 'spawn', a simpler "
                                   f"worker_init_fn, or a larger timeout_s.") from exc
            if "exited unexpectedly" in str(exc):
                raise RuntimeError(f"pools_in_workers: a DataLoader worker (start method "
                                   f"{method!r}) died. Under 'spawn'/'forkserver' this usually "
                                   f"means it could not import or unpickle the dataset or "
                                   f"worker_init_fn; look at the worker's error printed above. "
                                   f"Original error: {exc}") from exc
            raise
    finally:
        stop_workers(iterator)
    answers.sort(key=lambda p: -1 if p.worker_id is None else p.worker_id)
    seen = sorted(p.worker_id for p in answers if p.worker_id is not None)
    if seen != list(range(num_workers)):
        raise RuntimeError(f"pools_in_workers: expected one answer from each of workers "
                           f"0..{num_workers - 1}, got worker ids {seen}.")
    return answers
