"""The instructor guide's minutes table says what each notebook's first cell says, and its plans
(3 hours with 15 minutes of slack, one day with every core path, 90 minutes with named sections
skipped, the second afternoon) are built from the lessons' core paths and have times that add up."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_authoring.core_paths import (SECTION_NUMBER, _referenced, cell_text, estimated_minutes,
                                         parts, skipped_uses, stated_minutes)

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
THREE_HOURS = "A 3-hour plan (with two 10-minute breaks)"
ONE_DAY = "A one-day plan (6½ hours, the nine core paths of 00–08)"
SKIPPING = re.compile(r"(\d\d) core path without sections? ([\d ,and–-]+?) \((\d+)\)")


@pytest.mark.parametrize("title, length_min", [(THREE_HOURS, 180), (ONE_DAY, 390),
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


def test_the_second_afternoon_is_the_core_paths_of_04_to_07_and_09():
    """Each of 04-07 and 09 once, at its lesson's core-path minutes (test_the_plans_add_up checks
    those and the sums): the plan once said '04-05 (50)' for two core paths of 45."""
    rows = plan(GUIDE.read_text(encoding="utf-8"), SECOND_AFTERNOON)
    cited = [lesson for _, what in rows for lesson in re.findall(r"(\d\d) core path", what)]
    assert cited == ["04", "05", "06", "07", "09"], cited


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


def slack_problems(rows: list[tuple[int, str]], length_min: int, slack_min: int = 15) -> list[str]:
    """A plan whose work (every row but its slack) leaves less than ``slack_min`` of its length."""
    work = sum(int(n) for _, what in rows if not what.startswith("slack")
               for n in re.findall(r"\((\d+)\)", what))
    return [] if work + slack_min <= length_min else [
        f"the plan's work takes {work} of {length_min} minutes: less than {slack_min} minutes of slack"]


@pytest.mark.parametrize("rows, ok", [([(0, "00 core path (24)"), (24, "slack (156)")], True),
                                      ([(0, "a (150)"), (150, "b (15)"), (165, "slack (15)")], True),
                                      ([(0, "a (150)"), (150, "b (16)"), (166, "slack (14)")], False)])
def test_slack_is_what_the_work_leaves(rows, ok):
    assert (slack_problems(rows, 180) == []) == ok


def test_the_3_hour_plan_keeps_15_minutes_of_slack():
    assert slack_problems(plan(GUIDE.read_text(encoding="utf-8"), THREE_HOURS), 180) == []


def test_the_one_day_plan_is_every_core_path_once_with_breaks():
    rows = plan(GUIDE.read_text(encoding="utf-8"), ONE_DAY)
    cited = [lesson for _, what in rows for lesson in re.findall(r"(\d\d) core path", what)]
    assert cited == [f"{n:02d}" for n in range(9)], cited
    assert sum(what.startswith(("break", "lunch")) for _, what in rows) >= 3


def lesson_cells(lesson: str) -> list[dict]:
    [path] = (ROOT / "notebooks").glob(f"{lesson}_*.ipynb")
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def skipping_problems(what: str, cells_of=lesson_cells) -> list[str]:
    """For "NN core path without section K (M)": K is a core section of lesson NN, the core path
    without it reads in M minutes (within 15 %), and its later cells still run without it."""
    problems = []
    for lesson, sections, minutes in SKIPPING.findall(what):
        skip = _referenced(f"sections {sections}")
        cells = [dict(c) for c in cells_of(lesson)]
        found = set()
        for cell in cells:
            if cell["cell_type"] == "markdown" and (m := SECTION_NUMBER.match(cell_text(cell))) \
                    and int(m.group(1)) in skip and not cell_text(cell).startswith("## Deep dive"):
                cell["source"] = cell_text(cell).replace("## ", "## Deep dive (optional, ~1 min): ", 1)
                found.add(int(m.group(1)))
        problems += [f"lesson {lesson} has no core section {k}" for k in sorted(skip - found)]
        estimate = estimated_minutes(cells[i] for p in parts(cells) if not p.deep for i in p.cells)
        if abs(int(minutes) - estimate) > max(1.0, 0.15 * estimate):
            problems.append(f"lesson {lesson} without section(s) {sections} reads in ~{estimate:.0f} "
                            f"minutes, the plan says {minutes}")
        problems += skipped_uses(cells)
    return problems


def test_the_skipping_rule_on_a_small_lesson():
    lesson = [{"cell_type": "markdown", "source": "## 1. one"}, {"cell_type": "code", "source": "a = 1"},
              {"cell_type": "markdown", "source": "## 2. two"}, {"cell_type": "code", "source": "b = a"},
              {"cell_type": "markdown", "source": "## 3. three"}, {"cell_type": "code", "source": "print(b)"}]
    fake = lambda lesson_number: lesson                                     # noqa: E731
    assert skipping_problems("09 core path without section 3 (1)", fake) == []
    assert "lesson 09 has no core section 4" in skipping_problems("09 core path without section 4 (2)", fake)
    assert any("uses b" in p for p in skipping_problems("09 core path without section 2 (1)", fake))
    assert any("the plan says 9" in p for p in skipping_problems("09 core path without section 3 (9)", fake))


def test_the_90_minute_plan_names_sections_it_can_skip():
    rows = plan(GUIDE.read_text(encoding="utf-8"), "A 90-minute plan")
    skipping = [what for _, what in rows if SKIPPING.search(what)]
    assert skipping, "the 90-minute plan names no section to skip"
    for what in skipping:
        assert skipping_problems(what) == [], what
