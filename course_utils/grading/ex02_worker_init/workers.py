"""Exercise 02's grader in real DataLoader workers: a worker_init_fn recording what the answer did,
a Dataset reporting the pools after real work, and the run that reads a hung worker's stack."""
from __future__ import annotations

import faulthandler
import gc
import json
import linecache
import multiprocessing
import os
import re
import shutil
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np
import threadpoolctl
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from course_utils.data import JpegDataset, decode_jpeg
from course_utils.lessons.l02_threads import OpenCVHeavyTransform, forkserver_context
from course_utils.threads import THREAD_ENV_VARS, ThreadPools, thread_pools

from ..checker import ExerciseFailed

EXERCISE = "02.worker_init"

#: This file, as a worker's stack names it: the frames of the grader's own code.
OWN_FILE = os.path.join("ex02_worker_init", "workers.py")

#: What the worker process remembers about the learner's call (one dict per worker process).
_STATE: dict[str, Any] = {}

def _env() -> dict[str, str | None]:
    return {v: os.environ.get(v) for v in THREAD_ENV_VARS}


def _raise_small_pools(forked: bool) -> list[str]:
    """Raise BLAS (and, unforked, OpenCV) pools to 2, so a do-nothing answer fails on 1 CPU."""
    start = thread_pools().pools
    for lib in threadpoolctl.ThreadpoolController().lib_controllers:
        if lib.user_api == "blas" and (lib.num_threads or 0) < 2:
            lib.set_num_threads(2)
    if not forked and cv2.getNumThreads() < 2:
        cv2.setNumThreads(2)
    return [name for name, n in thread_pools().pools.items() if n > start.get(name, n)]


class _GradedInit:
    """The DataLoader's worker_init_fn: calls the answer and records what it did."""

    def __init__(self, answer: Callable[[int], Any], folder: str, dump_after_s: float, forked: bool) -> None:
        self.answer, self.folder, self.dump_after_s, self.forked = answer, folder, dump_after_s, forked

    def __call__(self, worker_id: int) -> None:
        if self.forked:  # as make_worker_init does: no finalizer of an inherited object runs
            gc.freeze()  # here (it could block on a lock held at fork time: a rare false hang)
        _STATE.clear()
        _STATE.update(raised=_raise_small_pools(self.forked), before=thread_pools().to_dict(),
                      env_before=_env())
        calls: list = []
        real = cv2.setNumThreads
        log = open(os.path.join(self.folder, f"calls{worker_id}.txt"), "w")

        def recording_set_num_threads(n: Any) -> Any:
            calls.append(n)
            log.write(f"{n!r}\n")
            log.flush()
            return real(n)

        dump = open(os.path.join(self.folder, f"stack_init{worker_id}.txt"), "w")
        cv2.setNumThreads = recording_set_num_threads
        faulthandler.dump_traceback_later(self.dump_after_s, file=dump)
        try:
            self.answer(worker_id)
        except BaseException as exc:  # the learner's code can raise anything
            _STATE["error"] = f"{type(exc).__name__}: {exc}"
            # the learner's frames only (skip this wrapper's own frame)
            _STATE["traceback"] = "".join(traceback.format_exception(
                type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None))
            _STATE["not_implemented"] = isinstance(exc, NotImplementedError)
        finally:
            faulthandler.cancel_dump_traceback_later()
            cv2.setNumThreads = real
            dump.close()
            log.close()
        _STATE.update(after=thread_pools().to_dict(), env_after=_env(), cv2_calls=[repr(c) for c in calls],
                      cv2_nonzero=[c for c in calls if not (isinstance(c, int) and c == 0)])
        with open(os.path.join(self.folder, f"state{worker_id}.json"), "w") as f:
            json.dump({"after": _STATE["after"]}, f)  # read by the grader if the worker hangs later


class _WorkerProbe(Dataset):
    """One item per worker: real work on a course JPEG, then the worker's pools."""

    def __init__(self, n: int, jpeg: np.ndarray, folder: str, dump_after_s: float) -> None:
        self.n, self.jpeg, self.folder, self.dump_after_s = n, jpeg, folder, dump_after_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        info = get_worker_info()
        wid = -1 if info is None else info.id
        dump = open(os.path.join(self.folder, f"stack_fetch{wid}.txt"), "w")
        faulthandler.dump_traceback_later(self.dump_after_s, file=dump)
        try:
            OpenCVHeavyTransform(work_side=384)(decode_jpeg(self.jpeg))
            a = np.random.default_rng(index).random((256, 256))
            float((a @ a).sum())                                 # BLAS
            float(torch.randn(64, 64).matmul(torch.randn(64, 64)).sum())  # torch's pool
        finally:
            faulthandler.cancel_dump_traceback_later()
            dump.close()
        return {"state": dict(_STATE), "pools": thread_pools().to_dict(), "worker": wid}


# ---- running it ------------------------------------------------------------------------------
class Hung(Exception):
    """A worker that did not answer in time: where it was stuck, and what it had done."""

    def __init__(self, method: str, where: str, stack: str, calls: list[str],
                 after: ThreadPools | None = None) -> None:
        super().__init__(where)
        self.method, self.where, self.stack, self.calls = method, where, stack, calls
        self.after = after  # the pools right after the answer returned, when it did


_FRAME_RE = re.compile(r'File "(?P<file>.+)", line (?P<line>\d+) in (?P<name>\S+)')
_LIBRARY_MARKS = ("site-packages", "dist-packages", f"{os.sep}lib{os.sep}python", "course_utils")


def stuck_frames(stack: str) -> tuple[str | None, list[str]]:
    """From a faulthandler dump: the latest frame, and the learner's frames (latest first)."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack)
    block = next((b for b in blocks if OWN_FILE in b), stack)
    frames = [line.strip() for line in block.splitlines() if line.strip().startswith("File ")]
    top = frames[0] if frames else None
    user = []
    for frame in frames:
        if OWN_FILE in frame and frame.endswith((" in __call__", " in __getitem__")):
            break  # the grader's own frame: what is below it is the worker's machinery
        if not any(mark in frame for mark in _LIBRARY_MARKS):
            user.append(frame)
    return top, user


def with_code(frame: str) -> str:
    """``frame`` followed by its line of code, when it can be found."""
    m = _FRAME_RE.search(frame)
    if not m:
        return frame
    text = linecache.getline(m.group("file"), int(m.group("line"))).strip()
    return f"{frame}: `{text}`" if text else frame


def use_parent_pools() -> int:
    """Use OpenCV's (>= 2 threads), BLAS's and torch's pools here; OpenCV's count before."""
    before = cv2.getNumThreads()
    if before < 2:
        cv2.setNumThreads(2)
    img = np.random.default_rng(0).integers(0, 255, (1024, 1024, 3), dtype=np.uint8)
    cv2.GaussianBlur(img, (15, 15), 0)
    a = np.random.default_rng(1).random((256, 256))
    a @ a
    torch.randn(128, 128) @ torch.randn(128, 128)
    return before


def _stop_workers(iterator: Any, kill: bool) -> None:
    """Shut the workers down; ``kill``: stuck ones first, hidden from the SIGCHLD watch."""
    if kill:
        try:
            from torch.utils.data import _utils  # in the try: a private module that may move

            if getattr(iterator, "_worker_pids_set", False):
                _utils.signal_handling._remove_worker_pids(id(iterator))
                iterator._worker_pids_set = False
        except Exception:  # private API: if it moved, the DataLoader's own shutdown still works
            pass
        else:
            for w in getattr(iterator, "_workers", []):
                if w.is_alive():
                    w.kill()
                    w.join(timeout=5)
    getattr(iterator, "_shutdown_workers", lambda: None)()


def run_in_workers(init: Callable[[int], Any], method: str, num_workers: int, timeout_s: float) -> list[dict]:
    """Start a real DataLoader with ``init`` as worker_init_fn; one answer per worker."""
    folder = tempfile.mkdtemp(prefix="ex02_")
    dump_after = max(1.0, 0.75 * timeout_s)
    jpeg = np.array(JpegDataset(n=1, max_side=320).encoded(0))
    graded = _GradedInit(init, folder, dump_after, forked=method == "fork")
    thread_pools()  # registers course_utils.fork_safety's before-fork hook in this process
    context = forkserver_context() if method == "forkserver" else multiprocessing.get_context(method)
    # a timeout under every method: it is how an init that hangs is caught. The price: under
    # forkserver (and spawn on Windows) a worker that died at start-up is reported only when it ends
    loader = DataLoader(_WorkerProbe(num_workers, jpeg, folder, dump_after), batch_size=None,
                        num_workers=num_workers, worker_init_fn=graded,
                        multiprocessing_context=context, timeout=timeout_s)
    iterator = iter(loader)
    answers: list[dict] = []
    try:
        try:
            for item in iterator:
                answers.append(item)
        except RuntimeError as exc:
            if "exited unexpectedly" in str(exc):
                raise ExerciseFailed(
                    EXERCISE, f"a DataLoader worker ({method}) died while running your function.",
                    expected="every worker to start, run it and deliver a sample", seen=str(exc),
                    hint=("under spawn/forkserver a worker must import your function: it has "
                          "to live in a module (or a script's top level), not in a notebook "
                          "cell. Look at the worker's error printed above.")) from None
            if "timed out" not in str(exc):
                raise
            wid = min(set(range(num_workers)) - {a["worker"] for a in answers}, default=0)
            init_stack, fetch_stack, calls, saved = (
                p.read_text() if p.is_file() else "" for p in (Path(folder) / f"{name}{wid}.{ext}"
                for name, ext in (("stack_init", "txt"), ("stack_fetch", "txt"),
                                  ("calls", "txt"), ("state", "json"))))
            where = "init" if init_stack.strip() or not fetch_stack.strip() else "fetch"
            after = ThreadPools.from_dict(json.loads(saved)["after"]) if saved else None
            raise Hung(method, where, init_stack or fetch_stack,
                       [c for c in calls.splitlines() if c], after) from None
    finally:
        _stop_workers(iterator, kill=len(answers) < num_workers)
        shutil.rmtree(folder, ignore_errors=True)
    return sorted(answers, key=lambda a: a["worker"])


