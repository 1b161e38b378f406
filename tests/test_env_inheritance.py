"""What DataLoader workers inherit under each start method, measured in real workers.

Lesson 02 judges the common recipe's ``os.environ[...] = "1"`` lines (set after the imports) in
real workers: the verdict is :func:`env_limit_verdict` of the pools measured there. Here: that
function on hand-made pool sizes just inside and outside its limits; real fork and spawn workers
started after this process set the variables (a few seconds); OpenCV's parallel framework read
from its build information; and the start-method and doctor texts that say what is inherited.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os

import cv2
import pytest
import torch

from course_utils.lessons.l02_threads import (
    ENV_VERDICTS,
    RECIPE_ENV_VARS,
    env_after_import_in_workers,
    env_limit_verdict,
    env_sized_pools,
)
from course_utils.machine import AcceleratorInfo, CpuInfo, advise, doctor
from course_utils.start_methods import explain_start_method
from course_utils.threads import (
    ThreadPools,
    opencv_follows_omp_num_threads,
    opencv_parallel_framework,
    thread_pools,
)

HAS = set(mp.get_all_start_methods())
TORCH_GOMP = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")


def _pools(openblas: int = 2, torch_omp: int = 2, opencv: int = 2) -> ThreadPools:
    return ThreadPools(torch_intra=1, torch_interop=1, opencv=opencv, pid=1, blas=[
        {"user_api": "blas", "internal_api": "openblas", "num_threads": openblas,
         "filepath": "/x/numpy.libs/libscipy_openblas64_.so", "prefix": "libscipy_openblas"},
        {"user_api": "openmp", "internal_api": "openmp", "num_threads": torch_omp,
         "filepath": TORCH_GOMP, "prefix": "libgomp"}])


# ------------------------------------------------------------------ the verdict, a pure function
@pytest.mark.parametrize("worker, parent, limit, expected", [
    ({"a": 1, "b": 1}, {"a": 2, "b": 1}, 1, "held"),            # every pool at the limit
    ({"a": 1, "b": 2}, {"a": 2, "b": 2}, 1, "did not hold"),    # one pool just above it
    ({"a": 2}, {"a": 2}, 1, "did not hold"),                    # fork: the parent's pool, as is
    ({"a": 1}, {"a": 1}, 1, "nothing to limit"),                # one CPU: nothing was above 1
    ({"a": 2}, {"a": 4}, 2, "held"),                            # just inside a limit of 2
    ({"a": 3}, {"a": 4}, 2, "did not hold"),                    # just outside it
    ({"a": 2}, {"a": 2}, 2, "nothing to limit"),
])
def test_env_limit_verdict_follows_the_measured_pools(worker, parent, limit, expected):
    assert env_limit_verdict(worker, parent, limit) == expected
    assert expected in ENV_VERDICTS


def test_env_limit_verdict_rejects_bad_input():
    with pytest.raises(ValueError, match="worker has no pool"):
        env_limit_verdict({}, {"a": 2})
    with pytest.raises(TypeError, match="worker"):
        env_limit_verdict([1], {"a": 2})
    with pytest.raises(ValueError, match="parent"):
        env_limit_verdict({"a": 1}, {"a": -1})
    with pytest.raises(ValueError, match="limit"):
        env_limit_verdict({"a": 1}, {"a": 2}, limit=0)


def test_env_sized_pools_leaves_out_torchs_openmp_and_opencv():
    sized = env_sized_pools(_pools(openblas=3, torch_omp=5, opencv=7))
    assert sized == {"openblas (libscipy_openblas)": 3}
    with pytest.raises(TypeError, match="pools must be a ThreadPools"):
        env_sized_pools({"openblas": 3})


def test_a_verdict_comes_from_the_pools_not_the_start_method():
    # the same pools give the same verdict whatever process they came from
    parent = env_sized_pools(_pools(openblas=2))
    assert env_limit_verdict(env_sized_pools(_pools(openblas=1, torch_omp=1)), parent) == "held"
    assert env_limit_verdict(env_sized_pools(_pools(openblas=2, torch_omp=1)), parent) == "did not hold"


# ------------------------------------------------------------------ real workers
@pytest.mark.timeout(120)
@pytest.mark.skipif(not {"fork", "spawn"} <= HAS, reason="needs fork and spawn")
def test_variables_set_after_import_reach_spawn_workers_pools_but_not_forked_ones():
    """This process has imported numpy, OpenCV and torch; the recipe's lines come after."""
    here = {k: os.environ.get(k) for k in RECIPE_ENV_VARS}
    results = {m: env_after_import_in_workers(m, timeout_s=90) for m in ("fork", "spawn")}
    assert {k: os.environ.get(k) for k in RECIPE_ENV_VARS} == here, "os.environ was not put back"
    for method, (parent, worker) in results.items():
        # both workers got this process's current os.environ ...
        assert all(worker.thread_env.get(k) == "1" for k in RECIPE_ENV_VARS), (method, worker.thread_env)
        assert worker.worker_id == 0 and worker.pid != os.getpid()
    above = any(n > 1 for n in env_sized_pools(results["fork"][0]).values())
    fork = env_limit_verdict(env_sized_pools(results["fork"][1]), env_sized_pools(results["fork"][0]))
    spawn = env_limit_verdict(env_sized_pools(results["spawn"][1]), env_sized_pools(results["spawn"][0]))
    # ... but only the spawned one loaded its libraries after them
    assert spawn == ("held" if above else "nothing to limit")
    assert fork == ("did not hold" if above else "nothing to limit")
    if above:
        assert fork != spawn


def test_env_after_import_in_workers_rejects_bad_arguments():
    with pytest.raises(ValueError, match="method="):
        env_after_import_in_workers("threads")
    method = sorted(HAS)[0]
    with pytest.raises(ValueError, match="variables"):
        env_after_import_in_workers(method, variables="OMP_NUM_THREADS")
    with pytest.raises(ValueError, match="value"):
        env_after_import_in_workers(method, value=1)
    with pytest.raises(ValueError, match="timeout_s"):
        env_after_import_in_workers(method, timeout_s=0)


def test_thread_pools_records_the_thread_variables_of_its_process(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    p = thread_pools()
    assert p.thread_env.get("OMP_NUM_THREADS") == "3" and "MKL_NUM_THREADS" not in p.thread_env
    assert ThreadPools.from_dict(p.to_dict()) == p
    old = p.to_dict()
    old.pop("thread_env")                       # a dict saved before the field existed
    assert ThreadPools.from_dict(old).thread_env == {}


# ------------------------------------------------------------------ OpenCV's framework
@pytest.mark.parametrize("line, framework, follows", [
    ("  Parallel framework:            pthreads", "pthreads", False),
    ("  Parallel framework:            OpenMP", "OpenMP", True),
    ("  Parallel framework:            TBB (ver 2021.11 interface 12110)",
     "TBB (ver 2021.11 interface 12110)", False),
    ("  Parallel framework:            GCD", "GCD", False),
    ("  Parallel framework:            TBB (ver 2021.11: oneAPI)", "TBB (ver 2021.11: oneAPI)", False),
])
def test_opencv_parallel_framework_read_from_build_information(line, framework, follows):
    text = f"General configuration for OpenCV\n  Other third-party libraries:\n{line}\n  Trace: YES\n"
    assert opencv_parallel_framework(text) == framework
    assert opencv_follows_omp_num_threads(framework) is follows


def test_opencv_parallel_framework_of_this_opencv():
    framework = opencv_parallel_framework()
    assert framework == opencv_parallel_framework(cv2.getBuildInformation())  # OpenCV is installed
    assert isinstance(framework, str) and framework
    assert opencv_parallel_framework("no such line here") is None
    assert opencv_follows_omp_num_threads(None) is None


# ------------------------------------------------------------------ the texts
def test_start_method_texts_say_what_is_inherited():
    fork, server, spawn = (explain_start_method(m) for m in ("fork", "forkserver", "spawn"))
    assert "os.environ as it is then" in fork and "its threads do not" in fork
    assert "PYTORCH_NVML_BASED_CUDA_CHECK=1" in fork and "asks NVML" in fork
    assert "environment from when it started" in server and "later are not seen" in server
    assert "not inherited" in server
    assert "current os.environ" in spawn and "not inherited" in spawn
    assert "nothing set in this process is inherited" not in spawn.lower()


@pytest.fixture(scope="module")
def report():
    return doctor()


def _busy(report, method: str):
    return dataclasses.replace(
        report, cpu=CpuInfo(logical=8, affinity=8, cgroup_quota=None, usable=8), pools=_pools(opencv=8, openblas=4),
        accelerator=AcceleratorInfo("cuda", "Some GPU", 16 * 2**30, 1), start_method=method,
        ram_total_bytes=64 * 2**30, ram_available_bytes=48 * 2**30, advice=[])


def test_doctor_says_per_start_method_how_workers_get_the_pools(report):
    fork, spawn = ("\n".join(advise(_busy(report, m))) for m in ("fork", "spawn"))
    for text in (fork, spawn):
        assert "keep their threads inside every DataLoader worker" not in text
        assert "not limited inside DataLoader workers" in text and "make_worker_init(1)" in text
    assert "lost its threads in the fork" in fork and "runs on one thread" in fork
    assert "loads these libraries afresh" in spawn and "current os.environ" in spawn
    server = "\n".join(advise(_busy(report, "forkserver")))
    assert "server's from when it started" in server


def test_doctor_on_a_cuda_build_without_gpu_knows_the_nvml_check(report, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    cpu_only = dataclasses.replace(_busy(report, "fork"),
                                   accelerator=AcceleratorInfo("cpu", "x86_64", None, 1))
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    assert "alone initialises the CUDA driver" in "\n".join(advise(cpu_only))
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    text = "\n".join(advise(cpu_only))
    assert "asks NVML and initialises nothing" in text and "alone initialises" not in text
