"""Pins ``course_utils.tools.tune.result`` (and the search's ``_result``): the epoch score on
hand-worked figures, each row scored with its own batch size, the side by side's ratios the
right way up (tuned over the baseline, CPU too), the winner and what is recommended, the trial
rows' labels, LoaderSettings as DataLoader arguments and back, the pasted code's wrapping, and
the Ctrl-C summary. Hand-made Measurements only."""
from __future__ import annotations

import json
import types

import pytest
from torch.utils.data import DataLoader

import course_utils.tools.tune.search as tuning
from course_utils.measurement import Measurement, compare
from course_utils.threads import make_worker_init
from course_utils.tools.tune.result import (LoaderSettings, Trial, TuningInterrupted, TuningResult,
                                            _call, epoch_row, epoch_score)

from _helpers import TinyDataset

E = 1064       # epoch_samples: with batch 64 the rest of the epoch is 1000 samples


def meas(sps: float, label: str, cpu: float, items: int = 200) -> Measurement:
    return Measurement.from_times(label, [items / sps, items / sps], items, cpu_s_per_sample=cpu,
                                  machine="test machine")


# ---- the score ------------------------------------------------------------------------------

def test_the_epoch_score_adds_the_start_up_to_the_rest_of_the_epoch():
    # 1064 samples, batch 64: 1000 after the first batch at 800/s = 1.25 s, + 0.75 s start-up
    assert epoch_score(800.0, 0.75, 64, E) == pytest.approx(1064 / 2.0)
    # batch 32: 1032 after it, at 1032/s = 1 s, + 3 s: 1064 / 4
    assert epoch_score(1032.0, 3.0, 32, E) == pytest.approx(266.0)
    assert epoch_score(500.0, 0.0, 10, 110) == pytest.approx(110 / 0.2)     # 100 / 500 = 0.2 s
    assert epoch_score(500.0, 2.0, 200, 100) == pytest.approx(50.0)         # one batch: 100 / 2
    assert epoch_score(0.0, 1.0, 64, E) == 0.0
    assert epoch_score(-1.0, 1.0, 64, E) == 0.0


def test_an_epoch_row_lasts_the_epoch_at_the_score_with_the_windows_cpu():
    m = meas(800.0, "tuned", cpu=0.002)
    row = epoch_row("row", m, 0.75, 64, E)
    assert row.label == "row" and row.items_per_repeat == E and row.times_s == [pytest.approx(2.0)]
    assert row.samples_per_s == pytest.approx(532.0) and row.cpu_s_per_sample == 0.002
    assert m.label == "tuned" and m.repeats == 2          # the window itself is unchanged


# ---- LoaderSettings ------------------------------------------------------------------------

def test_settings_without_workers_drop_prefetch_and_with_workers_default_it_to_two():
    assert LoaderSettings(num_workers=0, prefetch_factor=4).prefetch_factor is None
    assert LoaderSettings(num_workers=3).prefetch_factor == 2
    assert LoaderSettings(num_workers=3, prefetch_factor=5).prefetch_factor == 5
    for bad in (dict(persistent_workers=True), dict(multiprocessing_context="spawn")):
        with pytest.raises(ValueError, match="need num_workers >= 1"):
            LoaderSettings(num_workers=0, **bad)
    with pytest.raises(ValueError):
        LoaderSettings(batch_size=0)
    with pytest.raises(ValueError):
        LoaderSettings(threads_per_worker=0)
    LoaderSettings(threads_per_worker=None)


def test_settings_read_back_from_a_dataloader():
    data = TinyDataset(8)
    full = DataLoader(data, batch_size=16, num_workers=3, prefetch_factor=3, persistent_workers=True,
                      pin_memory=True, worker_init_fn=make_worker_init(2),
                      multiprocessing_context="spawn")
    assert LoaderSettings.of(full) == LoaderSettings(3, 16, 3, True, True, 2, "spawn")
    plain = DataLoader(data, batch_size=5)
    assert LoaderSettings.of(plain) == LoaderSettings(num_workers=0, batch_size=5)
    other = DataLoader(data, batch_size=5, num_workers=2, worker_init_fn=print)
    s = LoaderSettings.of(other)
    assert s.threads_per_worker is None and s.prefetch_factor == 2 and not s.persistent_workers
    assert s.multiprocessing_context is None and not s.pin_memory
    import multiprocessing
    ctx = DataLoader(data, batch_size=5, num_workers=2,
                     multiprocessing_context=multiprocessing.get_context("forkserver"))
    assert LoaderSettings.of(ctx).multiprocessing_context == "forkserver"


def test_settings_as_dataloader_arguments():
    assert LoaderSettings(num_workers=0, batch_size=8, pin_memory=True).loader_kwargs() == {
        "batch_size": 8, "shuffle": True, "num_workers": 0, "pin_memory": True}
    kw = LoaderSettings(num_workers=3, batch_size=16, prefetch_factor=4, persistent_workers=True,
                        threads_per_worker=2, multiprocessing_context="forkserver").loader_kwargs()
    assert kw["prefetch_factor"] == 4 and kw["persistent_workers"] is True
    assert kw["worker_init_fn"].n_threads == 2 and kw["multiprocessing_context"] == "forkserver"
    assert kw["num_workers"] == 3 and kw["pin_memory"] is False
    kw = LoaderSettings(num_workers=1, threads_per_worker=None).loader_kwargs()
    assert "worker_init_fn" not in kw and "multiprocessing_context" not in kw
    built = DataLoader(TinyDataset(4), **LoaderSettings(num_workers=2, batch_size=3).loader_kwargs())
    assert LoaderSettings.of(built) == LoaderSettings(num_workers=2, batch_size=3)


def test_a_settings_label_names_only_what_is_not_a_default():
    assert LoaderSettings(num_workers=0, batch_size=64).label() == "w=0 bs=64"
    assert LoaderSettings(num_workers=0, batch_size=64, pin_memory=True).label() == "w=0 bs=64 pin"
    assert LoaderSettings(num_workers=2, batch_size=32).label() == "w=2 bs=32 pf=2"
    assert LoaderSettings(num_workers=2, batch_size=32, prefetch_factor=4, persistent_workers=True,
                          threads_per_worker=3, multiprocessing_context="forkserver",
                          pin_memory=True).label() == "w=2 bs=32 pf=4 persistent thr=3 forkserver pin"
    assert LoaderSettings(num_workers=1, threads_per_worker=None).label() == "w=1 bs=64 pf=2 unlimited"


def test_call_args_write_the_worker_init_with_its_thread_count():
    s = LoaderSettings(num_workers=2, batch_size=32, threads_per_worker=3)
    assert s.call_args("make_worker_init({n})") == [
        "batch_size=32", "shuffle=True", "num_workers=2", "pin_memory=False", "prefetch_factor=2",
        "persistent_workers=False", "worker_init_fn=make_worker_init(3)"]


def test_the_call_wraps_under_the_width_aligned_after_the_parenthesis():
    assert _call("dataset", ["a=1"]) == ["loader = DataLoader(dataset, a=1)"]
    # "loader = DataLoader(dataset, " is 29 columns; the next argument would pass 30
    pad = " " * len("loader = DataLoader(")
    assert _call("dataset", ["batch_size=64", "shuffle=True"], width=30) == [
        "loader = DataLoader(dataset,", pad + "batch_size=64,", pad + "shuffle=True)"]
    # exactly at the width: stays on the line (29 + "a=1)" = 33)
    assert _call("dataset", ["a=1"], width=33) == ["loader = DataLoader(dataset, a=1)"]
    assert _call("dataset", ["a=1"], width=32) == ["loader = DataLoader(dataset,", pad + "a=1)"]
    # a first argument longer than the width is not put on a line of its own
    long = "x" * 40
    assert _call(long, [], width=30) == [f"loader = DataLoader({long})"]


# ---- a result, by hand ---------------------------------------------------------------------

def trial(index, settings, sps, startup, score, status="full", cpu=0.003):
    m = None if sps is None else meas(sps, settings.label(), cpu)
    return Trial(index, "num_workers", settings, status, m, startup, score)


TUNED = LoaderSettings(num_workers=3, batch_size=64)
RECIPE = LoaderSettings(num_workers=4, batch_size=32, threads_per_worker=None, pin_memory=True)
DEFAULTS = LoaderSettings(num_workers=0, batch_size=64)


def hand_result(winner="tuned", with_side=True, **kw):
    t1 = trial(1, DEFAULTS, 500.0, 0.0, 250.0)
    t2 = trial(2, TUNED, 800.0, 0.75, 532.0)
    t3 = trial(3, TUNED.replace(num_workers=1), 200.0, 0.2, 100.0, status="stopped after probe")
    t4 = trial(4, TUNED.replace(num_workers=6), None, None, None, status="failed: OSError: x")
    # the side by side: defaults 500/s, start-up 1 s: 1064 / (1 + 1000 / 500) = 354.67/s;
    # the recipe (batch 32) 1032/s, 3 s: 1064 / 4 = 266/s; tuned 800/s, 0.75 s: 532/s
    comparison = compare([meas(500.0, "defaults", 0.001), meas(1032.0, "common recipe", 0.004),
                          meas(800.0, "tuned", 0.002)], baseline="common recipe")
    fields = dict(best=TUNED, best_trial=t2, trials=[t1, t2, t3, t4], not_tried=[], skipped=[],
                  comparison=comparison if with_side else None,
                  startups={"defaults": 1.0, "common recipe": 3.0, "tuned": 0.75},
                  candidates={"defaults": DEFAULTS, "common recipe": RECIPE, "tuned": TUNED},
                  budget_s=40.0, elapsed_s=39.0, search_s=30.0, epoch_samples=E,
                  dataset="tiny", consumer="none", winner=winner, quick=False)
    fields.update(kw)
    return TuningResult(**fields)


def test_each_side_by_side_row_is_scored_with_its_own_batch_size():
    scores = hand_result().scores
    assert scores["tuned"] == pytest.approx(532.0)
    assert scores["common recipe"] == pytest.approx(266.0)       # batch 32, not the tuned 64
    assert scores["defaults"] == pytest.approx(1064 / 3.0)


def test_ratios_are_the_tuned_row_over_the_other():
    r = hand_result()
    assert r.ratio("common recipe") == pytest.approx(2.0)           # 532 / 266
    assert r.ratio("defaults") == pytest.approx(1.5)                # 532 / 354.67
    assert r.ratio("common recipe", "cpu_s_per_sample") == pytest.approx(0.5)   # 0.002 / 0.004
    assert r.ratio("defaults", "cpu_s_per_sample") == pytest.approx(2.0)        # 0.002 / 0.001
    with pytest.raises(ValueError, match="not a row"):
        r.ratio("seed recipe")
    with pytest.raises(ValueError, match="not a row"):
        hand_result(with_side=False).ratio("defaults")


def test_the_printed_result_says_the_ratios_and_the_recommendation():
    text = str(hand_result())
    assert "tuned vs common recipe: 2.00x samples/s per epoch, 0.50x CPU-s/sample" in text
    assert "tuned vs defaults: 1.50x samples/s per epoch, 2.00x CPU-s/sample" in text
    assert "Recommended: the tuned setting, w=3 bs=64 pf=2 -> 532 samples/s per epoch" in text
    assert "4 trials in 30.0 s of search, 39.0 s in all (budget 40 s)" in text
    assert "QUICK MODE" not in text
    assert "(quick mode) Recommended" in str(hand_result(quick=True))
    assert str(hand_result(quick=True)).startswith("QUICK MODE")


def test_a_winning_baseline_is_recommended_with_its_own_score():
    r = hand_result(winner="defaults", best=DEFAULTS)
    v = r.verdict()
    assert v.startswith("Recommended: the defaults (w=0 bs=64 -> 355 samples/s per epoch)")
    assert "beat the tuned setting (w=3 bs=64 pf=2 -> 532 samples/s" in v


def test_without_a_side_by_side_the_search_best_is_recommended():
    r = hand_result(with_side=False)
    assert r.verdict() == ("Recommended: the search's best, w=3 bs=64 pf=2 -> 532 samples/s per "
                           "epoch (no side by side).")
    assert r.side_by_side_rows() is None and r.scores == {}
    assert "tuned vs" not in str(r)


def test_the_side_by_side_rows_mark_the_winner_and_divide_by_the_recipe():
    rows = hand_result(winner="defaults", best=DEFAULTS).side_by_side_rows()
    assert rows.rows[rows.baseline].label.startswith("common recipe: ")
    labels = [m.label for m in rows.rows]
    assert labels[0] == "defaults: w=0 bs=64, start-up 1 s <- recommended"
    assert labels[2] == "tuned: w=3 bs=64 pf=2, start-up 750 ms"
    no_recipe = hand_result(comparison=compare([meas(500.0, "defaults", 0.001),
                                                meas(800.0, "tuned", 0.002)], baseline=1))
    rows = no_recipe.side_by_side_rows()
    assert rows.baseline == 0


def test_the_trial_rows_are_the_measured_trials_scored_per_epoch():
    r = hand_result()
    rows = r.trial_rows()
    assert [m.label for m in rows.rows] == [
        "1. w=0 bs=64, start-up 0 us", "2. w=3 bs=64 pf=2, start-up 750 ms <- best of the search",
        "3. w=1 bs=64 pf=2, start-up 200 ms (probe only)"]
    assert rows.baseline == 0
    # trial 2: 800/s and 0.75 s start-up, batch 64: 532/s per epoch
    assert rows.rows[1].samples_per_s == pytest.approx(532.0)
    assert r.table().splitlines()[-1] == "4. w=6 bs=64 pf=2: failed: OSError: x"


def test_the_json_names_the_best_trial_and_the_scores():
    d = json.loads(json.dumps(hand_result().to_dict()))
    assert d["best_trial"] == 2 and d["winner"] == "tuned" and d["machine"] == "test machine"
    assert d["scores"]["common recipe"] == pytest.approx(266.0)
    assert len(d["trials"]) == 4 and d["budget_s"] == 40.0
    assert d["code_course"] == hand_result().code_course()         # the code to paste, in the JSON
    assert d["trials"][0]["settings"]["num_workers"] == 0 and d["trials"][0]["index"] == 1   # each trial a dict


def test_the_code_for_the_course_pipeline():
    r = hand_result(code_dataset="BatchedJpegDataset(dataset, size=32)",
                    code_imports=["from course_utils import keep_batch, make_worker_init"])
    code = r.code_course()
    assert "collate_fn=keep_batch" in code and "make_worker_init(1)" in code
    assert code.index("shuffle=True") < code.index("collate_fn=keep_batch") < code.index("num_workers")
    assert "collate_fn" not in r.code_course("my_data")
    r = hand_result(best=RECIPE, code_imports=["from course_utils import keep_batch, make_worker_init",
                                               "from course_utils import make_worker_init"])
    code = r.code_course()
    assert "make_worker_init" not in code and "from course_utils import keep_batch" in code
    plain = hand_result(best=LoaderSettings(num_workers=2, threads_per_worker=3)).code_plain()
    assert "cv2.setNumThreads(3)" in plain and "torch.set_num_threads(3)" in plain
    plain1 = hand_result().code_plain()
    assert "cv2.setNumThreads(0)" in plain1 and "limits=1" in plain1
    assert "def worker_init_fn" not in hand_result(best=DEFAULTS).code_plain()


# ---- the search's result: the winner ------------------------------------------------------

class FakeSide:
    def __init__(self, result):
        self.settings = dict(result.candidates)
        self._summary = (result.comparison, result.startups)

    def summary(self):
        return self._summary


def search_result(side, out_of_budget=False):
    r = hand_result()
    search = types.SimpleNamespace(
        best_trial=r.best_trial, out_of_budget=out_of_budget, trials=r.trials, not_tried=["x"],
        skipped=[], budget_s=40.0, elapsed=lambda: 39.0, epoch_samples=E, consumer_text="none")
    pipe = types.SimpleNamespace(description="tiny", code_dataset="BatchedJpegDataset(dataset)",
                                 code_imports=["a"], baseline_code=("TransformedDataset(x)", ["b"]))
    return tuning._result(search, pipe, side, ["given"], 30.0)


def test_the_side_by_sides_best_score_wins():
    r = search_result(FakeSide(hand_result()))
    assert r.winner == "tuned" and r.best == TUNED and r.code_dataset == "BatchedJpegDataset(dataset)"
    assert r.notes == ["given"] and r.search_s == 30.0
    # the recipe row now at 2064/s steady, 0 s start-up: 1064 / (1032 / 2064) = 2128/s > 532
    faster = hand_result(comparison=compare([meas(500.0, "defaults", 0.001),
                                             meas(2064.0, "common recipe", 0.004),
                                             meas(800.0, "tuned", 0.002)]),
                         startups={"defaults": 1.0, "common recipe": 0.0, "tuned": 0.75})
    r = search_result(FakeSide(faster), out_of_budget=True)
    assert r.winner == "common recipe" and r.best == RECIPE
    assert r.code_dataset == "TransformedDataset(x)" and r.code_imports == ["b"]
    assert any("torch.set_num_threads(1)" in n for n in r.notes)
    assert any(n.startswith("the budget ran out after 4 trials") for n in r.notes)


def test_a_search_without_a_side_by_side_recommends_its_best():
    r = search_result(None)
    assert r.comparison is None and r.candidates == {"tuned": TUNED} and r.winner == "tuned"
    assert r.startups == {}
    empty = types.SimpleNamespace(best_trial=None)
    assert tuning._result(empty, None, None, [], 1.0) is None


# ---- Ctrl-C ----------------------------------------------------------------------------------

def test_the_interrupted_summary_gives_the_best_so_far():
    assert str(TuningInterrupted(None, 3.14, "search")) == (
        "interrupted during the search after 3.1 s, before any setting was measured fully; "
        "nothing to recommend.")
    text = str(TuningInterrupted(hand_result(with_side=False), 12.0, "search"))
    assert text.startswith("interrupted during the search after 12.0 s and 4 trial(s); best "
                           "measured so far: w=3 bs=64 pf=2 -> 532 samples/s per epoch of 1064")
    assert text.endswith("(3 ms CPU per sample)")
    text = str(TuningInterrupted(hand_result(winner="defaults", best=DEFAULTS), 20.0, "side"))
    assert "so far: the defaults, w=0 bs=64 -> 355 samples/s" in text
    assert text.endswith("(1 ms CPU per sample)")


def test_a_ratio_without_the_baselines_figure_is_nan():
    r = hand_result(comparison=compare([meas(500.0, "defaults", None), meas(1032.0, "common recipe", 0.0),
                                        meas(800.0, "tuned", 0.002)], baseline="common recipe"))
    import math
    assert math.isnan(r.ratio("defaults", "cpu_s_per_sample"))        # not measured
    assert math.isnan(r.ratio("common recipe", "cpu_s_per_sample"))   # 0: no ratio
    t = hand_result(comparison=compare([meas(500.0, "defaults", 0.001), meas(800.0, "tuned", None)]))
    assert math.isnan(t.ratio("defaults", "cpu_s_per_sample"))


def test_the_interrupted_exception_keeps_its_three_arguments():
    r = hand_result()
    exc = TuningInterrupted(r, 12.5, "search")
    assert exc.args == (r, 12.5, "search") and exc.result is r and exc.elapsed_s == 12.5


def test_the_plot_has_a_panel_per_table_sized_by_the_trials(monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    r = hand_result(consumer="c" * 50 + "d", dataset="x" * 70 + "y")
    fig = r.plot()
    try:
        # two panels 8 in wide; 4 trials: max(3.5, 1.5 + 0.4 x 4 = 3.1) = 3.5 in high
        assert list(fig.get_size_inches()) == [16.0, 3.5] and len(fig.axes) == 2
        assert fig.get_layout_engine() is not None
        from matplotlib.text import Text
        title = " ".join(t.get_text() for t in fig.axes[0].findobj(Text))
        assert "c" * 40 in title and "c" * 41 not in title and "x" * 60 in title and "x" * 61 not in title
        for name in ("best", "winner", "budget_s", "consumer", "data"):   # each setting named
            assert f"{name}=" in title, name
        assert "Side by side, repeats interleaved" in " ".join(t.get_text() for t in fig.axes[1].findobj(Text))
    finally:
        plt.close(fig)
    many = [trial(i + 1, DEFAULTS.replace(batch_size=8 + i), 500.0 + 100 * i, 0.0, 250.0)
            for i in range(10)]
    fig = hand_result(with_side=False, trials=many, best_trial=many[0]).plot()
    try:
        # the trials' ratios are to the first: 1064 / (1056 / 500) = 504/s is 1.00x
        texts = [t.get_text() for t in fig.axes[0].findobj(Text)]
        assert "504  (1.00x)" in texts
        # one panel; 10 trials: 1.5 + 0.4 x 10 = 5.5 in high
        assert list(fig.get_size_inches()) == [8.0, pytest.approx(5.5)] and len(fig.axes) == 1
    finally:
        plt.close(fig)
    few = [trial(1, DEFAULTS, 500.0, 0.0, 250.0)]
    fig = hand_result(with_side=False, trials=few, best_trial=few[0]).plot()
    try:
        assert list(fig.get_size_inches()) == [8.0, 3.5]
    finally:
        plt.close(fig)
