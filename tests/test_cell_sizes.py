"""One idea per code cell: each lesson's largest code cell, reported and held.

The target is :data:`TARGET` lines. Lessons whose largest cell is still above it have a ceiling
of their own, today's size: a cell may not grow, and once one is split the ceiling must come
down with it (the test says so). A ``%%writefile`` cell is a module written out for workers to
import, read as a file, and is held to :data:`WRITEFILE_CEILING` instead.
"""
from __future__ import annotations

import json

import pytest

from _helpers import ROOT

TARGET = 40
#: lesson -> the largest code cell it may keep until it is split (lines); only ever lowered
CEILINGS = {"02": 46, "03": 52, "05": 47, "06": 41, "07": 45, "08": 56}
WRITEFILE_CEILING = 102
LESSONS = sorted((ROOT / "notebooks").glob("0*.ipynb"))


def largest_code_cells(notebook: dict) -> tuple[int, int]:
    """(lines of the largest code cell, of the largest %%writefile cell) of a notebook's JSON."""
    plain, written = [0], [0]
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        (written if source.startswith("%%writefile") else plain).append(len(source.splitlines()))
    return max(plain), max(written)


def test_the_count_reads_code_cells_only():
    nb = {"cells": [{"cell_type": "markdown", "source": "x\n" * 90},
                    {"cell_type": "code", "source": ["a = 1\n"] * 41},
                    {"cell_type": "code", "source": "%%writefile m.py\n" + "b = 2\n" * 60}]}
    assert largest_code_cells(nb) == (41, 61)


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_code_cell_grows(path):
    plain, written = largest_code_cells(json.loads(path.read_text(encoding="utf-8")))
    ceiling = CEILINGS.get(path.stem[:2], TARGET)
    print(f"{path.stem}: largest code cell {plain} lines (target {TARGET}), largest %%writefile {written}")
    assert plain <= ceiling, (f"{path.name}: a code cell of {plain} lines, over {ceiling}; split it "
                              f"into cells of one idea each (ARCHITECTURE.md: the notebook anatomy)")
    assert ceiling == TARGET or plain == ceiling, (
        f"{path.name}: its largest code cell is now {plain} lines: lower CEILINGS[{path.stem[:2]!r}] "
        f"to {max(plain, TARGET)}")
    assert written <= WRITEFILE_CEILING, f"{path.name}: a %%writefile cell of {written} lines"
