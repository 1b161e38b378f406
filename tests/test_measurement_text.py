"""How a Measurement and a Comparison print, pinned character by character on hand-made figures
(each number below is worked out in a comment): the printed forms are what a learner reads, and
mutation testing showed their formatting branches unpinned."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_utils.measurement import Measurement, compare, fmt_time, jsonable


def two_workers(machine="box A"):
    # times 10, 12, 20 ms: median 12 ms, quartiles 11 and 16 ms -> IQR 5 ms = 41.7 % of the
    # median (noisy); 64 samples / 12 ms = 5,333 samples/s
    return Measurement.from_times("two workers", [0.010, 0.012, 0.020], 64, cpu_s_per_sample=0.0005,
                                  involuntary_ctx_switches=1234, peak_uss_bytes=150_000_000,
                                  peak_pss_bytes=120_500_000, machine=machine)


def defaults(machine="box A"):
    # times 39, 40, 40, 41 ms: median 40 ms, IQR 40.25 - 39.75 = 0.5 ms (1.25 %); 1,600 samples/s
    return Measurement.from_times("defaults", [0.040, 0.041, 0.039, 0.040], 64, machine=machine)


def test_a_measurement_prints_every_figure_it_has_and_its_warnings():
    assert str(two_workers()) == (
        "two workers\n"
        "  median 12 ms per repeat (IQR 5 ms, 41.7%), 3 repeats of 64 samples\n"
        "  5,333 samples/s | 500 us CPU/sample | 1,234 invol. ctx switches | peak USS 150.0 MB"
        " | PSS 120.5 MB\n"
        "  WARNING: noisy: IQR is 42% of the median (more repeats, a quieter machine, or longer "
        "repeats help)")


def test_a_measurement_prints_only_what_was_measured():
    assert str(defaults()) == ("defaults\n"
                               "  median 40 ms per repeat (IQR 500 us, 1.3%), 4 repeats of 64 samples\n"
                               "  1,600 samples/s")
    one = Measurement.from_times("one", [0.5], 1, machine="box A")
    assert str(one).splitlines()[1:3] == ["  median 500 ms per repeat (IQR 0 us, 0.0%), 1 repeat of 1 samples",
                                          "  2 samples/s"]
    zero = Measurement.from_times("instant", [0.0, 0.0, 0.0], 5, machine="box A")
    assert "(IQR 0 us)" in str(zero)                  # no share of a zero median


def test_a_comparison_prints_a_table_with_ratios_to_its_baseline():
    table = str(compare([defaults(), two_workers()], baseline="defaults"))
    assert table.splitlines() == [
        "label                samples/s  x base  CPU ms/sample  x base  invol. ctx sw.  peak USS MB  peak PSS MB",
        "-------------------  ---------  ------  -------------  ------  --------------  -----------  -----------",
        "defaults (baseline)      1,600   1.00x            n/a     n/a             n/a          n/a          n/a",
        "two workers *            5,333   3.33x            0.5     n/a           1,234        150.0        120.5",
        "x base: ratio to 'defaults'; samples/s: higher is better, CPU ms/sample: lower is better.",
        "CPU, context switches, memory: main process + workers. USS: private to each process, "
        "summed; PSS: total, shared pages split.",
        "* noisy: IQR above 10% of the median.",
        "machine: box A"]


def test_a_comparison_across_machines_says_which_row_ran_where():
    table = str(compare([two_workers("box B"), defaults("box A")], baseline=1))
    assert table.splitlines()[-3:] == ["machines differ between rows:", "  two workers: box B",
                                       "  defaults: box A"]
    assert "two workers * " in table and "defaults (baseline)" in table
    assert "noisy" in table and "ratio to 'defaults'" in table
    quiet = str(compare([defaults(""), defaults("")]))
    assert "machine" not in quiet and "noisy" not in quiet


def test_cpu_ratios_are_lower_is_better_and_unknowns_print_as_n_a():
    a = Measurement.from_times("a", [0.01] * 3, 10, cpu_s_per_sample=0.002, machine="m")
    b = Measurement.from_times("b", [0.02] * 3, 10, cpu_s_per_sample=0.001, machine="m")
    c = compare([a, b])
    assert c.ratio("b") == pytest.approx(0.5) and c.ratio("b", "cpu_s_per_sample") == pytest.approx(0.5)
    row_b = str(c).splitlines()[3].split()
    assert row_b == ["b", "500", "0.50x", "1", "0.50x", "n/a", "n/a", "n/a"]
    zero = Measurement.from_times("z", [0.01] * 3, 10, cpu_s_per_sample=0.0, machine="m")
    assert compare([zero, a]).ratio("a", "cpu_s_per_sample") == math.inf
    assert math.isnan(compare([zero, zero]).ratio(1, "cpu_s_per_sample"))
    assert str(compare([zero, a])).splitlines()[3].split()[4] == "n/a"      # inf is not a ratio


@pytest.mark.parametrize("seconds, text", [
    (1234.0, "1234 s"), (125.0, "125 s"), (99.94, "99.9 s"), (2.5, "2.5 s"), (1.0, "1 s"), (0.999, "999 ms"),
    (0.0123, "12.3 ms"), (0.001, "1 ms"), (0.000999, "999 us"), (1.23e-7, "0.123 us"),
    (0.0, "0 us"), (-0.5, "-500 ms"), (None, "n/a"), (math.inf, "n/a"), (math.nan, "n/a")])
def test_fmt_time_picks_the_unit_at_each_boundary(seconds, text):
    assert fmt_time(seconds) == text


@pytest.mark.parametrize("seconds, text", [(1 / 99.94, "99.9"), (0.01, "100"), (1 / 12345.6, "12,346"),
                                           (0.5, "2"), (0.0, "n/a")])
def test_rates_print_with_thousands_separators_from_100(seconds, text):
    m = Measurement.from_times("r", [seconds] * 3, 1, machine="m")
    assert str(m).splitlines()[2] == f"  {text} samples/s"


def test_jsonable_turns_every_kind_of_figure_into_plain_json():
    assert jsonable({1: np.float32(0.5), "x": [np.int64(3), math.nan, (True, None)],
                     "a": np.arange(3), "d": torch.device("cpu"), "m": two_workers()})["x"] == [
        3, None, [True, None]]
    out = jsonable({1: np.float32(0.5), "a": np.arange(3), "d": torch.device("cpu"), "inf": math.inf})
    assert out == {"1": 0.5, "a": [0, 1, 2], "d": "cpu", "inf": None}
    assert jsonable(two_workers())["label"] == "two workers"
    assert type(jsonable(np.int64(3))) is int and type(jsonable(np.float64(0.25))) is float


# ---- rows, ratios and bad input, with the message each gives ---------------------------------------

def three():
    return compare([defaults(), two_workers(), Measurement.from_times("x", [0.02] * 3, 64, machine="m")])


@pytest.mark.parametrize("key, row", [(0, 0), (2, 2), (-1, 2), (-3, 0), (np.int64(1), 1), ("x", 2)])
def test_a_row_is_found_by_label_or_by_any_index_in_range(key, row):
    assert three().index(key) == row


@pytest.mark.parametrize("key, exc, message", [
    (3, ValueError, r"index 3 is out of range for 3 measurements \(use 0\.\.2, or a label\)"),
    (-4, ValueError, r"index -4 is out of range"),
    (True, TypeError, r"expected a row label \(str\) or index \(int\), got True"),
    (1.0, TypeError, r"got 1\.0"),
    ("y", ValueError, r"no measurement is labelled 'y'; labels are: 'defaults', 'two workers', 'x'"),
])
def test_a_missing_row_is_a_clear_error(key, exc, message):
    with pytest.raises(exc, match=message):
        three().index(key)


def test_a_label_used_twice_must_be_asked_for_by_index():
    with pytest.raises(ValueError, match=r"label 'defaults' is used by rows \[0, 1\]"):
        compare([defaults(), defaults()]).index("defaults")


def test_ratios_of_unmeasured_or_zero_figures():
    a = Measurement.from_times("a", [0.01] * 3, 10, cpu_s_per_sample=0.001, machine="m")
    none = Measurement.from_times("none", [0.01] * 3, 10, machine="m")
    with pytest.raises(ValueError, match="cpu_s_per_sample was not measured for 'none' or the baseline 'a'"):
        compare([a, none]).ratio("none", "cpu_s_per_sample")
    with pytest.raises(ValueError, match="was not measured for 'a' or the baseline 'none'"):
        compare([none, a]).ratio("a", "cpu_s_per_sample")
    one = Measurement.from_times("one", [0.01] * 3, 10, cpu_s_per_sample=1.0, machine="m")
    assert compare([one, a]).ratio("a", "cpu_s_per_sample") == pytest.approx(0.001)
    zero = Measurement.from_times("z", [0.01] * 3, 10, cpu_s_per_sample=0.0, machine="m")
    small = Measurement.from_times("s", [0.01] * 3, 10, cpu_s_per_sample=0.5, machine="m")
    assert compare([zero, small]).ratio("s", "cpu_s_per_sample") == math.inf
    with pytest.raises(ValueError, match=r"metric='speed' is not known: use one of samples_per_s, "):
        none.metric("speed")


@pytest.mark.parametrize("make, baseline, exc, message", [
    (defaults, 0, TypeError, r"got a single Measurement: wrap it in a list, e\.g\. compare\(\[a, b\]\)"),
    (lambda: 5, 0, TypeError, r"measurements must be a list of Measurements, got int\."),
    (list, 0, ValueError, r"measurements is empty: pass at least one Measurement"),
    (lambda: ["a", "b"], 0, TypeError, r"measurements\[0\] is a str, not a Measurement"),
    (lambda: [defaults(), two_workers()], 2, ValueError, r"baseline: index 2 is out of range"),
    (lambda: [defaults(), two_workers()], "zz", ValueError, r"baseline: no measurement is labelled 'zz'"),
], ids=["one", "int", "empty", "strings", "index", "label"])
def test_compare_names_what_is_wrong_with_its_input(make, baseline, exc, message):
    with pytest.raises(exc, match=message):
        compare(make(), baseline=baseline)


def test_the_baseline_is_the_row_asked_for():
    c = compare([defaults(), two_workers()], baseline=-1)
    assert c.baseline == 1 and c.ratio(0) == pytest.approx(1600 / (64 / 0.012))
