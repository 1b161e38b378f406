"""The instructor guide's minutes table says what each notebook's first cell says, and its plans
(the 3-hour one and the second afternoon built from the lessons' core paths) have times that add
up."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_authoring.core_paths import stated_minutes

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "instructors" / "README.md"


def notebook_minutes() -> dict[str, tuple[int, int, int]]:
    return {path.name[:2]: stated_minutes(json.loads(path.read_text(encoding="utf-8"))["cells"])
            for path in sorted((ROOT / "notebooks").glob("*.ipynb"))}


def guide_minutes(text: str) -> dict[str, tuple[int, int, int]]:
    return {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(4)))
            for m in re.finditer(r"^\| (\d\d) [^|]+\| (\d+) \| (\d+) \| (\d+) \|$", text, re.M)}


def plan(text: str, title: str) -> list[tuple[int, str]]:
    """The rows (start minute, what) of the guide's table under the heading ``title``."""
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for m in re.finditer(r"^\| (\d):(\d\d) \| (.+) \|$", section, re.M):
        rows.append((int(m.group(1)) * 60 + int(m.group(2)), m.group(3)))
    return rows


def plan_problems(rows: list[tuple[int, str]], length_min: int, core: dict[str, int]) -> list[str]:
    """Rows whose start is not the previous start plus its minutes, a core path cited with other
    minutes than its lesson states, and a plan that runs past its length."""
    problems = []
    for (start, what), nxt in zip(rows, [r[0] for r in rows[1:]] + [None]):
        minutes = sum(int(n) for n in re.findall(r"\((\d+)\)", what))
        for lesson, stated in re.findall(r"(\d\d) core path \((\d+)\)", what):
            if int(stated) != core[lesson]:
                problems.append(f"{lesson}'s core path is {core[lesson]} minutes, the plan says {stated}")
        end = start + minutes
        if nxt is not None and end != nxt:
            problems.append(f"the row at {start // 60}:{start % 60:02d} ends at minute {end}, the next starts at {nxt}")
        if nxt is None and end > length_min:
            problems.append(f"the plan ends at minute {end}, past {length_min}")
    return problems


def test_guide_minutes_match_the_notebooks():
    assert guide_minutes(GUIDE.read_text(encoding="utf-8")) == notebook_minutes()


SECOND_AFTERNOON = "A second afternoon (3 hours, for people who already did 00–03)"


@pytest.mark.parametrize("title, length_min", [("A 3-hour plan (with two 10-minute breaks)", 180),
                                               (SECOND_AFTERNOON, 180),
                                               ("A 90-minute plan", 90),
                                               ('A 90-minute "your own training loop" plan (after 00)', 90)])
def test_the_plans_add_up(title, length_min):
    rows = plan(GUIDE.read_text(encoding="utf-8"), title)
    assert rows, f"no plan titled {title!r} in the guide"
    core = {k: v[0] for k, v in notebook_minutes().items()}
    assert plan_problems(rows, length_min, core) == []


def test_the_3_hour_plan_is_the_core_paths():
    rows = plan(GUIDE.read_text(encoding="utf-8"), "A 3-hour plan (with two 10-minute breaks)")
    cited = [lesson for _, what in rows for lesson in re.findall(r"(\d\d) core path", what)]
    assert len(cited) >= 4, f"the 3-hour plan cites the core paths of {cited}; it is built from them"


def test_the_second_afternoon_is_the_core_paths_of_04_to_07():
    """Each of 04-07 once, at its lesson's core-path minutes (test_the_plans_add_up checks those
    and the sums): the plan once said '04-05 (50)' for two core paths of 45."""
    rows = plan(GUIDE.read_text(encoding="utf-8"), SECOND_AFTERNOON)
    cited = [lesson for _, what in rows for lesson in re.findall(r"(\d\d) core path", what)]
    assert cited == ["04", "05", "06", "07"], cited


@pytest.mark.parametrize("rows, problem", [
    ([(0, "00 core path (30)"), (30, "break (10)")], None),
    ([(0, "00 core path (25)"), (30, "break (10)")], "00's core path is 30 minutes, the plan says 25"),
    ([(0, "00 core path (30), exercise 00 (15)"), (40, "break (10)")], "ends at minute 45, the next starts at 40"),
    ([(0, "00 core path (30)"), (30, "wrap-up (70)")], "the plan ends at minute 100, past 90"),
    ([(0, "00 core path (30)"), (30, "wrap-up (60)")], None),                  # ends exactly at 90
    ([(0, "04 core path (45), 05 core path (45)"), (50, "break (10)")],        # two core paths: 90
     "ends at minute 90, the next starts at 50"),
])
def test_plan_problems_are_found(rows, problem):
    found = plan_problems(rows, 90, {"00": 30, "04": 45, "05": 45})
    assert (problem is None and found == []) or (problem and any(problem in p for p in found)), found
