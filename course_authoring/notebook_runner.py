"""Run a notebook's code cells without Jupyter (for ``gpu-check`` on a bare GPU machine).

The GPU machine the course is checked on has torch but no Jupyter packages (no nbclient,
ipykernel or nbformat), so lessons 04 and 05 cannot run in a kernel there.
:func:`run_notebook_cells` reads the notebook as JSON and runs its code cells in one namespace
standing in for ``__main__``, in quick mode with matplotlib's Agg backend, skipping the
hosted-install cell; :func:`run_notebook` does that in a fresh Python process with a timeout, so
a hang or a crash cannot take the caller down. Maintainer tooling, not a learner helper.
"""
from __future__ import annotations

import ast
import builtins
import json
import linecache
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any, Callable, Mapping

from course_utils.config import QUICK_ENV

from .exercises import cell_source
from .hosted import is_install_cell

__all__ = ["UnsupportedMagic", "run_notebook_cells", "run_notebook"]

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
                       progress: Callable[[dict], None] | None = None) -> dict:
    """Run the code cells of the notebook at ``path`` in this process, top to bottom, in one
    fresh namespace that stands in for ``__main__`` (as in a Jupyter kernel), and stop at the
    first cell that raises.

    The notebook is read with the json module (no nbformat). While it runs: quick mode
    (:data:`course_utils.config.QUICK_ENV` set to 1), ``MPLBACKEND=Agg``, the working directory
    and ``sys.path[0]`` are the notebook's folder; all are put back afterwards. The hosted-install cell is skipped;
    ``%%writefile`` is run, ``%matplotlib`` lines are dropped, any other IPython magic or shell
    escape fails its cell (:class:`UnsupportedMagic`). Figures are closed after each cell.

    Returns ``{"notebook", "status" ("passed"|"failed"), "code_cells", "ran", "skipped" (cell
    indices), "not_run", "current" (index of the last cell started), "failure" (None or
    {"cell", "error", "source"}), "seconds"}``; cell indices count every cell of the notebook
    from 0. ``progress`` is called with that dict before each cell and at the end.
    """
    path = Path(path)
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        cells = nb["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a readable notebook (JSON with a 'cells' list): "
                         f"{type(exc).__name__}: {exc}") from None
    code_cells = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    result: dict[str, Any] = {"notebook": path.name, "status": "running",
                              "code_cells": len(code_cells), "ran": 0, "skipped": [], "not_run": 0,
                              "current": None, "failure": None, "seconds": 0.0}
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
                result["failure"] = {"cell": index, "error": f"{type(exc).__name__}: {message}",
                                     "source": _first_line(src)}
                result["not_run"] = len(code_cells) - n - 1
                break
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


def _save_json(path: Path, data: Mapping) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def _notebook_child(notebook: str, result_file: str) -> int:
    """The notebook process: run the cells, keep ``result_file`` up to date (the parent reads
    it after a timeout or a crash to say which cell was running)."""
    result = run_notebook_cells(notebook, progress=lambda r: _save_json(Path(result_file), r))
    return 0 if result["status"] == "passed" else 1


_CHILD = ("import sys\nfrom course_authoring.notebook_runner import _notebook_child\n"
          "sys.exit(_notebook_child(sys.argv[1], sys.argv[2]))")


def _kill(proc: subprocess.Popen) -> None:
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)   # its DataLoader workers too
        else:  # pragma: no cover - not POSIX
            proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()


def run_notebook(path: str | os.PathLike, timeout_s: float) -> dict:
    """Run the code cells of one notebook with :func:`run_notebook_cells` in a fresh Python
    process (this interpreter; its output goes to this process's stdout and stderr), killed
    with its workers after ``timeout_s`` seconds.

    Returns run_notebook_cells's dict; ``status`` is "passed", "failed" (a cell raised, or
    the process died) or "timed out", and ``detail`` says what happened, in one line.
    """
    path = Path(path)
    env = dict(os.environ, **{QUICK_ENV: "1", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.perf_counter()
    timed_out = False
    with tempfile.TemporaryDirectory(prefix="gpu_check_nb_") as tmp:
        result_file = Path(tmp) / "result.json"
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path.resolve()), str(result_file)],
                                env=env, cwd=str(ROOT), start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill(proc)
        try:
            result = json.loads(result_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            result = {"notebook": path.name, "current": None, "failure": None}
    result["seconds"] = time.perf_counter() - t0
    where = f"cell {result['current']}" if result.get("current") is not None else "before any cell"
    if timed_out:
        result.update(status="timed out",
                      detail=f"stopped after {timeout_s:.0f} s (the check's budget) in {where}")
    elif result.get("failure"):
        fail = result["failure"]
        result.update(status="failed", detail=f"cell {fail['cell']} ({fail['source']!r}) raised "
                                              f"{fail['error']}")
    elif proc.returncode != 0 or result.get("status") != "passed":
        result.update(status="failed", detail=f"the notebook process ended with exit status "
                                              f"{proc.returncode} in {where}")
    else:
        result.update(status="passed", detail=f"{result.get('ran', 0)} code cells ran")
    return result


# --------------------------------------------------------------------------------------
# the benchmark steps (module attributes so that tests can replace them)
# --------------------------------------------------------------------------------------

