"""The rules ``diagnose`` concludes with: each a pure function of figures the probe measured and
one named threshold."""
from __future__ import annotations


class DiagnoseError(ValueError):
    """Bad input to ``diagnose``: the message is one line that says what to do."""


#: The loop is data-bound when it waited for data more than this fraction of its time.
DATA_BOUND_FRACTION = 0.10
#: a worker with more OS threads than this runs thread pools of its own (OpenCV, BLAS, OpenMP)
POOL_THREADS = 3
#: a fix is recommended only above this many times the script's samples/s as it is
MIN_GAIN = 1.05
#: loading that computed more than this share of its time is held up by CPU work per sample
LOAD_BUSY = 0.5


def verdict(wait_fraction: float) -> str:
    """``"data-bound"`` above :data:`DATA_BOUND_FRACTION` of the loop's time waiting, else not."""
    return "data-bound" if wait_fraction > DATA_BOUND_FRACTION else "compute-bound"


def runs_own_pools(worker_threads: list[int]) -> bool:
    """True when a worker has more than :data:`POOL_THREADS` OS threads."""
    return bool(worker_threads) and max(worker_threads) > POOL_THREADS




#: at risk: shared memory or descriptors in flight above this share of their limit; workers' memory
HEALTH_SHARE, GROWTH_SHARE = 0.5, 0.1   # grown by more than this share of the memory limit in one run
#: how each of lesson 09's failures is fixed
FIXES = {"shm": "fewer workers or a smaller prefetch_factor, uint8 batches, or a larger --shm-size",
         "fds": "fewer tensors a batch, file_system sharing set in the workers too, or a larger ulimit -n",
         "memory": "keep samples in NumPy arrays or tensors, not Python lists and dicts (lesson 03)",
         "killed": "a signal or the out-of-memory killer (dmesg): watch the workers' memory growth",
         "hang": "dump the stuck worker's stack (py-spy dump --pid PID, or faulthandler)"}
#: the four ways a loader dies: words of the script's error, the failure's name, its fix
FAILURES = ((("shared memory", "Bus error", "No space left on device"), "out of shared memory", "shm"),
            (("Too many open files", "received 0 items of ancdata"), "too many open files", "fds"),
            (("is killed by signal", "exited unexpectedly"), "a DataLoader worker killed", "killed"),
            (("timed out after",), "a hang (a worker stopped delivering batches)", "hang"))


def health(used: float | None, limit: float | None, share: float = HEALTH_SHARE) -> str:
    """``"at risk"`` above ``share`` x ``limit`` (0 included), else ``"ok"``; unknown: ``"not measured"``."""
    return "not measured" if used is None or limit is None else "at risk" if used > share * limit else "ok"


def named_failure(error: str | None) -> tuple[str, str] | None:
    """(name, fix) of the first of :data:`FAILURES` whose words the error's text holds."""
    return next(((name, FIXES[fix]) for words, name, fix in FAILURES
                 if error and any(w in error for w in words)), None)
