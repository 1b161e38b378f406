"""Predict first, answered in place: every guess a lesson asks for is revealed right after the
measurement that answers it, before "The common advice, checked", never in a block at the end."""
from __future__ import annotations

import json
import re

import pytest

from _helpers import ROOT

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
