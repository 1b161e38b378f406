"""Grader for exercise 02: a ``worker_init_fn`` that limits every thread pool in the worker.

The learner writes ``limit_worker_threads(worker_id)``. The grader runs it where it matters:
as the ``worker_init_fn`` of a real DataLoader, in worker processes started with ``fork``
from this process *after* this process has used OpenCV's, BLAS's and torch's pools (what a
notebook that looked at a few images has always done). In each worker it records the pools
before and after the function, the environment variables it changed and the values it passed
to ``cv2.setNumThreads``; then the worker runs a real OpenCV-heavy sample (a course JPEG through
:class:`course_utils.lessons.l02_workload.OpenCVHeavyTransform`), a BLAS matrix product and a torch
op, and reports its pools again. The DataLoader has a timeout, and a worker that hangs dumps
its Python stack (``faulthandler``) before it is killed, so a deadlocking answer fails with a
message that says where it was stuck instead of hanging the notebook.

Why ``fork`` for a function written in a notebook: workers started with ``spawn`` or
``forkserver`` receive the ``worker_init_fn`` by pickling, which stores only its module and
name; a notebook function lives in ``__main__``, which those workers cannot import. ``fork``
copies the notebook process, function included. When the answer *is* importable (a function
in a module) the grader also runs it in fresh ``forkserver`` workers, where OpenCV really starts
its pool. Where ``fork`` does not exist (Windows) the grader sends the function's source code to
``spawn`` workers and runs it there.

Every pool must start above 1 thread in the worker, or an answer that does nothing would
"limit" it: on a machine with one CPU (BLAS sizes its pool from the CPUs) the grader raises each
BLAS pool below 2 threads to 2 in the worker before it calls the answer (OpenCV too, outside a
forked worker; in a forked one OpenCV reads the size this process set, 2), and the result names
any pool it could not raise as not checked. The course's own ``make_worker_init`` (or an answer
built on it) is refused: the exercise is to write it.
"""
from __future__ import annotations

import faulthandler
import inspect
import json
import multiprocessing
import os
import pickle
import re
import shutil
import tempfile
import textwrap
import traceback
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from ..grading import CheckResult, ExerciseFailed, grader, refuse_course_helper
from ..threads import (THREAD_ENV_VARS, ThreadPools, WorkerThreadLimiter, is_torch_openmp,
                       limit_threads, make_worker_init, thread_pools)

EXERCISE = "02.worker_init"

#: What the worker process remembers about the learner's call (one dict per worker process).
_STATE: dict[str, Any] = {}

_WHY_FORK = ("A notebook function can only reach workers started with 'fork' (they copy the "
             "notebook process); 'spawn' (the default on macOS and Windows) and 'forkserver' "
             "workers import what they run, so there the function must live in a module: "
             "course_utils.make_worker_init(1) is the course's version of it.")

#: the course's versions of the answer, refused (see refuse_course_helper)
_COURSE_LIMITERS = (make_worker_init, WorkerThreadLimiter, limit_threads)

_FIX = ("each library's own control over its running pool: threadpoolctl reaches the "
        "BLAS/OpenMP pools (for the worker's whole life, so not in a with-block), and OpenCV "
        "has a setting of its own, whose value for 'run sequentially' is not 1")


# --------------------------------------------------------------------------------------
# what runs in the worker
# --------------------------------------------------------------------------------------
def _env() -> dict[str, str | None]:
    return {v: os.environ.get(v) for v in THREAD_ENV_VARS}


class _ShippedSource:
    """Runs a function from its source code (for spawn workers that cannot import a notebook)."""

    def __init__(self, source: str, name: str) -> None:
        self.source, self.name = source, name

    def __call__(self, worker_id: int) -> Any:
        import cv2
        import threadpoolctl

        namespace: dict[str, Any] = {"os": os, "np": np, "numpy": np, "torch": torch, "cv2": cv2,
                                     "threadpoolctl": threadpoolctl,
                                     "threadpool_limits": threadpoolctl.threadpool_limits}
        exec(compile(self.source, f"<your {self.name}>", "exec"), namespace)
        return namespace[self.name](worker_id)


def _raise_small_pools(forked: bool) -> list[str]:
    """Raise every BLAS pool of this worker that runs fewer than 2 threads to 2, and OpenCV
    too outside a forked worker (in a forked one, resizing OpenCV's pool can hang; it reads the
    parent's size, which :func:`_use_parent_pools` set to 2). Without this, on a machine with
    one CPU the pools start at 1 and an answer that does nothing passes. Returns the pools
    raised, by name. Raising a BLAS pool is safe under fork (it starts fresh threads)."""
    import cv2
    import threadpoolctl

    start = thread_pools().pools
    for lib in threadpoolctl.ThreadpoolController().lib_controllers:
        if lib.user_api == "blas" and (lib.num_threads or 0) < 2:
            lib.set_num_threads(2)
    if not forked and cv2.getNumThreads() < 2:
        cv2.setNumThreads(2)
    return [name for name, n in thread_pools().pools.items() if n > start.get(name, n)]


class _GradedInit:
    """The DataLoader's worker_init_fn: calls the answer and records what it did."""

    def __init__(self, answer: Callable[[int], Any], folder: str, dump_after_s: float,
                 forked: bool) -> None:
        self.answer, self.folder, self.dump_after_s = answer, folder, dump_after_s
        self.forked = forked

    def __call__(self, worker_id: int) -> None:
        import gc

        import cv2

        if self.forked:
            # As make_worker_init does: keep the collector away from objects inherited from the
            # parent, whose finalizers can block on locks held by parent threads at fork time.
            # Unrelated to the pools this exercise is about; it only removes a rare false hang.
            gc.freeze()
        _STATE.clear()
        _STATE["raised"] = _raise_small_pools(self.forked)
        _STATE["before"] = thread_pools().to_dict()
        _STATE["env_before"] = _env()
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
        _STATE["after"] = thread_pools().to_dict()
        _STATE["env_after"] = _env()
        _STATE["cv2_calls"] = [repr(c) for c in calls]
        _STATE["cv2_nonzero"] = [c for c in calls if not (isinstance(c, int) and c == 0)]
        with open(os.path.join(self.folder, f"state{worker_id}.json"), "w") as f:
            json.dump({"after": _STATE["after"]}, f)  # read by the grader if the worker hangs later


class _WorkerProbe(Dataset):
    """One item per worker: real work on a course JPEG, then the worker's pools."""

    def __init__(self, n: int, jpeg: np.ndarray, folder: str, dump_after_s: float) -> None:
        self.n, self.jpeg, self.folder, self.dump_after_s = n, jpeg, folder, dump_after_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        from ..data import decode_jpeg
        from ..lessons.l02_workload import OpenCVHeavyTransform

        info = get_worker_info()
        wid = -1 if info is None else info.id
        dump = open(os.path.join(self.folder, f"stack_fetch{wid}.txt"), "w")
        faulthandler.dump_traceback_later(self.dump_after_s, file=dump)
        try:
            image = OpenCVHeavyTransform(work_side=384)(decode_jpeg(self.jpeg))
            a = np.random.default_rng(index).random((256, 256))
            float((a @ a).sum())                                 # BLAS
            float(torch.randn(64, 64).matmul(torch.randn(64, 64)).sum())  # torch's pool
        finally:
            faulthandler.cancel_dump_traceback_later()
            dump.close()
        return {"state": dict(_STATE), "pools": thread_pools().to_dict(), "worker": wid,
                "shape": tuple(image.shape)}


# --------------------------------------------------------------------------------------
# running it
# --------------------------------------------------------------------------------------
class _Hung(Exception):
    def __init__(self, method: str, where: str, stack: str, calls: list[str],
                 after: ThreadPools | None = None) -> None:
        super().__init__(where)
        self.method, self.where, self.stack, self.calls = method, where, stack, calls
        self.after = after  # the pools right after the answer returned, when it did


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


_FRAME_RE = re.compile(r'File "(?P<file>.+)", line (?P<line>\d+) in (?P<name>\S+)')
_LIBRARY_MARKS = ("site-packages", "dist-packages", f"{os.sep}lib{os.sep}python", "course_utils")


def _stuck_frames(stack: str) -> tuple[str | None, list[str]]:
    """From a faulthandler dump: the most recent frame of the worker's main thread, and the
    frames of the learner's code above the grader's own frame (most recent first)."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack)
    block = next((b for b in blocks if "ex02_worker_init.py" in b), stack)
    frames = [line.strip() for line in block.splitlines() if line.strip().startswith("File ")]
    top = frames[0] if frames else None
    user = []
    for frame in frames:
        if "ex02_worker_init.py" in frame and frame.endswith((" in __call__", " in __getitem__")):
            break  # the grader's own frame: what is below it is the worker's machinery
        if not any(mark in frame for mark in _LIBRARY_MARKS):
            user.append(frame)
    return top, user


def _with_code(frame: str) -> str:
    """``frame`` followed by its line of code, when it can be found."""
    import linecache

    m = _FRAME_RE.search(frame)
    if not m:
        return frame
    text = linecache.getline(m.group("file"), int(m.group("line"))).strip()
    return f"{frame}: `{text}`" if text else frame


def _use_parent_pools() -> int:
    """Use OpenCV's (>= 2 threads), BLAS's and torch's pools here, as a notebook would have.

    Returns OpenCV's thread count before, to restore after the check.
    """
    import cv2

    before = cv2.getNumThreads()
    if before < 2:
        cv2.setNumThreads(2)
    img = np.random.default_rng(0).integers(0, 255, (1024, 1024, 3), dtype=np.uint8)
    cv2.GaussianBlur(img, (15, 15), 0)
    a = np.random.default_rng(1).random((256, 256))
    a @ a
    torch.randn(128, 128) @ torch.randn(128, 128)
    return before


def _restore_opencv(before: int) -> None:
    import cv2

    if before < 2:
        cv2.setNumThreads(0 if before <= 1 else before)


def _stop_workers(iterator: Any, kill: bool) -> None:
    """Shut the DataLoader's workers down; with ``kill``, kill stuck ones first (at once,
    instead of the DataLoader's 5 s join per worker), after telling the DataLoader's SIGCHLD
    watch to ignore them (it would report the kill as a worker failure)."""
    if kill:
        try:
            from torch.utils.data import _utils

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
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _run_in_workers(init: Callable[[int], Any], method: str, num_workers: int,
                    timeout_s: float) -> list[dict]:
    """Start a real DataLoader with ``init`` as worker_init_fn; one answer per worker."""
    from ..data import JpegDataset

    folder = tempfile.mkdtemp(prefix="ex02_")
    dump_after = max(1.0, 0.75 * timeout_s)
    jpeg = np.array(JpegDataset(n=1, max_side=320).encoded(0))
    graded = _GradedInit(init, folder, dump_after, forked=method == "fork")
    thread_pools()  # registers course_utils.threads' before-fork hook in this process
    if method == "forkserver":
        from ..lessons.l02_workload import forkserver_context

        context = forkserver_context()
    else:
        context = multiprocessing.get_context(method)
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
                    expected="every worker to start, run it and deliver a sample",
                    seen=str(exc),
                    hint=("under spawn/forkserver a worker must import your function: it has "
                          "to live in a module, not in the notebook or in a script's "
                          "__main__. Look at the worker's error printed above.")) from None
            if "timed out" not in str(exc):
                raise
            stuck = sorted(set(range(num_workers)) - {a["worker"] for a in answers})
            wid = stuck[0] if stuck else 0
            init_stack = _read(os.path.join(folder, f"stack_init{wid}.txt"))
            fetch_stack = _read(os.path.join(folder, f"stack_fetch{wid}.txt"))
            calls = [c for c in _read(os.path.join(folder, f"calls{wid}.txt")).splitlines() if c]
            where = "init" if init_stack.strip() or not fetch_stack.strip() else "fetch"
            after = None
            saved = _read(os.path.join(folder, f"state{wid}.json"))
            if saved:
                after = ThreadPools.from_dict(json.loads(saved)["after"])
            raise _Hung(method, where, init_stack or fetch_stack, calls, after) from None
    finally:
        _stop_workers(iterator, kill=len(answers) < num_workers)
        shutil.rmtree(folder, ignore_errors=True)
    return sorted(answers, key=lambda a: a["worker"])


def _sendable(answer: Any) -> bool:
    """True when spawn/forkserver workers can receive ``answer`` (importable and picklable)."""
    module = getattr(answer, "__module__", None) or type(answer).__module__
    if module == "__main__":  # a notebook (or a script, which workers would re-run)
        return False
    try:
        pickle.dumps(answer)
    except Exception:
        return False
    return True


def _shipped(answer: Callable) -> _ShippedSource:
    name = getattr(answer, "__name__", "")
    try:
        source = textwrap.dedent(inspect.getsource(answer))
    except (OSError, TypeError):
        source = ""
    if not source or not name.isidentifier():
        raise ExerciseFailed(
            EXERCISE, "this platform has no 'fork', and the grader could not read the source "
                      "of your function to send it to 'spawn' workers.",
            expected="a function defined with `def` in a notebook cell",
            seen=repr(answer), hint=_WHY_FORK)
    return _ShippedSource(source, name)


# --------------------------------------------------------------------------------------
# reading the answers
# --------------------------------------------------------------------------------------
def _pools_text(p: ThreadPools) -> str:
    return ", ".join(f"{name} {n}" for name, n in p.pools.items())


def _over(p: ThreadPools, n: int = 1) -> dict[str, int]:
    return {name: k for name, k in p.pools.items() if k > n}


def seen_text(hung: _Hung, timeout_s: float) -> str:
    """Where a stuck worker was: inside the answer (at which of its lines) or after it."""
    top, user = _stuck_frames(hung.stack)
    if hung.where == "init":
        place = (f"at {_with_code(user[0])}" if user else
                 "in a library call" if top is None else f"in {_with_code(top)}")
        phase = "inside your function,"
    else:
        place = _with_code(top) if top else "in a library call"
        phase = "after your function returned, while loading the first sample, in"
    return f"worker stuck {phase} {place} (no answer within the DataLoader timeout of {timeout_s:g} s)"


def _hung_failure(hung: _Hung, timeout_s: float) -> ExerciseFailed:
    seen = seen_text(hung, timeout_s)
    in_cv2 = "recording_set_num_threads" in hung.stack  # stuck inside a cv2.setNumThreads call
    last = hung.calls[-1] if hung.calls else None        # logged just before the call
    nonzero = [c for c in hung.calls if c != "0"]
    # `from cv2 import setNumThreads` bypasses the recorder: read the stuck line instead
    line = re.search(r"setNumThreads\((.*?)\)`", seen)
    if not in_cv2 and not nonzero and line and line.group(1).strip() != "0":
        nonzero = [line.group(1).strip()]
    if in_cv2 and last == "0":
        return ExerciseFailed(
            EXERCISE, "the worker hung in cv2.setNumThreads(0) (rare).",
            expected="every worker to finish its set-up and deliver a sample", seen=seen,
            hint=("cv2.setNumThreads(0) is the right call and normally returns at once; a hang "
                  "there comes from a lock another thread of this notebook held at the moment "
                  "of the fork. Run the check again; if it keeps happening, restart the kernel "
                  "and run only this notebook."))
    if in_cv2 or nonzero:
        value = last if in_cv2 else nonzero[-1]
        return ExerciseFailed(
            EXERCISE, f"deadlock: cv2.setNumThreads({value}) hung in a forked worker.",
            expected="every worker to finish its set-up and deliver a sample",
            seen=seen + (f"; your function had called cv2.setNumThreads({', '.join(hung.calls)})"
                         if hung.calls else ""),
            hint=("this process had used OpenCV's thread pool before the workers were forked. "
                  "fork copies only the calling thread, so the worker inherits the pool's "
                  f"bookkeeping but not its threads; cv2.setNumThreads({value}) stops and joins "
                  "those threads, which do not exist in the worker, and waits forever. "
                  "cv2.setNumThreads(0) means 'run sequentially' without touching the pool, and "
                  "is safe under fork, forkserver and spawn."))
    if hung.where == "fetch" and hung.after is not None and hung.after.torch_intra > 1:
        return ExerciseFailed(
            EXERCISE, f"the worker hung: torch at {hung.after.torch_intra} threads in a forked "
                      f"worker.",
            expected="every pool at 1 thread, and every worker delivering a sample", seen=seen,
            hint=("your function raised torch's thread count (with torch.set_num_threads, or "
                  "with a threadpoolctl limit above 1, which also sizes torch's OpenMP runtime). "
                  "That runtime (GNU libgomp) is not fork-safe: in a forked worker whose parent "
                  "had used it, the first parallel torch operation with more than one thread "
                  "waits forever for threads fork did not copy. The DataLoader sets 1 in every "
                  "worker: keep it, and bring the other pools down to 1, never up."))
    return ExerciseFailed(
        EXERCISE, f"the worker hung ({hung.method} start method).",
        expected="every worker to finish its set-up and deliver a sample", seen=seen,
        hint=("in a forked worker, resizing a thread pool the parent had used can wait for "
              "threads that fork did not copy: only ever bring pools down to 1 thread (for "
              "OpenCV, with the value that means 'sequential'); never ask for more than 1 "
              "thread in a forked worker."))


def _started_at_one(before: ThreadPools) -> list[str]:
    """Pools already at 1 thread before the answer ran (so the check cannot show that the
    answer limits them), except torch's, which the DataLoader sets to 1 in every worker."""
    names = list(before.pools)
    blas_names = names[len(names) - len(before.blas):]   # pools lists the BLAS/OpenMP ones last
    torch_omp = {name for name, entry in zip(blas_names, before.blas) if is_torch_openmp(entry)}
    return [name for name, n in before.pools.items()
            if n <= 1 and name != "torch intra-op" and name not in torch_omp]


def _judge(answers: list[dict], method: str) -> tuple[ThreadPools, dict]:
    """Raise ExerciseFailed unless every worker ended with every pool at 1 thread."""
    first = answers[0]["state"]
    if first.get("not_implemented"):
        raise NotImplementedError(first.get("error"))
    for a in answers:
        state = a["state"]
        if "error" in state:
            raise ExerciseFailed(
                EXERCISE, f"your function raised {state['error']} in DataLoader worker "
                          f"{a['worker']}.",
                expected="it to return None after limiting the pools",
                seen=state.get("traceback", state["error"]).strip(),
                hint="the traceback shows the line of your function that failed; a worker "
                     "runs your function with the notebook's imports (under fork), so import "
                     "what it uses (cv2, threadpoolctl, torch) in the notebook.")
    for a in answers:
        nonzero = a["state"].get("cv2_nonzero", [])
        if method == "fork" and nonzero:
            calls = ", ".join(a["state"].get("cv2_calls", []))
            raise ExerciseFailed(
                EXERCISE, f"deadlock risk: cv2.setNumThreads({nonzero[0]!r}) in a forked worker.",
                expected="cv2.setNumThreads(0) in workers (0 = run sequentially)",
                seen=f"your function called cv2.setNumThreads({calls}) in worker {a['worker']}; "
                     f"it returned this time",
                hint=("this process had used OpenCV's pool before the workers were forked. A "
                      "forked worker has the pool's bookkeeping but not its threads, and "
                      "setNumThreads(1) (any size but 0) stops and joins those threads: in "
                      "the course's measurements it hangs in 9 out of 10 forks. "
                      "cv2.setNumThreads(0) runs OpenCV sequentially without touching the pool "
                      "and is safe under every start method."))
    worst = max(answers, key=lambda a: ThreadPools.from_dict(a["pools"]).total_max)
    pools = ThreadPools.from_dict(worst["pools"])
    before = ThreadPools.from_dict(worst["state"]["before"])
    after = ThreadPools.from_dict(worst["state"]["after"])
    if pools.limited_to(1):
        return pools, {"before": before.to_dict(), "after": after.to_dict(),
                       "raised": list(worst["state"].get("raised", [])),
                       "not_checked": _started_at_one(before)}

    over = _over(pools)
    unchanged = {k: v for k, v in over.items() if before.pools.get(k) == v}
    env_set = sorted(v for v in THREAD_ENV_VARS
                     if worst["state"]["env_after"].get(v) != worst["state"]["env_before"].get(v))
    seen = (f"in worker {worst['worker']}, before your function: {_pools_text(before)}; "
            f"while it loaded a sample: {_pools_text(pools)}")
    changed = {k for k in before.pools if before.pools[k] != after.pools.get(k)}
    if env_set and not changed:
        raise ExerciseFailed(
            EXERCISE, "environment variables set inside a running process do not resize its "
                      "thread pools.",
            expected="every pool at 1 thread", seen=seen + f"; your function set {', '.join(env_set)}",
            hint=("each library reads its variable once: BLAS and torch's OpenMP when they are "
                  "loaded, OpenCV when its pool is first used. The worker already has them loaded "
                  "and used (it is a copy of the notebook process, or imported them to unpickle "
                  "the dataset), so the pools stayed as they were: "
                  f"{', '.join(f'{k} {v}' for k, v in unchanged.items())}. Variables only help "
                  f"before the libraries load (in the shell, or at the very top of a script). "
                  f"Limit the running pools instead, with {_FIX}."))
    if before.torch_intra == 1 and set(changed) <= {"torch intra-op"} and "torch intra-op" not in over:
        raise ExerciseFailed(
            EXERCISE, "torch was already at 1 thread in the worker; OpenCV and BLAS are not.",
            expected="every pool at 1 thread", seen=seen,
            hint=("the DataLoader calls torch.set_num_threads(1) in every worker before your "
                  "worker_init_fn runs, so torch.set_num_threads(1) there changes nothing. "
                  "The pools that stay big are OpenCV's and the BLAS/OpenMP libraries' "
                  f"({', '.join(over)}). (In a forked worker OpenCV may only *read* its old "
                  "size, its threads were not copied; spawn and forkserver workers, or fork "
                  "workers of a process that had not used OpenCV yet, start a real pool of "
                  f"that size.) Limit those too, with {_FIX}."))
    hints = []
    if any(name == "OpenCV" for name in over):
        hints.append("OpenCV is not a pool threadpoolctl can see: OpenCV has its own thread "
                     "setting (look up which value means 'sequential': 1 can deadlock in a "
                     "forked worker)")
    blas = [name for name in over if name not in ("OpenCV", "torch intra-op")]
    if blas:
        hints.append(f"{', '.join(blas)}: threadpoolctl limits these, but the limit must "
                     f"outlast your function, so call it without `with` (a with-block gives the "
                     f"limit back when it ends, before the worker loads anything), and limit to "
                     f"1 thread")
    if "torch intra-op" in over:
        hints.append("torch: the DataLoader sets 1 thread in every worker; do not raise it")
    raise ExerciseFailed(
        EXERCISE, f"{len(over)} pool(s) still run more than 1 thread in the worker: "
                  f"{', '.join(f'{k} {v}' for k, v in over.items())}.",
        expected="every pool at 1 thread", seen=seen, hint="; ".join(hints) + ".")


@grader(EXERCISE)
def grade_worker_init(answer: Callable[[int], Any], *, num_workers: int = 2,
                      timeout_s: float = 20.0, start_method: str | None = None,
                      fresh_check: bool | None = None) -> CheckResult:
    """Run ``answer`` as the worker_init_fn of real DataLoader workers and inspect their pools.

    ``start_method``: None picks 'fork' where it exists (the answer may be a notebook
    function), else 'spawn' (the source is sent when the function cannot be pickled).
    ``timeout_s`` is the DataLoader timeout in seconds: a worker that does not answer in time
    fails the check with the place it was stuck. ``fresh_check``: also run the answer in
    'forkserver' workers (fresh pools) when it can be sent there; None = when it can.
    """
    if not callable(answer):
        raise ExerciseFailed(EXERCISE, "the answer is not a function.",
                             expected="a function limit_worker_threads(worker_id)",
                             seen=f"{type(answer).__name__}: {answer!r}")
    refuse_course_helper(EXERCISE, answer, _COURSE_LIMITERS,
                         write="in limit_worker_threads, bring each library's pool in the worker "
                               "down to 1 thread with that library's own call")
    try:
        inspect.signature(answer).bind(0)
    except TypeError:
        raise ExerciseFailed(EXERCISE, "a worker_init_fn is called with one argument, the "
                                       "worker id.",
                             expected="def limit_worker_threads(worker_id): ...",
                             seen=f"{getattr(answer, '__name__', answer)}{inspect.signature(answer)}")
    except ValueError:
        pass  # builtins without a signature: let the real call decide
    methods = multiprocessing.get_all_start_methods()
    method = start_method or ("fork" if "fork" in methods else "spawn")
    if method not in methods:
        raise ValueError(f"start_method={start_method!r} is not available here; use one of {methods}.")
    sendable = _sendable(answer)
    init: Callable[[int], Any] = answer
    if method != "fork" and not sendable:
        init = _shipped(answer)

    opencv_before = _use_parent_pools()
    try:
        try:
            answers = _run_in_workers(init, method, num_workers, timeout_s)
        except _Hung as hung:
            raise _hung_failure(hung, timeout_s) from None
        pools, details = _judge(answers, method)
        fresh_note = ""
        do_fresh = sendable if fresh_check is None else fresh_check
        if do_fresh and method == "fork" and "forkserver" in methods:
            try:
                fresh = _run_in_workers(answer, "forkserver", 1, max(timeout_s, 60.0))
            except _Hung as hung:
                raise _hung_failure(hung, max(timeout_s, 60.0)) from None
            fresh_pools, _ = _judge(fresh, "forkserver")
            details["forkserver"] = fresh_pools.to_dict()
            fresh_note = f" Also in a fresh forkserver worker: {_pools_text(fresh_pools)}."
    finally:
        _restore_opencv(opencv_before)
    details["start_method"] = method
    if method == "fork" and not sendable:
        where = " It ran under fork. " + _WHY_FORK
    elif method == "fork":
        where = " It is importable, so it also works in spawn and forkserver workers."
    else:
        where = f" It ran under {method}."
    summary = (f"in {num_workers} real DataLoader workers ({method}, after this process had used "
               f"OpenCV, BLAS and torch) every pool ran 1 thread: {_pools_text(pools)}."
               + fresh_note + where)
    if details["raised"]:
        summary += (f" On this machine {', '.join(details['raised'])} started at 1 thread (as "
                    f"on a machine with one CPU): the grader raised them to 2 in each worker before your function "
                    f"ran, so that limiting them shows.")
    if details["not_checked"]:
        summary += (f" NOT checked: {', '.join(details['not_checked'])} already ran 1 thread "
                    f"before your function, and the grader could not raise them, so this machine "
                    f"cannot show whether your function limits them.")
    return CheckResult(EXERCISE, summary, details)
