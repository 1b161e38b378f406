"""CPU time, context switches and memory of this process and its children (DataLoader workers),
read with :mod:`psutil` and /proc around the windows :mod:`course_utils.timing` times; and
stopping a loader's workers in the caller's frame."""
from __future__ import annotations

import contextlib
import glob
import threading
import time

import psutil

__all__ = ["TreeMonitor", "loader_worker_pids", "stop_workers", "thread_involuntary_switches"]

_Key = tuple  # (pid, create_time)


def loader_worker_pids(iterator: object) -> list[int] | None:
    """The worker pids of a DataLoader iterator (``[]`` for ``num_workers=0``), read from the
    attributes torch's iterators keep; None for any other iterator (then count the whole tree).
    Measuring one loader, another loader's persistent workers finishing their prefetched batches
    must not count: only this loader's workers (and their children) do."""
    if not isinstance(getattr(iterator, "_num_workers", None), int):
        return None
    if iterator._num_workers == 0:
        return []
    workers = getattr(iterator, "_workers", None)
    try:
        return [int(w.pid) for w in workers] if workers else None
    except (TypeError, AttributeError, ValueError):
        return None


def stop_workers(iterator: object, loader: object = None) -> None:
    """Shut a DataLoader iterator's workers down now, in the caller's frame (nothing for an
    iterator without workers). Left to the iterator's ``__del__``, a Ctrl-C that arrives while
    the workers are joined is printed as "Exception ignored" and lost, and the measurement goes
    on. The iterator a persistent-workers ``loader`` keeps for its next epoch is left running."""
    if loader is not None and getattr(loader, "_iterator", None) is iterator:
        return
    stop = getattr(iterator, "_shutdown_workers", None)
    if callable(stop):
        stop()


def thread_involuntary_switches(pid: int) -> dict[tuple[int, int], int] | None:
    """``{(pid, thread id): involuntary context switches}`` for every thread of ``pid``; None off
    Linux. Per thread because psutil's ``num_ctx_switches()`` reads the main thread only."""
    out: dict[tuple[int, int], int] = {}
    paths = glob.glob(f"/proc/{pid}/task/*/status")
    if not paths:
        return None
    for path in paths:
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("nonvoluntary_ctxt_switches"):
                        out[(pid, int(path.split("/")[4]))] = int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue  # the thread ended while we read
    return out


class TreeMonitor:
    """CPU time, involuntary context switches and memory of this process and its children.

    CPU time includes reaped children's, so a worker that exits during a window is neither lost
    nor counted twice. ``roots`` (pids, e.g. :func:`loader_worker_pids`) narrows the children to
    those processes and their own children; None counts every child. ``start()`` lists the tree
    (so a window can start right after warm-up) and samples memory in a thread every ~0.1 s; the
    sampler's own CPU time is subtracted.
    """

    def __init__(self, interval_s: float = 0.1) -> None:
        self.roots: list[int] | None = None
        self._proc = psutil.Process()
        self._interval_s = interval_s
        self._lock = threading.RLock()
        self._procs: list = [self._proc]
        self._last_ctx: dict[_Key, int] = {}
        self._sampler_cpu_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cost_s = 0.0
        self.ctx_available = True
        self.peak_uss: int | None = None
        self.peak_pss: int | None = None
        self.uss_available = True
        self.pss_available = True

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

    def _read_cpu(self, procs: list) -> dict[_Key, tuple[float, int | None]]:
        snap: dict[_Key, tuple[float, int | None]] = {}
        for p in procs:
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    t = p.cpu_times()
                    cpu = float(t.user + t.system + getattr(t, "children_user", 0.0)
                                + getattr(t, "children_system", 0.0))
                    ctx: int | None = None
                    if self.ctx_available:
                        try:
                            per_thread = thread_involuntary_switches(p.pid)
                            ctx = (int(p.num_ctx_switches().involuntary) if per_thread is None
                                   else sum(per_thread.values()))
                            self._last_ctx[key] = ctx
                        except (AttributeError, NotImplementedError, psutil.AccessDenied):
                            self.ctx_available = False
            except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
                continue
            snap[key] = (cpu, ctx)
        return snap

    def snapshot(self, fresh: bool = False) -> dict:
        """CPU readings of the tree now: of the processes listed at :meth:`start` (fast), or
        of a fresh listing (``fresh=True``, a few ms). Never overlaps a memory sample."""
        procs = self.list_tree() if fresh else self._procs
        with self._lock:
            snap: dict = self._read_cpu(procs)
            snap["sampler_cpu_s"] = self._sampler_cpu_s
        return snap

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
            self.peak_uss = uss if self.peak_uss is None else max(self.peak_uss, uss)
        if self.pss_available:
            self.peak_pss = pss if self.peak_pss is None else max(self.peak_pss, pss)

    def _sample_once(self) -> None:
        with self._lock:
            t0 = time.perf_counter()
            c0 = time.thread_time()
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
        while not self._stop.wait(max(self._interval_s, 20.0 * self._cost_s)):
            self._sample_once()

    def start(self, procs: list | None = None) -> None:
        """Remember the tree (``procs`` from :meth:`list_tree`, or listed now), then sample
        memory every ~0.1 s in a daemon thread until :meth:`stop`."""
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
        return (self.peak_uss if self.uss_available else None,
                self.peak_pss if self.pss_available else None)
