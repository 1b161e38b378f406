"""Every lesson's core path: marked in the notebook, at most 35 minutes and the nine of the
workshop day (00-08; lesson 09 is a second afternoon's) within 4 hours, its stated minutes within 15 % of the reading estimate and the same in the notebook,
the exercise and the instructor guide; runnable with every deep dive skipped, naming no deep
dive's section, and no deep dive leaning on another unless its heading says so."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_authoring.__main__ import main
from course_authoring.core_paths import (_referenced, core_only, deep_dive_needs, estimated_minutes,
                                         parts, section_numbers, section_references, skipped_uses,
                                         stated_minutes)

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CORE_TARGET_MIN = 35      # a core path's most, stated
COURSE_CORE_MAX = 240     # the nine core paths of one workshop day (4 hours), stated
ONE_DAY = [f"{n:02d}" for n in range(9)]   # the day's lessons; later ones are taught on a second afternoon


def cells_of(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def md(text: str) -> dict:
    return {"cell_type": "markdown", "source": text}


def code(text: str) -> dict:
    return {"cell_type": "code", "source": text}


def close_enough(stated: float, estimate: float, floor: float = 0.0) -> bool:
    """Stated minutes agree with the reading estimate within 15 % (or ``floor`` minutes)."""
    return abs(stated - estimate) <= max(floor, 0.15 * estimate)


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name[:2])
def test_each_lesson_states_its_core_and_deep_dive_minutes_and_they_fit_what_it_holds(path):
    cells = cells_of(path)
    core, deep, _ = stated_minutes(cells)
    found = parts(cells)
    dives = [p for p in found if p.deep]
    assert sum(p.minutes for p in dives) == deep, \
        f"{path.name}: the deep dives' headings add up to {sum(p.minutes for p in dives)} minutes; " \
        f"the first cell says {deep}"
    for dive in dives:
        estimate = estimated_minutes(cells[i] for i in dive.cells)
        assert close_enough(dive.minutes, estimate, floor=1.5), \
            f"{path.name}: '{dive.title}' states ~{dive.minutes} min; its text and code read in ~{estimate:.0f}"
    estimate = estimated_minutes(cells[i] for p in found if not p.deep for i in p.cells)
    assert close_enough(core, estimate), \
        f"{path.name}: the core path states {core} minutes; its text and code read in ~{estimate:.0f}"
    assert core <= CORE_TARGET_MIN, f"{path.name}: a core path of {core} minutes; mark more deep dives"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name[:2])
def test_the_core_path_runs_with_every_deep_dive_skipped(path):
    assert skipped_uses(cells_of(path)) == []


def test_the_core_paths_report():
    rows = []
    for path in LESSONS:
        core, deep, exercise = stated_minutes(cells_of(path))
        rows.append((path.name[:2], core, deep, exercise))
    print("\nlesson  core  deep dives  exercise (minutes)")
    for row in rows:
        print("  {}    {:>4}  {:>10}  {:>8}".format(*row))
    assert all(core <= CORE_TARGET_MIN for _, core, _, _ in rows)
    day = [core for lesson, core, _, _ in rows if lesson in ONE_DAY]
    assert len(day) == 9 and sum(day) <= COURSE_CORE_MAX, \
        f"the nine core paths of the day (00-08) state {sum(day)} minutes; a day holds {COURSE_CORE_MAX}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name[:2])
def test_the_core_path_names_no_deep_dive_section(path):
    assert section_references(cells_of(path)) == []


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name[:2])
def test_a_deep_dive_leans_on_another_only_where_its_heading_says_so(path):
    assert deep_dive_needs(cells_of(path)) == []


def test_each_exercise_states_the_minutes_its_lesson_gives_it():
    for path in LESSONS:
        _, _, exercise = stated_minutes(cells_of(path))
        solution = next((ROOT / "solutions").glob(f"{path.name[:2]}_*.ipynb"))
        first = json.loads(solution.read_text(encoding="utf-8"))["cells"][0]["source"]
        match = re.search(r"Time: about (\d+) minutes", "".join(first))
        assert match and int(match.group(1)) == exercise, \
            f"{solution.name} states {match and match.group(1)} minutes; lesson {path.name} gives it {exercise}"
        assert re.search(rf"Needs: lesson {path.name[:2]}\b", "".join(first)), \
            f"{solution.name}: its first cell names no 'Needs: lesson {path.name[:2]}, sections ...' line"


# --- the rules themselves, on small notebooks ------------------------------------------------

def test_a_deep_dive_ends_at_the_next_heading_of_its_level_or_higher():
    cells = [md("# 09 x"), code("a = 1"),
             md("## Deep dive (optional, ~5 min): one"), code("b = 2"), md("#### detail"), code("c = 3"),
             md("## 2. core again"), code("d = 4"),
             md("### Deep dive (optional, ~3 min): a part"), code("e = 5"),
             md("### back in the core"), code("f = 6"),
             md("### Deep dive (optional, ~2 min): another"), code("g = 7"), md("## 3. next"), code("h")]
    found = parts(cells)
    assert [(p.deep, p.minutes, p.cells) for p in found] == [
        (False, 0, [0, 1]), (True, 5, [2, 3, 4, 5]), (False, 0, [6, 7]), (True, 3, [8, 9]),
        (False, 0, [10, 11]), (True, 2, [12, 13]), (False, 0, [14, 15])]
    assert [c["source"] for c in core_only({"cells": cells})["cells"]] == [
        "# 09 x", "a = 1", "## 2. core again", "d = 4", "### back in the core", "f = 6", "## 3. next", "h"]


@pytest.mark.parametrize("heading", ["## Deep dive: no minutes", "## Deep dive (optional, ~ min): x",
                                     "# Deep dive (optional, ~5 min): x", "#### Deep dive (optional, ~5 min): x"])
def test_only_a_level_2_or_3_heading_with_minutes_opens_a_deep_dive(heading):
    assert not any(p.deep for p in parts([md("# 09"), md(heading), code("x = 1")]))


def lesson(*deep_code: str, core: str) -> list[dict]:
    return [md("# 09"), code("import numpy as np\nbase = 1"), md("## Deep dive (optional, ~5 min): d"),
            *[code(c) for c in deep_code], md("## The common advice, checked"), code(core)]


@pytest.mark.parametrize("core, broken", [
    ("print(base + np.pi)", False),                                   # only core names
    ("print(spread)", True),                                          # a deep dive's name
    ('if "spread" in globals():\n    print(spread)', False),          # guarded
    ('if "spread" in globals() and "base" in globals():\n    print(spread)', False),
    ('if "other" in globals():\n    print(spread)', True),            # guarded by the wrong name
    ('if "spread" in globals():\n    pass\nelse:\n    print(spread)', True),   # the else branch
    ('if "spread" in locals():\n    print(spread)', True),            # only globals() counts
    ("spread = 3\nprint(spread)", False),                             # the core cell defines it
    ("def f(spread):\n    return spread\nprint(f(2))", False),        # a parameter of the same name
    ("print([spread for spread in range(3)])", False),                # a comprehension's own name
    ("%timeit spread\nprint(base)", False),                           # magics are not Python
    ('ok = "spread" in globals() and spread > 0', False),             # and: read after its guard
    ('ok = spread > 0 and "spread" in globals()', True),              # ... not before it
    ('print(spread if "spread" in globals() else None)', False),      # a conditional expression
    ('print(base if "spread" in globals() else spread)', True),       # ... its else branch
    ("from lesson09_deep import g", True),                            # a module only a deep dive writes
    ("from lesson09_core import h", False),
])
def test_a_core_cell_may_use_a_deep_dive_name_only_under_a_globals_guard(core, broken):
    cells = lesson("spread = 0.2\n!echo shell lines are skipped", "%%writefile lesson09_deep.py\ng = 1",
                   core=core)
    cells.insert(1, code("%%writefile lesson09_core.py\nh = 1"))
    problems = skipped_uses(cells)
    assert bool(problems) == broken, problems
    if broken:
        assert "only a deep dive defines" in problems[0] and 'if "name" in globals()' in problems[0]


def test_a_name_the_core_defined_first_stays_usable_after_a_deep_dive_redefines_it():
    cells = lesson("base = 2", core="print(base)")
    assert skipped_uses(cells) == []


@pytest.mark.parametrize("first, expected", [
    ("*Core path: about 40 minutes. Deep dives (optional): about 45 minutes. Exercise: about 15 minutes.*",
     (40, 45, 15)),
    ("Core path: about 30 minutes. Exercises: about 20 minutes.", (30, 0, 20)),
])
def test_the_first_cell_states_the_minutes(first, expected):
    assert stated_minutes([md(first)]) == expected


def test_a_first_cell_without_minutes_is_refused_with_the_form_to_write():
    with pytest.raises(ValueError, match="Core path: about C minutes"):
        stated_minutes([md("*Teaching: about 25 minutes. Exercise: about 15 minutes.*")])


def test_the_reading_estimate_counts_words_code_lines_and_outputs():
    # 300 words at 200 a minute, 15 code lines (a %%writefile cell's too) at 10 a minute, 2 outputs
    cells = [md(" ".join(["word"] * 300)), code("a = 1\n\n" * 10), code("%%writefile m.py\n" + "b = 2\n" * 4)]
    assert estimated_minutes(cells) == pytest.approx(1.5 + 1.5 + 1.0)
    assert estimated_minutes([md("## 1. one two")]) == pytest.approx(3 / 200)


@pytest.mark.parametrize("stated, estimate, floor, ok", [
    (23, 20.0, 0.0, True), (24, 20.0, 0.0, False), (17, 20.0, 0.0, True), (16, 20.0, 0.0, False),
    (2, 1.0, 1.5, True), (3, 1.0, 1.5, False)])
def test_stated_minutes_hold_within_15_percent_on_both_sides(stated, estimate, floor, ok):
    assert close_enough(stated, estimate, floor) == ok


@pytest.mark.parametrize("text, numbers", [
    ("as section 4 showed", {4}), ("sections 2 to 4 give the recipe", {2, 3, 4}),
    ("put sections 4 and 7 together", {4, 7}), ("deep dive 5 measures it", {5}), ("§6", {6}),
    ("Sections 3, 5 and 9", {3, 5, 9}), ("section 10", {10}), ("in 4 sections", set()),
    ("sections 7–8", {7, 8})])
def test_section_references_are_read_as_a_learner_reads_them(text, numbers):
    assert _referenced(text) == numbers


def test_core_text_naming_a_deep_dive_section_is_found_and_a_core_section_is_not():
    cells = [md("# 09"), md("## 1. core"), code("x = 1"), md("## Deep dive (optional, ~5 min): 2. d"),
             code("y = 2"), md("### Deep dive (optional, ~2 min): a part"), md("## 3. back"),
             md("as section 1 showed"), code("# section 2 measured this\nprint(x)"), md("see section 3")]
    assert section_numbers(cells) == [None, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    [problem] = section_references(cells)
    assert problem.startswith("cell 8 names deep-dive section(s) 2")


@pytest.mark.parametrize("heading, reads, ok", [
    ("## Deep dive (optional, ~5 min): 4. b", "print(made_in_3)", False),
    ("## Deep dive (optional, ~5 min): 4. b (needs section 3)", "print(made_in_3)", True),
    ("## Deep dive (optional, ~5 min): 4. b (needs section 2)", "print(made_in_3)", False),
    ("## Deep dive (optional, ~5 min): 4. b", "made_in_3 = 1\nprint(made_in_3)", True),
    ("## Deep dive (optional, ~5 min): 4. b", "print(core_name)", True),
    ("## Deep dive (optional, ~5 min): 4. b", 'if "made_in_3" in globals():\n    print(made_in_3)', True),
    ("## Deep dive (optional, ~5 min): 4. b", "import lesson09_three", False),
])
def test_a_deep_dive_that_needs_another_must_say_which_in_its_heading(heading, reads, ok):
    cells = [md("# 09"), md("## 1. core"), code("core_name = 0"),
             md("## Deep dive (optional, ~5 min): 3. a"), code("made_in_3 = 1"),
             code("%%writefile lesson09_three.py\nz = 1"), md(heading), code(reads)]
    problems = deep_dive_needs(cells)
    assert (problems == []) == ok, problems
    if not ok:
        assert "(needs section 3)" in problems[0] and problems[0].startswith("cell 7")


def test_the_core_paths_command_reports_each_lesson_and_refuses_a_missing_notebook(capsys):
    assert main(["core-paths"]) == 0
    out = capsys.readouterr().out
    assert out.count("core ") == len(LESSONS)
    assert re.search(r"01_numpy_torch_opencv.ipynb: core \d+ min, \d+ deep dive\(s\) \d+ min, exercise \d+ min", out)
    assert main(["core-paths", "notebooks/99_missing.ipynb"]) == 2
    assert "no such notebook: notebooks/99_missing.ipynb" in capsys.readouterr().err


def test_the_core_paths_command_names_a_broken_core_path(tmp_path, capsys):
    broken = tmp_path / "09_x.ipynb"
    broken.write_text(json.dumps({"cells": lesson("spread = 0.2", core="print(spread)")
                                  + [md("Core path: about 5 minutes. Exercise: about 5 minutes.")]}))
    cells = json.loads(broken.read_text())["cells"]
    cells.insert(0, cells.pop())                                      # the minutes line first
    broken.write_text(json.dumps({"cells": cells}))
    assert main(["core-paths", str(broken)]) == 1
    assert "uses spread, which only a deep dive defines" in capsys.readouterr().out


def test_a_name_two_deep_dives_define_is_usable_under_a_guard_naming_either():
    cells = [md("# 09"), md("## Deep dive (optional, ~5 min): a"), code("shared = 1\nonly_a = 2"),
             md("## Deep dive (optional, ~5 min): b"), code("shared = 3\nonly_b = 4"),
             md("## 3. core"), code('if "only_b" in globals():\n    print(shared)')]
    assert skipped_uses(cells) == []
    cells[-1] = code('if "missing" in globals():\n    print(shared)')
    assert skipped_uses(cells)


def test_other_cell_magics_are_not_python_and_an_appended_module_is_still_a_deep_dives():
    cells = lesson("%%writefile -a lesson09_more.py\nh = 2", core="%%bash\necho $((1 + 2)) > /dev/null")
    assert skipped_uses(cells) == []
    cells.append(code("from lesson09_more import h"))
    assert "lesson09_more.py" in skipped_uses(cells)[0]


def test_a_notebook_that_opens_on_a_deep_dive_has_no_empty_core_part():
    found = parts([md("## Deep dive (optional, ~5 min): first"), code("x = 1"), md("## 2. core"), code("y")])
    assert [(p.deep, p.cells) for p in found] == [(True, [0, 1]), (False, [2, 3])]
