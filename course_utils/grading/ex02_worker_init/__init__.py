"""Grader for exercise 02: ``make_budget_init(cpu_budget)``'s picklable worker_init_fn gives every
pool ``max(1, cpu_budget // num_workers)`` threads, 1 under ``fork``; judged in real DataLoaders
(:data:`RUNS`) from the pools each worker reports, or where a hung one was stuck."""
from __future__ import annotations

import multiprocessing
import pickle
import re
from typing import Any, Callable

import cv2

from course_utils.threads import THREAD_ENV_VARS, ThreadPools, is_torch_openmp

from ..checker import (CheckResult, ExerciseFailed, call_answer, grader, refuse_course_code,
                       require_signature)
from .workers import EXERCISE, Hung, run_in_workers, stuck_frames, use_parent_pools, with_code

from .share import SHARE, grade_share      # step 1: the share alone (importing registers it)

__all__ = ["EXERCISE", "SHARE", "grade_share", "grade_worker_init"]

#: The graded runs: (start method, cpu_budget, num_workers); "fresh" is forkserver, or spawn
#: where there is no forkserver. A forked worker must run 1 thread per pool whatever its share.
RUNS = (("fork", 7, 2), ("fresh", 7, 2), ("fresh", 1, 2))

_FIX = ("each library's own control over its running pool: threadpoolctl reaches the "
        "BLAS/OpenMP pools (for the worker's whole life, so not in a with-block), and OpenCV "
        "has a setting of its own, whose value for 'run sequentially' is not 1")


def _pools_text(pools: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in pools.items())


def _hung_failure(hung: Hung, timeout_s: float, clamp: str) -> ExerciseFailed:
    """The failure of a worker that gave no answer: where it was stuck, and why it can hang."""
    top, user = stuck_frames(hung.stack)
    if hung.where == "init":
        place = (f"at {with_code(user[0])}" if user else
                 "in a library call" if top is None else f"in {with_code(top)}")
        seen = f"worker stuck inside your function, {place}"
    else:
        seen = ("worker stuck after your function returned, while loading the first sample, in "
                + (with_code(top) if top else "a library call"))
    seen += f" (no answer within the DataLoader timeout of {timeout_s:g} s)"
    in_cv2 = "recording_set_num_threads" in hung.stack  # stuck inside a cv2.setNumThreads call
    last = hung.calls[-1] if hung.calls else None        # logged just before the call
    nonzero = [c for c in hung.calls if c != "0"]
    # `from cv2 import setNumThreads` bypasses the recorder: read the stuck line instead
    line = re.search(r"setNumThreads\((.*?)\)`", seen)
    if not in_cv2 and not nonzero and line and line.group(1).strip() != "0":
        nonzero = [line.group(1).strip()]
    expected = "every worker to finish its set-up and deliver a sample"
    if in_cv2 and last == "0":
        return ExerciseFailed(EXERCISE, "the worker hung in cv2.setNumThreads(0) (rare).",
                              expected=expected, seen=seen, hint=(
            "that call is right and normally returns at once; a hang there comes from a lock "
            "another thread of this notebook held at the moment of the fork. Run the check again; "
            "if it keeps happening, restart the kernel and run only this notebook."))
    if in_cv2 or nonzero:
        value = last if in_cv2 else nonzero[-1]
        return ExerciseFailed(
            EXERCISE, f"deadlock: cv2.setNumThreads({value}) hung in a forked worker.",
            expected=expected, seen=seen + (f"; your function had called cv2.setNumThreads("
                                            f"{', '.join(hung.calls)})" if hung.calls else ""),
            hint=clamp + "This process had used OpenCV's thread pool before the workers were forked. fork "
                 "copies only the calling thread, so the worker inherits the pool's bookkeeping but not its "
                 f"threads; cv2.setNumThreads({value}) stops and joins those threads, which do not exist in "
                 "the worker, and waits forever. cv2.setNumThreads(0) means 'run sequentially' without "
                 "touching the pool, and is safe under fork, forkserver and spawn.")
    if hung.where == "fetch" and hung.after is not None and hung.after.torch_intra > 1:
        return ExerciseFailed(
            EXERCISE, f"the worker hung: torch at {hung.after.torch_intra} threads in a forked "
                      f"worker.", seen=seen,
            expected="every pool at 1 thread, and every worker delivering a sample",
            hint=clamp + "Your function raised torch's thread count (torch.set_num_threads, or a "
                 "threadpoolctl limit above 1, which also sizes torch's OpenMP runtime). That runtime (GNU "
                 "libgomp) is not fork-safe: in a forked worker whose parent had used it, the first parallel "
                 "torch operation waits forever for threads fork did not copy.")
    return ExerciseFailed(
        EXERCISE, f"the worker hung ({hung.method} start method).", expected=expected, seen=seen,
        hint=clamp + "In a forked worker, resizing a thread pool the parent had used can wait "
             "for threads that fork did not copy: only ever bring pools down to 1 thread there "
             "(for OpenCV, with the value that means 'sequential').")


def _clamp(method: str, budget: int, workers: int) -> str:
    """The start of a hint for a forked worker whose share of the budget is above 1."""
    share = max(1, budget // workers)
    return (f"This worker was started with fork, so the task asks for 1 thread per pool in it, "
            f"whatever its share of the budget ({budget} CPUs // {workers} workers = {share}). "
            if method == "fork" and share > 1 else "")


def _not_shown(before: ThreadPools, expect: int) -> list[str]:
    """Pools at ``expect`` before the answer ran (not torch's for 1: the DataLoader sets them)."""
    names = list(before.pools)
    blas_names = names[len(names) - len(before.blas):]   # pools lists the BLAS/OpenMP ones last
    torch_omp = {name for name, entry in zip(blas_names, before.blas) if is_torch_openmp(entry)}
    skip = {"torch intra-op"} | torch_omp if expect == 1 else set()
    return [name for name, n in before.pools.items() if n == expect and name not in skip]


def _init_for(answer: Callable[[int], Any], budget: int) -> Callable[[int], Any]:
    """``answer(budget)``, checked to be a worker_init_fn spawn/forkserver workers can receive."""
    name = f"{getattr(answer, '__name__', 'make_budget_init')}({budget})"
    init = call_answer(EXERCISE, answer, budget, what=name)
    if not callable(init):
        raise ExerciseFailed(EXERCISE, f"{name} returned {type(init).__name__}, not a "
                                       f"worker_init_fn.", expected="a callable taking the worker id")
    refuse_course_code(EXERCISE, init)
    require_signature(EXERCISE, init, "a worker_init_fn is called with one argument, the worker "
                      "id.", f"{name}(worker_id)", 0)
    try:  # a notebook's function or class is found by pickle here, but not in fresh workers
        data = b"__main__" if getattr(init, "__module__", None) == "__main__" else pickle.dumps(init)
    except Exception as exc:
        raise ExerciseFailed(
            EXERCISE, f"what {name} returned cannot be pickled, so spawn and forkserver workers "
                      f"cannot receive it.",
            expected="a worker_init_fn that pickle can send", seen=f"{type(exc).__name__}: {exc}",
            hint="pickle stores a function or a class by its module and name, and a function made "
                 "inside another one (a closure, a lambda) has neither. Return something pickle "
                 "can find by name that still carries the budget.") from None
    if b"__main__" in data:
        raise ExerciseFailed(
            EXERCISE, "your worker_init_fn is defined in the notebook (__main__).",
            expected="make_budget_init and what it returns defined in a module",
            seen=f"{name} returned {init!r}",
            hint="spawn and forkserver workers receive the worker_init_fn by pickle, which stores "
                 "only a module and a name, and they cannot import a notebook (__main__): lesson "
                 "00 showed it. Write make_budget_init and what it returns into a module with a "
                 "%%writefile cell, as lesson 02 did with lesson02_workers.py, and import it.")
    return init


def _judge(answers: list[dict], method: str, budget: int, workers: int) -> dict:
    """Fail unless every worker's pools are at its share (1 if forked); the worst one's report."""
    if answers[0]["state"].get("not_implemented"):
        raise NotImplementedError(answers[0]["state"].get("error"))
    clamp = _clamp(method, budget, workers)
    for a in answers:
        state = a["state"]
        if "error" in state:
            raise ExerciseFailed(
                EXERCISE, f"your function raised {state['error']} in DataLoader worker "
                          f"{a['worker']} ({method}; a budget of {budget} CPUs, {workers} workers).",
                expected="it to return None after sizing the pools",
                seen=state.get("traceback", state["error"]).strip(),
                hint="the traceback shows the line of your function that failed; a worker "
                     "imports your module, so import there everything the function uses.")
        if method == "fork" and state.get("cv2_nonzero"):
            raise ExerciseFailed(
                EXERCISE, f"deadlock risk: cv2.setNumThreads({state['cv2_nonzero'][0]!r}) in a "
                          f"forked worker.",
                expected="cv2.setNumThreads(0) in forked workers (0 = run sequentially)",
                seen=f"your function called cv2.setNumThreads({', '.join(state['cv2_calls'])}) "
                     f"in worker {a['worker']}; it returned this time",
                hint=clamp + "This process had used OpenCV's pool before the workers were forked. "
                     "A forked worker has the pool's bookkeeping but not its threads, and "
                     "setNumThreads(1) (any size but 0) stops and joins those threads: in the "
                     "course's measurements it hangs in 9 out of 10 forks. cv2.setNumThreads(0) "
                     "runs OpenCV sequentially without touching the pool, under every start method.")
    expect = 1 if method == "fork" else max(1, budget // workers)
    worst = max(answers, key=lambda a: sum(v != expect for v in
                                           ThreadPools.from_dict(a["pools"]).pools.values()))
    state = worst["state"]
    pools, before, after = (ThreadPools.from_dict(d) for d in (worst["pools"], state["before"],
                                                                state["after"]))
    report = {"start_method": method, "cpu_budget": budget, "num_workers": workers,
              "expected": expect, "pools": pools.to_dict(), "raised": list(state.get("raised", [])),
              "not_checked": _not_shown(before, expect)}
    wrong = {k: v for k, v in pools.pools.items() if v != expect}
    if not wrong:
        return report
    seen = (f"in worker {worst['worker']} ({method}), before your function: {_pools_text(before.pools)}; "
            f"while it loaded a sample: {_pools_text(pools.pools)}")
    if expect > 1:
        _share_failure(wrong, seen, budget, workers, expect, len(pools.pools))
    over = {name: k for name, k in pools.pools.items() if k > 1}
    env_set = sorted(v for v in THREAD_ENV_VARS if state["env_after"].get(v) != state["env_before"].get(v))
    changed = {k for k in before.pools if before.pools[k] != after.pools.get(k)}
    if env_set and not changed:
        unchanged = _pools_text({k: v for k, v in over.items() if before.pools.get(k) == v})
        raise ExerciseFailed(
            EXERCISE, "environment variables set inside a running process do not resize its thread pools.",
            expected="every pool at 1 thread", seen=seen + f"; your function set {', '.join(env_set)}",
            hint="each library reads its variable once: BLAS and torch's OpenMP when they are loaded, OpenCV "
                 "when its pool is first used. The worker already has them loaded and used (it is a copy of "
                 "the notebook process, or imported them to unpickle the dataset), so the pools stayed as "
                 f"they were: {unchanged}. Variables only help before the libraries load (in the shell, or "
                 f"at the very top of a script). Limit the running pools instead, with {_FIX}.")
    if before.torch_intra == 1 and changed <= {"torch intra-op"} and "torch intra-op" not in over:
        raise ExerciseFailed(
            EXERCISE, "torch was already at 1 thread in the worker; OpenCV and BLAS are not.",
            expected="every pool at 1 thread", seen=seen,
            hint="the DataLoader calls torch.set_num_threads(1) in every worker before your "
                 "worker_init_fn runs, so torch.set_num_threads(1) there changes nothing. The "
                 f"pools that stay big are OpenCV's and the BLAS/OpenMP libraries' ({', '.join(over)})."
                 " (In a forked worker OpenCV may only *read* its old size, its threads were not "
                 "copied; fresh workers, or forks of a process that had not used OpenCV yet, start "
                 f"a real pool of that size.) Limit those too, with {_FIX}.")
    hints = [clamp.strip()] if clamp else []
    if "OpenCV" in over:
        hints.append("OpenCV is not a pool threadpoolctl can see: OpenCV has its own thread setting (look up "
                     "which value means 'sequential': 1 can deadlock in a forked worker)")
    blas = [name for name in over if name not in ("OpenCV", "torch intra-op")]
    if blas:
        hints.append(f"{', '.join(blas)}: threadpoolctl limits these, but the limit must outlast your "
                     "function, so call it without `with` (a with-block gives the limit back when it ends, "
                     "before the worker loads anything), and limit to 1 thread")
    if "torch intra-op" in over:
        hints.append("torch: the DataLoader sets 1 thread in every worker; do not raise it")
    raise ExerciseFailed(
        EXERCISE, f"{len(over)} pool(s) still run more than 1 thread in the worker: {_pools_text(over)}.",
        expected="every pool at 1 thread", seen=seen, hint="; ".join(hints) + ".")


def _share_failure(wrong: dict[str, int], seen: str, budget: int, workers: int, expect: int,
                   pools: int) -> None:
    """Raise the failure of a fresh worker whose pools are not at its share, ``expect`` > 1."""
    low = len(wrong) == pools and all(v < expect for v in wrong.values())
    high = all(v > expect for v in wrong.values())
    hints = []
    if low and set(wrong.values()) == {1}:
        hints.append("1 thread per pool is lesson 02's setting, for num_workers near the cores; "
                     "with fewer workers than the budget each may run more. A worker can ask "
                     "torch.utils.data.get_worker_info() how many workers its loader has, and a "
                     "fresh (spawn or forkserver) worker can grow its pools safely")
    elif low or high:
        hints.append("all the workers run at once, so their pools add up: each gets the budget "
                     "divided by the number of workers, rounded down (and at least 1)")
    else:
        if wrong.get("OpenCV") == 1:
            hints.append("OpenCV reads 1 after setNumThreads(0), which means 'sequential'; for "
                         "more threads it takes the number itself, which is safe in a fresh worker")
        if any(k not in ("OpenCV", "torch intra-op") for k in wrong):
            hints.append("threadpoolctl sizes every BLAS/OpenMP pool; the limit must outlast your "
                         "function, so no with-block")
        if "torch intra-op" in wrong:
            hints.append("torch.set_num_threads sizes torch's pool")
    what = ("every pool ran fewer threads than" if low else "more threads than" if high else
            f"{_pools_text(wrong)}: not at")
    raise ExerciseFailed(EXERCISE, f"{what} the worker's share: a budget of {budget} CPUs over "
                                   f"{workers} workers leaves each worker {expect}.",
                         expected=f"every pool at {expect} threads ({budget} // {workers})",
                         seen=seen, hint="; ".join(hints) + ".")


@grader(EXERCISE)
def grade_worker_init(answer: Callable[[int], Any], *, timeout_s: float = 20.0,
                      runs: tuple = RUNS) -> CheckResult:
    """``answer(cpu_budget)`` as real workers' worker_init_fn (fresh ones get >= 60 s to start)."""
    require_signature(EXERCISE, answer, "make_budget_init is called with one argument, the CPU "
                      "budget.", "def make_budget_init(cpu_budget): ...", 7)
    methods = multiprocessing.get_all_start_methods()
    fresh = "forkserver" if "forkserver" in methods else "spawn"
    plan = [(fresh if m == "fresh" else m, int(b), int(w)) for m, b, w in runs]
    if any(m not in methods + ["fork"] for m, _, _ in plan):
        raise ValueError(f"runs={runs!r}: a start method is not available here; use {methods} or 'fresh'.")
    skipped, reports, opencv_before = any(m not in methods for m, _, _ in plan), [], use_parent_pools()
    try:
        for method, budget, workers in (p for p in plan if p[0] in methods):
            init = _init_for(answer, budget)
            wait = timeout_s if method == "fork" else max(timeout_s, 60.0)
            try:
                answers = run_in_workers(init, method, workers, wait)
            except Hung as hung:
                raise _hung_failure(hung, wait, _clamp(method, budget, workers)) from None
            reports.append(_judge(answers, method, budget, workers))
    finally:
        if opencv_before < 2:  # use_parent_pools raised it to 2; 0 is "sequential", which reads 1
            cv2.setNumThreads(0)
    summary = ("in real DataLoader workers (forked ones after this process had used OpenCV, BLAS "
               "and torch), " + "; ".join(
                   f"{r['start_method']}, budget {r['cpu_budget']} over {r['num_workers']} workers: "
                   f"every pool at {r['expected']} ({_pools_text(ThreadPools.from_dict(r['pools']).pools)})"
                   for r in reports) + ".")
    raised = sorted({p for r in reports if r["expected"] == 1 for p in r["raised"]})
    not_checked = sorted({f"{p} ({r['start_method']}, {r['expected']})" for r in reports
                          for p in r["not_checked"]})
    if raised:
        summary += (f" On this machine {', '.join(raised)} started at 1 thread (as on one CPU): the grader "
                    "raised them to 2 in each worker before your function, so that limiting them shows.")
    if not_checked:
        summary += (f" NOT checked: {', '.join(not_checked)} already had the expected number of "
                    f"threads before your function, so this machine cannot show that it set them.")
    if skipped:
        summary += " This platform has no 'fork': the rule for forked workers was not checked."
    return CheckResult(EXERCISE, summary, {"runs": reports, "raised": raised, "not_checked": not_checked})
