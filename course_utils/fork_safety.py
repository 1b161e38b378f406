"""What a process knows about the fork that made it, and what makes forking a busy process safe.

:mod:`course_utils.threads` limits pools; whether that is safe depends on how the process
started (fork copies a parent's pool bookkeeping and locks, not its threads). What was observed
on Linux with opencv-python 5 and torch 2, and the choices it led to there:

* OpenCV: ``cv2.setNumThreads(1)`` joins the pool's threads, which a forked child does not
  have: in forks of a parent that had used OpenCV it hung most of the time. ``setNumThreads(0)``
  ("sequential"; ``getNumThreads()`` then reads 1) does not touch them, so the course uses 0.
* torch's OpenMP runtime (libgomp): in a fork of a parent that used it, a parallel region of
  more than one thread hangs, so more than one thread is refused (:func:`refuse_unsafe_fork`).
* OpenBLAS resets its pool at fork: limiting it is safe everywhere.
* A reading is not a running thread: a forked worker reads its parent's OpenCV thread count
  but has one OS thread (``ThreadPools.os_threads`` shows it).
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

    OpenCV's first ``setNumThreads`` creates its backend (a plugin search) and ThreadPool
    (mutex init, cgroup files); after that, ``setNumThreads(0)`` is two stores to plain ints (no
    lock, no syscall: disassembly and strace). Left to a forked child, that first call could
    block on a lock another parent thread held at fork. The value set is the current one.
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
        raise RuntimeError(f"{what} asked for {n} threads per pool, but this process was started "
                           f"with the 'fork' start method from a process whose thread pools were "
                           f"already running. fork copies the pools' bookkeeping but not their "
                           f"threads: torch's OpenMP pool and OpenCV's pool can hang on their "
                           f"next parallel call if resized here. Use 1 thread in forked workers, "
                           f"or start the workers with multiprocessing_context='forkserver' (or "
                           f"'spawn') to give each of them {n}.")
