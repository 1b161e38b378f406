"""What a process knows about the fork that made it, and what makes forking a busy process safe.

:mod:`course_utils.threads` limits thread pools; whether a limit is safe depends on how the
process was started. This module keeps that bookkeeping in one place: whether this process is a
fork of the one that imported the course (:func:`is_fork_child`), whether its pools may be
copies of a parent's running pools (:func:`pools_may_be_fork_copies`), the before-fork hook that
records the parent's threads and finishes OpenCV's lazy set-up in the parent
(:func:`watch_forks`, registered lazily, never at import), and the refusal of a limit that
could hang (:func:`refuse_unsafe_fork`).

Fork safety (measured with opencv-python 5.0 / torch 2.13 CPU on Linux, and the reason for
choices in :mod:`course_utils.threads`):

* OpenCV (pthreads backend): ``cv2.setNumThreads(1)`` *shrinks* the pool, which joins the
  pool's worker threads. In a process created by ``fork`` from a parent that had used
  OpenCV, those threads do not exist (fork copies only the calling thread) and the call hangs
  (in ``pthread_cond_destroy``) most of the time. ``cv2.setNumThreads(0)`` means "run
  sequentially" (``cv2.getNumThreads()`` then reads 1) and does not touch the pool's
  threads, so the course always uses 0 to ask OpenCV for one thread.
* torch's OpenMP runtime (GNU libgomp) is not fork-safe: in a forked child of a parent that
  had used it, a parallel region with more than one thread hangs. One thread is fine (the
  DataLoader sets 1 in every worker). Setting more than one thread in such a child is refused
  with a clear error instead of a hang later.
* OpenBLAS resets its pool at fork by itself: limiting it is safe everywhere.
* Limiting must never hang a forked worker, even when the parent had other threads running
  at fork time (a psutil sampler, tqdm's monitor, DataLoader queue feeders, library pools):
  fork copies their locks in whatever state they were, and nothing releases them in the
  child. :class:`~course_utils.threads.WorkerThreadLimiter` therefore does as little as
  possible in a forked worker, in the safest order, and under a watchdog; see its ``__call__``
  for the details and the evidence.
* A reading is not a running thread: in a forked worker whose parent had already used
  OpenCV, ``cv2.getNumThreads()`` still reads the parent's value, but the pool's threads were
  not copied and OpenCV does not start new ones: the worker has one OS thread. If the
  parent had not used OpenCV yet, or under spawn/forkserver, the worker starts a real pool.
  ``ThreadPools.os_threads`` shows the difference.
"""
from __future__ import annotations

import os
import sys

import psutil

__all__ = ["count_os_threads", "is_fork_child", "pools_may_be_fork_copies",
           "prepare_opencv_for_fork", "refuse_unsafe_fork", "watch_forks"]

# The pid of the process that imported this module. In a child created by fork the module
# is inherited, so os.getpid() differs; after spawn (or in a fresh forkserver child of a
# server that never imported us) the module is imported anew and they are equal.
_IMPORT_PID = os.getpid()
# Number of OS threads in the parent right before the fork that created this process, as
# recorded by the at-fork hook (None when the hook was not registered before that fork).
_threads_at_fork: int | None = None
_fork_hook_registered = False


def count_os_threads() -> int | None:
    """OS threads of this process (Linux: /proc/self/task; elsewhere psutil); None if unknown."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        pass
    try:
        return int(psutil.Process().num_threads())
    except Exception:  # pragma: no cover - platform dependent
        return None


_opencv_ready_for_fork = False


def prepare_opencv_for_fork() -> None:
    """In the parent, before fork: finish OpenCV's lazy one-time initialisation here.

    ``cv::setNumThreads`` reaches two function-local statics: the parallel-backend object
    (created on first use by a plugin search: a directory scan of the cv2 package, logging,
    C++ exception handling) and the pthreads ``ThreadPool`` singleton (mutex init, reading
    cgroup CPU limits). Once both exist, ``cv2.setNumThreads(0)`` is two stores to plain ints:
    no lock, no system call (checked by disassembling opencv-python 5.0's
    ``cv::setNumThreads`` / ``parallel_pthreads_set_threads_num``; see strace evidence in
    :meth:`course_utils.threads.WorkerThreadLimiter.__call__`). A parent that imported cv2 but
    never ran a parallel OpenCV call would leave that initialisation to every forked child,
    where any lock another parent thread held at fork time stays held forever. Doing it here,
    once, on the forking thread of the parent, removes that path from the children. The value
    is set to what it already is, so nothing changes; when OpenCV reads <= 1 it is already
    sequential and the child never calls ``setNumThreads`` at all (see
    ``course_utils.threads._set_opencv_threads``).
    """
    global _opencv_ready_for_fork
    if _opencv_ready_for_fork:
        return
    cv2 = sys.modules.get("cv2")
    if cv2 is None or not hasattr(cv2, "setNumThreads"):
        return  # not imported (or half imported): nothing of OpenCV's exists to copy
    current = int(cv2.getNumThreads())  # creates the ThreadPool singleton
    if current > 1:
        cv2.setNumThreads(current)  # same value: creates the backend object, changes nothing
    _opencv_ready_for_fork = True


def _record_threads_before_fork() -> None:
    global _threads_at_fork
    try:
        prepare_opencv_for_fork()
    except Exception:  # pragma: no cover - a fork hook must never raise
        pass
    try:
        _threads_at_fork = count_os_threads()
    except Exception:  # pragma: no cover - a fork hook must never raise
        _threads_at_fork = None


def is_fork_child() -> bool:
    """True in a process created by fork from the process that imported this module."""
    return os.getpid() != _IMPORT_PID


def watch_forks() -> None:
    """Register (once, lazily, never at import) the hook that records the parent's threads."""
    global _fork_hook_registered
    if not _fork_hook_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_record_threads_before_fork)
        _fork_hook_registered = True


def pools_may_be_fork_copies() -> bool:
    """True when this process is a fork of a parent that had live threads at fork time.

    Then the OpenMP / OpenCV pool bookkeeping here describes threads that do not exist in
    this process, and resizing those pools (other than down to "sequential") can hang.
    """
    if os.getpid() == _IMPORT_PID:
        return False  # imported here: fresh interpreter (spawn/forkserver) or main process
    if _threads_at_fork is not None:
        return _threads_at_fork > 1
    # The hook was not registered before the fork: ask whether the parent has threads now
    # (a forkserver server has one, a notebook kernel that used its pools has many).
    try:
        return psutil.Process(os.getppid()).num_threads() > 1
    except Exception:
        return True  # cannot tell: assume the unsafe case


def refuse_unsafe_fork(n: int, what: str) -> None:
    """Raise RuntimeError, naming ``what``, when ``n`` > 1 threads are asked for in a fork copy."""
    if n > 1 and pools_may_be_fork_copies():
        raise RuntimeError(
            f"{what} asked for {n} threads per pool, but this process was started with the "
            f"'fork' start method from a process whose thread pools were already running. "
            f"fork copies the pools' bookkeeping but not their threads: torch's OpenMP pool "
            f"and OpenCV's pool can hang on their next parallel call if resized here. "
            f"Use 1 thread in forked workers, or start the workers with "
            f"multiprocessing_context='forkserver' (or 'spawn') to give each of them {n}."
        )
