"""CPU seconds, involuntary context switches and peak memory (bytes) of this process and its
children (DataLoader workers), read with psutil and /proc around the windows
:mod:`course_utils.timing` times; and stopping a loader's workers in the caller's frame."""
from __future__ import annotations

import contextlib
import glob
import threading
import time

import psutil

__all__ = ["TreeMonitor", "loader_worker_pids", "stop_workers"]


def loader_worker_pids(iterator: object) -> list[int] | None:
    """The worker pids of a DataLoader iterator (``[]`` without workers), from torch's iterator
    attributes; None for any other iterator (then the whole tree counts)."""
    if not isinstance(getattr(iterator, "_num_workers", None), int):
        return None
    if iterator._num_workers == 0:
        return []
    try:
        return [int(w.pid) for w in iterator._workers] or None
    except (TypeError, AttributeError, ValueError):
        return None


def stop_workers(iterator: object, loader: object = None) -> None:
    """Shut a DataLoader iterator's workers down now, in the caller's frame: left to ``__del__``,
    a Ctrl-C during the join is printed as "Exception ignored" and lost. The iterator a
    persistent-workers ``loader`` keeps for its next epoch is left running."""
    if loader is not None and getattr(loader, "_iterator", None) is iterator:
        return
    stop = getattr(iterator, "_shutdown_workers", None)
    if callable(stop):
        stop()


def _involuntary_switches(pid: int) -> int | None:
    """Involuntary context switches of every thread of ``pid`` (psutil's count is the main
    thread's only); None off Linux."""
    paths = glob.glob(f"/proc/{pid}/task/*/status")
    if not paths:
        return None
    total = 0
    for path in paths:
        with contextlib.suppress(OSError, ValueError, StopIteration):  # the thread ended
            with open(path) as fh:
                total += next(int(line.split()[1]) for line in fh
                              if line.startswith("nonvoluntary_ctxt_switches"))
    return total


class TreeMonitor:
    """CPU time, involuntary context switches and memory of this process and its children.

    CPU time includes reaped children's, so a worker that exits during a window is neither lost
    nor counted twice. ``roots`` (pids, e.g. :func:`loader_worker_pids`) narrows the children to
    those and their own children; None counts every child. ``start()`` samples memory (summed USS
    and PSS) in a thread every ~0.1 s; the sampler's own CPU time is subtracted.
    """

    def __init__(self) -> None:
        self.roots: list[int] | None = None
        self._proc = psutil.Process()
        self._lock = threading.RLock()
        self._procs: list = [self._proc]
        self._last_ctx: dict[tuple, int] = {}   # (pid, create time) -> last count seen
        self._sampler_cpu_s = self._cost_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ctx_available = self.uss_available = self.pss_available = True
        self.peak_uss: int | None = None
        self.peak_pss: int | None = None

    def list_tree(self) -> list:
        """The processes of the tree now (a few ms: it scans the process table)."""
        procs = [self._proc]
        try:
            if self.roots is None:
                return procs + self._proc.children(recursive=True)
            for pid in self.roots:
                with contextlib.suppress(psutil.NoSuchProcess):
                    root = psutil.Process(pid)
                    procs += [root, *root.children(recursive=True)]
        except (psutil.Error, OSError):
            pass
        return procs

    def _read_cpu(self, procs: list) -> dict[tuple, tuple[float, int | None]]:
        snap = {}
        for p in procs:
            try:
                with p.oneshot():
                    key, t = (p.pid, p.create_time()), p.cpu_times()
                    cpu = float(t.user + t.system + getattr(t, "children_user", 0.0)
                                + getattr(t, "children_system", 0.0))
                    ctx = None
                    if self.ctx_available:
                        try:
                            ctx = _involuntary_switches(p.pid)
                            if ctx is None:
                                ctx = int(p.num_ctx_switches().involuntary)
                            self._last_ctx[key] = ctx
                        except (AttributeError, NotImplementedError, psutil.AccessDenied):
                            self.ctx_available = False
            except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
                continue
            snap[key] = (cpu, ctx)
        return snap

    def snapshot(self, fresh: bool = False) -> dict:
        """CPU readings of the processes listed at :meth:`start` (fast), or of a fresh listing
        (``fresh=True``, a few ms). Never overlaps a memory sample."""
        procs = self.list_tree() if fresh else self._procs
        with self._lock:
            return {**self._read_cpu(procs), "sampler_cpu_s": self._sampler_cpu_s}

    def window(self, start: dict, end: dict) -> tuple[float, int | None]:
        """CPU seconds and involuntary context switches of the tree between two snapshots,
        without the sampler thread's own CPU time."""
        start, end = dict(start), dict(end)
        sampler = end.pop("sampler_cpu_s") - start.pop("sampler_cpu_s")
        cpu = sum(c for c, _ in end.values()) - sum(c for c, _ in start.values())
        ctx = 0
        for key in set(start) | set(end):
            # a process that vanished: its last seen count; a new one: counted from zero
            x1 = end[key][1] if key in end else self._last_ctx.get(key)
            x0 = start[key][1] if key in start else 0
            if x1 is not None and x0 is not None:
                ctx += max(0, x1 - x0)
        return max(0.0, cpu - sampler), (ctx if self.ctx_available else None)

    def _sample_memory(self, procs: list) -> None:
        uss = pss = 0
        for p in procs:
            try:
                info = p.memory_full_info()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            except (psutil.AccessDenied, NotImplementedError, AttributeError, OSError):
                self.uss_available = self.pss_available = False
                return
            u, s = getattr(info, "uss", None), getattr(info, "pss", None)
            self.uss_available &= u is not None
            self.pss_available &= s is not None
            uss += int(u or 0)
            pss += int(s or 0)
        if self.uss_available:
            self.peak_uss = max(self.peak_uss or 0, uss)
        if self.pss_available:
            self.peak_pss = max(self.peak_pss or 0, pss)

    def _sample_once(self) -> None:
        with self._lock:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                procs = self.list_tree()
                if self.uss_available or self.pss_available:
                    self._sample_memory(procs)
                self._read_cpu(procs)  # remember context switches of processes that may exit
            except Exception:  # never let the sampler break a measurement
                pass
            self._sampler_cpu_s += time.thread_time() - c0
            self._cost_s = time.perf_counter() - t0

    def _run(self) -> None:
        # sample less often when sampling is slow, to keep its cost to a few % of one core
        while not self._stop.wait(max(0.1, 20.0 * self._cost_s)):
            self._sample_once()

    def start(self, procs: list | None = None) -> None:
        """Remember the tree (``procs`` from :meth:`list_tree`, or listed now) and sample its
        memory in a daemon thread until :meth:`stop`."""
        self.stop()
        self._procs = self.list_tree() if procs is None else list(procs)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="course-utils-tree-sampler",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the sampler thread (if running) and take a last sample."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10.0)
        self._thread = None
        self._sample_once()

    def peaks(self) -> tuple[int | None, int | None]:
        """Peak summed USS and PSS in bytes (None where not readable)."""
        return (self.peak_uss if self.uss_available else None,
                self.peak_pss if self.pss_available else None)
