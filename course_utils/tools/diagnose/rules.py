"""The rules ``diagnose`` concludes with: each a pure function of measured figures and one
threshold, shared by the script and the ``MODULE:FUNCTION`` ways in."""
from __future__ import annotations


class DiagnoseError(ValueError):
    """Bad input to ``diagnose``: the message is one line that says what to do."""


#: The loop is data-bound when it waited for data more than this fraction of its time.
DATA_BOUND_FRACTION = 0.10
#: a worker with more OS threads than this runs thread pools of its own (OpenCV, BLAS, OpenMP)
POOL_THREADS = 3
#: the loader alone under this many times the loop's samples/s is "barely faster": decode-bound
LOADER_ALONE_FACTOR = 1.2
#: a fix whose step (without the wait) took over this many times the loop's step gets a note
STEP_SLOWDOWN_FACTOR = 1.5


def verdict(wait_fraction: float) -> str:
    """``"data-bound"`` when the loop waited more than :data:`DATA_BOUND_FRACTION` of its
    time, else ``"compute-bound"``."""
    return "data-bound" if wait_fraction > DATA_BOUND_FRACTION else "compute-bound"


def runs_own_pools(worker_threads: list[int]) -> bool:
    """True when a worker has more than :data:`POOL_THREADS` OS threads."""
    return bool(worker_threads) and max(worker_threads) > POOL_THREADS


def loader_barely_faster(loader_samples_per_s: float, loop_samples_per_s: float) -> bool:
    """True when the loader alone delivers under :data:`LOADER_ALONE_FACTOR` times the loop's
    samples/s: loading itself (decode, augment) is the limit, not the step."""
    return loader_samples_per_s < LOADER_ALONE_FACTOR * loop_samples_per_s


def step_slowed(base_step_s: float, fixed_step_s: float) -> bool:
    """True when a fix made the step itself (no wait) over :data:`STEP_SLOWDOWN_FACTOR` times
    as long (workers and the step's threads sharing the CPUs)."""
    return base_step_s > 0 and fixed_step_s > STEP_SLOWDOWN_FACTOR * base_step_s
