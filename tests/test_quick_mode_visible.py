"""Quick mode is visible: every figure a lesson or solution titles has its title (or, for a figure
of several panels, its suptitle or one panel's title) made by ``figure_title``, which stamps quick
mode as ``plot_measurements`` and ``plot_curve`` do, so a figure made from a shrunk experiment
can never pass for a real measurement."""
from __future__ import annotations

import ast
import json

import pytest

from _helpers import ROOT
from course_authoring.core_paths import _python, cell_text

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) + \
    sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
TITLE_CALLS = {"set_title", "suptitle", "title"}


def bare_titles(source: str) -> list[int]:
    """Lines of a cell that set titles when none of them is made by ``figure_title(...)``."""
    tree = _python(source)
    if tree is None:                                     # %%writefile and other cell magics
        tree = ast.parse(source.split("\n", 1)[1]) if source.lstrip().startswith("%%writefile") else None
    lines, stamped = [], False
    for node in ast.walk(tree) if tree else ():
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in TITLE_CALLS and node.args):
            first = node.args[0]
            stamped |= isinstance(first, ast.Call) and getattr(first.func, "id", None) == "figure_title"
            lines.append(node.lineno)
    return [] if stamped else sorted(lines)


@pytest.mark.parametrize("source, lines", [
    ('ax.set_title("Throughput")', [1]),
    ('fig.suptitle(f"{n} workers")', [1]),
    ('plt.title(name)', [1]),
    ('ax.set_title(figure_title("Throughput", {"n": 2}))', []),
    ('x = 1\nfig.suptitle(figure_title(f"{n} workers"))\nax.set_title("panel a")', []),   # panels
    ('ax.set_title("panel a")\nax2.set_title("panel b")', [1, 2]),
    ('ax.set_xlabel("workers")', []),
    ('%%writefile m.py\ndef draw(ax):\n    ax.set_title("in a module")', [2]),
])
def test_the_check_finds_a_bare_title(source, lines):
    assert bare_titles(source) == lines


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem[:2]}")
def test_every_figure_title_says_quick_mode_through_figure_title(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    bare = [f"cell {k} line {line}" for k, cell in enumerate(cells) if cell["cell_type"] == "code"
            for line in bare_titles(cell_text(cell))]
    assert not bare, (f"{path.name}: figure titles set without figure_title(...) at {', '.join(bare)}; "
                      f"write ax.set_title(figure_title('...')) so quick mode is stamped on it")
