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

