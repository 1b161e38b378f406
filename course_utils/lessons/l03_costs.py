"""Lesson 03's harness for what workers cost: start-up per start method
(:func:`worker_startup_time`, seconds until every worker answered once), whole epochs with and
without persistent workers (:func:`time_epochs`, seconds), private memory (:func:`uss_bytes`,
:func:`children_uss_bytes`, bytes), and the datasets that show ``persistent_workers`` and
``prefetch_factor`` at work (importable under every start method). Nothing happens at import time.
"""
from __future__ import annotations

import multiprocessing
import numbers
import os
import time
from collections.abc import Sequence
from typing import Any, Iterable, Optional

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from ..checks import check_index, check_int, check_seconds
from ..config import pick
from ..measurement import Measurement


__all__ = [
    "worker_startup_time",
    "time_epochs",
    "uss_bytes",
    "children_uss_bytes",
    "EpochTaggedDataset",
    "BurstyLatencyDataset",
    "SimulatedStep",
]



# --------------------------------------------------------------------------------------------
# worker start-up, epochs, persistent workers
# --------------------------------------------------------------------------------------------

class _PidProbe(Dataset):
    """``n`` items; each is the pid of the process that fetched it (cheap: no real work)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return os.getpid()


def worker_startup_time(start_method: str, num_workers: int = 1, *, repeats: int = 3,
                        warmup: int = 0, timeout_s: float = 120.0) -> Measurement:
    """Seconds from ``iter(loader)`` until each of ``num_workers`` workers has answered once.

    The dataset is trivial (each item is the worker's pid), so the time is what starting the
    workers costs: creating the processes with ``start_method`` (``fork`` copies this process;
    ``spawn`` starts a fresh interpreter that imports torch and unpickles the dataset;
    ``forkserver`` forks a small server process, which must also import torch unless it was
    told to preload it) plus each worker's set-up. Shutting the workers down afterwards is not
    timed. Returns a Measurement: ``median_s`` is the start-up time, ``items_per_repeat`` the
    number of workers. ``warmup`` untimed starts come first (the first ``forkserver`` start
    also starts the server). Each answer is awaited at most ``timeout_s`` seconds.
    """
    where = "worker_startup_time"
    methods = multiprocessing.get_all_start_methods()
    if start_method not in methods:
        raise ValueError(f"{where}: start_method={start_method!r} is not available here; use "
                         f"one of {methods}.")
    num_workers = check_int("num_workers", num_workers, 1, where)
    repeats = check_int("repeats", repeats, 1, where)
    warmup = check_int("warmup", warmup, 0, where)
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    context = multiprocessing.get_context(start_method)
    times: list[float] = []
    for r in range(warmup + repeats):
        loader = DataLoader(_PidProbe(num_workers), batch_size=None, num_workers=num_workers,
                            multiprocessing_context=context, timeout=timeout_s)
        t0 = time.perf_counter()
        it = iter(loader)
        try:
            pids = {next(it) for _ in range(num_workers)}
            elapsed = time.perf_counter() - t0
        finally:
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            del it
        if len(pids) != num_workers:  # pragma: no cover - the DataLoader deals round-robin
            raise RuntimeError(f"{where}: expected answers from {num_workers} workers, got "
                               f"{len(pids)} distinct pids.")
        if r >= warmup:
            times.append(elapsed)
    return Measurement.from_times(
        f"{start_method}, {num_workers} worker{'s' if num_workers != 1 else ''}", times,
        num_workers, settings={"start_method": start_method, "num_workers": num_workers},
        warnings=[] if repeats >= 3 else ["start-up times are single events: few repeats"])


def time_epochs(loader: Iterable, epochs: int = 3, *, progress: bool = True) -> list[float]:
    """Wall seconds of each of ``epochs`` full passes over ``loader``, start-up included.

    Each epoch is ``for batch in loader: pass`` timed from before ``iter(loader)`` (which starts
    the workers, unless ``persistent_workers=True`` and they already run) to the end of the
    last batch. Compare the first epoch (everyone starts workers) with later ones.
    """
    if not hasattr(loader, "__iter__"):
        raise TypeError(f"time_epochs: loader must be iterable (a DataLoader), got "
                        f"{type(loader).__name__}.")
    epochs = check_int("epochs", epochs, 1, "time_epochs")
    from tqdm.auto import tqdm  # lazy: DataLoader workers import this module

    out: list[float] = []
    for _ in tqdm(range(epochs), desc="epochs", disable=not progress, leave=False):
        t0 = time.perf_counter()
        for _batch in loader:
            pass
        out.append(time.perf_counter() - t0)
    return out


def uss_bytes(pid: Optional[int] = None) -> Optional[int]:
    """USS of a process (this one by default), in bytes: memory private to it. None where the
    platform does not report it. On Linux this reads /proc/<pid>/smaps (a few ms)."""

    try:
        proc = psutil.Process(pid) if pid is not None else psutil.Process()
        return int(proc.memory_full_info().uss)
    except (psutil.Error, AttributeError, NotImplementedError, OSError):
        return None


def children_uss_bytes() -> Optional[int]:
    """Sum of the USS (bytes) of this process's live child processes, e.g. persistent workers
    (and helper processes such as a forkserver); 0 when there are none, None where USS is not
    reported."""

    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += int(child.memory_full_info().uss)
        except psutil.NoSuchProcess:  # exited meanwhile (zombies included)
            continue
        except (psutil.Error, AttributeError, NotImplementedError, OSError):
            return None
    return total


class EpochTaggedDataset(Dataset):
    """``n`` items, each the value of the attribute :attr:`epoch` *in the fetching process*.

    Set ``dataset.epoch = e`` in the main process before each epoch: fresh workers copy the
    dataset when they start and see the new value; persistent workers keep the copy they
    started with and do not.
    """

    def __init__(self, n: int = 8) -> None:
        self.n = check_int("n", n, 1, "EpochTaggedDataset")
        self.epoch = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        check_index(i, self.n, "EpochTaggedDataset")
        return int(self.epoch)


class BurstyLatencyDataset(Dataset):
    """Mostly fast samples and a few slow ones: storage with cache misses.

    Every sample sleeps ``latency_s``; a fixed, seeded ``slow_fraction`` of the samples sleeps
    ``slow_s`` instead (same samples every epoch). Sleeping uses no CPU, so the effect is the
    same on any machine. Returns ``(uint8 tensor of item_shape, i % 10)``.
    :attr:`mean_latency_s` is the average sleep per sample.
    """

    def __init__(self, n: Optional[int] = None, latency_s: float = 0.001,
                 slow_fraction: float = 0.04, slow_s: float = 0.05, seed: int = 0,
                 item_shape: Sequence[int] = (3, 32, 32)) -> None:
        where = "BurstyLatencyDataset"
        self.n = check_int("n", pick(full=4000, quick=800) if n is None else n, 1, where)
        self.latency_s = check_seconds("latency_s", latency_s, where)
        self.slow_s = check_seconds("slow_s", slow_s, where)
        if isinstance(slow_fraction, bool) or not isinstance(slow_fraction, numbers.Real) \
                or not 0.0 <= float(slow_fraction) <= 1.0:
            raise ValueError(f"{where}: slow_fraction={slow_fraction!r} must be in [0, 1] "
                             f"(share of slow samples).")
        self.slow_fraction = float(slow_fraction)
        self.item_shape = tuple(int(d) for d in item_shape)
        rng = np.random.default_rng(check_int("seed", seed, 0, where))
        self.slow = rng.random(self.n) < self.slow_fraction

    @property
    def mean_latency_s(self) -> float:
        """Average sleep per sample over the dataset, in seconds."""
        k = int(self.slow.sum())
        return (k * self.slow_s + (self.n - k) * self.latency_s) / self.n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        i = check_index(i, self.n, "BurstyLatencyDataset")
        time.sleep(self.slow_s if self.slow[i] else self.latency_s)
        return torch.full(self.item_shape, i % 256, dtype=torch.uint8), i % 10

    def describe(self) -> str:
        return (f"BurstyLatencyDataset: {self.n} samples, {self.latency_s * 1e3:g} ms each, "
                f"{int(self.slow.sum())} slow ones ({self.slow_fraction:.0%}) of "
                f"{self.slow_s * 1e3:g} ms; mean {self.mean_latency_s * 1e3:.2f} ms per sample")


class SimulatedStep:
    """A training step that takes ``step_s`` seconds without using the CPU (``time.sleep``),
    like a GPU step the main process waits for. Use as
    ``measure_data_wait(loader, step_fn=SimulatedStep(0.02))``."""

    def __init__(self, step_s: float) -> None:
        self.step_s = check_seconds("step_s", step_s, "SimulatedStep")

    def __call__(self, batch: Any) -> None:
        time.sleep(self.step_s)

    def __repr__(self) -> str:
        return f"SimulatedStep(step_s={self.step_s})"
