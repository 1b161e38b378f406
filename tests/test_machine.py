"""Tests for course_utils.machine: CPUs (with fake cgroup folders), accelerator, start
method, the doctor's report and the advice it derives from its findings."""
from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import platform
import re

import pytest
import torch

from course_utils.__main__ import main

from course_utils.machine import (AcceleratorInfo, CpuInfo, DoctorReport, accelerator, advise,
                                  cpu_info, default_device, doctor, machine_summary, usable_cpus)
from course_utils.start_methods import (explain_start_method, forkserver_main, platform_default_start_method,
                                        start_method)
from course_utils.threads import ThreadPools

GIB = 1024**3


# ----------------------------------------------------------------------------- CPUs
def _limit(logical: int, affinity: int | None) -> int:
    return min(logical, affinity) if affinity else logical


def test_cpu_info_on_this_machine():
    info = cpu_info()
    assert info.logical == os.cpu_count()
    if hasattr(os, "sched_getaffinity"):
        assert info.affinity == len(os.sched_getaffinity(0))
    else:
        assert info.affinity is None
    assert 1 <= info.usable <= info.logical
    assert usable_cpus() == info.usable


def test_no_cgroup_files_means_no_quota(tmp_path):
    info = cpu_info(cgroup_root=tmp_path)
    assert info.cgroup_quota is None
    assert info.usable == _limit(info.logical, info.affinity)
    assert not any("quota" in reason for reason in info.limited_by)


def test_cgroup_v2_max_means_no_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_info(cgroup_root=tmp_path).cgroup_quota is None


def test_cgroup_v2_fractional_quota_rounds_down(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    info = cpu_info(cgroup_root=tmp_path)
    assert info.cgroup_quota == pytest.approx(1.5)
    assert info.usable == 1
    if info.logical > 1:
        assert any("quota" in reason for reason in info.limited_by)


def test_cgroup_v2_quota_above_cpus_changes_nothing(tmp_path):
    (tmp_path / "cpu.max").write_text(f"{(os.cpu_count() + 3) * 100000} 100000\n")
    info = cpu_info(cgroup_root=tmp_path)
    assert info.cgroup_quota == pytest.approx(os.cpu_count() + 3)
    assert info.usable == _limit(info.logical, info.affinity)


def test_cgroup_v1_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    info = cpu_info(cgroup_root=tmp_path)
    assert info.cgroup_quota == pytest.approx(0.5)
    assert info.usable == 1, "a quota below one CPU still leaves one usable CPU"


def test_cgroup_v1_minus_one_means_no_quota(tmp_path):
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_info(cgroup_root=tmp_path).cgroup_quota is None


def test_cgroup_v2_wins_over_v1_and_garbage_is_ignored(tmp_path):
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    (tmp_path / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_info(cgroup_root=tmp_path).cgroup_quota == pytest.approx(2.0)
    (tmp_path / "cpu.max").write_text("not a number\n")
    assert cpu_info(cgroup_root=tmp_path).cgroup_quota == pytest.approx(1.0)  # falls back to v1
    (tmp_path / "cpu.cfs_quota_us").write_text("garbage\n")
    assert cpu_info(cgroup_root=tmp_path).cgroup_quota is None


# ----------------------------------------------------------------------------- accelerator
def test_accelerator_and_default_device_agree():
    acc = accelerator()
    assert acc.kind in {"cuda", "mps", "cpu"}
    assert isinstance(acc.name, str) and acc.name
    assert acc.count >= 1
    assert default_device() == torch.device(acc.kind)
    if torch.cuda.is_available():
        assert acc.kind == "cuda" and acc.memory_bytes > 0
        assert acc.count == torch.cuda.device_count()
    elif acc.kind == "cpu":
        assert acc.memory_bytes is None


# ----------------------------------------------------------------------------- start method
def test_start_method_reads_without_fixing_it():
    before = mp.get_start_method(allow_none=True)
    method = start_method()
    assert method in mp.get_all_start_methods()
    assert mp.get_start_method(allow_none=True) == before, "start_method() must not fix the default"
    if before is not None:
        assert method == before


# ----------------------------------------------------------------------------- doctor
@pytest.fixture(scope="module")
def report() -> DoctorReport:
    return doctor()


def test_doctor_report_structure(report):
    assert isinstance(report.cpu, CpuInfo) and isinstance(report.pools, ThreadPools)
    assert isinstance(report.accelerator, AcceleratorInfo)
    assert report.torch_version == torch.__version__
    if torch.version.cuda:
        assert report.torch_build == f"CUDA {torch.version.cuda}"
    elif not getattr(torch.version, "hip", None):
        assert report.torch_build == "CPU-only"
    assert report.start_method == start_method()
    assert 0 < report.ram_available_bytes <= report.ram_total_bytes
    assert report.advice == advise(report)
    data = report.to_dict()
    json.dumps(data)  # plain data only
    assert data["cpu"]["usable"] == report.cpu.usable
    assert data["pools"]["torch_intra"] == report.pools.torch_intra


def test_doctor_command_prints_the_report(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    usable = re.findall(r"^  usable +(\d+)$", out.out, flags=re.MULTILINE)
    assert usable == [str(usable_cpus())], out.out


def test_doctor_json_is_valid_json(capsys):
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cpu"]["usable"] == usable_cpus()
    assert set(data) >= {"cpu", "pools", "accelerator", "advice"}


def test_doctor_render_is_for_a_person(report):
    text = report.render()
    assert str(report) == text
    for section in ("CPUs", "Thread pools", "Accelerator", "Memory", "start method", "Advice"):
        assert section in text
    lines = text.splitlines()
    assert lines[:3] == ["course_utils doctor", "=" * 19, ""]
    for heading in ("CPUs", "Accelerator", "Memory", "Processes", "Advice"):   # a blank line before each
        assert lines[lines.index(heading) - 1] == "", heading
    assert lines[lines.index(next(x for x in lines if x.startswith("Thread pools in this process"))) - 1] == ""
    assert f"os.cpu_count()      {os.cpu_count()}" in text
    assert "torch intra-op" in text and "OpenCV" in text
    for entry in report.pools.blas:
        assert os.path.basename(entry["filepath"]) in text
    assert report.python.split()[1] in text
    flat = " ".join(text.split())
    for i, advice in enumerate(report.advice, 1):
        assert f"{i}. {' '.join(advice.split())}" in flat


# ----------------------------------------------------------------------------- advice
def _pools(opencv: int = 1, blas: int = 1, omp: int = 1, intra: int = 1, thread_env=None) -> ThreadPools:
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    return ThreadPools(
        torch_intra=intra,
        torch_interop=1,
        opencv=opencv,
        blas=[
            {"user_api": "blas", "internal_api": "openblas", "num_threads": blas,
             "filepath": "/x/numpy.libs/libscipy_openblas64_.so", "prefix": "libscipy_openblas"},
            {"user_api": "openmp", "internal_api": "openmp", "num_threads": omp,
             "filepath": torch_lib, "prefix": "libgomp"},
        ],
        pid=1,
        thread_env=thread_env or {},
    )


def _fake(report: DoctorReport, **changes) -> DoctorReport:
    base = dict(
        cpu=CpuInfo(logical=8, affinity=8, cgroup_quota=None, usable=8),
        pools=_pools(),
        accelerator=AcceleratorInfo("cuda", "Some GPU", 16 * GIB, 1),
        start_method="forkserver",
        ram_total_bytes=64 * GIB,
        ram_available_bytes=48 * GIB,
        advice=[],
    )
    base.update(changes)
    return dataclasses.replace(report, **base)


def _joined(report: DoctorReport) -> str:
    return "\n".join(advise(report))


def test_advice_for_a_quiet_machine_says_little(report):
    text = _joined(_fake(report))
    assert "os.cpu_count()" not in text and "make_worker_init" not in text
    assert "No GPU" not in text and "RAM" not in text


def test_advice_usable_below_cpu_count_names_both_numbers(report):
    cpu = CpuInfo(logical=16, affinity=16, cgroup_quota=2.5, usable=2)
    text = _joined(_fake(report, cpu=cpu))
    assert "usable CPUs (2)" in text and "os.cpu_count() (16)" in text and "2.5" in text
    cpu = CpuInfo(logical=16, affinity=4, cgroup_quota=None, usable=4)
    assert "affinity allows 4" in _joined(_fake(report, cpu=cpu))


def test_advice_one_cpu(report):
    cpu = CpuInfo(logical=1, affinity=1, cgroup_quota=None, usable=1)
    assert "Only 1 usable CPU" in _joined(_fake(report, cpu=cpu))


def test_advice_about_pools_that_survive_in_workers(report):
    text = _joined(_fake(report, pools=_pools(opencv=8, blas=4)))
    assert "make_worker_init" in text and "OpenCV 8" in text and "openblas (libscipy_openblas) 4" in text
    assert "64 threads on 8 CPUs" in text  # 8 workers x the largest pool (8)
    # torch's own OpenMP runtime is set to 1 by the DataLoader: it alone triggers nothing.
    assert "make_worker_init" not in _joined(_fake(report, pools=_pools(omp=8)))


def test_advice_torch_threads_above_usable(report):
    cpu = CpuInfo(logical=64, affinity=64, cgroup_quota=4.0, usable=4)
    text = _joined(_fake(report, cpu=cpu, pools=_pools(intra=32)))
    assert "torch.set_num_threads(4)" in text
    assert "call torch.set_num_threads" not in _joined(_fake(report, pools=_pools(intra=8)))


def test_advice_env_var_set_after_import(report):
    text = _joined(_fake(report, pools=_pools(omp=8, thread_env={"OMP_NUM_THREADS": "1"})))
    assert "OMP_NUM_THREADS=1" in text
    assert "OMP_NUM_THREADS" not in _joined(_fake(report, pools=_pools(thread_env={"OMP_NUM_THREADS": "1"})))


def test_advice_follows_the_accelerator(report):
    assert "No GPU" in _joined(_fake(report, accelerator=AcceleratorInfo("cpu", "x86_64", None, 1)))
    assert "MPS" in _joined(_fake(report, accelerator=AcceleratorInfo("mps", "Apple MPS", None, 1)))
    text = _joined(_fake(report, start_method="fork"))
    assert "Some GPU" in text and "CUDA" in text


def test_advice_follows_the_start_method(report):
    spawn = _joined(_fake(report, start_method="spawn"))
    assert "'spawn'" in spawn and "importable module" in spawn
    fork = _joined(_fake(report, start_method="fork"))
    assert "importable module" not in fork and "NumPy arrays" in fork


def test_advice_low_ram(report):
    text = _joined(_fake(report, ram_available_bytes=int(1.5 * GIB)))
    assert "1.5 GiB" in text and "num_workers" in text


# ----------------------------------------------------------------------------- summary
def test_machine_summary_is_one_line():
    line = machine_summary()
    assert "\n" not in line
    cpu = cpu_info()
    parts = line.split(" | ")
    assert len(parts) == 5, line
    assert parts[0] == f"{platform.system()} {platform.machine()}"
    assert re.fullmatch(rf"{cpu.usable} usable CPUs? \(of {cpu.logical}\)", parts[1])
    assert parts[2].startswith(f"torch {torch.__version__.split('+')[0]} ")
    if not torch.cuda.is_available() and accelerator().kind == "cpu":
        # the default `pip install torch` on Linux is a CUDA build, also on a GPU-less laptop
        build = f"cuda {torch.version.cuda}" if torch.version.cuda else "cpu"
        assert parts[2].endswith(" " + build) and parts[3] == "no GPU"
    assert parts[4] == f"start: {start_method()}"


@pytest.fixture
def fake_cuda_build_without_gpu(monkeypatch):
    """This process looks like the default Linux torch (a CUDA build) on a machine with no GPU."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None:
        monkeypatch.setattr(mps, "is_available", lambda: False)


def test_summary_and_doctor_with_a_cuda_build_and_no_gpu(fake_cuda_build_without_gpu):
    parts = machine_summary().split(" | ")
    assert parts[2].endswith(" cuda 13.0") and parts[3] == "no GPU"
    report = doctor()
    assert report.accelerator.kind == "cpu"
    text = str(report)
    assert "CUDA 13.0" in text
    if report.start_method == "fork":
        assert any("torch.cuda.is_available() alone initialises the CUDA driver" in a for a in report.advice)


@pytest.mark.parametrize("platform_name, version, expected", [
    ("linux", (3, 10), "fork"), ("linux", (3, 13), "fork"), ("linux", (3, 14), "forkserver"),
    ("linux", (3, 15), "forkserver"), ("darwin", (3, 11), "spawn"), ("win32", (3, 14), "spawn"),
])
def test_platform_default_start_method(platform_name, version, expected):
    assert platform_default_start_method(platform_name, version) == expected


def test_explain_start_method_describes_the_learners_case():
    here = explain_start_method()
    assert f"'{start_method()}'" in here
    fork, server, spawn = (explain_start_method(m) for m in ("fork", "forkserver", "spawn"))
    assert "copy of this process" in fork and "cannot be used in a worker" in fork
    # what the server ran of __main__ depends on how this pytest was started (python -m pytest,
    # the pytest script, a harness such as mutmut): each case says what workers get of it
    assert "one server process" in server and ("runs its top level again" if forkserver_main() == "rerun"
                                                else "not inherited") in server
    assert "fresh interpreter" not in server          # forkserver is not spawn
    assert "CUDA in a worker works" in server and "wasteful" in server
    assert "fresh Python interpreter" in spawn and "importable module" in spawn
    with pytest.raises(ValueError, match="method="):
        explain_start_method("threads")
