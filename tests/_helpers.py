"""Small datasets shared by several test modules (module level, so DataLoader workers can use
them), and a loader for the scripts in tools/."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch.utils.data import Dataset


class TinyDataset(Dataset):
    """n instant items: ``(tensor of shape (3,) filled with i, i)``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((3,), float(i)), i


ROOT = Path(__file__).resolve().parents[1]


def load_tool(name: str) -> ModuleType:
    """Import ``tools/NAME.py`` (a script, not a package module) under the module name NAME."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def teaches(err, output=None):
    """A grader's failure teaches (ARCHITECTURE.md): it says what was expected, what was seen and
    a hint, all three; with ``output``, what it says was seen is that output described (a
    failure that dropped a part, or described something else, fails here). Returns ``err``."""
    from course_utils.grading.checker import describe   # only the grader tests need it
    assert err.expected and err.seen and err.hint, f"a failure without expected, seen or hint:\n{err}"
    if output is not None:
        assert err.seen == describe(output), (err.seen, describe(output))
    return err


#: the training scripts diagnose's tests run
DIAGNOSE_SCRIPTS = ROOT / "tests" / "diagnose_scripts"


def diagnose_cli(*args: str, path=(), timeout: float = 120):
    """``python -m course_utils diagnose --no-progress ARGS``, with ``path`` on PYTHONPATH beside
    the course (for ``-m MODULE``); the finished process, output captured as text."""
    return subprocess.run([sys.executable, "-m", "course_utils", "diagnose", "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *path])})


def needs_its_own_process() -> None:
    """Skip a test that needs this pytest process to own its thread pools and its fork server:
    ``make mutation`` runs each mutant's tests in a fork of mutmut's warm process, where the course's
    fork guard rightly refuses pools above one thread and the fork server is the parent's."""
    from course_utils import fork_safety   # only the tests that start pools or workers need it
    if fork_safety.is_fork_child():
        import pytest
        pytest.skip("this pytest runs in a fork of a process whose pools ran (make mutation)")
