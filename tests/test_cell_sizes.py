"""One idea per code cell: each lesson's largest code cell, reported and held to :data:`TARGET`
lines. A ``%%writefile`` cell is a module written out for workers to import, read as a file,
and is held to :data:`WRITEFILE_CEILING` instead.
"""
from __future__ import annotations

import json

import pytest

from _helpers import ROOT

TARGET = 40
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
    print(f"{path.stem}: largest code cell {plain} lines (at most {TARGET}), largest %%writefile {written}")
    assert plain <= TARGET, (f"{path.name}: a code cell of {plain} lines, over {TARGET}; split it "
                             f"into cells of one idea each (ARCHITECTURE.md: the notebook anatomy)")
    assert written <= WRITEFILE_CEILING, f"{path.name}: a %%writefile cell of {written} lines"
