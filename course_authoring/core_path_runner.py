"""Run a lesson for real in a Jupyter kernel, in quick mode, from the notebooks folder.

``python -m course_authoring core-paths --run`` (``make core-paths``) runs each lesson's core
path (the notebook without its deep dives), so the static check of ``core_paths.skipped_uses`` is
backed by an execution. ``passes=2`` runs every code cell, in order, a second time in the same
kernel, as a learner who re-runs cells does (``tests/test_rerun.py`` runs every lesson so).
Maintainer tooling (it needs nbclient, from the test extras).
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
from course_utils.grading.kernels import kernel_manager_class

from .core_paths import core_only

__all__ = ["CoreRun", "run_core_path"]


@dataclass
class CoreRun:
    """One run: the notebook, code cells run (both passes), seconds, the error if any (with the
    pass and cell it happened in), and the executed notebook (with its last outputs)."""
    path: Path
    cells_run: int
    seconds: float
    error: str | None
    executed: nbformat.NotebookNode

    @property
    def ok(self) -> bool:
        return self.error is None


def run_core_path(path: Path, *, cell_timeout_s: int = 300, passes: int = 1,
                  deep_dives: bool = False) -> CoreRun:
    """Execute ``path`` without its deep dives (all of it with ``deep_dives=True``) in a fresh
    kernel, in quick mode, from its folder; ``passes`` times over every code cell, in order, in
    the same kernel. ``nbformat.reads`` normalises the cells' sources (strings or lists of lines)."""
    if passes not in (1, 2):
        raise ValueError(f"passes must be 1 or 2 (2 re-runs every cell once), got {passes!r}")
    notebook = json.loads(Path(path).read_text(encoding="utf-8"))
    core = nbformat.reads(json.dumps(notebook if deep_dives else core_only(notebook)), as_version=4)
    env_before = {k: os.environ.get(k) for k in (QUICK_ENV, "MPLBACKEND")}
    os.environ[QUICK_ENV], os.environ["MPLBACKEND"] = "1", "Agg"
    client = NotebookClient(core, timeout=cell_timeout_s, kernel_name="python3",
                            kernel_manager_class=kernel_manager_class(asynchronous=True),
                            resources={"metadata": {"path": str(Path(path).resolve().parent)}})
    start, error, ran = time.perf_counter(), None, 0
    try:
        with client.setup_kernel():
            for number in range(1, passes + 1):
                for index, cell in enumerate(core.cells):
                    if cell.cell_type != "code":
                        continue
                    try:
                        client.execute_cell(cell, index)
                    except (CellExecutionError, CellTimeoutError) as exc:
                        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                        raise CellExecutionError(f"pass {number}, cell {index}: {last}", "", "") from exc
                    ran += 1
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    finally:
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return CoreRun(Path(path), ran, time.perf_counter() - start, error, core)
