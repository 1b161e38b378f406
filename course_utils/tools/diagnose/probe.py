"""Inside ``diagnose train.py``: :func:`run_probe` runs the script as ``__main__`` (its own
``sys.argv``) after three class-level wraps it never sees: ``DataLoader.__init__`` (settings, where
it is made, ``--try`` overrides), ``DataLoader.__iter__`` (an epoch starts), the iterator's
``__next__`` (the wait for each batch; the time to the next ``next`` is the step). Past the deadline
the next ``__next__`` stops every loader's workers and raises :class:`BudgetSpent`, which the
script's ``except Exception`` lets through. The figures (seconds) and what it raised go to a JSON file.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import runpy
import sys
import sysconfig
import threading
import time
import traceback
import weakref
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader
from torch.utils.data import dataloader as dataloader_module

from course_utils.process_tree import loader_worker_pids, stop_workers
from course_utils.start_methods import resolve_context
from course_utils.timing import batch_size_of, default_warmup

from .health import limits, open_fds, shm_free, tensors_in
from .script import BUDGET_ENDS, OUT_OF_SCOPE, TRY_KEYS, USAGE_ERROR

#: seconds between two samples of the workers' busy seconds and threads, per loader
SAMPLE_EVERY_S = 0.5
#: at most this many steps' CUDA events are kept per loader (two events each)
MAX_EVENT_STEPS = 4096


class BudgetSpent(BaseException):
    """Raised from a DataLoader's ``next`` once the budget is spent (a batch boundary)."""


class OutOfScope(BaseException):
    """The script starts processes of its own that train (ranks); diagnose does not follow them."""


_now = time.perf_counter
#: frames of these files are the tool's, never the script's (the probe's and runpy's)
TOOL_FILES = (__file__, runpy.__file__, "<frozen runpy>")
#: a frame in a path containing one of these is a library's, not the script's
LIBRARY_PARTS = ("<frozen", "site-packages", "dist-packages", "torch" + os.sep,
                 os.path.join("course_utils", "tools", "diagnose"), sysconfig.get_paths()["stdlib"])


def _at(frames: list) -> str:
    """``file:line`` of the first frame in the script's own files (else the first at all)."""
    own = [f for f in frames if not any(part in f.filename for part in LIBRARY_PARTS)]
    found = (own or frames)[:1]
    return f"{found[0].filename}:{found[0].lineno}" if found else "unknown"


def _where() -> str:
    """Where the loader is made: the first caller outside torch, the tool and libraries."""
    return _at([f for f in inspect.stack(0)[2:] if f.filename not in TOOL_FILES
                and "torch" + os.sep not in f.filename])


def script_error(exc: BaseException) -> dict:
    """What the script raised: ``error`` (type, first line), ``where`` (its deepest own frame),
    ``traceback`` (without the tool's frames), ``usage`` (argparse's exit)."""
    found = traceback.TracebackException.from_exception(exc)
    usage = any(f.filename == argparse.__file__ and f.name == "error" for f in found.stack)
    found.stack = traceback.StackSummary.from_list([f for f in found.stack if f.filename not in TOOL_FILES])
    first = (str(exc).splitlines() or [""])[0]
    return {"error": f"{type(exc).__name__}: {first}" if first else type(exc).__name__, "usage": usage,
            "where": _at(found.stack[::-1]), "traceback": "".join(found.format())}


def busy_s(task: str = "") -> float:
    """Seconds a task (``"PID"``, or this thread) ran or was queued to run (Linux's schedstat: a
    computation on a busy machine counts, a sleep or a read does not); elsewhere its CPU seconds."""
    try:
        with open(f"/proc/{task or f'self/task/{threading.get_native_id()}'}/schedstat", "rb", 0) as stat:
            ran, queued = stat.read().split()[:2]
        return (int(ran) + int(queued)) / 1e9
    except (OSError, ValueError):
        return sum(psutil.Process(int(task)).cpu_times()[:2]) if task else time.thread_time()


def _transform_of(dataset: Any) -> str:
    """The type name of the dataset's ``transform`` (through ``Subset``-style ``.dataset``)."""
    for _ in range(4):
        for attr in ("transform", "transforms"):
            found = getattr(dataset, attr, None)
            if callable(found):
                return type(found).__name__
        dataset = getattr(dataset, "dataset", None)
    return "None"


def _describe_batch(batch: Any) -> str:
    """``"float32 (8, 3, 8, 8)"``: the dtype and shape of the batch's images."""
    images = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if isinstance(images, dict) and images:
        images = next(iter(images.values()))
    if torch.is_tensor(images):
        return f"{str(images.dtype).replace('torch.', '')} {tuple(images.shape)}"
    return type(images).__name__


class GpuSteps:
    """CUDA events on the current stream around each timed step; the GPU's busy share is its time
    inside the steps over the first step's start to the last's end, read once at the end."""

    def __init__(self) -> None:
        self.pairs: list[tuple[Any, Any]] = []
        self.open: Any = None

    @staticmethod
    def active() -> bool:
        return torch.cuda.is_available() and torch.cuda.is_initialized()

    @staticmethod
    def event() -> Any:
        found = torch.cuda.Event(enable_timing=True)
        found.record()
        return found

    def started(self) -> None:
        if len(self.pairs) < MAX_EVENT_STEPS and self.active():
            self.open = self.event()

    def ended(self) -> None:
        if self.open is not None:
            self.pairs.append((self.open, self.event()))
            self.open = None

    def busy_share(self) -> float | None:
        """The share in [0, 1] over at least two steps; None when not measured."""
        if len(self.pairs) < 2:
            return None
        torch.cuda.synchronize()
        whole = self.pairs[0][0].elapsed_time(self.pairs[-1][1])
        busy = sum(start.elapsed_time(end) for start, end in self.pairs)
        return min(1.0, busy / whole) if whole > 0 else None


class LoaderRecord:
    """One DataLoader's settings and timings (seconds). Its first :func:`default_warmup` batches
    (every batch in flight, the start-up's included) are not timed; a later one counts once its
    step ended: its wait, the loop thread's :func:`busy_s` in it (no workers), its step."""

    def __init__(self, index: int, loader: DataLoader, where: str, overridden: dict) -> None:
        self.index, self.where, self.overridden = index, where, overridden
        self.settings = {k: getattr(loader, k, None) for k in TRY_KEYS} | {
            "start_method": resolve_context(loader.multiprocessing_context)[1]
                            if loader.num_workers else "main process",
            "dataset": type(loader.dataset).__name__, "transform": _transform_of(loader.dataset),
            "iterable_dataset": isinstance(loader.dataset, torch.utils.data.IterableDataset)}
        self.warmup = default_warmup(loader)
        self.startup_s: float | None = None
        self.waits, self.steps = [], []                  # seconds per timed batch
        self.samples = self.batches = self.epochs = 0
        self.wait_busy_s = self.epoch_start_wait_s = 0.0
        self.batch: str | None = None
        self.worker_busy: dict[int, list[float]] = {}    # pid -> busy_s and time, first and last seen
        self.worker_threads: dict[int, int] = {}
        self.worker_rss: dict[int, list[int]] = {}     # pid -> RSS bytes, first and last seen
        self.batch_tensors = self.batch_bytes = self.shm_free = None
        self.fds = {"at_start": None, "peak": None}      # this process's open descriptors
        self.gpu_steps = GpuSteps()
        self.t_iter = self.last = None                   # when iter(loader) came; the last batch
        self.pending: tuple | None = None                # a timed batch's figures, until its step ends
        self.next_sample = 0.0

    def epoch_starts(self, t: float) -> None:
        """``iter(loader)`` was called at ``t`` (workers start here unless they persist)."""
        self.t_iter, self.epochs, self.last, self.pending = t, self.epochs + 1, None, None
        self.shm_free = min((x for x in (shm_free(), self.shm_free) if x is not None), default=None)
        self.fds["at_start"] = self.fds["at_start"] or open_fds()

    def step_ends(self, t: float) -> None:
        """The loop body on the last batch ended at ``t`` (the next ``next`` call)."""
        if self.last is not None and self.pending is not None:
            wait, samples, busy, first = self.pending
            self.waits.append(wait)
            self.steps.append(t - self.last)
            self.samples += samples
            self.wait_busy_s += busy
            self.epoch_start_wait_s += wait * first
            self.gpu_steps.ended()
        self.pending = None

    def arrived(self, t0: float, t1: float, batch: Any, busy: float = 0.0) -> bool:
        """Record a batch that ``next`` returned at ``t1`` (called at ``t0``; the loop thread
        ``busy`` seconds in between); True when it is the first of its epoch."""
        first_of_epoch = self.last is None
        if self.batches == 0:
            self.startup_s = t1 - (self.t_iter if self.t_iter is not None else t0)
            self.batch = _describe_batch(batch)
            self.batch_tensors, self.batch_bytes = tensors_in(batch)
        if self.batches >= self.warmup:
            since_iter = first_of_epoch and self.t_iter is not None
            self.pending = (t1 - (self.t_iter if since_iter else t0), batch_size_of(batch), busy, since_iter)
            self.gpu_steps.started()
        self.batches += 1
        self.last = t1
        return first_of_epoch

    def epoch_ends(self) -> None:
        self.last, self.t_iter, self.pending = None, None, None

    def sample(self, iterator: Any, t: float, force: bool = False) -> None:
        """Every :data:`SAMPLE_EVERY_S` and at each epoch's first batch (new workers): each
        worker's :func:`busy_s`, OS threads and RSS, and when; this process's open descriptors."""
        if t < self.next_sample and not force:
            return
        self.next_sample = t + SAMPLE_EVERY_S
        self.fds["peak"] = max(filter(None, (open_fds(), self.fds["peak"])), default=None)
        for pid in loader_worker_pids(iterator) or []:
            try:
                proc = psutil.Process(pid)
                busy, rss = busy_s(str(pid)), proc.memory_info().rss
                self.worker_threads[pid] = max(self.worker_threads.get(pid, 0), proc.num_threads())
                self.worker_rss.setdefault(pid, [rss, rss])[1] = rss
            except psutil.Error:
                continue
            seen = self.worker_busy.setdefault(pid, [busy, t] * 2)
            seen[2:] = busy, t

    def to_dict(self) -> dict:
        seen = self.worker_busy.values()
        return {"index": self.index, "where": self.where, "settings": self.settings,
                "overridden": self.overridden, "startup_s": self.startup_s,
                "warmup_batches": self.warmup, "batches": self.batches, "epochs": self.epochs,
                "samples": self.samples, "waits_s": self.waits, "steps_s": self.steps,
                "wait_busy_s": self.wait_busy_s, "epoch_start_wait_s": self.epoch_start_wait_s,
                "batch": self.batch, "worker_busy_s": sum(c1 - c0 for c0, _, c1, _ in seen),
                "worker_wall_s": sum(t1 - t0 for _, t0, _, t1 in seen), "workers_seen": len(seen),
                "worker_threads": sorted(self.worker_threads.values()),
                "gpu_busy": self.gpu_steps.busy_share(), "batch_tensors": self.batch_tensors,
                "batch_bytes": self.batch_bytes, "shm_free": self.shm_free, "fds": self.fds,
                "worker_rss": list(self.worker_rss.values()), "limits": limits()}


class Probe:
    """The wraps, the records and the deadline: :meth:`install` once, :meth:`uninstall` after."""

    def __init__(self, budget_s: float, overrides: dict[int, dict] | None = None) -> None:
        self.deadline = _now() + budget_s
        self.overrides = overrides or {}
        self.records: list[LoaderRecord] = []
        self.iterators: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._saved: dict[tuple[type, str], Any] = {}

    def install(self) -> None:
        base = dataloader_module._BaseDataLoaderIter
        for owner, name, wrap in ((DataLoader, "__init__", self._wrap_init),
                                  (DataLoader, "__iter__", self._wrap_iter),
                                  (base, "__next__", self._wrap_next)):
            self._saved[owner, name] = original = owner.__dict__[name]
            setattr(owner, name, wrap(original))
        self._wrap_ranks()

    def uninstall(self) -> None:
        for (owner, name), original in self._saved.items():
            setattr(owner, name, original)
        self._saved.clear()

    def _wrap_ranks(self) -> None:
        def refuse(*_a: Any, **_k: Any) -> None:
            raise OutOfScope("the script starts training ranks of its own (torch.distributed / "
                             "torch.multiprocessing.spawn); diagnose times one process: run it on "
                             "one rank's loop without the launcher")
        for owner, name in ((dist, "init_process_group"), (tmp, "spawn"), (tmp, "start_processes")):
            if hasattr(owner, name):
                self._saved[owner, name] = getattr(owner, name)
                setattr(owner, name, refuse)

    def _wrap_init(self, original: Any) -> Any:
        probe, signature = self, inspect.signature(original)

        def __init__(loader: DataLoader, *args: Any, **kwargs: Any) -> None:
            index = len(probe.records)
            changes = probe.overrides.get(index, {})
            if changes:                  # DataLoader.__init__ has no **kwargs: all are named
                arguments = {**signature.bind(loader, *args, **kwargs).arguments, **changes}
                del arguments["self"]
                if arguments.get("num_workers", 0) == 0:
                    arguments.update(prefetch_factor=None, persistent_workers=False)
                args, kwargs = (), arguments     # a fix's workers may exceed torch's suggestion:
                setattr(loader, "check_worker_number_rationality", lambda: None)   # no warning
            original(loader, *args, **kwargs)
            if not getattr(loader, "_course_probe", None):     # a subclass calls super() once
                record = LoaderRecord(index, loader, _where(), changes)
                probe.records.append(record)
                loader._course_probe = record
        return __init__

    def _wrap_iter(self, original: Any) -> Any:
        def __iter__(loader: DataLoader) -> Any:
            t = _now()
            iterator = original(loader)
            record = getattr(loader, "_course_probe", None)
            if record is not None:
                record.epoch_starts(t)
                iterator._course_probe = record
                self.iterators.add(iterator)
            return iterator
        return __iter__

    def _wrap_next(self, original: Any) -> Any:
        def __next__(iterator: Any) -> Any:
            record = getattr(iterator, "_course_probe", None)
            if record is None:
                return original(iterator)
            own = not record.settings["num_workers"]        # the dataset runs in this thread
            busy0 = busy_s() if own else 0.0
            t0 = _now()
            record.step_ends(t0)
            if t0 >= self.deadline:
                self.stop()
                raise BudgetSpent()
            try:
                batch = original(iterator)
            except StopIteration:
                record.epoch_ends()
                raise
            t1 = _now()
            first = record.arrived(t0, t1, batch, busy_s() - busy0 if own else 0.0)
            record.sample(iterator, t1, force=first)
            return batch
        return __next__

    def stop(self) -> None:
        """Shut every loader's workers down (persistent ones too)."""
        for iterator in list(self.iterators):
            with contextlib.suppress(Exception):
                stop_workers(iterator)


def run_probe(config: dict) -> int:
    """Run the script of ``config`` (``script`` or ``module``, ``argv``, ``budget_s``,
    ``overrides``, ``out``, ``grace_s``) under a :class:`Probe`, write the figures to ``out``;
    the exit status: 0 (budget spent, script ended), the script's own, 1 (it raised), 130
    (Ctrl-C), 2 (out of scope or a usage error)."""
    probe = Probe(config["budget_s"], {int(k): v for k, v in config["overrides"].items()})
    end, status, error, raised = "the script ended", 0, None, None
    t_start = _now()
    sys.argv = [config.get("script") or config["module"], *config["argv"]]
    watchdog = threading.Timer(config["budget_s"] + config["grace_s"],
                               lambda: _write_and_exit(config, probe, t_start))
    watchdog.daemon = True
    probe.install()
    watchdog.start()
    try:
        if config.get("script"):
            sys.path.insert(0, str(Path(config["script"]).resolve().parent))
            runpy.run_path(config["script"], run_name="__main__")
        else:
            sys.path.insert(0, os.getcwd())
            runpy.run_module(config["module"], run_name="__main__", alter_sys=True)
    except BudgetSpent:
        end = BUDGET_ENDS[0]
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        end = USAGE_ERROR if script_error(exc)["usage"] else f"the script called sys.exit({exc.code!r})"
    except KeyboardInterrupt:
        end, status = "interrupted (Ctrl-C)", 130
    except OutOfScope as exc:
        end, status, error = OUT_OF_SCOPE, 2, str(exc)
    except Exception as exc:
        raised = script_error(exc)
        end, status, error = "the script raised", 1, raised.pop("traceback")
    finally:
        watchdog.cancel()
        probe.stop()
        probe.uninstall()
    _write(config, probe, end, status, error, _now() - t_start, raised)
    return status


def _write(config: dict, probe: Probe, end: str, status: int, error: str | None,
           elapsed_s: float, raised: dict | None = None) -> None:
    data = {"end": end, "status": status, "error": error, "raised": raised, "elapsed_s": elapsed_s,
            "cuda": torch.cuda.is_available() and torch.cuda.is_initialized(),
            "loaders": [r.to_dict() for r in probe.records]}
    Path(config["out"]).write_text(json.dumps(data))


def _write_and_exit(config: dict, probe: Probe, t_start: float) -> None:
    """The watchdog: no batch boundary long after the budget; write what was measured, exit."""
    _write(config, probe, BUDGET_ENDS[1], 0, None, _now() - t_start)
    os._exit(0)


def main() -> int:
    """``python -m course_utils.tools.diagnose.probe CONFIG.json`` (started by ``diagnose``)."""
    return run_probe(json.loads(Path(sys.argv[1]).read_text()))


if __name__ == "__main__":
    sys.exit(main())
