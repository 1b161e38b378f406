"""Exercise 02 grader: the reference answer passes; the common advice and other plausible wrong
answers fail with the message that teaches why. The learner hands in a factory,
``make_budget_init(cpu_budget)``; what it returns runs as the worker_init_fn of real DataLoader
workers: forked after this process has used OpenCV, BLAS and torch (every pool must end at 1),
then fresh forkserver workers (every pool at ``max(1, cpu_budget // num_workers)``).

Answers live in this module, so spawn and forkserver workers can import them. Most wrong answers
of the earlier, one-thread exercise are kept as *bodies*: :class:`Budgeted` computes the right
share (1 in a forked worker) and hands it to the body, so each fails where it did before."""
from __future__ import annotations

import functools
import multiprocessing as mp
import os

import cv2
import pytest
import threadpoolctl
import torch
from torch.utils.data import get_worker_info

from course_utils import make_worker_init
from course_utils.grading import ex02_worker_init as ex02
from course_utils.grading.checker import CheckResult, ExerciseFailed, check, exercise_ids

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif("fork" not in mp.get_all_start_methods(),
                                 reason="the grader's first run forks workers")]

FORK_ONLY = dict(runs=(("fork", 7, 2),))       # the wrong answers of the one-thread exercise fail here
FRESH_ONLY = dict(runs=(("fresh", 7, 2),))


def forked() -> bool:
    return type(mp.current_process()).__name__ == "ForkProcess"


# ---- the reference ----------------------------------------------------------------------------
class BudgetInit:
    def __init__(self, cpu_budget):
        self.cpu_budget = cpu_budget

    def __call__(self, worker_id):
        n = 1 if forked() else max(1, self.cpu_budget // get_worker_info().num_workers)
        cv2.setNumThreads(0 if n == 1 else n)
        threadpoolctl.threadpool_limits(limits=n)
        torch.set_num_threads(n)


def make_budget_init(cpu_budget):
    return BudgetInit(cpu_budget)


# ---- answers built from a body(n), with the right share ---------------------------------------
class Budgeted:
    """worker_init_fn: the right per-worker share (1 under fork), then ``body(n)``."""

    def __init__(self, body, cpu_budget, share=None, clamp=True):
        self.body, self.cpu_budget, self.share, self.clamp = body, cpu_budget, share, clamp

    def __call__(self, worker_id):
        workers = get_worker_info().num_workers
        n = (self.share or (lambda b, w: max(1, b // w)))(self.cpu_budget, workers)
        self.body(1 if self.clamp and forked() else n)


def factory(body, **options):
    return functools.partial(Budgeted, body, **options)


def all_pools(n):
    cv2.setNumThreads(0 if n == 1 else n)
    threadpoolctl.threadpool_limits(limits=n)
    torch.set_num_threads(n)


def only_torch(n):
    """The common advice."""
    torch.set_num_threads(n)


def env_after_import(n):
    """The other common advice, in the worker."""
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ["OPENBLAS_NUM_THREADS"] = str(n)
    os.environ["MKL_NUM_THREADS"] = str(n)


def cv2_n(n):
    """Limits everything, but with the call that deadlocks a forked worker."""
    threadpoolctl.threadpool_limits(limits=n)
    cv2.setNumThreads(n)


def only_threadpoolctl(n):
    threadpoolctl.threadpool_limits(limits=n)


def with_block(n):
    with threadpoolctl.threadpool_limits(limits=n):
        cv2.setNumThreads(0 if n == 1 else n)


def raises(n):
    return {}["missing"]


def not_done(n):
    raise NotImplementedError("Exercise: replace this line with your code")


def blas_two(n):
    threadpoolctl.threadpool_limits(limits=n + 1, user_api="blas")
    cv2.setNumThreads(0 if n == 1 else n)


def torch_two(n):
    """Raises torch's pool in a forked worker: its next parallel op hangs (libgomp)."""
    all_pools(n)
    torch.set_num_threads(2)


def one_thread(n):
    """Lesson 02's limit_worker_threads: 1 thread per pool, whatever the share."""
    all_pools(1)


def opencv_always_zero(n):
    cv2.setNumThreads(0)
    threadpoolctl.threadpool_limits(limits=n)
    torch.set_num_threads(n)


def does_nothing(n):
    return None


def only_opencv(n):
    cv2.setNumThreads(0 if n == 1 else n)


def not_implemented_factory(cpu_budget):
    raise NotImplementedError("Exercise: replace this line with your code")


def closure_factory(cpu_budget):
    def init(worker_id):
        all_pools(1)
    return init


class FromNotebook(BudgetInit):
    pass


FromNotebook.__module__ = "__main__"   # as a class defined in a notebook cell


class NoWorkerId:
    def __call__(self):
        return None


# ---- tests ----------------------------------------------------------------------------------
def test_registered():
    assert "02.worker_init" in exercise_ids()


def test_reference_passes_and_reports_every_run():
    result = check("02.worker_init", make_budget_init)
    assert isinstance(result, CheckResult)
    text = str(result)
    assert "PASSED 02.worker_init" in text and "OpenCV 1" in text and "OpenCV 3" in text, text
    runs = result.details["runs"]
    assert [(r["start_method"], r["expected"]) for r in runs][0] == ("fork", 1)
    assert [r["expected"] for r in runs] == [1, 3, 1]
    fresh = runs[1]["pools"]
    assert fresh["torch_intra"] == 3 and max(e["num_threads"] for e in fresh["blas"]) == 3


def test_the_same_answer_through_functools_partial_passes():
    assert "PASSED" in str(check("02.worker_init", factory(all_pools), **FRESH_ONLY))


# ---- the course's own limiter is refused ------------------------------------------------------
COURSE_INIT = make_worker_init(1)


def wraps_the_course(cpu_budget):
    return COURSE_INIT


@pytest.mark.parametrize("answer, name", [
    (make_worker_init, "make_worker_init"),               # handed in
    (wraps_the_course, "WorkerThreadLimiter"),            # returned by the learner's factory
])
def test_the_course_helper_is_refused_with_a_teaching_message(answer, name):
    with pytest.raises(ExerciseFailed) as info:
        check("02.worker_init", answer, **FORK_ONLY)
    err = info.value
    assert f"course's own `{name}` (course_utils.threads)" in err.problem, str(err)
    assert "write this mechanism yourself" in err.hint


# ---- the budget: fresh workers must get their share ----------------------------------------------
def test_lesson_02s_one_thread_everywhere_fails_the_budget():
    with pytest.raises(ExerciseFailed, match="(?s)fewer threads than the worker's share.*leaves each "
                                             "worker 3.*get_worker_info") as info:
        check("02.worker_init", factory(one_thread))
    assert "every pool at 3 threads" in str(info.value)


def whole_budget(cpu_budget, workers):
    return cpu_budget


def rounded_up(cpu_budget, workers):
    return -(-cpu_budget // workers)


def no_minimum(cpu_budget, workers):
    return cpu_budget // workers


@pytest.mark.parametrize("share", [whole_budget, rounded_up])
def test_the_whole_budget_or_rounding_up_is_more_than_the_share(share):
    with pytest.raises(ExerciseFailed, match="(?s)more threads than the worker's share.*rounded down"):
        check("02.worker_init", factory(all_pools, share=share), **FRESH_ONLY)


def test_a_share_of_zero_threads_fails_in_the_worker():
    with pytest.raises(ExerciseFailed, match=r"(?s)raised .*1 CPUs, 2 workers"):
        check("02.worker_init", factory(all_pools, share=no_minimum), runs=(("fresh", 1, 2),))


def test_opencv_at_zero_is_one_thread_not_the_share():
    with pytest.raises(ExerciseFailed, match="(?s)OpenCV 1: not at the worker's share.*OpenCV reads 1"):
        check("02.worker_init", factory(opencv_always_zero), **FRESH_ONLY)


def test_growing_the_pools_in_a_forked_worker_fails_without_hanging_the_grader():
    """No clamp under fork: OpenCV's resize is refused (or hangs), torch's grown pool hangs."""
    with pytest.raises(ExerciseFailed, match="(?s)(deadlock|hung).*started with fork, so the task "
                                             "asks for 1 thread per pool"):
        check("02.worker_init", factory(all_pools, clamp=False), timeout_s=4, **FORK_ONLY)


# ---- what make_budget_init returns must reach spawn/forkserver workers ---------------------------
def test_a_closure_cannot_be_pickled():
    with pytest.raises(ExerciseFailed, match="(?s)cannot be pickled.*closure, a lambda"):
        check("02.worker_init", closure_factory, **FORK_ONLY)


def test_a_notebook_class_cannot_reach_fresh_workers():
    with pytest.raises(ExerciseFailed, match=r"(?s)defined in the notebook \(__main__\).*%%writefile"):
        check("02.worker_init", FromNotebook, **FORK_ONLY)


# ---- pools that start at 1 (one CPU) ---------------------------------------------------------
@pytest.mark.parametrize("body", [does_nothing, only_opencv])
def test_pools_starting_at_one_are_raised_so_a_do_nothing_answer_fails(body):
    """BLAS sizes its pool from the CPUs: on a 1-CPU machine it starts at 1, and an answer that
    leaves it alone would "limit" it. The grader raises it to 2 in the worker first."""
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):  # as on one CPU
        with pytest.raises(ExerciseFailed, match="(?s)more than 1 thread|OpenCV and BLAS are not") as info:
            check("02.worker_init", factory(body), **FORK_ONLY)
    assert "openblas" in info.value.seen and "openblas" in str(info.value)


def test_pools_starting_at_one_are_raised_and_the_reference_still_passes():
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        result = check("02.worker_init", make_budget_init, **FORK_ONLY)
    assert result.details["raised"] and all("openblas" in p for p in result.details["raised"])
    assert "the grader raised them to 2" in result.summary
    assert result.details["not_checked"] == []


def test_a_pool_that_already_had_the_expected_size_is_named_as_not_checked():
    before = ex02.ThreadPools(torch_intra=1, torch_interop=1, opencv=1,
                              blas=[{"user_api": "blas", "internal_api": "openblas",
                                     "num_threads": 2, "prefix": "libopenblas", "filepath": ""}])
    assert ex02._not_shown(before, 1) == ["OpenCV"]
    assert ex02._not_shown(before, 2) == ["openblas (libopenblas)"]


# ---- the earlier wrong answers, in the forked run --------------------------------------------------
def test_only_torch_fails_saying_torch_is_already_one():
    with pytest.raises(ExerciseFailed) as info:
        check("02.worker_init", factory(only_torch), **FORK_ONLY)
    text = str(info.value)
    assert "torch was already at 1 thread" in text and "OpenCV and BLAS are not" in text
    assert "before your function: torch intra-op 1" in text  # the pools seen are shown
    assert "expected:" in text and "seen:" in text and "hint:" in text


def test_env_vars_in_the_worker_fail_saying_pools_did_not_change(monkeypatch):
    # the answer's variables count as set only where the shell had not set them already
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ExerciseFailed, match="(?s)environment variables set inside a running "
                                             "process.*OMP_NUM_THREADS.*stayed as they were"):
        check("02.worker_init", factory(env_after_import), **FORK_ONLY)


def test_cv2_set_num_threads_one_fails_with_the_deadlock_explanation():
    """It hangs in most forks (the timeout fires) or, rarely, returns: both fail the same way."""
    with pytest.raises(ExerciseFailed) as info:
        check("02.worker_init", factory(cv2_n), timeout_s=4, **FORK_ONLY)
    text = str(info.value)
    assert "deadlock" in text and "cv2.setNumThreads(1)" in text
    assert "cv2.setNumThreads(0)" in text and "fork" in text


def test_threadpoolctl_alone_leaves_opencv():
    with pytest.raises(ExerciseFailed, match="(?s)OpenCV 2.*OpenCV is not a pool threadpoolctl"):
        check("02.worker_init", factory(only_threadpoolctl), **FORK_ONLY)


def test_a_with_block_gives_the_limit_back():
    with pytest.raises(ExerciseFailed, match="(?s)openblas.*without `with`"):
        check("02.worker_init", factory(with_block), **FORK_ONLY)


def test_two_blas_threads_is_not_one():
    with pytest.raises(ExerciseFailed, match="(?s)still run more than 1 thread.*openblas"):
        check("02.worker_init", factory(blas_two), **FORK_ONLY)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: torch's pool stays at 1")
@pytest.mark.skipif(os.environ.get("OMP_NUM_THREADS") == "1",
                    reason="OMP_NUM_THREADS=1: the parent's OpenMP pool never ran wider, so a fork can grow it")
def test_torch_two_threads_in_a_forked_worker_fails_without_hanging_the_grader():
    with pytest.raises(ExerciseFailed, match="(?s)torch at 2 threads in a forked worker.*libgomp"):
        check("02.worker_init", factory(torch_two), timeout_s=4, **FORK_ONLY)


def test_an_error_in_the_worker_is_reported_with_its_traceback():
    with pytest.raises(ExerciseFailed, match=r"(?s)raised KeyError.*in raises"):
        check("02.worker_init", factory(raises), **FORK_ONLY)


@pytest.mark.parametrize("answer", [factory(not_done), not_implemented_factory])
def test_the_stub_is_not_done_yet(answer):
    with pytest.raises(ExerciseFailed, match="not done yet"):
        check("02.worker_init", answer, **FORK_ONLY)


@pytest.mark.parametrize("answer, message", [
    (42, "not a function"),
    (lambda: None, "one argument, the CPU budget"),
    (lambda cpu_budget: None, "returned NoneType, not a worker_init_fn"),
    (lambda cpu_budget: NoWorkerId(), "one argument, the worker id"),
])
def test_not_a_worker_init_fn_factory(answer, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("02.worker_init", answer)


def test_bad_start_method_is_a_clear_error():
    with pytest.raises(ValueError, match="a start method is not available here"):
        check("02.worker_init", make_budget_init, runs=(("nope", 7, 2),))


def test_the_grader_leaves_opencv_of_this_process_as_it_was():
    before = cv2.getNumThreads()
    check("02.worker_init", make_budget_init, **FORK_ONLY)
    assert cv2.getNumThreads() == before


# ---- pieces -------------------------------------------------------------------------------------
def test_stuck_frames_pick_the_learner_line():
    stack = (
        "Timeout (0:00:05)!\n"
        "Thread 0x0001 (most recent call first):\n"
        '  File "/x/lib/python3.11/threading.py", line 320 in wait\n'
        "\n"
        "Current thread 0x0002 (most recent call first):\n"
        '  File "/x/course_utils/grading/ex02_worker_init/workers.py", line 120 in recording_set_num_threads\n'
        '  File "/x/exercises/exercise02_budget.py", line 4 in __call__\n'
        '  File "/x/course_utils/grading/ex02_worker_init/workers.py", line 130 in __call__\n'
        '  File "/work/notebook.py", line 9 in main\n')
    top, user = ex02.stuck_frames(stack)
    assert "recording_set_num_threads" in top
    assert user == ['File "/x/exercises/exercise02_budget.py", line 4 in __call__']


@pytest.mark.parametrize("body", [only_torch, env_after_import, only_threadpoolctl, with_block])
def test_the_failures_teach_without_printing_the_fix(body):
    """A failure names what is wrong and where to look; it does not hold the answer's lines."""
    with pytest.raises(ExerciseFailed) as info:
        check("02.worker_init", factory(body), **FORK_ONLY)
    text = str(info.value)
    assert "threadpool_limits(limits=1)" not in text and "threadpool_limits(1)" not in text, text
    assert "cv2.setNumThreads(0)" not in text, text


def test_the_notebooks_demo_does_not_show_how_to_tell_a_forked_worker():
    """The exercise notebook grades lesson 02's one-thread function before the learner writes
    theirs, printing problem and seen: neither may say how a worker knows it was forked."""
    with pytest.raises(ExerciseFailed) as info:
        check("02.worker_init", factory(one_thread))
    shown = info.value.problem + info.value.seen
    assert "current_process" not in shown and "ForkProcess" not in shown and "get_worker_info" not in shown
