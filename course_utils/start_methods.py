"""How DataLoader workers start here: the start method (read, never stated: it depends on the
platform and Python version), what each means for a worker, and a DataLoader's context."""
from __future__ import annotations

import multiprocessing
import platform
import sys
from multiprocessing.context import BaseContext
from typing import Any

__all__ = ["start_method", "platform_default_start_method", "explain_start_method",
           "resolve_context"]


def start_method() -> str:
    """The start method new processes (and DataLoader workers) get, read without fixing it
    (``get_start_method()`` would, and a later ``set_start_method`` would fail)."""
    default = getattr(multiprocessing.context._default_context, "_default_context", None)
    return (multiprocessing.get_start_method(allow_none=True) or getattr(default, "_name", None)
            or platform_default_start_method())


def platform_default_start_method(platform_name: str | None = None,
                                  version: tuple[int, int] | None = None) -> str:
    """What Python picks by default on ``platform_name`` (``sys.platform``) at ``version``."""
    if (platform_name or sys.platform) in ("darwin", "win32"):
        return "spawn"
    return "forkserver" if tuple(version or sys.version_info[:2]) >= (3, 14) else "fork"


_START_METHOD_CASES = {
    "fork": (
        "Each worker is a copy of this process, made when the loader starts its workers. It "
        "inherits everything: what is defined here (a Dataset class written in a notebook cell "
        "works), os.environ as it is then, the thread settings made here (torch.set_num_threads, "
        "cv2.setNumThreads, threadpoolctl limits; the DataLoader then sets torch's pool to 1 in "
        "every worker) and the state of every loaded library. Only the calling thread is copied: "
        "a thread pool's settings and bookkeeping come along, its threads do not (OpenCV's pool, "
        "if this process has used it, reads its old size in a worker but runs on one thread), "
        "and thread variables set in os.environ after the imports reach the worker's os.environ "
        "but not the pools it copied, which were sized when this process loaded them. CUDA "
        "initialised here - by using it, or with a CUDA build of torch by "
        "torch.cuda.is_available(), which asks the CUDA driver (with "
        "PYTORCH_NVML_BASED_CUDA_CHECK=1 set it asks NVML instead and initialises nothing, "
        "unless NVML fails) - cannot be used in a worker: keep CUDA out of workers."),
    "forkserver": (
        "Each worker is forked from one server process that multiprocessing starts once, the "
        "first time it is needed, with this process's os.environ as it is at that moment. "
        "Workers inherit the server, not this process: its environment from when it started "
        "(variables set here later are not seen; thread variables set before it started size "
        "the pools of the libraries that read them as the server or the worker loads them), "
        "and its imports - only the "
        "modules named by multiprocessing.set_forkserver_preload, so unless torch is preloaded "
        "every worker imports torch itself. Settings made here by calls (torch.set_num_threads, "
        "cv2.setNumThreads, threadpoolctl limits) are not inherited. A Dataset, collate_fn or "
        "worker_init_fn defined in a notebook cell cannot be pickled to them (\"Can't get "
        "attribute ... on <module '__main__'>\") and must live in an importable module. CUDA in "
        "a worker works (the server never initialised it), but each worker then builds its own "
        "CUDA context - GPU memory and seconds of start-up per worker: wasteful; copy batches to "
        "the GPU in the main process."),
    "spawn": (
        "Each worker is a fresh Python interpreter, started with this process's current "
        "os.environ, that imports everything it runs: thread variables (OMP_NUM_THREADS, "
        "OPENBLAS_NUM_THREADS, MKL_NUM_THREADS, ...) set in os.environ here before the workers "
        "start - even after this process's own imports - size the pools of the libraries that "
        "read them when the worker imports them. Settings made here by calls "
        "(torch.set_num_threads, cv2.setNumThreads, threadpoolctl limits) are not inherited. A "
        "Dataset, collate_fn or worker_init_fn defined in a notebook cell cannot be pickled to "
        "it and must live in an importable module; start-up costs a torch import per worker "
        "(use persistent_workers=True). CUDA in a worker works, but each worker builds its own "
        "CUDA context: wasteful; copy in the main process."),
}


def explain_start_method(method: str | None = None) -> str:
    """A few sentences on how DataLoader workers start with ``method`` (default: this
    process's) and what follows for notebook-defined code, inherited settings and CUDA."""
    here = start_method()
    method = here if method is None else method
    if method not in _START_METHOD_CASES:
        raise ValueError(f"method={method!r} is not a start method; use one of "
                         f"{sorted(_START_METHOD_CASES)} (or None for this process's default).")
    py = f"Python {sys.version_info[0]}.{sys.version_info[1]}"
    default = platform_default_start_method()
    if method != here:
        head = f"With '{method}' (not this process's default, which is '{here}'):"
    elif here == default:
        head = (f"DataLoader workers here start with '{here}', the default of {py} on "
                f"{platform.system() or sys.platform} (Linux: fork up to Python 3.13, forkserver "
                f"from 3.14; macOS and Windows: spawn).")
    else:
        head = (f"DataLoader workers here start with '{here}', set for this process (the default "
                f"of {py} on {platform.system() or sys.platform} would be '{default}').")
    case = _START_METHOD_CASES[method]
    return head + " " + (case if method == here else case[0].lower() + case[1:])


def resolve_context(multiprocessing_context: Any, where: str = "") -> tuple[Any, str]:
    """(context for a DataLoader or None, start method) for ``multiprocessing_context`` (None:
    this process's default; a name must be one this platform offers)."""
    if multiprocessing_context is None:
        return None, start_method()
    if isinstance(multiprocessing_context, BaseContext):
        return multiprocessing_context, multiprocessing_context.get_start_method()
    methods = multiprocessing.get_all_start_methods()
    if isinstance(multiprocessing_context, str) and multiprocessing_context in methods:
        return multiprocessing.get_context(multiprocessing_context), multiprocessing_context
    raise ValueError(f"{where + ': ' if where else ''}multiprocessing_context="
                     f"{multiprocessing_context!r} is not a start method on this platform; use "
                     f"one of {methods}, a multiprocessing context, or None for the default.")
