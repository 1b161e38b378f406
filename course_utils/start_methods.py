"""How DataLoader workers start here: the start method (read, never stated: it depends on the
platform and Python version), what each means for a worker, and a DataLoader's context."""
from __future__ import annotations

import inspect
import multiprocessing
import multiprocessing.spawn
import platform
import sys
from multiprocessing.context import BaseContext
from typing import Any

__all__ = ["start_method", "platform_default_start_method", "explain_start_method",
           "resolve_context", "worker_timeout", "forkserver_main", "server_runs_main", "FORKSERVER_MAIN"]


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
        "if this process has used it, reads its old size in a worker but runs on one thread), and "
        "thread variables set in os.environ after the imports reach the worker's os.environ but "
        "not the pools it copied, sized when this process loaded them. CUDA initialised here - by "
        "using it, or with a CUDA build of torch by torch.cuda.is_available(), which asks the "
        "CUDA driver (with PYTORCH_NVML_BASED_CUDA_CHECK=1 set it asks NVML instead and "
        "initialises nothing, unless NVML fails) - cannot be used in a worker: keep CUDA out of "
        "workers."),
    "forkserver": (
        "Each worker is forked from one server process that multiprocessing starts once, the "
        "first time it is needed, with this process's os.environ as it is then. Workers inherit "
        "the server, not this process: its environment from when it started (variables set here "
        "later are not seen), the modules named by multiprocessing.set_forkserver_preload, and "
        "what it ran of __main__: {main}. A Dataset, collate_fn or worker_init_fn defined in a "
        "notebook cell cannot be pickled to them (\"Can't get attribute ... on <module '__main__' "
        "...>\") and must live in an importable module. CUDA in a worker works where the server "
        "never initialised it, but each worker then builds its own CUDA context: wasteful; copy "
        "in the main process."),
    "spawn": (
        "Each worker is a fresh Python interpreter, started with this process's current "
        "os.environ, that imports everything it runs: thread variables (OMP_NUM_THREADS, ...) set "
        "in os.environ here before the workers start - even after this process's own imports - "
        "size the pools of the libraries that read them when the worker imports them. Settings "
        "made here by calls (torch.set_num_threads, cv2.setNumThreads, threadpoolctl limits) are "
        "not inherited (a script's top level runs again in each worker). A Dataset, collate_fn or "
        "worker_init_fn defined in a notebook cell cannot be pickled to it and must live in an "
        "importable module; start-up costs a torch import per worker (use "
        "persistent_workers=True). CUDA in a worker works, but each worker builds its own CUDA "
        "context: wasteful; copy in the main process."),
}

#: What a forkserver's workers get of ``__main__``, per :func:`forkserver_main` case.
FORKSERVER_MAIN = {
    "none": ("here __main__ has no file (a notebook kernel, python -c, the REPL), so the server "
             "ran none of it: calls made here (torch.set_num_threads, cv2.setNumThreads) are not "
             "inherited, and each worker imports torch itself unless the preload names it"),
    "inherited": ("here __main__ is a script whose top level the server ran once (CPython's fix "
                  "for gh-126631, in 3.14 and 3.13.8): its imports and calls are inherited by "
                  "every worker, and after a top-level CUDA call CUDA fails in a worker as under "
                  "fork; code under if __name__ == '__main__' is not inherited"),
    "rerun": ("the server ran none of __main__ here (python -m, or a script on a Python without "
              "CPython's fix for gh-126631): each worker runs its top level again itself"),
}


def server_runs_main() -> bool:
    """Whether the fork server runs the main script (gh-126631's fix): from the source, or version."""
    try:
        import multiprocessing.forkserver as fs    # here: absent on some platforms
        return "init_main_from_path" in inspect.getsource(fs.ForkServer.ensure_running)
    except (ImportError, OSError, TypeError):
        return sys.version_info >= (3, 14) or (3, 13, 8) <= sys.version_info[:3] < (3, 14)


def forkserver_main() -> str:
    """A :data:`FORKSERVER_MAIN` case, from the data multiprocessing sends a new process."""
    data = multiprocessing.spawn.get_preparation_data("probe")
    if "init_main_from_path" in data:
        return "inherited" if server_runs_main() else "rerun"
    name = data.get("init_main_from_name", "__main__")
    return "none" if name == "__main__" or name.endswith(".__main__") else "rerun"


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
    case = _START_METHOD_CASES[method].replace("{main}", FORKSERVER_MAIN[forkserver_main()])
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


def worker_timeout(seconds: float, multiprocessing_context: Any = None) -> float:
    """A loader ``timeout``: ``seconds`` under fork, else 0 (elsewhere a dead worker shows at its end)."""
    return float(seconds) if resolve_context(multiprocessing_context)[1] == "fork" else 0.0
