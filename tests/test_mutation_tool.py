"""tools/mutation.py: which files a group mutates in a copy of this checkout or of an older commit,
and which survivors change only a message's text (the run itself takes minutes: `make mutation`)."""
from __future__ import annotations

import json

import pytest

from _helpers import ROOT, load_tool

mutation = load_tool("mutation")


def _touch(root, *paths):
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("")


def test_every_group_names_modules_of_this_checkout_and_has_tests(tmp_path):
    mutation.write_verdict_modules(tmp_path)           # the verdicts exist in the scratch copy only
    for group, modules in mutation.GROUPS.items():
        in_copy = [m for m in modules if m.startswith(mutation.VERDICTS_DIR)]
        assert mutation.modules_in(tmp_path if in_copy else ROOT, modules, group) == modules
        assert mutation.tests_for(modules), f"{group}: no test file imports {modules}"


def test_a_groups_tests_are_every_test_file_that_imports_one_of_its_modules(tmp_path):
    groups = load_tool("mutation_groups")
    (tmp_path / "course_utils" / "sub").mkdir(parents=True)
    for name in ("__init__.py", "sub/__init__.py", "sub/alpha.py", "beta.py", "grading/ex04_x.py"):
        (tmp_path / "course_utils" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "course_utils" / name).write_text("")
    (tmp_path / "course_utils" / "__init__.py").write_text("from .beta import gamma\n")
    (tmp_path / "tests").mkdir()
    tests = {
        "test_plain.py": "import course_utils.sub.alpha\n",
        "test_from.py": "from course_utils.sub import alpha\n",
        "test_reexport.py": "from course_utils import gamma\n",                      # -> beta
        "test_patch.py": "def test(m):\n    m.setattr('course_utils.beta.f', 1)\n",
        "test_grader.py": "check('04.prefetcher', None)\n",
        "test_verdicts.py": "notebook_module('x.ipynb', 'lesson03_verdicts')\n",
        "test_none.py": "import course_utils\nx = 'course_utils'\n",
        "helper.py": "import course_utils.beta\n",                  # not a test file
        "test_fixtures.py": "from test_from import alpha_fixture\n",    # another test's fixtures
    }
    for name, text in tests.items():
        (tmp_path / "tests" / name).write_text(text)
    assert groups.tests_for(["course_utils/sub/alpha.py"], tmp_path) == [
        "tests/test_fixtures.py", "tests/test_from.py", "tests/test_plain.py"]
    assert groups.tests_for(["course_utils/beta.py"], tmp_path) == [
        "tests/test_patch.py", "tests/test_reexport.py"]
    assert groups.tests_for(["course_utils/grading/ex04_x.py"], tmp_path) == ["tests/test_grader.py"]
    assert groups.tests_for([f"{groups.VERDICTS_DIR}/lesson03_verdicts.py"], tmp_path) == [
        "tests/test_verdicts.py"]
    assert groups.tests_for([f"{groups.VERDICTS_DIR}/lesson04_verdicts.py"], tmp_path) == []


def test_an_older_commit_is_scored_where_its_modules_lived(tmp_path):
    _touch(tmp_path, "course_utils/bench.py", "course_utils/measurement.py")
    assert mutation.modules_in(tmp_path, ["course_utils/measurement.py", "course_utils/timing.py"],
                               "timing@old") == ["course_utils/measurement.py", "course_utils/bench.py"]
    _touch(tmp_path, "course_utils/timing.py")            # the new path wins where both exist
    assert mutation.modules_in(tmp_path, ["course_utils/timing.py"], "timing@new") == [
        "course_utils/timing.py"]


def test_a_module_in_neither_place_stops_with_one_line(tmp_path):
    with pytest.raises(SystemExit, match="timing@x: no course_utils/bench.py to mutate"):
        mutation.modules_in(tmp_path, ["course_utils/timing.py"], "timing@x")


@pytest.mark.parametrize("diff, only_text", [
    ('--- a\n+++ b\n-    raise ValueError("too few")\n+    raise ValueError("XXtoo fewXX")\n', True),
    ('--- a\n+++ b\n-    if n < 10:\n+    if n <= 10:\n', False),
    ('--- a\n+++ b\n-    x = "a"\n', False),
    ('--- a\n+++ b\n-    f("a b", "c",\n+    f("XXa bXX", "c",\n', True),          # an open bracket
    ('--- a\n+++ b\n-    f("a b", 1,\n+    f("a b", 2,\n', False),
    # a key, a name or a flag is code, not a message's words
    ('--- a\n+++ b\n-    {"pid": pid, "tid": 0}\n+    {"XXpidXX": pid, "tid": 0}\n', False),
    ('--- a\n+++ b\n-    with record_function("fetch"):\n+    with record_function("FETCH"):\n', False),
    ('--- a\n+++ b\n-    e.get("name", "")\n+    e.get("name", "XXXX")\n', False),
    ('--- a\n+++ b\n-    open(p, encoding="utf-8")\n+    open(p, encoding="UTF-8")\n', False),
    ('--- a\n+++ b\n-    return ("the trace has steps; print "\n+    return ("THE TRACE HAS STEPS; PRINT "\n', True),
    ('--- a\n+++ b\n-    "subtract.") if v < 0 else\n+    "SUBTRACT.") if v < 0 else\n', True),  # a message's end
    ('--- a\n+++ b\n-    p = join(tmp, "trace.json")\n+    p = join(tmp, "TRACE.JSON")\n', False),
])
def test_a_survivor_that_changes_only_a_message_is_told_apart(diff, only_text):
    assert mutation.text_only(diff) is only_text


def test_every_hand_mutation_still_applies_to_this_checkout():
    # the 13 bugs of issue 22 (make mutation MUTATION_ARGS=--hand): each edit finds its text
    # exactly once, and each names test files that exist, so the list moves with the code
    assert len(mutation.HAND_MUTATIONS) == 13
    for m in mutation.HAND_MUTATIONS:
        text = (ROOT / m.path).read_text(encoding="utf-8")
        for old, new in m.edits:
            assert text.count(old) == 1 and old != new, (m.what, old)
        assert all((ROOT / t.split("::")[0]).is_file() for t in m.tests), m.what


def test_the_hand_report_names_the_test_or_says_not_caught():
    text = mutation.hand_report([
        {"what": "a", "path": "p.py", "status": 1, "caught": True,
         "by": ["tests/t.py::test_x", "tests/t.py::test_y[a b]", "tests/t.py::z", "tests/t.py::w"]},
        {"what": "b", "path": "q.py", "status": 0, "caught": False, "by": []}])
    assert text.startswith("# Hand mutations: 1 of 2 caught")
    assert ("| a | `p.py` | 4 | `tests/t.py::test_x`<br>`tests/t.py::test_y[a b]`<br>`tests/t.py::z` |"
            in text)
    assert "| b | `q.py` | 0 | **not caught** (pytest exit status 0) |" in text


def test_the_score_counts_only_mutants_that_ran_and_timeouts_as_caught():
    stats = {"total": 20, "killed": 10, "timeout": 2, "survived": 3, "no_tests": 1, "skipped": 0}
    row = mutation.score_line("g", ["course_utils/a.py"], stats, text_only=2)
    # 4 not run; caught 12 of the 16 that ran (75 %); without 2 text-only misses 12 of 14 (86 %)
    assert row == "| g | a.py | 20 | 4 | 10 | 2 | 3 | 1 | 75% | 86% |"


def test_a_rerun_keeps_what_was_caught_and_counts_the_misses_again():
    before = {"total": 20, "killed": 10, "timeout": 2, "survived": 5, "no_tests": 1}   # 2 not run
    # mutmut dropped the earlier results (a new test selection): only the 6 misses were counted
    dropped = mutation.merged_stats(before, {"total": 20, "killed": 4, "timeout": 1, "survived": 1})
    assert dropped == {"killed": 16, "timeout": 1, "segfault": 0, "skipped": 0, "suspicious": 0,
                       "survived": 1, "no_tests": 0, "total": 20}
    assert mutation.score_line("g", ["a.py"], dropped, 0) == "| g | a.py | 20 | 2 | 16 | 1 | 1 | 0 | 94% | 94% |"
    # mutmut kept them: the rerun's counts are whole already
    kept = {"total": 20, "killed": 14, "timeout": 3, "survived": 1, "no_tests": 0}
    assert mutation.merged_stats(before, kept)["killed"] == 14


def test_the_report_leaves_out_survivors_the_survivors_file_explains(tmp_path):
    survivors = tmp_path / "mutation_survivors.md"
    survivors.write_text("# g\n- `m.x_f__mutmut_2` (f): `<` vs `<=` where equality cannot happen\n"
                         "not a line: `m.x_f__mutmut_9`\n")
    reasons = mutation.explained(survivors)
    assert reasons == {"m.x_f__mutmut_2": "(f): `<` vs `<=` where equality cannot happen"}
    code = '--- a\n+++ b\n-    if n < 10:\n+    if n <= 10:\n'
    words = '--- a\n+++ b\n-    raise ValueError("too few")\n+    raise ValueError("XXtoo fewXX")\n'
    missed = [{"name": f"m.x_f__mutmut_{k}", "status": "survived", "function": "m.f", "diff": code}
              for k in (2, 9)] + [{"name": "m.x_g__mutmut_1", "status": "survived", "function": "m.g",
                                   "diff": words}]
    text = mutation.report([{"group": "g", "modules": ["course_utils/m.py"], "survivors": missed,
                             "stats": {"total": 10, "killed": 7, "survived": 3}}], reasons)
    assert "## g: 2 missed mutants that change code, 1 of them explained in mutation_survivors.md" in text
    assert "- m.f (survived): 1" in text and "m.g" not in text        # the text-only one is apart
    assert mutation.explained(tmp_path / "absent.md") == {}


def test_a_line_of_the_survivors_file_may_name_several_mutants_of_one_function(tmp_path):
    survivors = tmp_path / "mutation_survivors.md"
    survivors.write_text("- `m.x_f__mutmut_7`, `_8` / `m.x_f__mutmut_12` and `_30` (f): the same reason here\n"
                         "- `m.x_g__mutmut_3` (g): `<` vs `<=` at a value never reached\n")
    assert mutation.explained(survivors) == {
        **{f"m.x_f__mutmut_{k}": "(f): the same reason here" for k in (7, 8, 12, 30)},
        "m.x_g__mutmut_3": "(g): `<` vs `<=` at a value never reached"}


def test_every_line_of_the_survivors_file_names_a_mutant_of_a_group_and_a_reason():
    groups = {m.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
              for modules in mutation.GROUPS.values() for m in modules}
    for name, reason in mutation.explained().items():
        assert name.rpartition(".")[0] in groups, f"{name}: not a module of any group"
        assert len(reason.split(":", 1)[-1].split()) >= 3, f"{name}: say why it is left alive"


def test_report_prints_the_saved_runs_again_and_names_a_group_never_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(mutation, "WORK", tmp_path)
    survivors = [{"name": "course_utils.timing.x_f__mutmut_3", "status": "survived", "function": "timing.f",
                  "diff": '--- a\n+++ b\n-    x = get("pid")\n+    x = get("XXpidXX")\n'}]
    (tmp_path / "timing.json").write_text(json.dumps({
        "group": "timing", "modules": ["course_utils/timing.py"], "survivors": survivors,
        "stats": {"total": 5, "killed": 4, "survived": 1}}))
    assert mutation.main(["--report", "timing", "scaling"]) == 0
    out, err = capsys.readouterr()
    assert "| timing | timing.py | 5 | 0 | 4 | 0 | 1 | 0 | 80% | 80% |" in out      # a key is code
    assert "- timing.f (survived): 1" in out and "scaling: no saved run" in err
