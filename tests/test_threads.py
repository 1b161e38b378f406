"""Tests for course_utils.threads: inventory, limiting, and limiting inside real workers.

The worker tests start real DataLoader workers under every start method this platform has,
after this process has used its torch, BLAS and OpenCV pools (the case in which a forked
child can hang). Every test that starts processes has a timeout.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import sys
import time

import cv2
import numpy as np
import pytest
import torch

from _helpers import needs_its_own_process
from course_utils import fork_safety, threads
from course_utils.threads import (
    ThreadPools,
    WorkerThreadLimiter,
    limit_threads,
    make_worker_init,
    pools_in_workers,
    thread_pools,
)

METHODS = [m for m in ("fork", "forkserver", "spawn") if m in mp.get_all_start_methods()]
NON_FORK = [m for m in ("forkserver", "spawn") if m in mp.get_all_start_methods()]


def _use_every_pool() -> None:
    rng = np.random.default_rng(0)
    a = rng.random((512, 512))
    a @ a  # BLAS pool
    img = rng.integers(0, 255, (2000, 2000, 3), dtype=np.uint8)
    cv2.resize(img, (1000, 1000))
    cv2.GaussianBlur(img, (15, 15), 0)  # OpenCV pool
    t = torch.randn(512, 512)
    t @ t  # torch's pool
    torch.randn(1, 3, 256, 256).mul(2.0).sum()


@pytest.fixture(scope="module")
def busy_parent() -> ThreadPools:
    """This process with every pool already used; returns its pools."""
    _use_every_pool()
    return thread_pools()


def _blas_max(pools: ThreadPools) -> int:
    return max([e["num_threads"] for e in pools.blas if e["user_api"] == "blas"] or [0])


def _signature(p: ThreadPools) -> tuple:
    return (p.torch_intra, p.torch_interop, p.opencv, sorted((e["filepath"], e["num_threads"]) for e in p.blas))


# ----------------------------------------------------------------------------- inventory
def test_thread_pools_inventory_structure():
    p = thread_pools()
    assert p.pid == os.getpid() and p.worker_id is None
    assert p.torch_intra == torch.get_num_threads() >= 1
    assert p.torch_interop == torch.get_num_interop_threads() >= 1
    assert p.opencv == cv2.getNumThreads()
    assert p.blas, "threadpoolctl should see at least NumPy's BLAS"
    for entry in p.blas:
        assert {"user_api", "internal_api", "num_threads", "filepath"} <= set(entry)
    assert p.total_max == max(p.pools.values()) >= 1
    assert p.pools["torch intra-op"] == p.torch_intra and p.pools["OpenCV"] == p.opencv
    assert ThreadPools.from_dict(p.to_dict()) == p
    text = str(p)
    assert "torch intra-op" in text and "OpenCV" in text and "\n" not in text


def test_thread_pools_changes_nothing():
    assert _signature(thread_pools()) == _signature(thread_pools())


def test_torch_openmp_is_recognised():
    p = thread_pools()
    omp = [e for e in p.blas if e["user_api"] == "openmp" and "torch" in str(e["filepath"])]
    for entry in omp:
        assert threads.is_torch_openmp(entry)
    assert not any(threads.is_torch_openmp(e) for e in p.blas if e["user_api"] == "blas")


# ----------------------------------------------------------------------------- limit_threads
def test_limit_threads_context_manager_limits_and_restores(busy_parent):
    before = thread_pools()
    with limit_threads(1) as lim:
        inside = thread_pools()
        _use_every_pool()  # still works, sequentially
    after = thread_pools()
    assert lim.n == 1
    assert inside.torch_intra == 1 and inside.opencv == 1
    assert all(e["num_threads"] == 1 for e in inside.blas)
    assert inside.limited_to(1) and inside.total_max == 1
    assert _signature(after) == _signature(before)


def test_limit_threads_restores_after_an_exception():
    before = thread_pools()
    with pytest.raises(KeyError):
        with limit_threads(1):
            raise KeyError("boom")
    assert _signature(thread_pools()) == _signature(before)


def test_limit_threads_as_decorator_applies_per_call():
    before = thread_pools()

    @limit_threads(1)
    def inside() -> ThreadPools:
        return thread_pools()

    assert _signature(thread_pools()) == _signature(before), "decorating must not change pools"
    for _ in range(2):
        assert inside().total_max == 1
        assert _signature(thread_pools()) == _signature(before)


def test_limit_threads_nests():
    needs_its_own_process()
    before = thread_pools()
    with limit_threads(1):
        with limit_threads(3):
            assert thread_pools().torch_intra == 3 and thread_pools().opencv == 3
        assert thread_pools().total_max == 1
    assert _signature(thread_pools()) == _signature(before)


def test_limit_threads_object_is_not_reentrant():
    lim = limit_threads(1)
    with lim:
        with pytest.raises(RuntimeError, match="already active"):
            lim.__enter__()


@pytest.mark.parametrize("bad", [0, -2])
def test_limit_threads_rejects_non_positive(bad):
    with pytest.raises(ValueError, match=r"\bn must be >= 1"):
        limit_threads(bad)


@pytest.mark.parametrize("bad", ["2", 1.5, True, None])
def test_limit_threads_rejects_non_int(bad):
    with pytest.raises(TypeError, match=r"\bn must be an int >= 1"):
        limit_threads(bad)


def test_limit_threads_accepts_numpy_int():
    with limit_threads(np.int64(1)):
        assert thread_pools().total_max == 1


# ----------------------------------------------------------------------------- worker init
def test_make_worker_init_validates():
    with pytest.raises(ValueError, match="n_threads"):
        make_worker_init(n_threads=-1)
    with pytest.raises(ValueError, match="n_threads"):
        make_worker_init(n_threads=0)
    with pytest.raises(TypeError, match="n_threads"):
        make_worker_init(n_threads="1")
    with pytest.raises(ValueError, match="seed"):
        make_worker_init(seed=-1)
    with pytest.raises(ValueError, match="seed"):
        make_worker_init(seed="7")


def test_worker_init_is_picklable():
    fn = make_worker_init(2, seed=5)
    assert isinstance(fn, WorkerThreadLimiter)
    back = pickle.loads(pickle.dumps(fn))
    assert (back.n_threads, back.seed, back.set_env) == (2, 5, True)
    assert "n_threads=2" in repr(back)


def _child_limits_then_works(queue, worker_id: int) -> None:
    """Runs in a forked child of a process whose pools are busy."""
    try:
        report = {"fork_copy": fork_safety.pools_may_be_fork_copies()}
        WorkerThreadLimiter(1, seed=7)(worker_id)
        report["pools"] = thread_pools().to_dict()
        _use_every_pool()  # every pool is usable after limiting
        with limit_threads(1):
            _use_every_pool()
        try:
            with limit_threads(2):
                pass
        except RuntimeError as exc:
            report["refused"] = str(exc)
        report["env"] = {k: os.environ.get(k) for k in threads.THREAD_ENV_VARS}
        report["draws"] = (float(np.random.random()), __import__("random").random())
        queue.put(report)
    except BaseException as exc:  # report, do not hang the parent
        queue.put({"error": repr(exc)})


@pytest.mark.timeout(120)
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork on this platform")
def test_worker_limiter_never_hangs_in_forked_children(busy_parent):
    """Repeated, because the OpenCV hang this guards against happens in most forks, not all."""
    needs_its_own_process()
    ctx = mp.get_context("fork")
    reports = []
    for worker_id in (0, 1, 0):
        queue = ctx.Queue()
        proc = ctx.Process(target=_child_limits_then_works, args=(queue, worker_id))
        proc.start()
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join()
            pytest.fail("a forked child hung while limiting or using its thread pools")
        reports.append(queue.get(timeout=5))
    for report in reports:
        assert "error" not in report, report.get("error")
        assert report["fork_copy"] is True
        pools = ThreadPools.from_dict(report["pools"])
        assert pools.total_max == 1 and pools.opencv == 1 and pools.torch_intra == 1
        assert all(v == "1" for v in report["env"].values())
        assert "forkserver" in report["refused"]
    assert reports[0]["draws"] == reports[2]["draws"], "same seed + worker_id -> same streams"
    assert reports[0]["draws"] != reports[1]["draws"], "different workers -> different streams"
    assert fork_safety.pools_may_be_fork_copies() is False  # the parent is not a fork copy


# ----------------------------------------------------------------------------- pools_in_workers
def test_pools_in_workers_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_workers"):
        pools_in_workers(num_workers=0)
    with pytest.raises(ValueError, match="num_workers"):
        pools_in_workers(num_workers=True)
    with pytest.raises(ValueError, match="timeout_s"):
        pools_in_workers(timeout_s=0)
    with pytest.raises(ValueError, match="multiprocessing_context") as info:
        pools_in_workers(multiprocessing_context="forky")
    assert "spawn" in str(info.value)
    with pytest.raises(TypeError, match="worker_init_fn"):
        pools_in_workers(worker_init_fn=3)


@pytest.mark.skipif(not NON_FORK, reason="no spawn/forkserver")
def test_pools_in_workers_refuses_unpicklable_init_before_starting_workers():
    with pytest.raises(TypeError, match="worker_init_fn.*pickled"):
        pools_in_workers(worker_init_fn=lambda worker_id: None, multiprocessing_context=NON_FORK[-1])


@pytest.mark.skipif(not NON_FORK, reason="no spawn/forkserver")
def test_pools_in_workers_explains_notebook_defined_init(monkeypatch):
    import types

    def init_in_notebook(worker_id):
        pass

    init_in_notebook.__module__ = "__main__"
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # like Jupyter
    with pytest.raises(TypeError, match="notebook"):
        pools_in_workers(init_in_notebook, multiprocessing_context=NON_FORK[-1])


class _SlowInit:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, worker_id: int) -> None:
        time.sleep(self.seconds)


@pytest.mark.timeout(60)
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork on this platform")
def test_pools_in_workers_times_out_with_a_clear_error():
    with pytest.raises(RuntimeError) as info:
        pools_in_workers(_SlowInit(2.0), num_workers=1, multiprocessing_context="fork", timeout_s=0.5)
    message = str(info.value)
    assert "'fork'" in message and "timeout_s=0.5" in message and "spawn" in message


class _PerWorkerInit:
    """Test helper: a different worker_init_fn per worker id, so one loader (one slow
    spawn/forkserver start-up) shows several settings side by side."""

    def __init__(self, inits: dict) -> None:
        self.inits = inits

    def __call__(self, worker_id: int) -> None:
        init = self.inits.get(worker_id)
        if init is not None:
            init(worker_id)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("method", METHODS)
def test_pools_in_real_workers_without_and_with_make_worker_init(busy_parent, method):
    """Worker 0 runs without worker_init_fn, worker 1 with make_worker_init(1)."""
    if method == "forkserver":
        needs_its_own_process()
    pools = pools_in_workers(
        _PerWorkerInit({1: make_worker_init(1)}), num_workers=2, multiprocessing_context=method, timeout_s=90
    )
    assert [p.worker_id for p in pools] == [0, 1]
    assert len({p.pid for p in pools}) == 2 and os.getpid() not in {p.pid for p in pools}

    plain = pools[0]
    assert plain.torch_intra == 1, "the DataLoader sets torch's pool to 1 in every worker"
    if busy_parent.opencv > 1:
        assert plain.opencv > 1, f"OpenCV pool in a {method} worker without init: {plain}"
    if _blas_max(busy_parent) > 1:
        assert _blas_max(plain) > 1, f"BLAS pool in a {method} worker without init: {plain}"
    if method == "fork":  # inherited as they were in the parent
        assert plain.opencv == busy_parent.opencv
        assert _blas_max(plain) == _blas_max(busy_parent)

    limited = pools[1]
    assert limited.torch_intra == 1 and limited.opencv == 1, limited
    assert all(e["num_threads"] == 1 for e in limited.blas), limited
    assert limited.limited_to(1)


def test_the_seed_gives_each_worker_its_own_numpy_and_random_streams():
    """Called in this (non-forked) process as a worker calls it: n_threads=1 is never refused
    here and no watchdog is armed; limit_threads(1) puts the pools back and the RNG states are
    restored. Each library is checked on its own: seed + worker_id for NumPy AND for random."""
    import random

    saved, pools_before = (random.getstate(), np.random.get_state()), _signature(thread_pools())
    draws = {}
    try:
        with limit_threads(1):
            for worker_id in (0, 1, 0):
                WorkerThreadLimiter(1, seed=7, set_env=False)(worker_id)
                draws.setdefault(worker_id, []).append((float(np.random.random()), random.random()))
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
    assert _signature(thread_pools()) == pools_before
    assert draws[0][0] == draws[0][1], "same seed + worker_id -> same streams"
    (numpy0, random0), (numpy1, random1) = draws[0][0], draws[1][0]
    assert numpy0 != numpy1, "NumPy's global stream must depend on worker_id"
    assert random0 != random1, "random's stream must depend on worker_id"
    for worker_id in (0, 1):                             # the documented seed + worker_id
        numpy_draw, random_draw = draws[worker_id][0]
        assert numpy_draw == np.random.RandomState(7 + worker_id).random_sample()
        assert random_draw == random.Random(7 + worker_id).random()


def test_worker_limiter_sets_more_than_one_thread_in_a_fresh_process(monkeypatch):
    """The n > 1 path, run in this (non-forked) process and undone by limit_threads."""
    for var in threads.THREAD_ENV_VARS:  # recorded, so monkeypatch restores them afterwards
        monkeypatch.setenv(var, "placeholder")
    before = thread_pools()
    with limit_threads(1):
        WorkerThreadLimiter(3)(0)
        p = thread_pools()
        assert p.torch_intra == 3 and p.opencv == 3, p
        assert all(e["num_threads"] == 3 for e in p.blas), p
        assert os.environ["OMP_NUM_THREADS"] == "3"
    assert _signature(thread_pools()) == _signature(before)


@pytest.mark.timeout(60)
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork on this platform")
def test_make_worker_init_passed_directly_limits_forked_workers(busy_parent):
    for p in pools_in_workers(make_worker_init(1), num_workers=2, multiprocessing_context="fork"):
        assert p.limited_to(1) and p.opencv == 1 and p.torch_intra == 1, p


@pytest.mark.timeout(60)
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork on this platform")
def test_make_worker_init_refuses_more_than_one_thread_in_forked_workers(busy_parent):
    needs_its_own_process()
    with pytest.raises(RuntimeError, match="n_threads=2.*forkserver"):
        pools_in_workers(make_worker_init(2), num_workers=2, multiprocessing_context="fork", timeout_s=30)


# ----------------------------------------------------------------------------- fork under load
class _BusyParentThreads:
    """Background threads that keep this process busy while it forks, like a benchmark does:
    a psutil sampler of the process tree, an OpenCV user, and a churner of multiprocessing
    locks (sem_open/sem_close) and cyclic garbage. Context manager.

    No thread runs NumPy BLAS here: forking while another thread is inside OpenBLAS can
    deadlock the *parent* in OpenBLAS's own fork handler (``blas_thread_shutdown_`` joining a
    pool thread that missed its wake-up; seen once while writing this test; OpenBLAS issues
    #2270/#3111). Nothing in a worker_init_fn can help with that one."""

    def __init__(self) -> None:
        import threading

        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(fn,), daemon=True, name=f"busy-{fn.__name__}")
            for fn in (self._sample, self._opencv, self._churn)
        ]
        self.rounds = 0

    @staticmethod
    def _sample() -> None:
        import psutil

        for proc in [psutil.Process()] + psutil.Process().children(recursive=True):
            try:
                proc.memory_info()
                proc.num_threads()
            except psutil.Error:
                pass

    @staticmethod
    def _opencv() -> None:
        img = np.full((480, 640, 3), 7, np.uint8)
        cv2.GaussianBlur(cv2.resize(img, (320, 240)), (5, 5), 0)

    @staticmethod
    def _churn() -> None:
        import multiprocessing.synchronize  # noqa: F401  (imported once, before any fork)

        lock = mp.get_context("fork").Lock()
        cycle = [lock]
        cycle.append(cycle)  # cyclic garbage holding a semaphore: freed by the collector
        del lock, cycle

    def _loop(self, fn) -> None:
        while not self._stop.is_set():
            fn()
            self.rounds += 1

    def __enter__(self) -> "_BusyParentThreads":
        for fn in (self._sample, self._opencv, self._churn):
            fn()  # imports and first uses happen here, not at fork time
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)


def _forked_worker_init_report(conn, worker_id: int) -> None:
    try:
        WorkerThreadLimiter(1)(worker_id)
        pools = thread_pools()
        img = np.full((480, 640, 3), 9, np.uint8)
        cv2.GaussianBlur(cv2.resize(img, (320, 240)), (5, 5), 0)  # OpenCV still usable
        import gc

        conn.send({"pools": pools.to_dict(), "frozen": gc.get_freeze_count()})
    except BaseException as exc:
        conn.send({"error": repr(exc)})
    finally:
        conn.close()


@pytest.mark.timeout(60)
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork on this platform")
def test_worker_limiter_never_hangs_when_forked_from_a_busy_parent(busy_parent):
    """Regression: a forked DataLoader worker once hung for good inside make_worker_init(1)
    (in the cv2.setNumThreads line) while the parent benchmark had threads running. Fork many
    children while four parent threads use psutil, OpenCV, BLAS/torch and multiprocessing
    locks; every child must limit its pools and answer within the time limit."""
    ctx = mp.get_context("fork")
    reports, hung = [], []
    deadline = time.monotonic() + 25
    with _BusyParentThreads() as busy:
        for i in range(12):
            if time.monotonic() > deadline and i >= 6:
                break  # slow machine: at least 6 forks
            parent_end, child_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_forked_worker_init_report, args=(child_end, i % 2))
            proc.start()
            child_end.close()
            if parent_end.poll(15):
                reports.append(parent_end.recv())
            else:
                hung.append(proc.pid)
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
            parent_end.close()
        assert busy.rounds > 0
    assert not hung, f"forked children {hung} hung while limiting their thread pools"
    for report in reports:
        assert "error" not in report, report.get("error")
        pools = ThreadPools.from_dict(report["pools"])
        assert pools.limited_to(1) and pools.opencv == 1 and pools.torch_intra == 1, pools
        assert report["frozen"] > 0, "a forked worker puts what it inherited out of the collector's reach"


@pytest.mark.timeout(60)
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork on this platform")
def test_forked_dataloader_workers_limit_while_the_parent_is_busy(busy_parent):
    """The same through real DataLoader workers, twice (fresh workers each time)."""
    with _BusyParentThreads():
        for _ in range(2):
            pools = pools_in_workers(make_worker_init(1), num_workers=2, multiprocessing_context="fork",
                                     timeout_s=20)
            assert all(p.limited_to(1) and p.opencv == 1 for p in pools), pools


def _child_with_a_stuck_init(stderr_path: str) -> None:
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)  # the watchdog writes the stacks to file descriptor 2
    threads.WORKER_INIT_WATCHDOG_S = 1.0
    threads.torch.set_num_threads = lambda n: time.sleep(60)  # stands in for a stuck call
    WorkerThreadLimiter(1)(0)


@pytest.mark.timeout(60)
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork on this platform")
def test_a_stuck_forked_worker_init_ends_the_worker_instead_of_hanging(busy_parent, tmp_path):
    stderr_path = str(tmp_path / "stderr.txt")
    t0 = time.monotonic()
    proc = mp.get_context("fork").Process(target=_child_with_a_stuck_init, args=(stderr_path,))
    proc.start()
    proc.join(timeout=30)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail("the watchdog did not end a forked worker stuck in WorkerThreadLimiter")
    assert proc.exitcode == 1
    assert time.monotonic() - t0 < 20
    text = open(stderr_path).read()
    assert "Timeout" in text and "__call__" in text and "<lambda>" in text, text[-2000:]


def test_prepare_opencv_for_fork_changes_nothing():
    before = (cv2.getNumThreads(), thread_pools().opencv)
    fork_safety.prepare_opencv_for_fork()
    fork_safety.prepare_opencv_for_fork()
    assert (cv2.getNumThreads(), thread_pools().opencv) == before


def test_set_opencv_threads_leaves_a_sequential_opencv_alone(monkeypatch):
    calls = []
    with limit_threads(1):
        assert cv2.getNumThreads() == 1
        monkeypatch.setattr(cv2, "setNumThreads", lambda n: calls.append(n))
        threads._set_opencv_threads(1)
        assert calls == [], "already sequential: no call into OpenCV"
        threads._set_opencv_threads(2)
        assert calls == [2]
        monkeypatch.undo()


def test_thread_pools_print_where_they_were_read_and_every_pool():
    blas = [{"internal_api": "openblas", "prefix": "libopenblas", "num_threads": 3}]
    main = ThreadPools(torch_intra=4, torch_interop=2, opencv=None, blas=blas, pid=17)
    assert str(main) == "[pid 17] torch intra-op 4, openblas (libopenblas) 3; torch inter-op 2"
    worker = ThreadPools(torch_intra=1, torch_interop=1, opencv=0, pid=18, worker_id=0)
    assert str(worker) == "[pid 18, worker 0] torch intra-op 1, OpenCV 0; torch inter-op 1"
