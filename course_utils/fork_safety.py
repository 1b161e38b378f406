"""What a process knows of the fork that made it, and what makes limiting pools there safe.

Observed on Linux (opencv-python 5, torch 2) in forks of a parent whose pools had run (fork copies
a pool's bookkeeping and locks, not its threads): ``cv2.setNumThreads(1)`` joins threads the
child lacks and mostly hung, ``setNumThreads(0)`` ("sequential", reads 1) does not, so the course
uses 0; a libgomp parallel region of more than one thread hangs, so more than one thread is
refused (:func:`refuse_unsafe_fork`); OpenBLAS resets its pool at fork. A forked worker reads its
parent's OpenCV thread count but runs one OS thread (``ThreadPools.os_threads`` shows it).
"""
from __future__ import annotations

import contextlib
import os
import sys

import psutil

__all__ = ["count_os_threads", "is_fork_child", "pools_may_be_fork_copies",
           "prepare_opencv_for_fork", "refuse_unsafe_fork", "watch_forks"]

# The pid that imported this module: a fork child inherits it (its own pid differs), as does a
# forkserver child whose server imported it; a spawn child imports the module anew.
_IMPORT_PID = os.getpid()
# OS threads of the parent just before the fork that made this process (None: no hook then).
_threads_at_fork: int | None = None
_fork_hook_registered = False
_opencv_ready_for_fork = False


def count_os_threads() -> int | None:
    """OS threads of this process (Linux: /proc/self/task; elsewhere psutil); None if unknown."""
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/task"))
    with contextlib.suppress(Exception):  # platform dependent
        return int(psutil.Process().num_threads())
    return None


def prepare_opencv_for_fork() -> None:
    """In the parent, before a fork: make OpenCV's lazy first-call set-up (backend plugin search,
    ThreadPool) here, so that in the child ``setNumThreads(0)`` is two stores to plain ints (no
    lock, no syscall: disassembly and strace). Sets the current value; changes nothing."""
    global _opencv_ready_for_fork
    cv2 = sys.modules.get("cv2")
    if _opencv_ready_for_fork or cv2 is None or not hasattr(cv2, "setNumThreads"):
        return  # done, or OpenCV not (fully) imported: nothing of it to copy
    current = int(cv2.getNumThreads())  # creates the ThreadPool singleton
    if current > 1:
        cv2.setNumThreads(current)  # same value: creates the backend object
    _opencv_ready_for_fork = True


def _record_threads_before_fork() -> None:
    global _threads_at_fork
    with contextlib.suppress(Exception):  # a fork hook must never raise
        prepare_opencv_for_fork()
    _threads_at_fork = count_os_threads()


def is_fork_child() -> bool:
    """True in a process forked from the one that imported this module."""
    return os.getpid() != _IMPORT_PID


def watch_forks() -> None:
    """Register (once, lazily, never at import) the hook that records the parent's threads."""
    global _fork_hook_registered
    if not _fork_hook_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_record_threads_before_fork)
        _fork_hook_registered = True


def pools_may_be_fork_copies() -> bool:
    """True in a fork of a parent that had live threads: its pools' bookkeeping here describes
    threads this process lacks, and resizing them (but to "sequential") can hang."""
    if not is_fork_child():
        return False  # the main process, or one that imported this module itself
    if _threads_at_fork is not None:
        return _threads_at_fork > 1
    try:  # no hook before the fork: does the parent have threads now?
        return psutil.Process(os.getppid()).num_threads() > 1
    except Exception:
        return True  # cannot tell: assume the unsafe case


def refuse_unsafe_fork(n: int, what: str) -> None:
    """Raise RuntimeError, naming ``what``, when ``n`` > 1 threads are asked for in a fork copy."""
    if n > 1 and pools_may_be_fork_copies():
        raise RuntimeError(f"{what} asked for {n} threads per pool in a process forked from one "
                           f"whose pools were running: fork copies a pool's bookkeeping, not its "
                           f"threads, so torch's OpenMP pool and OpenCV's can hang on their next "
                           f"parallel call if resized here. Use 1 thread in forked workers, or "
                           f"multiprocessing_context='forkserver' (or 'spawn') to give each {n}.")
