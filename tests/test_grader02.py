"""Exercise 02 grader: the reference answer passes; the common advice and other plausible wrong
answers fail with the message that teaches why. The grader runs every answer in real DataLoader
workers (fork where available), after this process has used OpenCV, BLAS and torch."""
from __future__ import annotations

import functools
import multiprocessing as mp
import os

import cv2
import pytest
import threadpoolctl
import torch

from course_utils import limit_threads, make_worker_init
from course_utils.threads import WorkerThreadLimiter
from course_utils.graders import ex02_worker_init as ex02
from course_utils.grading import CheckResult, ExerciseFailed, check, exercise_ids

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif("fork" not in mp.get_all_start_methods(),
                                 reason="the grader runs notebook functions under fork")]

FAST = dict(fresh_check=False)  # skip the forkserver re-run except where tested


# ---- answers --------------------------------------------------------------------------------
def reference(worker_id):
    threadpoolctl.threadpool_limits(limits=1)
    torch.set_num_threads(1)
    cv2.setNumThreads(0)


def only_torch(worker_id):
    """The common advice."""
    torch.set_num_threads(1)


def env_after_import(worker_id):
    """The other common advice, in the worker."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"


def cv2_one(worker_id):
    """Limits everything, but with the call that deadlocks a forked worker."""
    threadpoolctl.threadpool_limits(limits=1)
    cv2.setNumThreads(1)


def only_threadpoolctl(worker_id):
    threadpoolctl.threadpool_limits(limits=1)


def with_block(worker_id):
    with threadpoolctl.threadpool_limits(limits=1):
        cv2.setNumThreads(0)


def raises(worker_id):
    return {}["missing"]


def not_done(worker_id):
    raise NotImplementedError("Exercise: replace this line with your code")


def blas_two(worker_id):
    threadpoolctl.threadpool_limits(limits=2, user_api="blas")
    cv2.setNumThreads(0)


def torch_two(worker_id):
    """Raises torch's pool in a forked worker: its next parallel op hangs (libgomp)."""
    reference(worker_id)
    torch.set_num_threads(2)


# ---- tests ----------------------------------------------------------------------------------
def test_registered():
    assert "02.worker_init" in exercise_ids()


def test_reference_passes_and_reports_the_pools():
    result = check("02.worker_init", reference, **FAST)
    assert isinstance(result, CheckResult)
    text = str(result)
    assert "PASSED 02.worker_init" in text and "OpenCV 1" in text
    assert result.details["start_method"] == "fork"


def test_an_importable_answer_passes_under_fork_and_in_a_fresh_forkserver_worker():
    result = check("02.worker_init", reference)
    assert "forkserver" in str(result)
    if "forkserver" in mp.get_all_start_methods():
        assert max(e["num_threads"] for e in result.details["forkserver"]["blas"]) == 1


# ---- the course's own limiter is refused ------------------------------------------------------
COURSE_INIT = make_worker_init(1)


def wraps_the_course(worker_id):
    COURSE_INIT(worker_id)


class CourseSubclass(WorkerThreadLimiter):
    pass


@pytest.mark.parametrize("answer, seen", [
    (make_worker_init(1), "instance of it (what make_worker_init(...) returns)"),
    (make_worker_init, "`make_worker_init` itself"),
    (CourseSubclass(1), "instance of it"),
    (wraps_the_course, "`wraps_the_course` holds an instance of it"),
    (lambda worker_id: make_worker_init(1)(worker_id), "uses it"),
    (functools.partial(limit_threads(1).__enter__), "instance of it"),
])
def test_the_course_helper_is_refused_with_a_teaching_message(answer, seen):
    with pytest.raises(ExerciseFailed) as info:
        check("02.worker_init", answer, **FAST)
    err = info.value
    assert "course's own `" in err.problem and "(course_utils." in err.problem, str(err)
    assert seen in err.seen, str(err)
    assert "write the mechanism yourself" in err.hint and "threadpool_limits" not in err.hint


# ---- pools that start at 1 (one CPU) ---------------------------------------------------------
def only_opencv(worker_id):
    cv2.setNumThreads(0)


def does_nothing(worker_id):
    return None


@pytest.mark.parametrize("answer", [does_nothing, only_opencv])
def test_pools_starting_at_one_are_raised_so_a_do_nothing_answer_fails(answer):
    """BLAS sizes its pool from the CPUs: on a 1-CPU machine it starts at 1, and an answer that
    leaves it alone would "limit" it. The grader raises it to 2 in the worker first."""
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):  # as on one CPU
        with pytest.raises(ExerciseFailed, match="(?s)more than 1 thread|OpenCV and BLAS are not") as info:
            check("02.worker_init", answer, **FAST)
    assert "openblas" in info.value.seen and "openblas" in str(info.value)


def test_pools_starting_at_one_are_raised_and_the_reference_still_passes():
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        result = check("02.worker_init", reference, **FAST)
    assert result.details["raised"] and all("openblas" in p for p in result.details["raised"])
    assert "the grader raised them to 2" in result.summary
    assert result.details["not_checked"] == []


def test_a_pool_that_cannot_be_raised_is_named_as_not_checked():
    before = ex02.ThreadPools(torch_intra=1, torch_interop=1, opencv=1,
                              blas=[{"user_api": "blas", "internal_api": "openblas",
                                     "num_threads": 2, "prefix": "libopenblas", "filepath": ""}])
    assert ex02._started_at_one(before) == ["OpenCV"]


def test_only_torch_fails_saying_torch_is_already_one():
    with pytest.raises(ExerciseFailed) as info:
        check("02.worker_init", only_torch, **FAST)
    text = str(info.value)
    assert "torch was already at 1 thread" in text and "OpenCV and BLAS are not" in text
    assert "before your function: torch intra-op 1" in text  # the pools seen are shown
    assert "expected:" in text and "seen:" in text and "hint:" in text


def test_env_vars_in_the_worker_fail_saying_pools_did_not_change():
    with pytest.raises(ExerciseFailed, match="(?s)environment variables set inside a running "
                                             "process.*OMP_NUM_THREADS.*stayed as they were"):
        check("02.worker_init", env_after_import, **FAST)


def test_cv2_set_num_threads_one_fails_with_the_deadlock_explanation():
    """It hangs in most forks (the timeout fires) or, rarely, returns: both fail the same way."""
    with pytest.raises(ExerciseFailed) as info:
        check("02.worker_init", cv2_one, timeout_s=6, **FAST)
    text = str(info.value)
    assert "deadlock" in text and "cv2.setNumThreads(1)" in text
    assert "cv2.setNumThreads(0)" in text and "fork" in text


def test_threadpoolctl_alone_leaves_opencv():
    with pytest.raises(ExerciseFailed, match="(?s)OpenCV 2.*OpenCV is not a pool threadpoolctl"):
        check("02.worker_init", only_threadpoolctl, **FAST)


def test_a_with_block_gives_the_limit_back():
    with pytest.raises(ExerciseFailed, match="(?s)openblas.*without `with`"):
        check("02.worker_init", with_block, **FAST)


def test_two_blas_threads_is_not_one():
    with pytest.raises(ExerciseFailed, match="(?s)still run more than 1 thread.*openblas"):
        check("02.worker_init", blas_two, **FAST)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: torch's pool stays at 1")
def test_torch_two_threads_in_a_forked_worker_fails_without_hanging_the_grader():
    with pytest.raises(ExerciseFailed, match="(?s)torch at 2 threads in a forked worker.*libgomp"):
        check("02.worker_init", torch_two, timeout_s=6, **FAST)


def test_an_error_in_the_worker_is_reported_with_its_traceback():
    with pytest.raises(ExerciseFailed, match=r"(?s)raised KeyError.*in raises"):
        check("02.worker_init", raises, **FAST)


def test_the_stub_is_not_done_yet():
    with pytest.raises(ExerciseFailed, match="not done yet"):
        check("02.worker_init", not_done, **FAST)


@pytest.mark.parametrize("answer, message", [
    (42, "not a function"),
    (lambda: None, "one argument, the worker id"),
])
def test_not_a_worker_init_fn(answer, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("02.worker_init", answer)


def test_bad_start_method_is_a_clear_error():
    with pytest.raises(ValueError, match="start_method='nope' is not available"):
        check("02.worker_init", reference, start_method="nope")


def test_the_grader_leaves_opencv_of_this_process_as_it_was():
    before = cv2.getNumThreads()
    check("02.worker_init", reference, **FAST)
    assert cv2.getNumThreads() == before


# ---- pieces -------------------------------------------------------------------------------------
def test_shipped_source_runs_a_notebook_style_function():
    shipped = ex02._ShippedSource("def f(worker_id):\n    return worker_id + len(os.sep)\n", "f")
    assert shipped(2) == 3
    import pickle

    assert pickle.loads(pickle.dumps(shipped))(0) == 1


def test_sendable_only_for_importable_answers():
    assert ex02._sendable(make_worker_init(1))  # importable, though the grader refuses it
    assert ex02._sendable(reference)  # a test module is importable

    def local(worker_id):
        return None

    assert not ex02._sendable(local)  # a closure cannot be pickled


def test_stuck_frames_pick_the_learner_line():
    stack = (
        "Timeout (0:00:05)!\n"
        "Thread 0x0001 (most recent call first):\n"
        '  File "/x/lib/python3.11/threading.py", line 320 in wait\n'
        "\n"
        "Current thread 0x0002 (most recent call first):\n"
        '  File "/x/course_utils/graders/ex02_worker_init.py", line 120 in recording_set_num_threads\n'
        '  File "/tmp/ipykernel_1/123.py", line 4 in limit_worker_threads\n'
        '  File "/x/course_utils/graders/ex02_worker_init.py", line 130 in __call__\n'
        '  File "/work/notebook.py", line 9 in main\n')
    top, user = ex02._stuck_frames(stack)
    assert "recording_set_num_threads" in top
    assert user == ['File "/tmp/ipykernel_1/123.py", line 4 in limit_worker_threads']


@pytest.mark.parametrize("answer", [only_torch, env_after_import, only_threadpoolctl, with_block])
def test_the_demo_failures_teach_without_printing_the_fix(answer):
    """Lesson 02's notebook shows the common advice failing before the learner writes the
    answer: those messages must not hold the solution's lines."""
    with pytest.raises(ExerciseFailed) as info:
        check("02.worker_init", answer, **FAST)
    text = str(info.value)
    assert "threadpool_limits(limits=1)" not in text and "threadpool_limits(1)" not in text, text
    assert "cv2.setNumThreads(0)" not in text, text
