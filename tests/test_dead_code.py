"""No dead code in ``course_utils``: vulture at 60 % confidence over the package, with every place
that may use one of its names scanned beside it (the lessons', solutions' and exercises' code
cells, the authors' package, the maintainers' scripts) and only the package's own findings kept.
The tests are not scanned: a name only a test uses is test-only code and is reported.
``tests/dead_code_whitelist.py`` names what only a framework calls (pytest hooks, Jupyter's
``_repr_html_``, NumPy's ``flags.writeable`` written)."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vulture", reason="vulture is in the test extra: make test installs it")
ROOT = Path(__file__).resolve().parents[1]
MAGIC = re.compile(r"^(\s*)[%!].*$", re.MULTILINE)


def notebook_code(out: Path) -> list[Path]:
    """Each notebook's code cells as one Python file in ``out`` (a magic or shell line becomes
    ``pass``); a file that does not parse fails the test, so the scan is never blind to it."""
    files = []
    for nb in sorted(ROOT.glob("*/[0-9][0-9]_*.ipynb")):
        cells = ["".join(c["source"]) for c in json.loads(nb.read_text(encoding="utf-8"))["cells"]
                 if c["cell_type"] == "code"]
        code = "\n\n".join(MAGIC.sub(r"\1pass", cell) for cell in cells) + "\n"
        ast.parse(code, filename=str(nb))
        path = out / f"{nb.parent.name}_{nb.stem}.py"
        path.write_text(code, encoding="utf-8")
        files.append(path)
    return files


def test_no_dead_code_in_the_package(tmp_path):
    users = [ROOT / "course_authoring", ROOT / "tools", *notebook_code(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "vulture", "course_utils", *map(str, users),
         str(ROOT / "tests" / "dead_code_whitelist.py"), "--min-confidence", "60",
         "--ignore-decorators", "@grader", "--ignore-names", "pytest_*"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    dead = [line for line in proc.stdout.splitlines() if line.startswith("course_utils")]
    assert not dead, ("unused code in course_utils (delete it; or, if only a framework calls it, "
                      "name it in tests/dead_code_whitelist.py):\n" + "\n".join(dead))


def test_the_check_finds_an_unused_function(tmp_path):
    module = tmp_path / "course_utils" / "m.py"
    module.parent.mkdir()
    module.write_text("def used():\n    return 1\n\n\ndef unused():\n    return used()\n")
    proc = subprocess.run([sys.executable, "-m", "vulture", "course_utils", "--min-confidence", "60"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "unused function 'unused'" in proc.stdout and "'used'" not in proc.stdout
