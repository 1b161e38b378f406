"""Run a lesson's core path for real: the notebook without its deep dives, in a Jupyter kernel.

``python -m course_authoring core-paths --run`` (``make core-paths``) runs each lesson this way,
in quick mode, from the notebooks folder, so the static check of ``core_paths.skipped_uses`` is
backed by an execution. Maintainer tooling (it needs nbclient, from the test extras).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from course_utils.config import QUICK_ENV

from .core_paths import core_only

__all__ = ["CoreRun", "run_core_path"]


@dataclass
class CoreRun:
    """One core path's run: the notebook, its code cells run, seconds, the error if any, and the
    executed core-only notebook (with its outputs)."""
    path: Path
    cells_run: int
    seconds: float
    error: str | None
    executed: nbformat.NotebookNode

    @property
    def ok(self) -> bool:
        return self.error is None


def run_core_path(path: Path, *, cell_timeout_s: int = 300) -> CoreRun:
    """Execute ``path`` without its deep dives in a fresh kernel, in quick mode, from its folder
    (``nbformat.reads`` normalises the cells' sources, stored as strings or lists of lines)."""
    notebook = json.loads(Path(path).read_text(encoding="utf-8"))
    core = nbformat.reads(json.dumps(core_only(notebook)), as_version=4)
    env_before = {k: os.environ.get(k) for k in (QUICK_ENV, "MPLBACKEND")}
    os.environ[QUICK_ENV], os.environ["MPLBACKEND"] = "1", "Agg"
    client = NotebookClient(core, timeout=cell_timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(Path(path).resolve().parent)}})
    start, error = time.perf_counter(), None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        error = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    finally:
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    ran = sum(1 for c in core.cells if c.cell_type == "code" and c.get("execution_count"))
    return CoreRun(Path(path), ran, time.perf_counter() - start, error, core)
