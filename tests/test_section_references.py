"""Every "lesson NN, section K" the course writes (package hints, the guides, the notebooks and
the exercises' "Needs:" lines) names a section lesson NN has, and calls a deep dive a deep dive:
a learner who skipped the deep dives must not be sent to one as if it were on the core path."""
from __future__ import annotations

import json
import re

import pytest

from _helpers import ROOT
from course_authoring.core_paths import SECTION_NUMBER, _referenced, cell_text

REFERENCE = re.compile(r"[Ll]esson (\d\d)(?:,|'s)? (sections?|deep dives?) "
                       r"(\d+(?:\s*(?:,|and|or|to|-|–)\s*\d+)*)")


def sections_of(lesson: str) -> dict[int, bool]:
    """Section number -> whether it is a deep dive, from lesson ``lesson``'s ``## K.`` headings."""
    [path] = (ROOT / "notebooks").glob(f"{lesson}_*.ipynb")
    found = {}
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for line in cell_text(cell).splitlines() if cell["cell_type"] == "markdown" else ():
            if match := SECTION_NUMBER.match(line):
                found[int(match.group(1))] = line.startswith("## Deep dive")
    return found


def wrong_references(text: str, sections=sections_of) -> list[str]:
    problems = []
    for match in REFERENCE.finditer(text):
        lesson, kind, numbers = match.groups()
        have = sections(lesson)
        for number in sorted(_referenced(f"sections {numbers}")):
            if number not in have:
                problems.append(f"'{match.group(0)}': lesson {lesson} has no section {number}")
            elif have[number] != kind.startswith("deep"):
                problems.append(f"'{match.group(0)}': lesson {lesson}'s section {number} is "
                                f"{'a deep dive' if have[number] else 'on the core path'}")
    return problems


def test_the_check_reads_ranges_and_knows_a_deep_dive():
    have = {1: False, 2: False, 3: True}
    fake = lambda lesson: have                                  # noqa: E731
    assert wrong_references("lesson 09, sections 1–2 and lesson 09's deep dive 3", fake) == []
    assert wrong_references("Lesson 09, section 3", fake) == [
        "'Lesson 09, section 3': lesson 09's section 3 is a deep dive"]
    assert wrong_references("lesson 09, deep dive 2", fake) == [
        "'lesson 09, deep dive 2': lesson 09's section 2 is on the core path"]
    assert wrong_references("lesson 09, sections 1 to 4", fake)[-1] == \
        "'lesson 09, sections 1 to 4': lesson 09 has no section 4"


FILES = [*sorted((ROOT / "course_utils").rglob("*.py")), *sorted((ROOT / "course_authoring").rglob("*.py")),
         ROOT / "README.md", ROOT / "instructors" / "README.md",
         *sorted((ROOT / "notebooks").glob("*.ipynb")), *sorted((ROOT / "solutions").glob("*.ipynb"))]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_section_reference_names_a_real_section_of_its_kind(path):
    assert wrong_references(path.read_text(encoding="utf-8")) == []
