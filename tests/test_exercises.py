"""The exercise generator: stubs, errors, and exercises/ matching solutions/."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from course_authoring.__main__ import main
from course_authoring.exercises import (BEGIN, END, ExerciseFormatError, exercise_notebook,
                                    make_exercises, strip_solution)

ROOT = Path(__file__).resolve().parents[1]


def test_strip_keeps_indentation_and_surrounding_code():
    src = ("def f(x):\n"
           "    y = 1\n"
           f"    {BEGIN}\n"
           "    return x + y\n"
           f"    {END}\n"
           "\n"
           "print('after')\n")
    out = strip_solution(src)
    assert out == ("def f(x):\n"
                   "    y = 1\n"
                   '    raise NotImplementedError("Exercise: replace this line with your code '
                   '(see the instructions above).")\n'
                   "\n"
                   "print('after')\n")
    assert "return x + y" not in out
    compile(out, "<stub>", "exec")  # still valid Python


def test_strip_handles_several_regions_and_top_level():
    src = f"{BEGIN}\na = 1\n{END}\nb = 2\nif b:\n    {BEGIN}\n    c = 3\n    {END}\n"
    out = strip_solution(src)
    assert out.count("raise NotImplementedError") == 2
    assert "a = 1" not in out and "c = 3" not in out and "b = 2" in out
    compile(out, "<stub>", "exec")


@pytest.mark.parametrize("src, message", [
    (f"{BEGIN}\nx = 1\n", "never closed"),
    (f"x = 1\n{END}\n", "without a"),
    (f"{BEGIN}\n{BEGIN}\n{END}\n", "inside another"),
])
def test_bad_markers_raise_a_clear_error(src, message):
    with pytest.raises(ExerciseFormatError, match=message):
        strip_solution(src, where="sol.ipynb cell 3")


def _nb(*sources: str) -> dict:
    return {"cells": [{"cell_type": "code", "source": s, "metadata": {}, "outputs": [{"x": 1}],
                       "execution_count": 3} for s in sources],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_exercise_notebook_strips_outputs_and_requires_a_region():
    nb = exercise_notebook(_nb(f"{BEGIN}\nx = 1\n{END}\n", "print(1)"))
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in nb["cells"])
    with pytest.raises(ExerciseFormatError, match="no '### BEGIN SOLUTION' region"):
        exercise_notebook(_nb("print(1)"), name="empty.ipynb")


def test_make_exercises_writes_and_checks(tmp_path):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    (sol / "01_a.ipynb").write_text(json.dumps(_nb(f"{BEGIN}\nx = 1\n{END}\n")))
    assert make_exercises(sol, ex, check=True) == [ex / "01_a.ipynb"]
    assert make_exercises(sol, ex) == [ex / "01_a.ipynb"]
    assert make_exercises(sol, ex, check=True) == []
    (ex / "99_stale.ipynb").write_text("{}")
    assert make_exercises(sol, ex, check=True) == [ex / "99_stale.ipynb"]
    with pytest.raises(FileNotFoundError, match="solutions_dir"):
        make_exercises(tmp_path / "nope", ex)


def test_shipped_exercises_are_exactly_what_the_generator_makes():
    stale = make_exercises(ROOT / "solutions", ROOT / "exercises", check=True)
    assert stale == [], (f"exercises/ differs from solutions/ for {stale}; "
                         f"run `python -m course_authoring make-exercises`")
    assert sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb")), "no solution notebooks"


def test_cli_check_reports_up_to_date(capsys):
    assert main(["make-exercises", "--check", "--solutions", str(ROOT / "solutions"),
                 "--exercises", str(ROOT / "exercises")]) == 0
    assert "up to date" in capsys.readouterr().out


def _one_line_error(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("python -m course_authoring make-exercises: error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_cli_bad_folders_are_one_line_exit_2(tmp_path, capsys):
    missing = str(tmp_path / "nonexistent")
    assert main(["make-exercises", "--solutions", missing]) == 2
    _one_line_error(capsys.readouterr().err, f"--solutions {missing!r} is not a folder")
    (tmp_path / "solutions").mkdir()
    (tmp_path / "a_file").write_text("not a folder")
    assert main(["make-exercises", "--solutions", str(tmp_path / "solutions"),
                 "--exercises", str(tmp_path / "a_file")]) == 2
    _one_line_error(capsys.readouterr().err, "--exercises", "is not a folder")


@pytest.mark.parametrize("text, words", [
    ('{"cells": [', ["is not valid notebook JSON", "bad.ipynb"]),
    (json.dumps(_nb(f"{BEGIN}\nx = 1\n")), ["bad.ipynb cell 0, line 1", "never closed"]),
])
def test_cli_malformed_solution_is_one_line_exit_2(tmp_path, capsys, text, words):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "bad.ipynb").write_text(text)
    assert main(["make-exercises", "--solutions", str(tmp_path / "solutions"),
                 "--exercises", str(tmp_path / "exercises")]) == 2
    _one_line_error(capsys.readouterr().err, *words)
    assert not (tmp_path / "exercises").exists()
