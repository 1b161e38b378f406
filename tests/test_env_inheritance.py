"""What DataLoader workers inherit, as the core reads and says it: the thread variables a
process's ThreadPools records, OpenCV's parallel framework read from its build information, and
the start-method and doctor texts. (Lesson 02's verdict on the recipe's variables, measured in real
workers, is tested with the lesson: tests/test_l02_threads.py.)
"""
from __future__ import annotations

import dataclasses
import os

import cv2
import pytest
import torch

from course_utils.machine import AcceleratorInfo, CpuInfo, advise, doctor
from course_utils.start_methods import explain_start_method
from course_utils.threads import (
    ThreadPools,
    opencv_follows_omp_num_threads,
    opencv_parallel_framework,
    thread_pools,
)

TORCH_GOMP = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")


def _pools(openblas: int = 2, torch_omp: int = 2, opencv: int = 2) -> ThreadPools:
    return ThreadPools(torch_intra=1, torch_interop=1, opencv=opencv, pid=1, blas=[
        {"user_api": "blas", "internal_api": "openblas", "num_threads": openblas,
         "filepath": "/x/numpy.libs/libscipy_openblas64_.so", "prefix": "libscipy_openblas"},
        {"user_api": "openmp", "internal_api": "openmp", "num_threads": torch_omp,
         "filepath": TORCH_GOMP, "prefix": "libgomp"}])


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
