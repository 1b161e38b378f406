"""gpu-check's preflight: what the machine brings before any step runs, printed first and kept
in the summary (:func:`preflight`): Python, torch, torchvision, CUDA, cuDNN and NCCL versions,
each GPU's compute and persistence mode (nvidia-smi, bounded like a step), the compilers
``torch.compile`` needs (:func:`toolchain`: lesson 05's own check), /dev/shm. Authors' tooling."""
from __future__ import annotations

import platform
from typing import Any, Callable, Mapping, Optional

import torch
import torchvision

from course_utils.jpeg_decoders import tensor_decoder
from course_utils.tools.bench.dali import dali_missing

from .notebook_modules import notebook_module
from .step_runner import Step, StepResult, run_step

__all__ = ["SMI_QUERY", "SMI_TIMEOUT_S", "smi_step", "nvidia_smi_gpus", "toolchain", "preflight",
           "preflight_line", "preflight_warnings", "optional_library_notes"]

#: The preflight's nvidia-smi query, run as a step (bounded, every escalation counted).
SMI_QUERY = ("nvidia-smi", "--query-gpu=index,name,driver_version,compute_mode,persistence_mode",
             "--format=csv,noheader")
SMI_TIMEOUT_S = 3
#: The notebook whose lesson05_compile cell checks the compile toolchain (one check, the lesson's).
NOTEBOOK = "05_gpu_augmentation.ipynb"
GIB = 1024 ** 3


def _gib(n: float | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.1f} GiB"


def smi_step() -> Step:
    """The preflight's nvidia-smi query as a step (not required: a machine may lack it)."""
    return Step("nvidia-smi (preflight)", list(SMI_QUERY), SMI_TIMEOUT_S, required=False)


def toolchain(check: Optional[Callable[[str], Mapping[str, Any]]] = None) -> dict:
    """What ``torch.compile`` needs to build kernels here, as lesson 05's compile cell checks it
    (``check``: its ``lesson05_compile.compile_toolchain``, imported from the notebook), asked for
    CUDA (Triton: a C compiler) and the CPU (Inductor: a C++ one). Keys: c_compiler, cxx_compiler,
    python_h (paths or None), ok_cuda, ok_cpu, why_not_cuda, why_not_cpu."""
    if check is None:
        check = notebook_module(NOTEBOOK, "lesson05_compile").compile_toolchain
    cuda, cpu = check("cuda"), check("cpu")
    return {"c_compiler": cuda["compiler"], "cxx_compiler": cpu["compiler"],
            "python_h": cuda["python_h"] or cpu["python_h"],
            "ok_cuda": cuda["missing"] is None, "ok_cpu": cpu["missing"] is None,
            "why_not_cuda": cuda["missing"], "why_not_cpu": cpu["missing"]}


def nvidia_smi_gpus(run: Callable[..., StepResult] = run_step) -> tuple[list[dict], str | None]:
    """Each GPU as nvidia-smi reports it (index, name, driver, compute_mode, persistence_mode),
    bounded like a step; ([], why) where nvidia-smi is missing, fails or hangs."""
    seen: list[str] = []
    result = run(smi_step(), seen.append)
    if result.status != "passed":
        return [], (result.failures or [result.status])[-1]
    keys = ("index", "name", "driver", "compute_mode", "persistence_mode")
    rows = [dict(zip(keys, (v.strip() for v in line.split(","))))
            for line in "".join(seen).splitlines() if line.count(",") == len(keys) - 1]
    return rows, None if rows else "nvidia-smi listed no GPU"


def _library_versions() -> dict:
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else None
    except (RuntimeError, AttributeError, TypeError):
        nccl = None
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "nccl": nccl}


def preflight(memory: Mapping[str, Any], *, cuda: bool, gpus: Callable[[], tuple[list, str | None]] = nvidia_smi_gpus,
              versions: Callable[[], dict] = _library_versions,
              tools: Callable[[], dict] = toolchain) -> dict:
    """What this machine brings to the check, before any step: Python, torch, torchvision, CUDA,
    cuDNN, NCCL versions; each GPU's compute and persistence mode (nvidia-smi, where present);
    the compilers torch.compile needs (:func:`toolchain`);
    /dev/shm's size and free bytes (from ``memory``: gpu_check's ``host_memory()``). Kept in the
    summary JSON as ``preflight``."""
    rows, smi_why = gpus()
    return {**versions(), "cuda_available": cuda, "gpus": rows, "nvidia_smi": smi_why,
            "compiler": tools(), "shm_total_bytes": memory.get("shm_total_bytes"),
            "shm_free_bytes": memory.get("shm_free_bytes")}


def preflight_line(pf: Mapping[str, Any]) -> str:
    """The preflight as one line for a person."""
    gpus = "; ".join(f"GPU {g['index']} {g['name']} (driver {g['driver']}, compute mode "
                     f"{g['compute_mode']}, persistence {g['persistence_mode']})" for g in pf["gpus"])
    tc = pf["compiler"]
    compilers = (f"C compiler {tc['c_compiler'] or 'none'}, C++ compiler {tc['cxx_compiler'] or 'none'}, "
                 f"Python.h {'found' if tc['python_h'] else 'MISSING'}")
    return (f"python {pf['python']}, torch {pf['torch']}, torchvision {pf['torchvision']}, "
            + (f"built for CUDA {pf['cuda']}" if pf["cuda"] else "a CPU build of torch")
            + f" ({'a GPU is visible' if pf['cuda_available'] else 'no GPU visible'}), cuDNN "
            f"{pf['cudnn'] or 'none'}, NCCL {pf['nccl'] or 'none'}; "
            + (gpus or f"nvidia-smi: {pf['nvidia_smi']}") + f"; {compilers}; /dev/shm "
            + ("not found" if pf["shm_free_bytes"] is None else
               f"{_gib(pf['shm_free_bytes'])} free of {_gib(pf['shm_total_bytes'])}"))


def preflight_warnings(pf: Mapping[str, Any], *, rehearse: bool) -> list[str]:
    """What in the preflight will cost steps, one line each."""
    lines = []
    key = "cpu" if rehearse else "cuda"
    if not pf["compiler"][f"ok_{key}"]:
        lines.append(f"WARNING: torch.compile cannot build kernels on {key} here "
                     f"({pf['compiler'][f'why_not_{key}']}): its probe and notebook 05's compile "
                     f"cell skip, saying so")
    for g in pf["gpus"]:
        if g["compute_mode"] not in ("Default", "[N/A]"):
            lines.append(f"WARNING: GPU {g['index']} is in compute mode {g['compute_mode']}: one "
                         f"process at a time (or none) may use it; a step left running blocks the next")
    return lines


def optional_library_notes() -> list[str]:
    """One line each on the optional extras this machine has: NVIDIA DALI (its wheel, 0.4 GB, is
    over what the device tool carries, so a bare GPU machine lacks it) and the JPEG decoder."""
    why = dali_missing()
    return ["NVIDIA DALI: installed; lesson 05's deep dive 11 runs its pipeline here" if why is None
            else f"{why} Lesson 05's deep dive 11 skips here; the rehearsal runs its "
                 f"CPU pipeline, and its 'mixed' path waits for a GPU machine with DALI installed.",
            f"JPEG tensor decoder: {tensor_decoder()}"]
