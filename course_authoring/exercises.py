"""Make learner exercise notebooks from the solution notebooks.

``solutions/`` is the single source of every exercise. In a solution notebook, the part the
learner writes sits between two marker lines (nbgrader's delimiters)::

    def time_loader(loader, batches, warmup_batches=2):
        ### BEGIN SOLUTION
        ...reference answer...
        ### END SOLUTION

The generator replaces each marked region with ``raise NotImplementedError(...)`` at the
indentation of the ``### BEGIN SOLUTION`` line, removes outputs, and writes the notebook under
``exercises/`` with the same file name. ``exercises/`` is never edited by hand; a test checks
that it is exactly what :func:`make_exercises` produces.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
STUB_MESSAGE = "Exercise: replace this line with your code (see the instructions above)."

_BEGIN_RE = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION\s*$")
_END_RE = re.compile(r"^[ \t]*### END SOLUTION\s*$")


class ExerciseFormatError(ValueError):
    """A solution notebook's markers are unbalanced or misplaced, or it is not notebook JSON."""


def strip_solution(source: str, *, where: str = "cell") -> str:
    """Return ``source`` with every solution region replaced by a ``NotImplementedError`` stub.

    ``where`` names the cell in error messages. Raises :class:`ExerciseFormatError` when a
    ``### BEGIN SOLUTION`` has no matching ``### END SOLUTION`` (or the other way round).
    """
    out: list[str] = []
    lines = source.splitlines(keepends=True)
    inside = False
    begin_line = 0
    for number, line in enumerate(lines, start=1):
        text = line.rstrip("\r\n")
        begin = _BEGIN_RE.match(text)
        if begin:
            if inside:
                raise ExerciseFormatError(
                    f"{where}, line {number}: '{BEGIN}' inside another solution region that "
                    f"began on line {begin_line}; close it with '{END}' first.")
            inside, begin_line = True, number
            newline = "\n" if line.endswith("\n") else ""
            out.append(f'{begin.group("indent")}raise NotImplementedError("{STUB_MESSAGE}"){newline}')
            continue
        if _END_RE.match(text):
            if not inside:
                raise ExerciseFormatError(
                    f"{where}, line {number}: '{END}' without a '{BEGIN}' above it.")
            inside = False
            continue
        if not inside:
            out.append(line)
    if inside:
        raise ExerciseFormatError(
            f"{where}, line {begin_line}: '{BEGIN}' is never closed; add '{END}' after the answer.")
    result = "".join(out)
    # A stub that ended the cell should not leave a dangling newline difference.
    return result.rstrip("\n") if not source.endswith("\n") else result


def _clean_cell(cell: dict) -> dict:
    cell = dict(cell)
    if cell.get("cell_type") == "code":
        cell["outputs"] = []
        cell["execution_count"] = None
    return cell


def cell_source(cell: dict) -> str:
    """A notebook cell's source as one string (``.ipynb`` stores it as a string or a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def exercise_notebook(solution: dict, *, name: str = "notebook") -> dict:
    """Return the exercise version of a solution notebook (a parsed ``.ipynb`` dict)."""
    nb = json.loads(json.dumps(solution))  # deep copy
    regions = 0
    for index, cell in enumerate(nb.get("cells", [])):
        text = cell_source(cell)
        if cell.get("cell_type") == "code" and (BEGIN in text or END in text):
            regions += text.count(BEGIN)
            text = strip_solution(text, where=f"{name} cell {index}")
        cell["source"] = text
        nb["cells"][index] = _clean_cell(cell)
    if regions == 0:
        raise ExerciseFormatError(
            f"{name}: no '{BEGIN}' region found; a solution notebook must mark at least one answer.")
    return nb


def render_notebook(nb: dict) -> str:
    """Serialise a notebook the way Jupyter does (indent 1, trailing newline)."""
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def make_exercises(solutions_dir: str | Path = "solutions", exercises_dir: str | Path = "exercises",
                   *, check: bool = False) -> list[Path]:
    """Write ``exercises_dir/NAME.ipynb`` for every ``solutions_dir/NAME.ipynb``.

    With ``check=True`` nothing is written; the paths that are missing or differ from what the
    generator would write are returned instead (empty list: up to date). Exercise notebooks with
    no solution counterpart are reported as stale too.
    """
    src, dst = Path(solutions_dir), Path(exercises_dir)
    if not src.is_dir():
        raise FileNotFoundError(
            f"solutions_dir={str(src)!r} is not a folder; run from the course root or pass the "
            f"folder that holds the solution notebooks.")
    changed: list[Path] = []
    expected_names = set()
    for path in sorted(src.glob("*.ipynb")):
        expected_names.add(path.name)
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ExerciseFormatError(f"{path} is not valid notebook JSON ({exc}); restore it "
                                      f"(e.g. from git) or open and save it in Jupyter.") from None
        text = render_notebook(exercise_notebook(nb, name=str(path)))
        target = dst / path.name
        if target.exists() and target.read_text(encoding="utf-8") == text:
            continue
        changed.append(target)
        if not check:
            dst.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    if dst.is_dir():
        for extra in sorted(dst.glob("*.ipynb")):
            if extra.name not in expected_names:
                changed.append(extra)
    return changed
