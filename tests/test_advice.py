"""The lessons' "common advice, checked" table: what it shows, and the input it refuses."""
from __future__ import annotations

import numpy as np
import pytest

from course_utils.advice import WIDTHS, AdviceTable, verdict_word
from course_utils.config import QUICK_ENV, QUICK_STAMP


def test_verdict_words():
    assert verdict_word(True) == "held" and verdict_word(False) == "did not hold"
    assert verdict_word(np.bool_(True)) == "held" and verdict_word(np.float64(1) < 0) == "did not hold"
    assert verdict_word(None) == "not measured"
    assert verdict_word("a trade-off") == "a trade-off"


@pytest.mark.parametrize("bad", [1, 0.5, "", "  "])
def test_a_verdict_is_a_bool_none_or_a_word(bad):
    with pytest.raises((TypeError, ValueError), match="held"):
        verdict_word(bad)


def test_rows_keep_their_verdicts_in_order():
    table = AdviceTable().add("more workers", "3 of 3 curves", True).add("prefetch", "2% -> 1%", False)
    assert [r[2] for r in table.rows] == ["held", "did not hold"]


@pytest.mark.parametrize("claim, measured", [("", "x"), ("x", ""), (None, "x"), ("x", 3)])
def test_empty_cells_are_refused_by_name(claim, measured):
    with pytest.raises(ValueError, match="claim|measured"):
        AdviceTable().add(claim, measured, True)


def test_text_table_wraps_long_cells_within_their_columns(monkeypatch):
    monkeypatch.setenv(QUICK_ENV, "0")
    long = "wait 42% -> 40% (slow loader, floor 38%), 3% -> 1% (fast loader), prefetch 2 -> 8"
    text = str(AdviceTable().add("a bigger prefetch_factor is better", long, False))
    lines = text.splitlines()
    assert lines[0].split() == ["advice", "measured", "here", "verdict"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert len(lines) > 3                                   # the measured cell wrapped
    assert max(len(line) for line in lines) <= sum(WIDTHS) + 2 * (len(WIDTHS) - 1)
    assert "did not hold" in lines[2] and " ".join(" ".join(lines[2:]).split()).count("38%") == 1
    assert repr(AdviceTable().add("a", "b", None)) == str(AdviceTable().add("a", "b", None))


def test_a_table_made_in_quick_mode_says_so_in_text_and_html_and_keeps_it(monkeypatch):
    monkeypatch.setenv(QUICK_ENV, "1")
    table = AdviceTable().add("a", "b", True)
    monkeypatch.setenv(QUICK_ENV, "0")                      # the mode it was measured in counts
    assert str(table).splitlines()[0] == QUICK_STAMP and str(table).splitlines()[1].split()[0] == "advice"
    assert f"<caption>{QUICK_STAMP}</caption>" in table._repr_html_()
    full = AdviceTable().add("a", "b", True)
    assert "QUICK" not in str(full) and "caption" not in full._repr_html_()


def test_html_escapes_what_it_shows():
    page = AdviceTable().add("batch <64>", "a & b", None)._repr_html_()
    assert "<table>" in page and "batch &lt;64&gt;" in page and "a &amp; b" in page
    assert page.count("<tr>") == 2 and "not measured" in page


def test_a_guess_is_answered_only_when_made(capsys):
    from course_utils.advice import reveal
    assert reveal(None, 3.2, "speed-up") is None and capsys.readouterr().out == ""
    assert reveal(2.0, "3.20x", "speed-up") == "your guess, speed-up: 2.0; measured here: 3.20x"
    assert capsys.readouterr().out == "your guess, speed-up: 2.0; measured here: 3.20x\n"
    assert reveal(0, 1, "zero is a guess") is not None


def test_a_skipped_deep_dive_leaves_its_claim_not_measured_and_says_where():
    table = AdviceTable().skipped("in_order=False makes loading faster", " deep dive 6 ")
    assert table.rows == [("in_order=False makes loading faster",
                           "deep dive 6 measures this; run it to check", "not measured")]
    for bad in ("", "  ", None):
        with pytest.raises(ValueError, match="where must name the deep dive"):
            AdviceTable().skipped("a claim", bad)
