"""Notebooks as stored: no outputs, explicit imports that exist, the anatomy, stubs that fail.

The notebooks themselves are executed elsewhere (``make test``: the lessons twice over in
tests/test_rerun.py, the solutions under ``--nbval-lax``); this file checks what a run does not.
"""
from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest
from IPython.core.inputtransformer2 import TransformerManager

import course_utils
from course_authoring.hosted import is_install_cell
from course_utils.grading.grade import NotebookGrade, grade_notebooks

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
ALL = LESSONS + SOLUTIONS + EXERCISES


def _cells(path: Path, kind: str | None = None) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for cell in nb["cells"]:
        if kind is None or cell["cell_type"] == kind:
            src = cell["source"]
            out.append("".join(src) if isinstance(src, list) else src)
    return out


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def test_there_are_notebooks():
    assert LESSONS and SOLUTIONS and EXERCISES


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_stored_without_outputs(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{_id(path)}: cells {dirty} have outputs; clear them before committing"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_cell_ids_are_unique(path):
    # nbformat 4.5 requires it; JupyterLab and nbformat.validate reject a notebook without it
    ids = [c.get("id") for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    assert not repeated and None not in ids, f"{_id(path)}: cell ids {repeated} are used twice"


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_imports_are_explicit_and_exist(path):
    for source in _cells(path, "code"):
        code = TransformerManager().transform_cell(source)     # magics become plain calls
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]
                assert "*" not in names, f"{_id(path)}: star import from {node.module}"
                if node.module == "course_utils":
                    missing = [n for n in names if not hasattr(course_utils, n)]
                    assert not missing, f"{_id(path)}: course_utils has no {missing}"


@pytest.mark.parametrize("path", LESSONS, ids=_id)
def test_lesson_anatomy(path):
    text = "\n".join(_cells(path, "markdown")).lower()
    for part in ("learning objectives", "predict first", "the common advice, checked",
                 "key points", "exercise"):
        assert part in text, f"{_id(path)}: no '{part}' section (see ARCHITECTURE.md: a lesson's anatomy)"
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and not is_install_cell(c)]
    src = code[0]["source"]
    setup = "".join(src) if isinstance(src, list) else src
    assert "machine_summary()" in setup and "mode_banner()" in setup, \
        f"{_id(path)}: the setup cell (the first code cell after the hosted-install cell) " \
        f"should print machine_summary() and mode_banner()"


SOLVED_00 = ROOT / "solutions" / "00_measure_first.ipynb"   # the cheapest solution to grade


@functools.lru_cache(maxsize=1)
def _shipped_grades() -> dict[Path, NotebookGrade]:
    """Every shipped exercise and solution 00, graded in ONE grade run (one pytest start-up):
    this also tests that grade_notebooks maps each cell back to its own notebook, since
    exercises/00 and solutions/00 have the same cells and opposite outcomes."""
    paths = [*EXERCISES, SOLVED_00]
    return dict(zip(paths, grade_notebooks(paths, cell_timeout=300)))


@pytest.mark.timeout(900)   # the first test to ask runs the whole grade run
@pytest.mark.parametrize("path", EXERCISES, ids=_id)
def test_exercises_as_shipped_fail_exactly_at_their_stubs(path):
    grade = _shipped_grades()[path]
    assert grade.exercises, f"{_id(path)}: no check(...) cell found"
    assert not grade.other_failures, (
        f"{_id(path)}: cells outside the checks failed:\n" + "\n".join(map(str, grade.other_failures)))
    for exercise in grade.exercises:
        assert not exercise.passed and "not done yet" in exercise.message, str(exercise)
    assert not grade.passed and "not done yet" in str(grade), str(grade)


@pytest.mark.timeout(900)
def test_grade_passes_a_solved_notebook_and_fails_its_exercise():
    solved, shipped = _shipped_grades()[SOLVED_00], _shipped_grades()[ROOT / "exercises" / SOLVED_00.name]
    assert solved.passed, str(solved)
    assert [(e.exercise, e.passed) for e in solved.exercises] == [("00.time_loader", True)]
    assert not solved.other_failures and "1 of 1 exercises pass" in str(solved), str(solved)
    assert [(e.exercise, e.passed) for e in shipped.exercises] == [("00.time_loader", False)]
