"""Run a notebook's code cells without Jupyter (for ``gpu-check`` on a bare GPU machine).

The GPU machine the course is checked on has torch but no Jupyter packages (no nbclient,
ipykernel or nbformat), so lessons 04 and 05 cannot run in a kernel there.
:func:`run_notebook_cells` reads the notebook as JSON and runs its code cells in one namespace
standing in for ``__main__``, in quick mode with matplotlib's Agg backend, skipping the
hosted-install cell. gpu-check runs each notebook that way as a step of its own, in a fresh
Python process with a timeout (:mod:`course_authoring.step_runner`), so a hang or a crash cannot
take the check down. Maintainer tooling, not a learner helper.
"""
from __future__ import annotations

import ast
import builtins
import json
import linecache
import os
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any, Callable

from course_utils.config import QUICK_ENV

from .exercises import cell_source
from .hosted import is_install_cell

__all__ = ["UnsupportedMagic", "run_notebook_cells"]

#: The repository root: child processes import course_utils from here.
ROOT = Path(__file__).resolve().parent.parent


class UnsupportedMagic(RuntimeError):
    """A cell uses an IPython magic or shell escape that only a Jupyter kernel can run."""


def _first_line(src: str) -> str:
    return next((line.strip() for line in src.splitlines() if line.strip()), "")[:100]


def _display(*objs: Any, **_: Any) -> None:
    """Stands in for IPython's ``display`` outside a kernel: prints each object's repr."""
    for obj in objs:
        print(repr(obj))


def writefile_target(header: str) -> tuple[Path, bool]:
    """The file a ``%%writefile [-a] FILE`` header names, and whether it appends."""
    args = header.split()[1:]
    append = bool(args) and args[0] in ("-a", "--append")
    if append:
        args = args[1:]
    if len(args) != 1:
        raise UnsupportedMagic(f"{header.strip()!r}: %%writefile takes [-a] and one file name")
    return Path(os.path.expanduser(args[0].strip("'\""))), append


def _write_file(header: str, body: str) -> None:
    """``%%writefile [-a] FILE`` as IPython runs it (relative to the working directory)."""
    target, append = writefile_target(header)
    print(f"{'Appending to' if append and target.exists() else 'Writing'} {target}")
    with open(target, "a" if append else "w", encoding="utf-8") as fh:
        fh.write(body)


def _python_of(src: str) -> str | None:
    """The Python source of a cell: None when a cell magic this runner implements handled it;
    ``%matplotlib`` lines become blank (Agg is set); any other magic raises UnsupportedMagic."""
    stripped = src.lstrip()
    if stripped.startswith("%%"):
        header, _, body = stripped.partition("\n")
        if header.split()[0] == "%%writefile":
            _write_file(header, body)
            return None
        raise UnsupportedMagic(f"cell magic {header.split()[0]!r} needs a Jupyter kernel; this "
                               f"runner implements %%writefile only")
    lines = ["" if line.strip().startswith("%matplotlib") else line
             for line in src.splitlines()]
    code = "\n".join(lines)
    try:
        ast.parse(code)
    except SyntaxError:
        magic = next(((n, line.strip()) for n, line in enumerate(lines, 1)
                      if line.strip()[:1] in ("%", "!")), None)
        if magic is not None:
            raise UnsupportedMagic(f"line {magic[0]}: {magic[1][:80]!r} is an IPython magic or "
                                   f"shell escape, which needs a Jupyter kernel") from None
        raise
    return code


def _run_cell(code: str, namespace: dict, filename: str) -> None:
    """exec ``code`` in ``namespace``; print the value of a last bare expression, as Jupyter
    shows it (unless the cell ends with ``;``)."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        value = eval(compile(last, filename, "eval"), namespace)
        if value is not None:
            print(repr(value))


def _close_figures() -> None:
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")


def run_notebook_cells(path: str | os.PathLike, *, log: Callable[[str], None] = print,
                       progress: Callable[[dict], None] | None = None,
                       keep_going: bool = False) -> dict:
    """Run the code cells of the notebook at ``path`` in this process, top to bottom, in one
    fresh namespace that stands in for ``__main__`` (as in a Jupyter kernel), and stop at the
    first cell that raises (``keep_going``: run the later cells too, so one failure does not
    hide what the rest would show; they may fail for want of its names).

    The notebook is read with the json module (no nbformat). While it runs: quick mode
    (:data:`course_utils.config.QUICK_ENV` set to 1), ``MPLBACKEND=Agg``, the working directory
    and ``sys.path[0]`` are the notebook's folder; all are put back afterwards. The hosted-install cell is skipped;
    ``%%writefile`` is run, ``%matplotlib`` lines are dropped, any other IPython magic or shell
    escape fails its cell (:class:`UnsupportedMagic`). Figures are closed after each cell.

    Returns ``{"notebook", "status" ("passed"|"failed"), "code_cells", "ran", "skipped" (cell
    indices), "not_run", "current" (index of the last cell started), "failure" (None or the
    first {"cell", "error", "source"}), "failures" (every one), "seconds"}``; cell indices count
    every cell of the notebook from 0. ``progress`` is called with that dict before each cell
    and at the end.
    """
    path = Path(path).resolve()          # the working directory changes below
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        cells = nb["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a readable notebook (JSON with a 'cells' list): "
                         f"{type(exc).__name__}: {exc}") from None
    code_cells = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    result: dict[str, Any] = {"notebook": path.name, "status": "running",
                              "code_cells": len(code_cells), "ran": 0, "skipped": [], "not_run": 0,
                              "current": None, "failure": None, "failures": [], "seconds": 0.0}
    t0 = time.perf_counter()
    module = types.ModuleType("__main__")
    module.__dict__.update(__builtins__=builtins, display=_display)
    saved_env = {k: os.environ.get(k) for k in (QUICK_ENV, "MPLBACKEND")}
    saved_main, saved_cwd, saved_path = sys.modules.get("__main__"), os.getcwd(), list(sys.path)
    os.environ.update({QUICK_ENV: "1", "MPLBACKEND": "Agg"})
    if "matplotlib" in sys.modules:
        sys.modules["matplotlib"].use("Agg")
    try:
        sys.modules["__main__"] = module
        os.chdir(path.parent)
        sys.path.insert(0, str(path.parent))
        for n, index in enumerate(code_cells):
            cell = cells[index]
            src = cell_source(cell)
            if is_install_cell(cell):
                result["skipped"].append(index)
                log(f"--- {path.name} cell {index}: the hosted-install cell, skipped")
                continue
            if not src.strip():
                continue
            result["current"] = index
            if progress is not None:
                progress(result)
            log(f"--- {path.name} cell {index}: {_first_line(src)}")
            try:
                code = _python_of(src)
                if code is not None:
                    _run_cell(code, module.__dict__, f"<{path.name} cell {index}>")
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # SystemExit too: a cell must not end the run
                traceback.print_exc()
                message = (str(exc).strip().splitlines() or [""])[0][:300]
                failure = {"cell": index, "error": f"{type(exc).__name__}: {message}",
                           "source": _first_line(src)}
                result["failures"].append(failure)
                result["failure"] = result["failure"] or failure
                if not keep_going:
                    result["not_run"] = len(code_cells) - n - 1
                    break
                continue
            finally:
                _close_figures()
            result["ran"] += 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    result["status"] = "failed" if result["failure"] else "passed"
    result["seconds"] = time.perf_counter() - t0
    if progress is not None:
        progress(result)
    return result
