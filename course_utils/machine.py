"""The machine: usable CPUs (affinity and cgroup quota), the accelerator, ``doctor()`` (what
matters for data loading, with advice derived from it) and ``machine_summary()`` (one line for
plot titles and result tables)."""
from __future__ import annotations

import math
import os
import platform
import sys
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cv2
import numpy
import psutil
import torch

from .config import QUICK_ENV
from .start_methods import (FORKSERVER_MAIN, explain_start_method,  # lesson 00 imports it from here
                            forkserver_main, start_method)
from .threads import ThreadPools, opencv_parallel_framework, thread_pools

__all__ = ["CpuInfo", "cpu_info", "usable_cpus", "AcceleratorInfo", "accelerator", "default_device",
           "DoctorReport", "doctor", "advise", "machine_summary", "explain_start_method"]

GIB = 1024**3
#: Below this much available RAM (bytes) the doctor warns about worker memory.
LOW_RAM_BYTES = 4 * GIB


@dataclass
class CpuInfo:
    """CPUs this process may use: ``logical`` (``os.cpu_count()``), ``affinity`` (None where the
    OS cannot tell), ``cgroup_quota`` in CPUs (None: no quota), and ``usable``, the smallest of
    these rounded down, at least 1."""

    logical: int
    affinity: int | None
    cgroup_quota: float | None
    usable: int

    @property
    def limited_by(self) -> list[str]:
        """Why ``usable`` is below ``logical`` (empty when it is not)."""
        reasons = []
        if self.affinity is not None and self.affinity < self.logical:
            reasons.append(f"CPU affinity allows {self.affinity}")
        if self.cgroup_quota is not None and self.cgroup_quota < self.logical:
            reasons.append(f"cgroup CPU quota is {self.cgroup_quota:g} CPUs")
        return reasons


def _quota(folder: Path, quota_file: str, period_file: str | None) -> float | None:
    """quota / period in CPUs from cgroup files (v2 ``cpu.max`` holds both); None for no quota
    ("max", -1), a missing file or text that is not a number."""
    try:
        text = (folder / quota_file).read_text().split()
        quota, period = float(text[0]), float(
            (folder / period_file).read_text() if period_file else (text[1:] or ["100000"])[0])
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def cpu_info(cgroup_root: str | os.PathLike = "/sys/fs/cgroup") -> CpuInfo:
    """Logical CPUs, affinity, cgroup quota (v2, else v1; ``cgroup_root``: the cgroup mount,
    a fake folder in tests) and the usable CPU count they leave."""
    root = Path(cgroup_root)
    quota = _quota(root, "cpu.max", None)
    for folder in (root / "cpu", root / "cpu,cpuacct", root):
        if quota is None:
            quota = _quota(folder, "cpu.cfs_quota_us", "cpu.cfs_period_us")
    logical = os.cpu_count() or 1
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    usable = min(n for n in (logical, affinity, quota and math.floor(quota)) if n is not None)
    return CpuInfo(logical=logical, affinity=affinity, cgroup_quota=quota, usable=max(1, usable))


def usable_cpus() -> int:
    """CPUs this process can really use (affinity and cgroup quota taken into account)."""
    return cpu_info().usable


@dataclass
class AcceleratorInfo:
    """``kind`` 'cuda', 'mps' or 'cpu'; the device's ``name``; ``memory_bytes`` (None where
    unknown); ``count`` of devices of that kind (1 for cpu)."""

    kind: str
    name: str
    memory_bytes: int | None
    count: int


def accelerator() -> AcceleratorInfo:
    """The accelerator torch can use: CUDA, else Apple MPS, else the CPU (for CUDA this
    initialises torch's CUDA state but allocates nothing)."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return AcceleratorInfo("cuda", str(props.name), int(props.total_memory), int(torch.cuda.device_count()))
    if torch.backends.mps.is_available():
        try:
            memory = int(torch.mps.recommended_max_memory())
        except Exception:  # an older torch, or the driver cannot say
            memory = None
        return AcceleratorInfo("mps", "Apple MPS", memory, 1)
    return AcceleratorInfo("cpu", platform.processor() or platform.machine() or "cpu", None, 1)


def default_device() -> torch.device:
    """``torch.device`` of :func:`accelerator` ('cuda', 'mps' or 'cpu')."""
    return torch.device(accelerator().kind)


def _torch_build() -> str:
    if getattr(torch.version, "cuda", None):
        return f"CUDA {torch.version.cuda}"
    if getattr(torch.version, "hip", None):
        return f"ROCm {torch.version.hip}"
    return "CPU-only"


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.1f} GiB"


@dataclass
class DoctorReport:
    """What the doctor found; ``print(report)`` renders it, ``advice`` is :func:`advise`'s."""

    python: str
    platform: str
    torch_version: str
    torch_build: str
    cpu: CpuInfo
    pools: ThreadPools
    accelerator: AcceleratorInfo
    start_method: str
    ram_total_bytes: int
    ram_available_bytes: int
    advice: list[str] = field(default_factory=list)
    opencv_version: str | None = None
    opencv_parallel: str | None = None
    numpy_version: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        cpu, acc, pools = self.cpu, self.accelerator, self.pools
        ocv = (self.opencv_version or "not installed") + (
            f" (parallel framework: {self.opencv_parallel})" if self.opencv_parallel else "")
        affinity = "not available on this OS" if cpu.affinity is None else cpu.affinity
        quota = "none" if cpu.cgroup_quota is None else f"{cpu.cgroup_quota:g} CPUs"
        lines = ["course_utils doctor", "===================", "",
                 f"Python        {self.python}", f"Platform      {self.platform}",
                 f"torch         {self.torch_version} ({self.torch_build})",
                 f"NumPy         {self.numpy_version or 'not installed'}", f"OpenCV        {ocv}",
                 "", "CPUs", f"  usable              {cpu.usable}",
                 f"  os.cpu_count()      {cpu.logical}", f"  affinity            {affinity}",
                 f"  cgroup CPU quota    {quota}",
                 f"  usable < os.cpu_count() because: {'; '.join(cpu.limited_by)}" if cpu.limited_by
                 else "  usable == os.cpu_count(): no affinity or quota limit",
                 "", f"Thread pools in this process (pid {pools.pid})",
                 f"  torch intra-op      {pools.torch_intra}    torch.get_num_threads()",
                 f"  torch inter-op      {pools.torch_interop}    torch.get_num_interop_threads()",
                 f"  OpenCV              {'-' if pools.opencv is None else pools.opencv}    "
                 f"cv2.getNumThreads()"]
        lines += [f"  {'%s/%s' % (e.get('user_api'), e.get('internal_api')):<19} {e.get('num_threads')}    "
                  f"{os.path.basename(str(e.get('filepath')))}" for e in pools.blas]
        if pools.os_threads is not None:
            lines.append(f"  OS threads now      {pools.os_threads}")
        env = ", ".join(f"{k}={v}" for k, v in pools.thread_env.items()) or "none set"
        mem = f", {_gib(acc.memory_bytes)}" if acc.memory_bytes else ""
        lines += [f"  thread env vars     {env}", "", "Accelerator",
                  "  none: torch runs on the CPU" if acc.kind == "cpu" else
                  f"  {acc.kind}: {acc.name}{mem} (x{acc.count})", "", "Memory",
                  f"  RAM                 {_gib(self.ram_total_bytes)} total, "
                  f"{_gib(self.ram_available_bytes)} available", "", "Processes",
                  f"  start method        {self.start_method} (DataLoader workers use it unless "
                  f"multiprocessing_context is set)", "", "Advice"]
        for i, text in enumerate(self.advice, 1):
            lines += textwrap.wrap(text, width=92, initial_indent=f"  {i}. ", subsequent_indent="     ")
        return "\n".join(lines if self.advice else lines + ["  nothing stands out"])

    __str__ = render


def advise(report: DoctorReport) -> list[str]:
    """Advice computed from a report's findings."""
    advice: list[str] = []
    cpu, pools, acc = report.cpu, report.pools, report.accelerator

    if cpu.usable < cpu.logical:
        advice.append(f"Size num_workers from the usable CPUs ({cpu.usable}), not os.cpu_count() "
                      f"({cpu.logical}): {'; '.join(cpu.limited_by)}.")
    if cpu.usable == 1:
        advice.append("Only 1 usable CPU: worker processes cannot run in parallel with the "
                      "training loop here, so expect num_workers > 0 to help only when loading "
                      "waits on I/O.")
    if pools.torch_intra > cpu.usable:
        advice.append(f"torch uses {pools.torch_intra} intra-op threads but only {cpu.usable} "
                      f"CPUs are usable: call torch.set_num_threads({cpu.usable}) in the main "
                      f"process.")

    # A worker's torch.set_num_threads(1) sizes torch's pool and OpenMP runtime, no other pool;
    # how a worker gets those depends on the start method (lesson 02, section 2).
    busy = {name: n for name, n in pools.pools.items()   # ThreadPools names torch's ", torch)"
            if n > 1 and name != "torch intra-op" and not name.endswith(", torch)")}
    if busy:
        listed = ", ".join(f"{name} {n}" for name, n in busy.items())
        worst = max(busy.values())
        if report.start_method == "fork":
            how = ("Workers here start with 'fork' and inherit these sizes; OpenCV's pool, if this "
                   "process has used it before the workers start, lost its threads in the fork: "
                   "it reads its size there but runs on one thread until something resizes it.")
        elif report.start_method == "forkserver" and forkserver_main() == "inherited":
            how = ("Workers here start with 'forkserver' from a server that ran this script's top "
                   "level: they inherit these libraries with the pools the server sized.")
        else:
            how = (f"Workers here start with '{report.start_method}': each loads these libraries "
                   f"afresh, with pools at the libraries' default size (one thread per core) "
                   f"unless a thread variable in the worker's environment sets another.")
        advice.append(f"These pools are not limited inside DataLoader workers ({listed}): the "
                      f"DataLoader sets only torch's own pool to 1 there. {how} {cpu.usable} "
                      f"workers can run up to {cpu.usable * worst} threads on {cpu.usable} CPUs. "
                      f"Limit them in worker_init_fn (course_utils.make_worker_init(1)).")

    omp = pools.thread_env.get("OMP_NUM_THREADS")
    if omp is not None and omp.strip().isdigit():
        ignored = [f"{e.get('prefix') or e.get('internal_api')} {e.get('num_threads')}"
                   for e in pools.blas
                   if e.get("user_api") == "openmp" and e.get("num_threads") != int(omp)]
        if ignored:
            advice.append(f"OMP_NUM_THREADS={omp} is set but {', '.join(ignored)} disagrees: the "
                          f"variable only sizes pools loaded after it was set (or the pool was "
                          f"resized since). Use course_utils.limit_threads / threadpoolctl to "
                          f"change a running pool.")

    if acc.kind == "cpu":
        advice.append("No GPU: the GPU lessons (host-to-device copies, GPU augmentation) run the "
                      "same code on CPU tensors, so their timings say nothing about a GPU.")
    elif acc.kind == "mps":
        advice.append("Apple MPS: lessons run on 'mps'; CUDA-only parts (pinned memory with "
                      "non_blocking copies, CUDA streams) run on CPU tensors instead.")
    elif acc.kind == "cuda" and report.start_method == "fork":
        advice.append(f"GPU {acc.name} with the 'fork' start method: never use CUDA inside "
                      f"DataLoader workers (a forked child cannot re-initialise CUDA); move "
                      f"batches to the GPU in the main process.")

    if acc.kind == "cpu" and getattr(torch.version, "cuda", None) and report.start_method == "fork":
        if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1":
            check = ("PYTORCH_NVML_BASED_CUDA_CHECK=1 is set here, so torch.cuda.is_available() "
                     "asks NVML and initialises nothing (unless NVML fails); using CUDA still "
                     "initialises it, after which")
        else:
            check = ("torch.cuda.is_available() alone initialises the CUDA driver here (unless "
                     "PYTORCH_NVML_BASED_CUDA_CHECK=1 is set: then it asks NVML), after which")
        advice.append(f"This torch is a CUDA {torch.version.cuda} build on a machine without a "
                      f"usable GPU: {check} a forked worker that touches CUDA raises 'Cannot "
                      f"re-initialize CUDA in forked subprocess'. Keep CUDA out of workers (or "
                      f"install a CPU-only build: much smaller, no CUDA libraries).")

    module = ("every Dataset, collate_fn and worker_init_fn must live in an importable module (like "
              "course_utils), not in the notebook")
    advice.append({
        "forkserver": f"Workers start with 'forkserver', forked from one server process, not from "
                      f"this one: {module}; their os.environ is the server's from when it started "
                      f"(variables set here later are not seen); "
                      f"{FORKSERVER_MAIN[forkserver_main()]}.",
        "spawn": f"Workers start with 'spawn': {module}; each worker is a fresh interpreter, started "
                 f"with this process's current os.environ (thread variables set here before the "
                 f"workers start size its BLAS/OpenMP pools; settings made by calls are not "
                 f"inherited), that imports torch afresh, so consider persistent_workers=True.",
        "fork": "Workers start with 'fork': they share the parent's memory copy-on-write, so hold "
                "datasets as NumPy arrays, not lists of Python objects (reading those copies pages "
                "into every worker)."}[report.start_method])
    if report.ram_available_bytes < LOW_RAM_BYTES:
        advice.append(f"Only {_gib(report.ram_available_bytes)} of RAM available: each worker is "
                      f"a process holding its own prefetched batches (prefetch_factor x "
                      f"batch_size); keep num_workers and batch sizes modest and run the course "
                      f"in quick mode ({QUICK_ENV}=1).")
    return advice


def doctor() -> DoctorReport:
    """Inspect this machine and process; ``print(doctor())`` for a readable report."""
    memory = psutil.virtual_memory()
    report = DoctorReport(
        python=f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        platform=platform.platform(), torch_version=torch.__version__, torch_build=_torch_build(),
        cpu=cpu_info(), pools=thread_pools(), accelerator=accelerator(),
        start_method=start_method(), ram_total_bytes=int(memory.total),
        ram_available_bytes=int(memory.available), opencv_version=str(cv2.__version__),
        opencv_parallel=opencv_parallel_framework(), numpy_version=numpy.__version__)
    report.advice = advise(report)
    return report


def machine_summary() -> str:
    """One line: ``Linux x86_64 | 2 usable CPUs (of 2) | torch 2.13.0 cpu | no GPU | start: fork``."""
    cpu = cpu_info()
    acc = accelerator()
    version = torch.__version__.split("+")[0]
    build = _torch_build().lower().removesuffix("-only")   # "cuda 12.4", "rocm 6.2" or "cpu"
    gpu = {"cuda": acc.name + (f" x{acc.count}" if acc.count > 1 else ""),
           "mps": "Apple MPS"}.get(acc.kind, "no GPU")
    cpus = f"{cpu.usable} usable CPU{'s' if cpu.usable != 1 else ''} (of {cpu.logical})"
    return f"{platform.system()} {platform.machine()} | {cpus} | torch {version} {build} | {gpu} | start: {start_method()}"
