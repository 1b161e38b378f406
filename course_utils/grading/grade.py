"""``python -m course_utils grade exercises/00_measure_first.ipynb``: each notebook run top to
bottom in a fresh kernel by ``pytest --nbval-lax``, each cell's outcome mapped back to the
exercise whose ``check("ID", ...)`` call it holds. The pytest run loads this module as a plugin
too (``-p course_utils.grading.grade``): its hooks write each cell's outcome as a JSON line."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_CHECK_RE = re.compile(r"""check\(\s*["']([\w.\-]+)["']""")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_CELL_RE = re.compile(r"::Cell (\d+)$")
_EXAMPLE = "exercises/00_measure_first.ipynb"
_PATHS: dict[str, str] = {}          # nodeid -> absolute path of the notebook that holds it


def pytest_itemcollected(item):  # noqa: D103 - pytest hook
    _PATHS[item.nodeid] = os.path.realpath(str(item.path))


def pytest_runtest_logreport(report):  # noqa: D103 - pytest hook
    target = os.environ.get("COURSE_GRADE_REPORT")
    if not target or report.when != "call" and not (report.when == "setup" and report.failed):
        return
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"nodeid": report.nodeid, "path": _PATHS.get(report.nodeid, ""),
                             "outcome": report.outcome, "longrepr": str(report.longrepr or "")}) + "\n")


@dataclass
class ExerciseGrade:
    """The outcome of one exercise in a graded notebook."""

    exercise: str
    cell: int
    passed: bool
    message: str = ""

    def __str__(self) -> str:
        return "\n".join([f"  {'PASS' if self.passed else 'FAIL'}  {self.exercise}  (cell {self.cell})"]
                         + ["        " + line for line in self.message.splitlines()])


@dataclass
class NotebookGrade:
    """All exercises of a notebook, plus cells that failed outside any check."""

    notebook: str
    exercises: list[ExerciseGrade]
    other_failures: list[ExerciseGrade]

    @property
    def passed(self) -> bool:
        return bool(self.exercises) and all(e.passed for e in self.exercises) and not self.other_failures

    def __str__(self) -> str:
        lines = [f"Grading {self.notebook}"]
        lines += [str(e) for e in self.exercises]
        if self.other_failures:
            lines.append("  Cells that failed outside a check (fix these first; later checks may "
                         "depend on them):")
            lines += [str(e) for e in self.other_failures]
        done = sum(e.passed for e in self.exercises)
        lines.append(f"{done} of {len(self.exercises)} exercises pass"
                     + ("" if self.passed else " — not done yet"))
        return "\n".join(lines)


def exercise_cells(notebook: dict) -> dict[int, str]:
    """Map code-cell index (as nbval numbers them) to the exercise id its check() call grades."""
    found: dict[int, str] = {}
    code = [c.get("source", "") for c in notebook.get("cells", []) if c.get("cell_type") == "code"]
    for index, src in enumerate(code):
        if match := _CHECK_RE.search("".join(src) if isinstance(src, list) else src):
            found[index] = match.group(1)
    return found


def _failure_message(longrepr: str) -> str:
    text = _ANSI_RE.sub("", longrepr)
    lines = [line.rstrip() for line in text.splitlines()]
    # The exception's own lines come last in the traceback nbval prints.
    for i, line in enumerate(lines):
        if line.startswith("ExerciseFailed:"):
            body = [line[len("ExerciseFailed:"):].strip()]
            body += [l for l in lines[i + 1:] if l.startswith("  ")]
            return "\n".join(body)
    tail = [l for l in lines if l.strip()]
    return "\n".join(tail[-3:])


def read_notebook(path: str | os.PathLike) -> dict:
    """The notebook at ``path`` as a dict; an error names the path and says what to pass."""
    nb_path = Path(path)
    where = f"NOTEBOOK {str(path)!r}"
    if not nb_path.exists():
        raise FileNotFoundError(f"{where} does not exist; pass a notebook path like {_EXAMPLE}.")
    if nb_path.is_dir():
        raise IsADirectoryError(f"{where} is a folder; pass notebook files, e.g. "
                                f"{nb_path.as_posix()}/*.ipynb for every notebook in it.")
    if nb_path.suffix != ".ipynb":
        raise ValueError(f"{where} is not a notebook (.ipynb file); pass a path like {_EXAMPLE}.")
    try:   # an unreadable file raises its own OSError, naming the path
        notebook = json.loads(nb_path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} is not valid notebook JSON ({exc}); restore it, e.g. with git checkout -- "
                         f"{nb_path.as_posix()} (this discards your edits) or from a backup.") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ValueError(f"{where} is JSON but not a notebook (it has no list of cells); pass "
                         f"a notebook path like {_EXAMPLE}.")
    return notebook


def grade_notebooks(paths: list[str | os.PathLike], *, cell_timeout: int = 600) -> list[NotebookGrade]:
    """One grade per path from one nbval run; a path that is not a notebook raises first."""
    nb_paths = [Path(p) for p in paths]
    checks = {p: exercise_cells(read_notebook(p)) for p in nb_paths}
    real = {p: os.path.realpath(p) for p in nb_paths}       # how the report names each notebook
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        env = dict(os.environ, COURSE_GRADE_REPORT=str(report))
        cmd = [sys.executable, "-m", "pytest", "-p", "course_utils.grading.grade",
               "-p", "course_utils.grading._nbval_kernels", "-p", "no:cacheprovider", "-q", "--nbval-lax",
               f"--nbval-cell-timeout={cell_timeout}", *dict.fromkeys(real.values())]
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    outcomes: dict[str, dict[int, dict]] = {}
    for row in rows:
        if m := _CELL_RE.search(row["nodeid"]):
            outcomes.setdefault(row["path"], {})[int(m.group(1))] = row
    return [_notebook_grade(p, checks[p], outcomes.get(real[p], {})) for p in nb_paths]


def _notebook_grade(nb_path: Path, checks: dict[int, str], outcomes: dict[int, dict]) -> NotebookGrade:
    """The grade of one notebook from its check cells and its cells' outcomes (cell -> row)."""
    exercises, others = [], []
    for cell, exercise in sorted(checks.items()):
        row = outcomes.get(cell)
        if row is None:
            exercises.append(ExerciseGrade(exercise, cell, False, "this cell did not run"))
        else:
            ok = row["outcome"] == "passed"
            exercises.append(ExerciseGrade(exercise, cell, ok, "" if ok else _failure_message(row["longrepr"])))
    for cell, row in sorted(outcomes.items()):
        if cell not in checks and row["outcome"] == "failed":
            others.append(ExerciseGrade("(no exercise)", cell, False, _failure_message(row["longrepr"])))
    return NotebookGrade(str(nb_path), exercises, others)
