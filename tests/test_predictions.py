"""Predict first, answered in place: every guess a lesson asks for is revealed right after the
measurement that answers it, before "The common advice, checked", never in a block at the end;
a guess asked on the core path is answered on the core path, one asked in a deep dive in that
same deep dive (a learner who skips the deep dives still gets every answer they were asked for)."""
from __future__ import annotations

import json
import re

import pytest

from _helpers import ROOT
from course_authoring.core_paths import parts

LESSONS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
GUESS = re.compile(r"^(my_guess\w*)\s*=", re.M)


def _cells(path):
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        yield cell["cell_type"], source


def guesses_and_answers(cells):
    """(the guess names defined, {name: index of the first code cell that reads it after its
    definition}, index of the "common advice" heading)."""
    names, answered, advice = [], {}, None
    for k, (kind, source) in enumerate(cells):
        if kind == "markdown" and source.startswith("## The common advice") and advice is None:
            advice = k
        if kind != "code":
            continue
        defined = GUESS.findall(source)
        names += defined
        for name in names:
            if name not in defined and name not in answered and re.search(rf"\b{name}\b", source):
                answered[name] = k
    return names, answered, advice


def test_the_check_sees_an_answer_given_at_the_end():
    cells = [("code", "my_guess_x = None"), ("code", "x = 1\nreveal(my_guess_x, x, 'x')"),
             ("markdown", "## The common advice, checked"), ("code", "print(my_guess_y)")]
    assert guesses_and_answers(cells) == (["my_guess_x"], {"my_guess_x": 1}, 2)
    late = [("code", "my_guess_x = None"), ("markdown", "## The common advice"),
            ("code", "reveal(my_guess_x, 1, 'x')")]
    assert guesses_and_answers(late)[1]["my_guess_x"] > guesses_and_answers(late)[2]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_guess_is_answered_before_the_common_advice(path):
    names, answered, advice = guesses_and_answers(list(_cells(path)))
    assert names, f"{path.name}: no my_guess... variables in its Predict first cell"
    for name in names:
        assert name in answered, f"{path.name}: {name} is never answered"
        assert advice is None or answered[name] < advice, (
            f"{path.name}: {name} is first answered after 'The common advice, checked'; reveal it "
            f"right after the measurement that answers it")


def part_of_each_cell(cells: list[dict]) -> dict[int, int]:
    """Cell index -> the index of its part (core parts share -1; each deep dive its own)."""
    return {i: (k if part.deep else -1) for k, part in enumerate(parts(cells)) for i in part.cells}


def unanswered_where_asked(cells: list[dict]) -> list[str]:
    """Guesses not answered in the part that asks them (the core path, or their own deep dive)."""
    part = part_of_each_cell(cells)
    sources = [(c["cell_type"], c["source"] if isinstance(c["source"], str) else "".join(c["source"]))
               for c in cells]
    asked = {}
    for k, (kind, source) in enumerate(sources):
        if kind == "code":
            for name in GUESS.findall(source):
                asked.setdefault(name, k)
    problems = []
    for name, k in asked.items():
        if not any(kind == "code" and j != k and part[j] == part[k] and re.search(rf"\b{name}\b", source)
                   for j, (kind, source) in enumerate(sources) if j > k):
            where = "the core path" if part[k] == -1 else "its deep dive"
            problems.append(f"{name} (asked in cell {k}) is not answered on {where}")
    return problems


def test_the_part_rule_sees_a_core_guess_answered_only_in_a_deep_dive():
    md = lambda t: {"cell_type": "markdown", "source": t}          # noqa: E731
    code = lambda t: {"cell_type": "code", "source": t}            # noqa: E731
    cells = [md("# 09"), code("my_guess_a = None\nmy_guess_b = None"),
             md("## Deep dive (optional, ~5 min): 2. d"), code("reveal(my_guess_a, 1, 'a')"),
             code("my_guess_c = None"), code("reveal(my_guess_c, 2, 'c')"),
             md("## 3. core"), code("reveal(my_guess_b, 2, 'b')")]
    assert unanswered_where_asked(cells) == ["my_guess_a (asked in cell 1) is not answered on the core path"]
    cells[5] = code("pass")
    cells.append(code("reveal(my_guess_c, 2, 'c')"))
    assert unanswered_where_asked(cells)[1] == "my_guess_c (asked in cell 4) is not answered on its deep dive"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_guess_is_answered_in_the_part_that_asks_it(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert unanswered_where_asked(cells) == []
