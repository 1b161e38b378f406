"""Grader 02 (course_utils/grading/ex02_worker_init/: __init__.py, workers.py, share.py) judged
in this process, on made-up worker reports: the expected share (1 when forked, else
``max(1, budget // workers)``, on budgets 7 / 2 -> 3, 6 / 3 -> 2, 1 / 2 -> 1), which worker's
report is shown, each failure's branch (low / high / mixed share, env vars, torch only, pools over
1, cv2 deadlock risk), the hung-worker failures read from a faulthandler dump, the picklability
checks of ``_init_for``, ``grade_worker_init``'s plan and summary with a fake run, and step 1's
rule names. No DataLoader worker is started here (test_grader02.py runs the real ones)."""
from __future__ import annotations

import os
import pickle

import pytest

import course_utils.grading.ex02_worker_init as G
import course_utils.grading.ex02_worker_init.share as S
import course_utils.grading.ex02_worker_init.workers as W
from course_utils.grading.checker import CheckResult, ExerciseFailed
from course_utils.threads import ThreadPools

pytestmark = pytest.mark.timeout(60)

BLAS = "openblas (libopenblas)"


def pools(torch=1, opencv=1, blas=1) -> dict:
    entry = {"user_api": "blas", "internal_api": "openblas", "num_threads": blas,
             "prefix": "libopenblas", "filepath": "/x/libopenblas.so"}
    return ThreadPools(torch_intra=torch, torch_interop=1, opencv=opencv, blas=[entry]).to_dict()


def report(worker=0, now=None, before=None, after=None, env_before=None, env_after=None, **state):
    """One worker's answer as the probe dataset returns it."""
    now = now if now is not None else pools()
    return {"worker": worker, "pools": now,
            "state": {"before": before or pools(2, 2, 2), "after": after or now,
                      "env_before": env_before or {}, "env_after": env_after or {},
                      "raised": [], **state}}


def judge_failure(answers, method="fork", budget=7, workers=2) -> ExerciseFailed:
    with pytest.raises(ExerciseFailed) as info:
        G._judge(answers, method, budget, workers)
    return info.value


# ---- the expected share -------------------------------------------------------------------------

@pytest.mark.parametrize("method, budget, workers, expect", [
    ("fork", 7, 2, 1),             # forked: 1 whatever the share
    ("forkserver", 7, 2, 3),       # 7 // 2 = 3, not 3.5 or 4
    ("forkserver", 6, 3, 2),       # 6 // 3 = 2
    ("forkserver", 1, 2, 1),       # 1 // 2 = 0, raised to 1
    ("spawn", 8, 2, 4),
], ids=["fork", "7-over-2", "6-over-3", "1-over-2", "spawn-8-over-2"])
def test_every_pool_at_the_share_passes_and_the_report_says_so(method, budget, workers, expect):
    answers = [report(w, pools(expect, expect, expect)) for w in range(workers)]
    out = G._judge(answers, method, budget, workers)
    assert out["expected"] == expect and out["cpu_budget"] == budget
    assert out["num_workers"] == workers and out["start_method"] == method
    assert ThreadPools.from_dict(out["pools"]).pools == {"torch intra-op": expect, "OpenCV": expect,
                                                         BLAS: expect}


@pytest.mark.parametrize("method, budget, workers, share", [
    ("forkserver", 7, 2, 3), ("forkserver", 6, 3, 2), ("fork", 7, 2, 1)])
def test_one_thread_more_than_the_share_fails(method, budget, workers, share):
    answers = [report(w, pools(share, share + 1, share)) for w in range(workers)]
    err = judge_failure(answers, method, budget, workers)
    assert f"while it loaded a sample: torch intra-op {share}, OpenCV {share + 1}," in err.seen, str(err)


def test_the_worst_worker_is_the_one_shown():
    good, bad = pools(3, 3, 3), pools(3, 1, 5)
    err = judge_failure([report(0, good), report(1, bad), report(2, good)], "forkserver", 9, 3)
    assert err.seen.startswith("in worker 1 (forkserver)"), err.seen
    assert "OpenCV 1, openblas (libopenblas) 5: not at the worker's share" in err.problem


def test_the_report_is_the_worst_workers_and_lists_what_was_already_at_the_share():
    answers = [report(0, pools(1, 1, 1), before=pools(1, 1, 1)),
               report(1, pools(1, 1, 1), before=pools(1, 2, 2))]
    out = G._judge(answers, "fork", 7, 2)
    # both workers are right; the first (max keeps the first of equals) is reported; torch is not
    # listed as "already at 1": the DataLoader sets it
    assert out["not_checked"] == ["OpenCV", BLAS]


def test_the_answers_not_implemented_is_raised_as_such():
    with pytest.raises(NotImplementedError, match="Exercise: write it"):
        G._judge([report(not_implemented=True, error="Exercise: write it")], "fork", 7, 2)


def test_an_error_in_a_worker_is_reported_with_its_traceback_and_run():
    err = judge_failure([report(0), report(1, error="KeyError: 'x'", traceback="  tb line\n")],
                        "forkserver", 6, 3)
    assert err.problem == ("your function raised KeyError: 'x' in DataLoader worker 1 "
                           "(forkserver; a budget of 6 CPUs, 3 workers).")
    assert err.seen == "tb line"


@pytest.mark.parametrize("budget, clamp", [(4, True), (3, False), (2, False)],
                         ids=["share-2", "share-1-rounded", "share-1"])
def test_cv2_nonzero_in_a_forked_worker_is_a_deadlock_risk_and_the_clamp_note_needs_a_share_over_1(
        budget, clamp):
    answers = [report(0, cv2_nonzero=[1], cv2_calls=["1"])]
    err = judge_failure(answers, "fork", budget, 2)
    assert err.problem == "deadlock risk: cv2.setNumThreads(1) in a forked worker."
    assert err.hint.startswith("This worker was started with fork") is clamp
    if clamp:
        assert f"({budget} CPUs // 2 workers = {budget // 2})" in err.hint


def test_cv2_nonzero_in_a_fresh_worker_is_no_deadlock_risk():
    answers = [report(0, pools(3, 3, 3), cv2_nonzero=[3], cv2_calls=["3"])]
    assert G._judge(answers, "forkserver", 7, 2)["expected"] == 3


# ---- a fresh worker off its share (expect > 1) ----------------------------------------------------

def test_every_pool_at_one_for_a_share_of_three_says_lesson_02s_setting_is_too_few():
    err = judge_failure([report(0, pools(1, 1, 1))], "forkserver", 7, 2)
    assert err.problem == ("every pool ran fewer threads than the worker's share: a budget of 7 "
                           "CPUs over 2 workers leaves each worker 3.")
    assert err.expected == "every pool at 3 threads (7 // 2)"
    assert "lesson 02's setting" in err.hint


@pytest.mark.parametrize("now, what", [
    (pools(2, 2, 2), "every pool ran fewer threads than"),   # all low, but not all 1
    (pools(7, 7, 7), "more threads than"),                   # the whole budget each
    (pools(4, 3, 4), "more threads than"),                   # the wrong ones all high
], ids=["all-2", "all-7", "some-4"])
def test_pools_that_add_up_past_the_budget_or_stay_below_it_say_divide(now, what):
    err = judge_failure([report(0, now)], "forkserver", 7, 2)
    assert err.problem.startswith(what), err.problem
    assert "their pools add up" in err.hint


def test_a_mix_of_low_and_right_pools_names_each_wrong_one_and_its_tool():
    err = judge_failure([report(0, pools(1, 1, 3))], "forkserver", 7, 2)
    assert err.problem.startswith("torch intra-op 1, OpenCV 1: not at the worker's share")
    assert "OpenCV reads 1 after setNumThreads(0)" in err.hint
    assert "torch.set_num_threads sizes torch's pool" in err.hint
    assert "threadpoolctl" not in err.hint                   # BLAS was right
    err = judge_failure([report(0, pools(3, 2, 1))], "forkserver", 7, 2)
    assert "threadpoolctl sizes every BLAS/OpenMP pool" in err.hint
    assert "OpenCV reads 1" not in err.hint and "torch.set_num_threads" not in err.hint


# ---- a forked worker over 1 thread ------------------------------------------------------------------

def test_env_vars_that_change_no_pool_are_named_with_the_pools_that_stayed():
    same = pools(1, 2, 2)
    err = judge_failure([report(0, same, before=same, after=same,
                                env_before={}, env_after={"OMP_NUM_THREADS": "1"})])
    assert err.problem.startswith("environment variables set inside a running process")
    assert err.seen.endswith("; your function set OMP_NUM_THREADS")
    assert f"stayed as they were: OpenCV 2, {BLAS} 2." in err.hint


def test_env_vars_with_a_pool_changed_are_judged_on_the_pools():
    err = judge_failure([report(0, pools(1, 2, 1), before=pools(1, 2, 2), after=pools(1, 2, 1),
                                env_after={"OMP_NUM_THREADS": "1"})])
    assert err.problem == "1 pool(s) still run more than 1 thread in the worker: OpenCV 2."


def test_only_torch_changed_from_one_says_torch_was_already_one():
    err = judge_failure([report(0, pools(1, 2, 2), before=pools(1, 2, 2), after=pools(1, 2, 2))])
    assert err.problem == "torch was already at 1 thread in the worker; OpenCV and BLAS are not."
    assert f"({'OpenCV'}, {BLAS})" in err.hint


def test_torch_starting_above_one_is_not_called_already_one():
    err = judge_failure([report(0, pools(1, 2, 2), before=pools(2, 2, 2), after=pools(1, 2, 2))])
    assert err.problem.startswith("2 pool(s) still run more than 1 thread")


def test_pools_over_one_in_a_forked_worker_get_a_hint_for_each_library():
    err = judge_failure([report(0, pools(2, 2, 2), before=pools(1, 1, 1), after=pools(2, 2, 2))],
                        "fork", 2, 2)
    assert err.problem == ("3 pool(s) still run more than 1 thread in the worker: torch intra-op 2, "
                           f"OpenCV 2, {BLAS} 2.")
    assert err.expected == "every pool at 1 thread"
    hint = err.hint
    assert not hint.startswith("This worker")               # share 2 // 2 = 1: no clamp note
    assert "OpenCV has its own thread setting" in hint and f"{BLAS}: threadpoolctl" in hint
    assert "do not raise it" in hint and hint.endswith(".")
    err = judge_failure([report(0, pools(1, 1, 2), before=pools(1, 1, 1), after=pools(1, 1, 2))],
                        "fork", 7, 2)
    assert err.hint.startswith("This worker was started with fork")   # 7 // 2 = 3: the clamp note
    assert "OpenCV has its own" not in err.hint and "do not raise it" not in err.hint


def test_clamp_note_only_for_a_forked_worker_whose_share_is_over_one():
    assert "(7 CPUs // 2 workers = 3)" in G._clamp("fork", 7, 2)
    assert G._clamp("fork", 3, 2) == ""                     # 3 // 2 = 1
    assert G._clamp("forkserver", 7, 2) == ""


def test_not_shown_keeps_torch_when_the_expected_count_is_not_one():
    before = ThreadPools.from_dict(pools(2, 1, 2))
    assert G._not_shown(before, 2) == ["torch intra-op", BLAS]
    assert G._not_shown(ThreadPools.from_dict(pools(1, 1, 2)), 1) == ["OpenCV"]


# ---- a hung worker --------------------------------------------------------------------------------

def dump(*frames: str, thread="Current thread 0x0002") -> str:
    return f"Timeout (0:00:05)!\n{thread} (most recent call first):\n" + "".join(
        f'  File "{f}\n' for f in frames)


OWN_CALL = '/x/course_utils/grading/ex02_worker_init/workers.py", line 130 in __call__'
OWN_GET = '/x/course_utils/grading/ex02_worker_init/workers.py", line 140 in __getitem__'
RECORDER = '/x/course_utils/grading/ex02_worker_init/workers.py", line 120 in recording_set_num_threads'


@pytest.fixture
def answer_file(tmp_path):
    path = tmp_path / "answer02.py"
    path.write_text("import cv2\n\ndef init(worker_id):\n    cv2.setNumThreads(4)\n    pass\n")
    return str(path)


def test_a_worker_stuck_in_a_cv2_call_of_zero_is_the_rare_lock():
    hung = W.Hung("fork", "init", dump(RECORDER, OWN_CALL), ["0"])
    err = G._hung_failure(hung, 20, "")
    assert err.problem == "the worker hung in cv2.setNumThreads(0) (rare)."


def test_a_worker_stuck_in_a_cv2_call_of_one_is_the_fork_deadlock(answer_file):
    hung = W.Hung("fork", "init", dump(RECORDER, f'{answer_file}", line 4 in init', OWN_CALL),
                  ["0", "1"])
    err = G._hung_failure(hung, 20, "CLAMP. ")
    assert err.problem == "deadlock: cv2.setNumThreads(1) hung in a forked worker."
    assert err.seen == (f'worker stuck inside your function, at File "{answer_file}", line 4 in '
                        f"init: `cv2.setNumThreads(4)` (no answer within the DataLoader timeout of "
                        f"20 s); your function had called cv2.setNumThreads(0, 1)")
    assert err.hint.startswith("CLAMP. This process had used OpenCV")


def test_a_worker_that_called_cv2_with_nonzero_before_hanging_elsewhere_is_the_deadlock():
    hung = W.Hung("fork", "fetch", dump('/x/lib/python3.11/threading.py", line 3 in wait', OWN_GET),
                  ["2", "0"])
    err = G._hung_failure(hung, 20, "")
    assert err.problem == "deadlock: cv2.setNumThreads(2) hung in a forked worker."
    assert err.seen.startswith("worker stuck after your function returned, while loading the first "
                               'sample, in File "/x/lib/python3.11/threading.py", line 3 in wait')


def test_a_from_import_of_set_num_threads_is_read_off_the_stuck_line(answer_file):
    # `from cv2 import setNumThreads` bypasses the recorder: no call logged, the line shows it
    hung = W.Hung("fork", "init", dump(f'{answer_file}", line 4 in init', OWN_CALL), [])
    err = G._hung_failure(hung, 20, "")
    assert err.problem == "deadlock: cv2.setNumThreads(4) hung in a forked worker."


def test_a_worker_stuck_on_another_line_is_a_plain_hang(answer_file):
    hung = W.Hung("forkserver", "init", dump(f'{answer_file}", line 5 in init', OWN_CALL), ["0"])
    err = G._hung_failure(hung, 60, "")
    assert err.problem == "the worker hung (forkserver start method)."
    assert "(no answer within the DataLoader timeout of 60 s)" in err.seen


@pytest.mark.parametrize("torch_threads, problem", [
    (4, "the worker hung: torch at 4 threads in a forked worker."),
    (1, "the worker hung (fork start method)."),
], ids=["torch-4", "torch-1"])
def test_a_hang_while_loading_blames_torch_only_above_one_thread(torch_threads, problem):
    after = ThreadPools.from_dict(pools(torch_threads, 1, 1))
    hung = W.Hung("fork", "fetch", dump('/x/site-packages/torch/x.py", line 1 in mm', OWN_GET), [],
                  after)
    assert G._hung_failure(hung, 20, "").problem == problem


def test_where_a_hang_inside_the_function_is_told_without_the_learners_frames():
    hung = W.Hung("fork", "init", dump('/x/site-packages/lib.py", line 1 in f', OWN_CALL), [])
    assert G._hung_failure(hung, 20, "").seen.startswith(
        'worker stuck inside your function, in File "/x/site-packages/lib.py", line 1 in f')
    hung = W.Hung("fork", "init", "no frames at all", [])
    assert G._hung_failure(hung, 20, "").seen.startswith(
        "worker stuck inside your function, in a library call")
    hung = W.Hung("fork", "fetch", "no frames at all", [])
    assert "while loading the first sample, in a library call" in G._hung_failure(hung, 20, "").seen


def test_stuck_frames_read_the_block_of_the_thread_running_the_grader():
    stack = (dump('/a/other.py", line 1 in g', thread="Thread 0x0001") + "\n"
             + dump('/b/mine.py", line 2 in f', OWN_CALL, '/b/notebook.py", line 9 in main'))
    top, user = W.stuck_frames(stack)
    assert top == 'File "/b/mine.py", line 2 in f'
    assert user == ['File "/b/mine.py", line 2 in f']        # stops at the grader's own frame


def test_with_code_adds_the_line_only_where_it_is_found(answer_file):
    frame = f'File "{answer_file}", line 4 in init'
    assert W.with_code(frame) == f"{frame}: `cv2.setNumThreads(4)`"
    assert W.with_code(f'File "{answer_file}", line 2 in init') == f'File "{answer_file}", line 2 in init'
    assert W.with_code("no frame here") == "no frame here"


# ---- the answer's worker_init_fn, before any worker ---------------------------------------------

class PicklableInit:
    def __init__(self, budget):
        self.budget = budget

    def __call__(self, worker_id):
        return None


def test_a_picklable_worker_init_fn_is_returned_as_it_is():
    init = G._init_for(PicklableInit, 7)
    assert isinstance(init, PicklableInit) and init.budget == 7
    assert pickle.loads(pickle.dumps(init)).budget == 7


def test_a_factory_returning_no_callable_or_a_closure_or_a_notebook_class_fails():
    with pytest.raises(ExerciseFailed) as info:
        G._init_for(lambda budget: 3, 7)
    assert info.value.problem == "<lambda>(7) returned int, not a worker_init_fn."

    def closure_factory(budget):
        return lambda worker_id: None

    with pytest.raises(ExerciseFailed, match="cannot be pickled"):
        G._init_for(closure_factory, 7)
    notebook = type("NotebookInit", (PicklableInit,), {"__module__": "__main__"})
    with pytest.raises(ExerciseFailed, match=r"defined in the notebook \(__main__\)"):
        G._init_for(notebook, 7)


# ---- grade_worker_init with a made-up run ----------------------------------------------------

class FakeCV2:
    def __init__(self):
        self.calls = []

    def setNumThreads(self, n):
        self.calls.append(n)


@pytest.fixture
def fake_run(monkeypatch):
    """run_in_workers replaced: every worker reports its share; the runs asked for are kept."""
    runs, cv2 = [], FakeCV2()

    def run(init, method, workers, wait):
        runs.append((method, init.budget, workers, wait))
        expect = 1 if method == "fork" else max(1, init.budget // workers)
        return [report(w, pools(expect, expect, expect), raised=["OpenCV"] if method == "fork" else [])
                for w in range(workers)]

    monkeypatch.setattr(G, "run_in_workers", run)
    monkeypatch.setattr(G, "use_parent_pools", lambda: 1)
    monkeypatch.setattr(G, "cv2", cv2)
    return runs, cv2


def test_the_graded_runs_and_their_waits(fake_run):
    runs, cv2 = fake_run
    result = G.grade_worker_init(PicklableInit, timeout_s=20.0,
                                 runs=(("fork", 7, 2), ("fresh", 6, 3), ("fresh", 1, 2)))
    assert isinstance(result, CheckResult)
    fresh = "forkserver" if "forkserver" in G.multiprocessing.get_all_start_methods() else "spawn"
    # fork waits timeout_s; a fresh worker gets at least 60 s to start
    assert runs == [("fork", 7, 2, 20.0), (fresh, 6, 3, 60.0), (fresh, 1, 2, 60.0)]
    assert [r["expected"] for r in result.details["runs"]] == [1, 2, 1]
    assert "fork, budget 7 over 2 workers: every pool at 1" in result.summary
    assert f"{fresh}, budget 6 over 3 workers: every pool at 2" in result.summary
    assert cv2.calls == [0]                 # OpenCV was below 2 before: put back to sequential


def test_a_long_timeout_is_kept_for_fresh_workers(fake_run):
    runs, _ = fake_run
    G.grade_worker_init(PicklableInit, timeout_s=90.0, runs=(("fresh", 7, 2),))
    assert runs[0][3] == 90.0


def test_the_summary_says_which_pools_the_grader_raised_and_which_it_could_not_check(fake_run):
    result = G.grade_worker_init(PicklableInit, runs=(("fork", 7, 2),))
    assert result.details["raised"] == ["OpenCV"]
    assert "On this machine OpenCV started at 1 thread" in result.summary
    # every pool was 2 before the answer (report's default), expected 1: none already right
    assert result.details["not_checked"] == [] and "NOT checked" not in result.summary


def test_opencv_is_left_alone_when_it_had_two_threads_or_more(fake_run, monkeypatch):
    _, cv2 = fake_run
    monkeypatch.setattr(G, "use_parent_pools", lambda: 2)
    G.grade_worker_init(PicklableInit, runs=(("fresh", 7, 2),))
    assert cv2.calls == []


def test_a_hung_run_fails_with_the_wait_it_had(monkeypatch):
    def hangs(init, method, workers, wait):
        raise W.Hung(method, "init", "no frames", [])

    monkeypatch.setattr(G, "run_in_workers", hangs)
    monkeypatch.setattr(G, "use_parent_pools", lambda: 2)
    with pytest.raises(ExerciseFailed) as info:
        G.grade_worker_init(PicklableInit, timeout_s=5.0, runs=(("fresh", 7, 2),))
    assert "(no answer within the DataLoader timeout of 60 s)" in info.value.seen


# ---- step 1: the share alone ----------------------------------------------------------------------

@pytest.mark.parametrize("args, got, words", [
    ((16, 4, True), 4, "a forked worker must keep 1 thread"),
    ((1, 2, False), 0, "at least one thread"),
    ((2, 2, False), 2, "2 CPUs shared by 2 workers is 1 threads each"),    # budget == workers
    ((7, 2, False), 4, "rounded down"),                                    # 7 % 2 = 1
    ((8, 2, False), 5, "8 CPUs shared by 2 workers is 4 threads each"),
    ((8, 2, False), 4.0, "rounded down"),                                  # a float
], ids=["forked", "budget-below-workers", "budget-equals-workers", "odd", "even", "float"])
def test_each_wrong_share_names_the_rule_it_broke(args, got, words):
    want = dict(S.CASES).get(args, 4)
    assert words in S._rule(args, want, got)


def share_failure(answer) -> ExerciseFailed:
    with pytest.raises(ExerciseFailed) as info:
        S.grade_share(answer)
    return info.value


def right_share(budget, workers, forked):
    return 1 if forked else max(1, budget // workers)


def test_the_right_share_passes_all_cases():
    assert S.grade_share(right_share).summary.startswith("the right share in all 7 cases")


def test_a_wrong_share_names_the_call_and_the_expected_value():
    err = share_failure(lambda b, w, f: 1 if f else max(1, -(-b // w)))       # rounds up
    assert err.problem == "thread_share(7, 2, False) returned 4."
    assert err.expected == "3" and err.seen == "4" and "rounded down" in err.hint


@pytest.mark.parametrize("value, kind", [(True, "bool True"), (4.0, "float 4.0"), (None, "NoneType None")])
def test_a_share_that_is_not_an_int_fails_even_when_it_equals_the_share(value, kind):
    err = share_failure(lambda b, w, f: value)
    assert err.problem == f"thread_share(8, 2, False) returned {kind}, not an int."
    assert err.expected == "4"


# ---- the worker side, called in this process (its pools put back afterwards) ----------------------

@pytest.fixture
def restore_pools():
    import cv2
    import threadpoolctl
    cv2_before = cv2.getNumThreads()
    controller = threadpoolctl.ThreadpoolController()
    saved = [(lib, lib.num_threads) for lib in controller.lib_controllers]
    yield
    for lib, n in saved:
        lib.set_num_threads(n)
    cv2.setNumThreads(cv2_before)
    W._STATE.clear()


def test_the_graded_init_records_each_cv2_call_and_the_nonzero_ones(tmp_path, restore_pools):
    import cv2

    def answer(worker_id):
        cv2.setNumThreads(0)
        cv2.setNumThreads(3)

    real = cv2.setNumThreads
    W._GradedInit(answer, str(tmp_path), 30.0, forked=False)(1)
    assert cv2.setNumThreads is real                         # the recorder is taken out again
    assert W._STATE["cv2_calls"] == ["0", "3"] and W._STATE["cv2_nonzero"] == [3]
    assert (tmp_path / "calls1.txt").read_text() == "0\n3\n"
    assert "after" in __import__("json").loads((tmp_path / "state1.json").read_text())
    assert "error" not in W._STATE


@pytest.mark.skipif("MUTANT_UNDER_TEST" in os.environ,
                    reason="under mutmut a trampoline's frames sit in the traceback this test reads")
@pytest.mark.parametrize("exc, not_implemented", [(ValueError("boom"), False),
                                                   (NotImplementedError("todo"), True)])
def test_the_graded_init_keeps_the_answers_error(tmp_path, restore_pools, exc, not_implemented):
    def answer(worker_id):
        raise exc

    W._GradedInit(answer, str(tmp_path), 30.0, forked=False)(0)
    assert W._STATE["error"] == f"{type(exc).__name__}: {exc}"
    assert W._STATE["not_implemented"] is not_implemented
    assert "in answer" in W._STATE["traceback"] and "in __call__" not in W._STATE["traceback"]
