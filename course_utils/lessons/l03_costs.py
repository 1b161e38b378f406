"""Lesson 03's epoch timer, :func:`time_epochs` (seconds per full pass over a loader).

Lesson 03 writes this loop in its own cell, with the rest of what workers cost (start-up per
start method, the workers' private memory, the datasets that show ``persistent_workers`` and
``prefetch_factor``). The package keeps this copy because the ``00.time_loader`` grader refuses
the course's own timers as an answer, and it must name them. Nothing happens at import time.
"""
from __future__ import annotations

import time
from typing import Iterable

from ..checks import check_int


__all__ = ["time_epochs"]


def time_epochs(loader: Iterable, epochs: int = 3, *, progress: bool = True) -> list[float]:
    """Wall seconds of each of ``epochs`` full passes over ``loader``, start-up included: each
    epoch is ``for batch in loader: pass``, timed from before ``iter(loader)`` (which starts the
    workers unless persistent ones already run) to the end of the last batch."""
    if not hasattr(loader, "__iter__"):
        raise TypeError(f"time_epochs: loader must be iterable (a DataLoader), got "
                        f"{type(loader).__name__}.")
    epochs = check_int("epochs", epochs, 1, "time_epochs")
    from tqdm.auto import tqdm  # lazy: kept out of `import course_utils` (workers)

    out: list[float] = []
    for _ in tqdm(range(epochs), desc="epochs", disable=not progress, leave=False):
        t0 = time.perf_counter()
        for _batch in loader:
            pass
        out.append(time.perf_counter() - t0)
    return out
