"""course_utils.machine: the usable CPU count (logical CPUs, affinity below the core count, cgroup
quota v2 and v1), why it is limited, the accelerator probe, the one-line machine summary, and the
doctor's report and advice, on hand-made machines (fake os, torch, psutil and cgroup folders) so
that every threshold is tested on both sides and every figure on numbers that differ."""
from __future__ import annotations

import os
import platform
from types import SimpleNamespace

import pytest
import torch

from course_utils import machine
from course_utils.machine import (GIB, LOW_RAM_BYTES, AcceleratorInfo, CpuInfo, DoctorReport,
                                  accelerator, advise, cpu_info, default_device, doctor,
                                  machine_summary, usable_cpus)
from course_utils.start_methods import FORKSERVER_MAIN

ThreadPools = machine.ThreadPools          # the doctor's own import, not course_utils.threads'


@pytest.fixture
def eight_cores(monkeypatch):
    """os reports 8 logical CPUs; ``set(n)`` makes the affinity n of them (None: no affinity)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)

    def set_affinity(n):
        if n is None:
            monkeypatch.delattr(os, "sched_getaffinity", raising=False)
        else:
            monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)

    set_affinity(3)
    return set_affinity


# ---- usable CPUs ------------------------------------------------------------------------------

def test_affinity_below_the_core_count_sets_the_usable_cpus(eight_cores, tmp_path):
    info = cpu_info(tmp_path)
    assert (info.logical, info.affinity, info.cgroup_quota, info.usable) == (8, 3, None, 3)
    assert info.limited_by == ["CPU affinity allows 3"]


def test_usable_cpus_is_the_usable_count_of_the_real_cgroup_root(eight_cores, monkeypatch):
    monkeypatch.setattr(machine, "cpu_info", lambda: CpuInfo(8, 3, 2.5, 2))
    assert usable_cpus() == 2


def test_a_quota_below_the_affinity_wins_rounded_down(eight_cores, tmp_path):
    (tmp_path / "cpu.max").write_text("250000 100000\n")          # 2.5 CPUs -> 2
    info = cpu_info(tmp_path)
    assert (info.affinity, info.cgroup_quota, info.usable) == (3, 2.5, 2)
    assert info.limited_by == ["CPU affinity allows 3", "cgroup CPU quota is 2.5 CPUs"]


def test_an_affinity_below_the_quota_wins(eight_cores, tmp_path):
    (tmp_path / "cpu.max").write_text("550000 100000\n")          # 5.5 CPUs, affinity 3
    assert cpu_info(tmp_path).usable == 3


def test_without_affinity_the_quota_or_the_core_count_limits(eight_cores, tmp_path):
    eight_cores(None)
    info = cpu_info(tmp_path)
    assert (info.affinity, info.usable, info.limited_by) == (None, 8, [])
    (tmp_path / "cpu.max").write_text("600000 100000\n")
    info = cpu_info(tmp_path)
    assert (info.affinity, info.usable) == (None, 6)
    assert info.limited_by == ["cgroup CPU quota is 6 CPUs"]


def test_an_unknown_core_count_counts_as_one(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert cpu_info(tmp_path).logical == 1 and cpu_info(tmp_path).usable == 1


def test_a_quota_under_one_cpu_still_leaves_one(eight_cores, tmp_path):
    (tmp_path / "cpu.max").write_text("40000 100000\n")            # 0.4 CPUs
    info = cpu_info(tmp_path)
    assert info.cgroup_quota == pytest.approx(0.4) and info.usable == 1


def test_limits_equal_to_the_core_count_are_not_reasons():
    assert CpuInfo(logical=8, affinity=8, cgroup_quota=8.0, usable=8).limited_by == []
    assert CpuInfo(logical=8, affinity=7, cgroup_quota=7.5, usable=7).limited_by == [
        "CPU affinity allows 7", "cgroup CPU quota is 7.5 CPUs"]
    assert CpuInfo(logical=8, affinity=None, cgroup_quota=None, usable=8).limited_by == []


# ---- cgroup files ------------------------------------------------------------------------------

def test_cgroup_v2_with_no_period_assumes_100_ms(eight_cores, tmp_path):
    (tmp_path / "cpu.max").write_text("150000\n")
    assert cpu_info(tmp_path).cgroup_quota == pytest.approx(1.5)


def test_cgroup_v2_uses_its_own_period(eight_cores, tmp_path):
    (tmp_path / "cpu.max").write_text("300000 200000\n")          # 300 / 200 ms = 1.5, not 3
    assert cpu_info(tmp_path).cgroup_quota == pytest.approx(1.5)


@pytest.mark.parametrize("text", ["0 100000\n", "100000 0\n", "", "\xff\xfe"])
def test_a_zero_empty_or_unreadable_quota_is_no_quota(eight_cores, tmp_path, text):
    (tmp_path / "cpu.max").write_bytes(text.encode("latin-1"))
    assert cpu_info(tmp_path).cgroup_quota is None


@pytest.mark.parametrize("folder", ["cpu", "cpu,cpuacct", "."])
def test_cgroup_v1_is_read_from_each_of_its_folders(eight_cores, tmp_path, folder):
    where = tmp_path / folder
    where.mkdir(exist_ok=True)
    (where / "cpu.cfs_quota_us").write_text("200000\n")
    (where / "cpu.cfs_period_us").write_text("80000\n")             # 200 / 80 = 2.5
    info = cpu_info(tmp_path)
    assert info.cgroup_quota == pytest.approx(2.5) and info.usable == 2


def test_cgroup_v1_first_folder_wins(eight_cores, tmp_path):
    for folder, quota in (("cpu", "100000"), ("cpu,cpuacct", "400000")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "cpu.cfs_quota_us").write_text(quota)
        (tmp_path / folder / "cpu.cfs_period_us").write_text("100000")
    assert cpu_info(tmp_path).cgroup_quota == pytest.approx(1.0)


def test_cgroup_v1_without_a_period_file_is_no_quota(eight_cores, tmp_path):
    (tmp_path / "cpu.cfs_quota_us").write_text("200000\n")
    assert cpu_info(tmp_path).cgroup_quota is None


# ---- accelerator -------------------------------------------------------------------------------

@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def test_a_cuda_device_is_read_from_device_zero(monkeypatch):
    def props(i):
        assert i == 0
        return SimpleNamespace(name="Fake GPU", total_memory=8 * GIB)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert accelerator() == AcceleratorInfo("cuda", "Fake GPU", 8 * GIB, 3)


def test_mps_reports_its_memory_or_none(no_gpu, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 12 * GIB, raising=False)
    assert accelerator() == AcceleratorInfo("mps", "Apple MPS", 12 * GIB, 1)
    assert default_device() == torch.device("mps")

    def fails():
        raise RuntimeError("no driver")

    monkeypatch.setattr(torch.mps, "recommended_max_memory", fails, raising=False)
    assert accelerator() == AcceleratorInfo("mps", "Apple MPS", None, 1)


def test_the_cpu_is_named_by_processor_then_machine(no_gpu, monkeypatch):
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert accelerator() == AcceleratorInfo("cpu", "arm64", None, 1)
    monkeypatch.setattr(platform, "machine", lambda: "")
    assert accelerator().name == "cpu"
    monkeypatch.setattr(platform, "processor", lambda: "x86_64")
    assert accelerator().name == "x86_64" and default_device() == torch.device("cpu")


# ---- the one-line summary ----------------------------------------------------------------------

@pytest.fixture
def summary_machine(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu124")
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(machine, "start_method", lambda: "spawn")
    monkeypatch.setattr(machine, "cpu_info", lambda: CpuInfo(8, 3, None, 3))
    monkeypatch.setattr(machine, "accelerator", lambda: AcceleratorInfo("cuda", "H100", GIB, 2))
    return monkeypatch


def test_summary_reads_usable_cpus_gpus_build_and_start_method(summary_machine):
    assert machine_summary() == ("Linux x86_64 | 3 usable CPUs (of 8) | torch 2.5.1 cuda 12.4 | "
                                 "H100 x2 | start: spawn")


def test_summary_of_one_cpu_one_gpu_and_other_builds(summary_machine):
    summary_machine.setattr(machine, "cpu_info", lambda: CpuInfo(8, 1, None, 1))
    summary_machine.setattr(machine, "accelerator", lambda: AcceleratorInfo("cuda", "H100", GIB, 1))
    assert machine_summary().split(" | ")[1:4] == ["1 usable CPU (of 8)", "torch 2.5.1 cuda 12.4",
                                                   "H100"]
    summary_machine.setattr(torch.version, "cuda", None)
    summary_machine.setattr(torch.version, "hip", "6.2")
    summary_machine.setattr(machine, "accelerator", lambda: AcceleratorInfo("mps", "x", None, 1))
    assert machine_summary().split(" | ")[2:4] == ["torch 2.5.1 rocm 6.2", "Apple MPS"]
    summary_machine.setattr(torch.version, "hip", None)
    summary_machine.setattr(machine, "accelerator", lambda: AcceleratorInfo("cpu", "x", None, 1))
    assert machine_summary().split(" | ")[2:4] == ["torch 2.5.1 cpu", "no GPU"]


# ---- the doctor's report and advice ------------------------------------------------------------

TORCH_GOMP = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")


def pools(intra=1, opencv=1, blas=1, omp=1, env=None, os_threads=None, extra=()):
    return ThreadPools(torch_intra=intra, torch_interop=1, opencv=opencv, pid=42,
                       os_threads=os_threads, thread_env=dict(env or {}), blas=[
                           {"user_api": "blas", "internal_api": "openblas", "num_threads": blas,
                            "filepath": "/x/libscipy_openblas.so", "prefix": "libscipy_openblas"},
                           {"user_api": "openmp", "internal_api": "openmp", "num_threads": omp,
                            "filepath": TORCH_GOMP, "prefix": "libgomp"}, *extra])


def report(cpu=CpuInfo(8, 3, None, 3), pools_=None, acc=AcceleratorInfo("cuda", "Big GPU", 16 * GIB, 1),
           start="spawn", ram=48 * GIB, advice=()):
    return DoctorReport(python="CPython 3.11.9 (/venv/python)", platform="Linux-6.1", torch_version="2.5.1",
                        torch_build="CUDA 12.4", cpu=cpu, pools=pools_ or pools(), accelerator=acc,
                        start_method=start, ram_total_bytes=64 * GIB, ram_available_bytes=ram,
                        advice=list(advice), opencv_version="4.10.0", opencv_parallel="pthreads",
                        numpy_version="1.26.4")


@pytest.fixture
def quiet(monkeypatch):
    """No CUDA build and a notebook's __main__, so advise says only what the report causes."""
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(machine, "forkserver_main", lambda: "none")


def test_advice_sizes_workers_from_an_affinity_below_the_core_count(quiet):
    advice = advise(report(cpu=CpuInfo(8, 3, None, 3)))
    assert advice[0] == ("Size num_workers from the usable CPUs (3), not os.cpu_count() (8): CPU "
                         "affinity allows 3.")
    assert not any("os.cpu_count()" in a for a in advise(report(cpu=CpuInfo(8, 8, None, 8))))


def test_advice_on_one_usable_cpu_only_at_one(quiet):
    assert any(a.startswith("Only 1 usable CPU") for a in advise(report(cpu=CpuInfo(8, 1, None, 1))))
    assert not any(a.startswith("Only 1 usable CPU") for a in advise(report(cpu=CpuInfo(8, 2, None, 2))))


def test_advice_on_torch_threads_only_above_the_usable_cpus(quiet):
    over = advise(report(pools_=pools(intra=4)))
    assert ("torch uses 4 intra-op threads but only 3 CPUs are usable: call torch.set_num_threads(3) "
            "in the main process.") in over
    assert not any("intra-op threads" in a for a in advise(report(pools_=pools(intra=3))))


def test_pool_advice_counts_the_largest_pool_per_worker(quiet):
    text = "\n".join(advise(report(pools_=pools(opencv=2, blas=4, omp=8))))
    # OpenCV 2 and OpenBLAS 4 are busy, torch's own OpenMP (8) is not counted; 3 workers x 4 = 12
    assert "(OpenCV 2, openblas (libscipy_openblas) 4)" in text
    assert "3 workers can run up to 12 threads on 3 CPUs" in text
    assert "libgomp, torch" not in text


def test_pool_advice_needs_a_pool_above_one_thread(quiet):
    assert not any("not limited inside DataLoader workers" in a
                   for a in advise(report(pools_=pools(opencv=1, blas=1, omp=8, intra=2))))
    assert any("(OpenCV 2)" in a for a in advise(report(pools_=pools(opencv=2))))


@pytest.mark.parametrize("start, case, says, not_says", [
    ("fork", "none", "Workers here start with 'fork' and inherit these sizes", "afresh"),
    ("forkserver", "inherited", "from a server that ran this script's top level", "afresh"),
    ("forkserver", "none", "Workers here start with 'forkserver': each loads these libraries afresh",
     "server that ran"),
    ("spawn", "inherited", "Workers here start with 'spawn': each loads these libraries afresh",
     "server that ran"),
])
def test_pool_advice_follows_how_workers_start(monkeypatch, start, case, says, not_says):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(machine, "forkserver_main", lambda: case)
    (pool_advice,) = [a for a in advise(report(pools_=pools(blas=4), start=start))
                      if "not limited inside DataLoader workers" in a]
    assert says in pool_advice and not_says not in pool_advice


def test_omp_advice_names_each_openmp_pool_that_disagrees(quiet):
    nameless = {"user_api": "openmp", "internal_api": "openmp", "num_threads": 6,
                "filepath": "/x/libomp.so", "prefix": None}
    agrees = {"user_api": "openmp", "internal_api": "openmp", "num_threads": 2,
              "filepath": "/x/libiomp.so", "prefix": "libiomp"}
    text = "\n".join(advise(report(pools_=pools(omp=8, blas=5, env={"OMP_NUM_THREADS": " 2 "},
                                                extra=(nameless, agrees)))))
    # the torch OpenMP (8) and the nameless one (6) disagree with 2; OpenBLAS is not OpenMP
    assert "OMP_NUM_THREADS= 2  is set but libgomp 8, openmp 6 disagrees" in text


def test_omp_advice_needs_a_number_and_a_disagreement(quiet):
    assert not any("is set but" in a for a in advise(report(pools_=pools(omp=2, env={"OMP_NUM_THREADS": "2"}))))
    assert not any("is set but" in a for a in advise(report(pools_=pools(omp=8, env={"OMP_NUM_THREADS": "auto"}))))
    assert any("is set but libgomp 8" in a for a in advise(report(pools_=pools(omp=8, env={"OMP_NUM_THREADS": "2"}))))


def test_accelerator_advice(quiet):
    def says(acc, start):
        return "\n".join(advise(report(acc=acc, start=start)))

    cpu, mps = AcceleratorInfo("cpu", "x86_64", None, 1), AcceleratorInfo("mps", "Apple MPS", None, 1)
    cuda = AcceleratorInfo("cuda", "Big GPU", 16 * GIB, 1)
    assert "No GPU" in says(cpu, "spawn") and "Apple MPS: lessons run on 'mps'" not in says(cpu, "spawn")
    assert "Apple MPS: lessons run on 'mps'" in says(mps, "fork") and "No GPU" not in says(mps, "fork")
    assert "GPU Big GPU with the 'fork' start method" in says(cuda, "fork")
    assert "GPU Big GPU" not in says(cuda, "spawn") and "No GPU" not in says(cuda, "spawn")


@pytest.mark.parametrize("nvml, says", [(None, "torch.cuda.is_available() alone initialises"),
                                        ("1", "PYTORCH_NVML_BASED_CUDA_CHECK=1 is set here")])
def test_a_cuda_build_without_a_gpu_under_fork_is_warned(monkeypatch, nvml, says):
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(machine, "forkserver_main", lambda: "none")
    if nvml is None:
        monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    else:
        monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", nvml)
    cpu = AcceleratorInfo("cpu", "x86_64", None, 1)
    (warning,) = [a for a in advise(report(acc=cpu, start="fork")) if "CUDA 12.4 build" in a]
    assert says in warning
    for acc, start in ((cpu, "spawn"), (AcceleratorInfo("cuda", "G", GIB, 1), "fork")):
        assert not any("CUDA 12.4 build" in a for a in advise(report(acc=acc, start=start)))
    monkeypatch.setattr(torch.version, "cuda", None)
    assert not any("build on a machine without" in a for a in advise(report(acc=cpu, start="fork")))


def test_start_method_advice_comes_last_before_ram(quiet, monkeypatch):
    monkeypatch.setattr(machine, "forkserver_main", lambda: "rerun")
    server = advise(report(start="forkserver"))
    assert server[-1].startswith("Workers start with 'forkserver', forked from one server process")
    assert server[-1].endswith(FORKSERVER_MAIN["rerun"] + ".")
    assert advise(report(start="spawn"))[-1].startswith("Workers start with 'spawn'")
    assert advise(report(start="fork"))[-1].startswith("Workers start with 'fork'")


def test_low_ram_advice_only_below_four_gib(quiet):
    low = advise(report(ram=LOW_RAM_BYTES - 1))
    assert low[-1].startswith("Only 4.0 GiB of RAM available") and "COURSE_QUICK=1" in low[-1]
    assert not any("of RAM available" in a for a in advise(report(ram=LOW_RAM_BYTES)))
    assert advise(report(ram=int(1.5 * GIB)))[-1].startswith("Only 1.5 GiB of RAM available")


def test_a_quiet_machine_gets_only_the_start_method_advice(quiet):
    quiet_report = report(cpu=CpuInfo(8, 8, None, 8), acc=AcceleratorInfo("cuda", "G", GIB, 1))
    (only,) = advise(quiet_report)
    assert only.startswith("Workers start with 'spawn'")


# ---- the rendered report -----------------------------------------------------------------------

def test_render_shows_the_limits_pools_and_numbered_advice():
    text = report(cpu=CpuInfo(8, 3, 2.5, 2), pools_=pools(blas=4, os_threads=17,
                                                          env={"OMP_NUM_THREADS": "1"}),
                  advice=["first piece of advice", "second"]).render()
    lines = text.splitlines()
    assert "  usable              2" in lines and "  os.cpu_count()      8" in lines
    assert "  affinity            3" in lines and "  cgroup CPU quota    2.5 CPUs" in lines
    assert ("  usable < os.cpu_count() because: CPU affinity allows 3; cgroup CPU quota is 2.5 CPUs"
            in lines)
    assert "  OS threads now      17" in lines and "  thread env vars     OMP_NUM_THREADS=1" in lines
    assert "  blas/openblas       4    libscipy_openblas.so" in lines
    assert "  cuda: Big GPU, 16.0 GiB (x1)" in lines
    assert "  RAM                 64.0 GiB total, 48.0 GiB available" in lines
    assert "  OpenCV              1    cv2.getNumThreads()" in lines
    assert "OpenCV        4.10.0 (parallel framework: pthreads)" in lines
    assert lines[-2:] == ["  1. first piece of advice", "  2. second"]


def test_render_of_an_unlimited_machine_without_gpu_or_advice():
    bare = report(cpu=CpuInfo(8, None, None, 8), acc=AcceleratorInfo("cpu", "x86_64", None, 1))
    bare.opencv_parallel = None
    bare.pools.opencv = None
    lines = bare.render().splitlines()
    assert "  affinity            not available on this OS" in lines
    assert "  cgroup CPU quota    none" in lines
    assert "  usable == os.cpu_count(): no affinity or quota limit" in lines
    assert not any(line.startswith("  OS threads now") for line in lines)
    assert "  thread env vars     none set" in lines and "  none: torch runs on the CPU" in lines
    assert "  OpenCV              -    cv2.getNumThreads()" in lines
    assert "OpenCV        4.10.0" in lines and lines[-1] == "  nothing stands out"
    no_memory = report(acc=AcceleratorInfo("cuda", "G", None, 2)).render().splitlines()
    assert "  cuda: G (x2)" in no_memory


def test_long_advice_wraps_at_92_characters_under_its_number():
    # "  1. " (5) + 43 + " " + 44 = 93 characters: one too many for a line of 92
    advice = "x" * 43 + " " + "y" * 44
    lines = report(advice=[advice]).render().splitlines()
    assert lines[lines.index("Advice") + 1:] == ["  1. " + "x" * 43, "     " + "y" * 44]
    shorter = "x" * 43 + " " + "y" * 43                          # 92: fits
    assert report(advice=[shorter]).render().splitlines()[-1] == "  1. " + shorter


def test_doctor_reads_memory_and_derives_its_advice(monkeypatch):
    monkeypatch.setattr(machine.psutil, "virtual_memory",
                        lambda: SimpleNamespace(total=32 * GIB, available=3 * GIB))
    monkeypatch.setattr(machine, "cpu_info", lambda: CpuInfo(8, 3, None, 3))
    found = doctor()
    assert (found.ram_total_bytes, found.ram_available_bytes) == (32 * GIB, 3 * GIB)
    assert found.cpu == CpuInfo(8, 3, None, 3)
    assert found.advice == advise(found) and found.advice[0].startswith("Size num_workers")
    assert any(a.startswith("Only 3.0 GiB of RAM") for a in found.advice)


def test_doctor_names_this_python_platform_and_libraries(monkeypatch):
    import sys

    import cv2
    import numpy

    monkeypatch.setattr(platform, "python_implementation", lambda: "CPython")
    monkeypatch.setattr(platform, "python_version", lambda: "3.11.9")
    monkeypatch.setattr(platform, "platform", lambda: "Linux-6.1-x86_64")
    monkeypatch.setattr(machine, "opencv_parallel_framework", lambda: "pthreads")
    found = doctor()
    assert found.python == f"CPython 3.11.9 ({sys.executable})"
    assert found.platform == "Linux-6.1-x86_64" and found.opencv_parallel == "pthreads"
    assert found.opencv_version == str(cv2.__version__) and found.numpy_version == numpy.__version__


def test_an_unknown_size_is_said_to_be_unknown():
    assert machine._gib(None) == "unknown" and machine._gib(3 * GIB // 2) == "1.5 GiB"
