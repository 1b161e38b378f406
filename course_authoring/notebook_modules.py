"""Import the modules a lesson notebook writes with ``%%writefile``, without Jupyter.

A lesson shows its harness in its own cells; the parts that DataLoader workers (or the GPU
check) must import are written by ``%%writefile lessonNN_name.py`` cells. ``gpu-check`` runs
those same modules in full mode on a GPU machine that has no Jupyter packages:
:func:`notebook_module` writes every ``%%writefile`` cell of the notebook into a private folder
(a lesson module may import another one) and imports the module asked for from there. One source
for the code: the notebook.

``make mutation`` mutates the lessons' verdict modules as files of a package in its scratch copy
and names that package in ``COURSE_NOTEBOOK_MODULES``: a module found there is imported from it.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from .exercises import cell_source
from .notebook_runner import writefile_target

__all__ = ["writefile_cells", "notebook_module"]

#: notebook path -> the folder its modules were written to, so that several modules of one
#: notebook share one folder (and one sys.path entry) per process.
_FOLDERS: dict[Path, Path] = {}

#: The lesson notebooks, beside this package.
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _notebook_path(notebook: str | Path) -> Path:
    path = Path(notebook)
    if not path.is_absolute() and not path.exists():
        path = NOTEBOOKS / path
    if not path.is_file():
        raise FileNotFoundError(f"notebook={str(notebook)!r} is not a file; pass a path or a name "
                                f"in {NOTEBOOKS}")
    return path.resolve()


def writefile_cells(notebook: str | Path) -> dict[str, str]:
    """The ``%%writefile`` cells of ``notebook``: {file name: text written}, in cell order."""
    path = _notebook_path(notebook)
    files: dict[str, str] = {}
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        header, _, body = cell_source(cell).lstrip().partition("\n")
        if cell.get("cell_type") == "code" and header.split()[:1] == ["%%writefile"]:
            target, append = writefile_target(header)
            files[target.name] = (files.get(target.name, "") if append else "") + body
    return files


def notebook_module(notebook: str | Path, module: str) -> ModuleType:
    """Write ``notebook``'s ``%%writefile`` cells into a temporary folder (once per notebook and
    process), put it first on ``sys.path`` and import ``module`` (such as ``"lesson04_copies"``).

    Raises LookupError, naming the files the notebook does write, when none is ``module.py``.
    """
    files = writefile_cells(notebook)
    if f"{module}.py" not in files:
        raise LookupError(f"module={module!r}: {Path(notebook).name} writes no {module}.py "
                          f"(it writes {sorted(files) or 'nothing'}); pass one of those names "
                          f"without .py")
    key = _notebook_path(notebook)
    if key not in _FOLDERS:
        folder = Path(tempfile.mkdtemp(prefix="course-notebook-modules-"))
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8")
        for name in files:                  # a module imported earlier from another folder goes
            sys.modules.pop(Path(name).stem, None)
        sys.path.insert(0, str(folder))
        _FOLDERS[key] = folder
    package = os.environ.get("COURSE_NOTEBOOK_MODULES")        # make mutation's copy
    if package and importlib.util.find_spec(package) is not None:
        if importlib.util.find_spec(f"{package}.{module}") is not None:
            return importlib.import_module(f"{package}.{module}")
    return importlib.import_module(module)
