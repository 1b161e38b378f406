"""Bad input and printed results name what they are about, with values chosen so that a changed
name, a dropped figure or a filler string shows: the argument a check refuses, the class an
index error comes from, the type a loader of saved results was given, every row of the advice
table (an empty cell stays empty), the time each line of a prefetch comparison prints."""
from __future__ import annotations

import pytest

from course_utils.advice import AdviceTable
from course_utils.lessons.l03_num_workers import RecordArrayDataset, make_records
from course_utils.lessons.l04_copies import BandwidthSweep
from course_utils.prefetch import PrefetchTiming, compare_prefetch


@pytest.mark.parametrize("kwargs, name", [
    (dict(claim="", measured="3.1x faster"), "claim must be a non-empty string"),
    (dict(claim="workers help", measured=" "), "measured must be a non-empty string")])
def test_an_advice_row_without_its_text_names_the_part_missing(kwargs, name):
    with pytest.raises(ValueError, match=f"AdviceTable.add: {name}"):
        AdviceTable().add(**kwargs, held=True)


def test_the_advice_table_prints_every_row_and_nothing_between_them():
    table = AdviceTable().add("pin_memory helps", "1.8x the copy rate", True)
    table.add("more workers are faster", "x" * 3 + " " + "y" * 200, False)   # wraps over lines
    text = str(table)
    assert "XX" not in text and text.count("pin_memory helps") == 1
    html = table._repr_html_()
    assert html.count("<tr>") == 3 and "</tr><tr>" in html                 # header + 2 rows


def test_an_index_out_of_range_names_the_record_dataset():
    ds = RecordArrayDataset(make_records(3))
    with pytest.raises(IndexError, match=r"\bRecordArrayDataset\b"):
        ds[7]


def test_saved_copy_results_of_the_wrong_type_name_the_type_given():
    with pytest.raises(TypeError, match="got list"):
        BandwidthSweep.from_dict([1, 2])


def test_a_prefetch_comparison_prints_each_time_it_measured():
    timing = PrefetchTiming("cpu", 8, 0.004, 0.002, copy_s_per_batch=0.0015, step_s=0.0025)
    text = str(timing)
    assert "plain loop 4 ms/step" in text and "DevicePrefetcher 2 ms/step (2.00x)" in text
    assert "copy 1.5 ms/batch, compute 2.5 ms/step" in text and text.count("\n") == 1
    assert text.endswith("compute 2.5 ms/step")                  # no note: nothing after it
    assert str(PrefetchTiming("cpu", 8, 0.004, 0.002, note="on the CPU nothing overlaps")).endswith(
        "\n  on the CPU nothing overlaps")


def test_a_bad_repeat_count_names_repeats():
    with pytest.raises(ValueError, match=r"\brepeats\b"):
        compare_prefetch([1, 2], lambda b: b, repeats=0)
