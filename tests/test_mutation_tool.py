"""tools/mutation.py: which files a group mutates in a copy of this checkout or of an older commit,
and which survivors change only a message's text (the run itself takes minutes: `make mutation`)."""
from __future__ import annotations

import pytest

from _helpers import ROOT, load_tool

mutation = load_tool("mutation")


def _touch(root, *paths):
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("")


def test_every_group_names_modules_and_tests_of_this_checkout():
    for group, (modules, tests) in mutation.GROUPS.items():
        assert mutation.modules_in(ROOT, modules, group) == modules
        assert all((ROOT / t).is_file() for t in tests), group


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
])
def test_a_survivor_that_changes_only_a_message_is_told_apart(diff, only_text):
    assert mutation.text_only(diff) is only_text
