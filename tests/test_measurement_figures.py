"""Tests for course_utils.measurement and course_utils.advice: the figures and tables a learner
reads, pinned on hand-made values (each worked out in a comment): the advice table's columns,
left-aligned and wrapped, as text and HTML; the JSON a comparison saves; what a wrong verdict's
error names."""
from __future__ import annotations

import pytest

from course_utils.advice import AdviceTable, verdict_word
from course_utils.config import QUICK_ENV
from course_utils.measurement import Measurement, compare


@pytest.fixture
def full_mode(monkeypatch):
    monkeypatch.setenv(QUICK_ENV, "0")


def test_advice_rows_are_left_aligned_in_their_columns_with_no_trailing_spaces(full_mode):
    text = str(AdviceTable().add("a", "b", True))
    # columns of 30, 58 and 14 characters, two spaces between: "a" at 0, "b" at 32, "held" at 92
    assert text.splitlines()[2] == "a" + " " * 31 + "b" + " " * 59 + "held"
    assert text.splitlines()[0] == "advice" + " " * 26 + "measured here" + " " * 47 + "verdict"
    assert text.splitlines()[1] == "-" * 30 + "  " + "-" * 58 + "  " + "-" * 14


def test_a_long_cell_wraps_and_the_other_columns_stay_blank_on_its_extra_lines(full_mode):
    measured = "x" * 50 + " " + "y" * 20          # 71 characters: wraps after the x's at 58
    lines = str(AdviceTable().add("claim", measured, False)).splitlines()
    assert lines[2:] == ["claim" + " " * 27 + "x" * 50 + " " * 10 + "did not hold",
                         " " * 32 + "y" * 20]


def test_the_html_table_has_one_header_row_and_one_row_per_claim(full_mode):
    page = AdviceTable().add("a < b", "1 & 2", None)._repr_html_()
    td = '<td style="text-align:left; vertical-align:top">{}</td>'
    th = '<th style="text-align:left">{}</th>'
    assert page == ("<table><thead><tr>" + th.format("advice") + th.format("measured here")
                    + th.format("verdict") + "</tr></thead><tbody><tr>" + td.format("a &lt; b")
                    + td.format("1 &amp; 2") + td.format("not measured") + "</tr></tbody></table>")


@pytest.mark.parametrize("held, named", [(1, "int 1"), (0.5, "float 0.5"), ("  ", "str '  '")])
def test_a_verdict_that_is_not_a_bool_or_word_names_what_it_got(held, named):
    with pytest.raises(TypeError, match=f"got {named};"):
        verdict_word(held)


def test_a_verdict_word_is_kept_without_its_surrounding_spaces():
    assert verdict_word("  a trade-off ") == "a trade-off"


def test_a_comparison_saves_its_baseline_index_and_every_row():
    # 100 samples in 0.5 s -> 200 samples/s; 100 in 0.25 s -> 400
    slow = Measurement.from_times("slow", [0.5] * 3, 100, machine="m")
    fast = Measurement.from_times("fast", [0.25] * 3, 100, machine="m")
    saved = compare([slow, fast], baseline="fast").to_dict()
    assert set(saved) == {"baseline", "rows"} and saved["baseline"] == 1
    assert [(r["label"], r["samples_per_s"]) for r in saved["rows"]] == [("slow", 200.0), ("fast", 400.0)]
