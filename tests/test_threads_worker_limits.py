"""course_utils.threads: what a worker_init_fn sets (threads, environment, seeds independent per
worker), how OpenCV is asked for threads, how pools are named and compared with a limit, what
limit_threads sets and gives back, and how pools_in_workers asks a DataLoader and reads its
answers and failures. The libraries' setters and the DataLoader are replaced by recorders, so no
worker starts and no pool of this process is left changed."""
from __future__ import annotations

import os
import pickle
import random
import sys
import types

import numpy as np
import pytest
import torch

from course_utils import threads
from course_utils.threads import (THREAD_ENV_VARS, ThreadPools, WorkerThreadLimiter, is_torch_openmp,
                                  limit_threads, make_worker_init, opencv_follows_omp_num_threads,
                                  opencv_parallel_framework, pools_in_workers, thread_pools)

TORCH_DIR = os.path.dirname(torch.__file__)


class Recorder:
    """Stands in for the libraries a limiter calls: records every call."""

    def __init__(self, monkeypatch, opencv_now=8):
        self.calls: list[tuple] = []
        self.opencv_now = opencv_now
        monkeypatch.setattr(threads.cv2, "getNumThreads", lambda: self.opencv_now)
        monkeypatch.setattr(threads.cv2, "setNumThreads", lambda n: self.calls.append(("opencv", n)))
        monkeypatch.setattr(threads.torch, "set_num_threads", lambda n: self.calls.append(("torch", n)))
        monkeypatch.setattr(threads.threadpoolctl, "threadpool_limits",
                            lambda limits: self.calls.append(("blas", limits)) or f"limits {limits}")
        monkeypatch.setattr(threads, "refuse_unsafe_fork",
                            lambda n, what: self.calls.append(("refuse?", n, what)))
        monkeypatch.setattr(threads, "is_fork_child", lambda: False)
        for var in THREAD_ENV_VARS:
            monkeypatch.setenv(var, "untouched")


# ---- OpenCV's pool -----------------------------------------------------------------------------

@pytest.mark.parametrize("asked, now, call", [
    (1, 8, 0),       # sequential is asked as 0 (1 would join the pool's threads)
    (1, 2, 0),
    (1, 1, None),    # already sequential: OpenCV is not called
    (1, 0, None),
    (0, 4, 0),
    (2, 1, 2),
    (3, 8, 3),
])
def test_opencv_is_asked_for_0_when_sequential_else_the_count(monkeypatch, asked, now, call):
    recorder = Recorder(monkeypatch, opencv_now=now)
    threads._set_opencv_threads(asked)
    assert recorder.calls == ([] if call is None else [("opencv", call)])


@pytest.mark.parametrize("text, framework", [
    ("General\n  Parallel framework:            pthreads\n  Other: x", "pthreads"),
    ("  parallel FRAMEWORK: TBB (ver 2021.11 interface 12110): extra", "TBB (ver 2021.11 interface 12110): extra"),
    ("  Parallel framework:   \n", None),
    ("  Parallel frameworks: OpenMP\n  Parallel framework OpenMP", None),
])
def test_the_parallel_framework_line_is_read_after_its_first_colon(text, framework):
    assert opencv_parallel_framework(text) == framework


@pytest.mark.parametrize("framework, follows", [(None, None), ("  OpenMP", True), ("openmp 201511", True),
                                                ("pthreads", False), ("TBB (ver 2021)", False)])
def test_only_an_openmp_opencv_follows_omp_num_threads(framework, follows):
    assert opencv_follows_omp_num_threads(framework) is follows


def test_torch_openmp_is_the_openmp_runtime_inside_torchs_folder():
    inside = os.path.join(TORCH_DIR, "lib", "libgomp.so.1")
    assert is_torch_openmp({"user_api": "openmp", "filepath": inside})
    assert not is_torch_openmp({"user_api": "blas", "filepath": inside})
    assert not is_torch_openmp({"user_api": "openmp", "filepath": TORCH_DIR + "_extra/libgomp.so"})
    assert not is_torch_openmp({"user_api": "openmp", "filepath": "/usr/lib/libgomp.so.1"})
    assert not is_torch_openmp({"user_api": "openmp", "filepath": None})


# ---- ThreadPools -------------------------------------------------------------------------------

def test_pools_are_named_by_prefix_or_file_and_never_merged():
    blas = [{"user_api": "blas", "internal_api": "openblas", "num_threads": 4, "prefix": "libopenblas",
             "filepath": "/a/libopenblas.so"},
            {"user_api": "blas", "internal_api": "openblas", "num_threads": 6, "prefix": "libopenblas",
             "filepath": "/b/libopenblas.so"},
            {"user_api": "openmp", "internal_api": "openmp", "num_threads": None, "prefix": None,
             "filepath": "/c/libomp.so"},
            {"user_api": "openmp", "internal_api": "openmp", "num_threads": 5, "prefix": "libgomp",
             "filepath": os.path.join(TORCH_DIR, "lib", "libgomp.so.1")},
            {"internal_api": "mkl", "num_threads": 2}]
    pools = ThreadPools(torch_intra=3, torch_interop=9, opencv=7, blas=blas).pools
    assert pools == {"torch intra-op": 3, "OpenCV": 7, "openblas (libopenblas)": 4,
                     "openblas (libopenblas)'": 6, "openmp (libomp.so)": 0,
                     "openmp (libgomp, torch)": 5, "mkl (?)": 2}


def test_the_most_threads_of_any_pool_against_a_limit():
    pools = ThreadPools(torch_intra=2, torch_interop=16, opencv=None,
                        blas=[{"internal_api": "openblas", "prefix": "x", "num_threads": 3}])
    assert pools.total_max == 3                     # not the inter-op pool's 16
    assert pools.limited_to(3) and not pools.limited_to(2)


def test_pools_round_trip_through_a_dict_and_ignore_unknown_keys():
    entry = {"internal_api": "openblas", "prefix": "x", "num_threads": 3}
    data = {"torch_intra": 2, "torch_interop": 1, "opencv": 4, "blas": [entry], "pid": 5,
            "worker_id": 1, "os_threads": 9, "thread_env": None, "from_a_newer_version": True}
    pools = ThreadPools.from_dict(data)
    assert pools == ThreadPools(2, 1, 4, [entry], 5, 1, 9, {})
    entry["num_threads"] = 99                        # a copy, not the caller's dict
    assert pools.blas[0]["num_threads"] == 3
    assert ThreadPools.from_dict({"torch_intra": 1, "torch_interop": 1, "opencv": None}).blas == []


def test_thread_pools_reads_the_worker_threads_and_variables(monkeypatch):
    monkeypatch.setattr(threads, "get_worker_info", lambda: types.SimpleNamespace(id=3))
    monkeypatch.setattr(threads, "count_os_threads", lambda: 11)
    for var in THREAD_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    monkeypatch.setenv("OPENCV_FOR_THREADS_NUM", "1")
    monkeypatch.setenv("NOT_A_THREAD_VAR", "5")
    pools = thread_pools()
    assert (pools.worker_id, pools.os_threads, pools.pid) == (3, 11, os.getpid())
    assert pools.thread_env == {"MKL_NUM_THREADS": "2", "OPENCV_FOR_THREADS_NUM": "1"}


# ---- limit_threads -----------------------------------------------------------------------------

def test_limit_threads_sets_every_pool_then_gives_back_the_old_sizes(monkeypatch):
    recorder = Recorder(monkeypatch, opencv_now=8)
    monkeypatch.setattr(threads.torch, "get_num_threads", lambda: 6)
    restored = []
    monkeypatch.setattr(threads.threadpoolctl, "threadpool_limits",
                        lambda limits: recorder.calls.append(("blas", limits)) or types.SimpleNamespace(
                            restore_original_limits=lambda: restored.append(limits)))
    with limit_threads(3):
        assert recorder.calls == [("refuse?", 3, "limit_threads(3)"), ("opencv", 3), ("blas", 3),
                                  ("torch", 3)]
        recorder.calls.clear()
    assert restored == [3] and recorder.calls == [("torch", 6), ("opencv", 8)]


def test_limit_threads_to_one_asks_opencv_for_sequential(monkeypatch):
    recorder = Recorder(monkeypatch, opencv_now=4)
    monkeypatch.setattr(threads.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(threads.threadpoolctl, "threadpool_limits",
                        lambda limits: types.SimpleNamespace(restore_original_limits=lambda: None))
    with limit_threads():
        pass
    assert ("opencv", 0) in recorder.calls and ("torch", 1) in recorder.calls
    assert recorder.calls[-2:] == [("torch", 2), ("opencv", 4)]


# ---- the worker_init_fn ------------------------------------------------------------------------

def test_make_worker_init_passes_its_arguments():
    init = make_worker_init(3, 7, set_env=False)
    assert isinstance(init, WorkerThreadLimiter)
    assert (init.n_threads, init.seed, init.set_env) == (3, 7, False)
    assert repr(init) == "WorkerThreadLimiter(n_threads=3, seed=7)"
    default = make_worker_init()
    assert (default.n_threads, default.seed, default.set_env) == (1, None, True)
    assert pickle.loads(pickle.dumps(init)).seed == 7


def test_the_limiter_accepts_its_smallest_values():
    limiter = WorkerThreadLimiter(1, 0)
    assert (limiter.n_threads, limiter.seed) == (1, 0)
    with pytest.raises(ValueError, match="seed"):
        WorkerThreadLimiter(1, -1)


def test_a_worker_gets_every_pool_and_variable_set_to_its_count(monkeypatch):
    recorder = Recorder(monkeypatch, opencv_now=8)
    monkeypatch.setattr(threads, "_worker_limits", [])
    WorkerThreadLimiter(2)(worker_id=1)
    assert recorder.calls == [("refuse?", 2, "make_worker_init(n_threads=2)"), ("opencv", 2),
                              ("blas", 2), ("torch", 2)]
    assert threads._worker_limits == ["limits 2"]          # kept for the worker's life
    assert {var: os.environ[var] for var in THREAD_ENV_VARS} == dict.fromkeys(THREAD_ENV_VARS, "2")


def test_a_worker_without_set_env_leaves_the_variables(monkeypatch):
    Recorder(monkeypatch)
    monkeypatch.setattr(threads, "_worker_limits", [])
    WorkerThreadLimiter(1, set_env=False)(worker_id=0)
    assert all(os.environ[var] == "untouched" for var in THREAD_ENV_VARS)


def _draws():
    return random.random(), float(np.random.random())


def test_seeded_workers_draw_from_seed_plus_worker_id(monkeypatch):
    Recorder(monkeypatch)
    monkeypatch.setattr(threads, "_worker_limits", [])
    state = random.getstate(), np.random.get_state()
    try:
        WorkerThreadLimiter(1, seed=10)(worker_id=3)
        worker3 = _draws()
        WorkerThreadLimiter(1, seed=10)(worker_id=0)
        worker0 = _draws()
        WorkerThreadLimiter(1, seed=13)(worker_id=0)
        seed13 = _draws()
        # worker 3 of seed 10 draws what seed 13 draws, worker 0 its own; random and NumPy both
        assert worker3 == seed13 and worker0 != worker3
        assert worker3 == (random.Random(13).random(), float(np.random.RandomState(13).random_sample()))
        # NumPy's seed wraps at 2**32; random's does not
        WorkerThreadLimiter(1, seed=2**32 - 1)(worker_id=3)
        wrapped = _draws()
        assert wrapped[1] == float(np.random.RandomState(2).random_sample())
        assert wrapped[0] == random.Random(2**32 + 2).random()
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])


def test_an_unseeded_worker_leaves_the_random_streams_alone(monkeypatch):
    Recorder(monkeypatch)
    monkeypatch.setattr(threads, "_worker_limits", [])
    random.seed(5)
    np.random.seed(5)
    WorkerThreadLimiter(1)(worker_id=2)
    assert _draws() == (random.Random(5).random(), float(np.random.RandomState(5).random_sample()))


def test_a_forked_worker_freezes_the_gc_under_a_watchdog(monkeypatch):
    recorder = Recorder(monkeypatch)
    monkeypatch.setattr(threads, "_worker_limits", [])
    monkeypatch.setattr(threads, "is_fork_child", lambda: True)
    monkeypatch.setattr(threads.gc, "freeze", lambda: recorder.calls.append(("gc.freeze",)))
    monkeypatch.setattr(threads.faulthandler, "dump_traceback_later",
                        lambda s, exit, file: recorder.calls.append(("watchdog", s, exit, file)))
    monkeypatch.setattr(threads.faulthandler, "cancel_dump_traceback_later",
                        lambda: recorder.calls.append(("cancel",)))
    WorkerThreadLimiter(1)(worker_id=0)
    assert [c[0] for c in recorder.calls] == ["refuse?", "watchdog", "gc.freeze", "opencv", "blas",
                                              "torch", "cancel"]
    assert recorder.calls[1] == ("watchdog", threads.WORKER_INIT_WATCHDOG_S, True, sys.__stderr__)


def test_a_worker_in_its_own_process_has_no_watchdog(monkeypatch):
    recorder = Recorder(monkeypatch)
    monkeypatch.setattr(threads, "_worker_limits", [])
    monkeypatch.setattr(threads.gc, "freeze", lambda: recorder.calls.append(("gc.freeze",)))
    monkeypatch.setattr(threads.faulthandler, "dump_traceback_later",
                        lambda *a, **k: recorder.calls.append(("watchdog",)))
    WorkerThreadLimiter(1)(worker_id=0)
    assert ("gc.freeze",) not in recorder.calls and ("watchdog",) not in recorder.calls


# ---- pools_in_workers, with a recording DataLoader ---------------------------------------------

class FakeLoader:
    """Records how it was made; yields the pools of the worker ids in ``answers``, or raises."""

    made: list = []
    answers: list = []
    error: Exception | None = None
    stopped: list = []

    def __init__(self, dataset, **kwargs):
        FakeLoader.made.append((dataset, kwargs))

    def __iter__(self):
        def items():
            for worker_id in FakeLoader.answers:
                yield ThreadPools(1, 1, 0, pid=100 + (worker_id or 0), worker_id=worker_id).to_dict()
            if FakeLoader.error is not None:
                raise FakeLoader.error
        return items()


@pytest.fixture
def loader(monkeypatch):
    FakeLoader.made, FakeLoader.answers, FakeLoader.error, FakeLoader.stopped = [], [], None, []
    monkeypatch.setattr(threads, "DataLoader", FakeLoader)
    monkeypatch.setattr(threads, "stop_workers", lambda it: FakeLoader.stopped.append(it))
    return FakeLoader


def test_pools_in_workers_asks_one_item_per_worker_and_sorts_the_answers(loader):
    loader.answers = [2, 0, 1]
    init = make_worker_init(1)
    answers = pools_in_workers(init, num_workers=3, multiprocessing_context="fork", timeout_s=9)
    assert [p.worker_id for p in answers] == [0, 1, 2] and answers[2].pid == 102
    ((dataset, kwargs),) = loader.made
    assert len(dataset) == 3
    assert kwargs["batch_size"] is None and kwargs["num_workers"] == 3
    assert kwargs["worker_init_fn"] is init and kwargs["timeout"] == 9.0
    assert kwargs["multiprocessing_context"].get_start_method() == "fork"
    assert len(loader.stopped) == 1


def test_pools_in_workers_gives_non_fork_workers_no_timeout(loader):
    loader.answers = [0]
    pools_in_workers(None, num_workers=1, multiprocessing_context="spawn", timeout_s=9)
    assert loader.made[0][1]["timeout"] == 0.0


def test_pools_in_workers_needs_an_answer_from_every_worker(loader):
    loader.answers = [0, 2, None]
    with pytest.raises(RuntimeError, match=r"expected one answer from each of workers 0\.\.2, got "
                                           r"worker ids \[0, 2\]"):
        pools_in_workers(None, num_workers=3, multiprocessing_context="fork")
    assert len(loader.stopped) == 1


@pytest.mark.parametrize("error, says", [
    ("DataLoader worker (pid 7) timed out after 5 seconds",
     "(start method 'fork') did not answer within timeout_s=5.0 s: stuck in worker_init_fn"),
    ("DataLoader worker (pid 7) exited unexpectedly", "(start method 'fork') died: under 'spawn'"),
])
def test_pools_in_workers_explains_a_stuck_or_dead_worker(loader, error, says):
    loader.error = RuntimeError(error)
    with pytest.raises(RuntimeError) as info:
        pools_in_workers(None, num_workers=1, multiprocessing_context="fork", timeout_s=5)
    assert says in str(info.value) and str(info.value).endswith(f"Original error: {error}")
    assert len(loader.stopped) == 1


def test_pools_in_workers_passes_other_errors_on_unchanged(loader):
    loader.error = RuntimeError("something else")
    with pytest.raises(RuntimeError, match="^something else$"):
        pools_in_workers(None, num_workers=1, multiprocessing_context="fork")


def test_pools_in_workers_checks_a_non_fork_init_before_making_a_loader(loader, monkeypatch):
    with pytest.raises(TypeError, match="cannot be pickled"):
        pools_in_workers(lambda worker_id: None, num_workers=1, multiprocessing_context="spawn")
    assert loader.made == []
    loader.answers = [0]
    pools_in_workers(lambda worker_id: None, num_workers=1, multiprocessing_context="fork")
    assert len(loader.made) == 1                     # fork sends nothing: a lambda is fine


def test_a_notebook_init_is_refused_but_a_script_one_is_sent(loader, monkeypatch):
    notebook = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", notebook)
    init = types.SimpleNamespace(__module__="__main__")          # picklable, defined in __main__
    with pytest.raises(TypeError, match="is defined in the notebook"):
        threads._check_sendable(init, "spawn")
    notebook.__file__ = "/somewhere/train.py"
    threads._check_sendable(make_worker_init(1), "spawn")        # importable: no error
    threads._check_sendable(init, "spawn")                       # a script's __main__ can be imported
