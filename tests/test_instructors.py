"""The instructor guide's minutes table says what each notebook's first cell says."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def notebook_minutes() -> dict[str, tuple[int, int]]:
    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        first = json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"]
        text = "".join(first) if isinstance(first, list) else first
        m = re.search(r"Teaching: about (\d+) minutes\. Exercises?: about (\d+) minutes", text)
        assert m, f"{path.name}: first cell lacks 'Teaching: about N minutes. Exercise: about M minutes'"
        found[path.name[:2]] = (int(m.group(1)), int(m.group(2)))
    return found


def guide_minutes() -> dict[str, tuple[int, int]]:
    text = (ROOT / "instructors" / "README.md").read_text(encoding="utf-8")
    return {m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"^\| (\d\d) [^|]+\| (\d+) \| (\d+) \|$", text, re.M)}


def test_guide_minutes_match_the_notebooks():
    assert guide_minutes() == notebook_minutes()
