"""Pins ``course_utils.tools.tune.window``: the side by side's rounds and window sizes on a fake
clock (what is left of a budget above 1, split over the rounds left and the rows, both sides of
its stopping rule), its pooled start-ups (a median, not a mean), the Draws sampler's epochs,
the Timed wrapper's start-ups and consumer order, a window's sampler length, ``rebuilt`` and the
consumer/device arguments. Workers-free loaders over a tiny dataset: nothing here starts a
worker process."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import course_utils.tools.tune.window as window
from course_utils.measurement import Measurement
from course_utils.tools.tune.result import LoaderSettings
from course_utils.tools.tune.window import (Draws, QuietInit, SideBySide, Timed, consumer_device,
                                            make_consumer, measure_window, pooled, rebuilt)

from _helpers import TinyDataset


def meas(sps: float, label: str = "x", items: int = 64) -> Measurement:
    return Measurement.from_times(label, [items / sps], items, cpu_s_per_sample=0.002,
                                  machine="test machine")


# ---- Draws: each epoch exactly the window's length, whole shuffled passes ----------------

def test_an_epoch_longer_than_the_data_is_whole_shuffled_passes_cut_to_its_length():
    d = Draws(5)
    assert len(d) == 5 and sorted(d) == [0, 1, 2, 3, 4]
    d.length = 12                        # ceil(12 / 5) = 3 passes, cut to 12
    drawn = list(d)
    assert len(d) == 12 and len(drawn) == 12
    assert sorted(drawn[:5]) == [0, 1, 2, 3, 4] and sorted(drawn[5:10]) == [0, 1, 2, 3, 4]
    assert set(drawn[10:]) <= set(range(5)) and len(set(drawn[10:])) == 2
    d.length = 3                         # shorter than one pass: 3 distinct indices
    drawn = list(d)
    assert len(drawn) == 3 and len(set(drawn)) == 3
    d.length = 10                        # exactly two passes
    drawn = list(d)
    assert sorted(drawn[:5]) == sorted(drawn[5:]) == [0, 1, 2, 3, 4]


def test_the_passes_are_shuffled_independently():
    torch.manual_seed(0)
    d = Draws(50)
    d.length = 100
    drawn = list(d)
    assert drawn[:50] != drawn[50:] and drawn[:50] != list(range(50))


# ---- pooled: the windows of one setting ----------------------------------------------------

def test_a_settings_windows_pool_their_repeats_and_take_the_median_start_up():
    parts = [(meas(100.0, "a"), 0.1), (meas(200.0, "b"), 0.5), (meas(400.0, "c"), 0.2)]
    m, startup = pooled(parts, "w=2")
    assert startup == 0.2            # median of 0.1, 0.5, 0.2 (the mean would be 0.2667)
    assert m.label == "w=2" and m.repeats == 3
    assert m.samples_per_s == pytest.approx(200.0)        # median of the three windows
    two = pooled(parts[:2], "w=2")[1]
    assert two == pytest.approx(0.3)


# ---- the consumer and the device ------------------------------------------------------------

def test_the_consumer_is_a_sleep_of_step_s_or_the_step_function(monkeypatch):
    slept = []
    monkeypatch.setattr(window, "time", types.SimpleNamespace(sleep=slept.append,
                                                              perf_counter=lambda: 0.0))
    fn, text = make_consumer(0.002, None)
    fn("batch")
    assert slept == [0.002] and text.startswith("a 2 ms training step per batch")
    assert make_consumer(None, None)[0] is None and make_consumer(0, None)[0] is None
    assert make_consumer(None, None)[1].startswith("none: the loader alone")

    def train_step(batch):
        return batch

    fn, text = make_consumer(None, train_step)
    assert fn is train_step and text == "train_step(batch), called on each batch"
    with pytest.raises(ValueError, match="not both"):
        make_consumer(0.01, train_step)
    with pytest.raises(TypeError, match="step must be a function"):
        make_consumer(None, 3)


def test_batches_are_copied_to_cuda_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert consumer_device("auto") is None and consumer_device(None) is None
    assert consumer_device("cpu") is None
    with pytest.raises(ValueError, match="CUDA device only"):
        consumer_device("cuda")
    with pytest.raises(ValueError, match="CUDA device only"):
        consumer_device("meta")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert consumer_device("auto") == "cuda" and consumer_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError):
        consumer_device("meta")


# ---- rebuilt and Timed ------------------------------------------------------------------

def init_fn(worker_id):
    pass


def test_a_rebuilt_loader_keeps_every_setting_and_draws_whole_epochs():
    data = TinyDataset(10)
    loader = DataLoader(data, batch_size=3, num_workers=2, prefetch_factor=3,
                        persistent_workers=True, worker_init_fn=init_fn, timeout=7,
                        multiprocessing_context="spawn")
    r = rebuilt(loader)
    assert (r.batch_size, r.num_workers, r.prefetch_factor, r.persistent_workers) == (3, 2, 3, True)
    assert r.timeout == 7 and isinstance(r.sampler, Draws) and r.sampler.n == 10
    assert isinstance(r.worker_init_fn, QuietInit) and r.worker_init_fn.fn is init_fn
    assert r.multiprocessing_context.get_start_method() == "spawn"
    # no timeout given: a forked worker gets 120 s to make a batch, a spawned one none
    fork = rebuilt(DataLoader(data, batch_size=3, num_workers=2, multiprocessing_context="fork"))
    spawn = rebuilt(DataLoader(data, batch_size=3, num_workers=2, multiprocessing_context="spawn"))
    assert fork.timeout == 120 and spawn.timeout == 0
    plain = rebuilt(DataLoader(data, batch_size=4, pin_memory=True))
    assert plain.num_workers == 0 and plain.worker_init_fn is None and plain.pin_memory
    assert plain.batch_size == 4 and plain.timeout == 0


def test_a_quiet_worker_ignores_ctrl_c_then_runs_the_users_init():
    import signal
    import sys
    seen = []
    old, hook = signal.getsignal(signal.SIGINT), sys.excepthook
    try:
        QuietInit(seen.append)(3)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and seen == [3]
        QuietInit(None)(1)
    finally:
        signal.signal(signal.SIGINT, old)
        sys.excepthook = hook


class Clock:
    """time for the window module: perf_counter advances 1 s a call, sleep records."""

    def __init__(self):
        self.t, self.slept = 0.0, []

    def perf_counter(self):
        self.t += 1.0
        return self.t

    def sleep(self, s):
        self.slept.append(s)


def test_timed_records_each_epochs_start_up_and_feeds_the_consumer_before_the_next_batch(
        monkeypatch):
    clock = Clock()
    monkeypatch.setattr(window, "time", clock)
    events = []
    loader = rebuilt(DataLoader(TinyDataset(6), batch_size=2))
    timed = Timed(loader, None, lambda b: events.append(("step", int(b[1][0]))))
    assert len(timed) == 3 and timed.batch_size == 2 and timed.num_workers == 0
    for batch in timed:
        events.append(("got", int(batch[1][0])))
    firsts = [e for e in events if e[0] == "got"]
    assert len(firsts) == 3
    # each batch goes to the step before the next one is pulled
    assert [e[0] for e in events] == ["got", "step"] * 3
    assert [e[1] for e in events][::2] == [e[1] for e in events][1::2]
    assert timed.startups == [1.0]          # t0 = 1, first batch at 2: one tick of the clock
    list(timed)
    assert len(timed.startups) == 2
    timed.close()


def test_a_window_times_its_batches_after_the_warm_up_in_one_epoch():
    loader = rebuilt(DataLoader(TinyDataset(40), batch_size=4))
    timed = Timed(loader)
    m, startup = measure_window(timed, 3, "w=0 bs=4")
    # warm-up max(2, 0 workers) = 2 batches, then 3 timed: an epoch of (2 + 3) x 4 = 20 samples
    assert loader.sampler.length == 20 and len(timed) == 5
    assert m.repeats == 1 and m.items_per_repeat == 12 and m.label == "w=0 bs=4"
    assert startup == timed.startups[-1] and len(timed.startups) == 1
    measure_window(timed, 6, "again")
    assert loader.sampler.length == 32 and len(timed.startups) == 2
    timed.close()


# ---- the side by side -----------------------------------------------------------------------

class FakeSearch:
    """What SideBySide.measure reads of a search; its clock is moved by the fake windows."""

    def __init__(self, budget_s, t0):
        self.budget_s, self.clock, self.device, self.consumer = budget_s, t0, None, None
        self.ticks = []

    def elapsed(self):
        return self.clock

    def tick(self, text):
        self.ticks.append(text)


RATES = {"defaults": 320.0, "tuned": 640.0, "common recipe": 160.0}


@pytest.fixture
def windows(monkeypatch):
    """measure_window replaced: a row's window is delivered at RATES[label] samples/s and moves
    the search's clock by ``cost(round, label)`` seconds; records (label, batches, threads)."""
    state = types.SimpleNamespace(search=None, cost=lambda label: 2.0, asked=[])

    def fake(timed, batches, label):
        state.asked.append((label, batches, torch.get_num_threads()))
        state.search.clock += state.cost(label)
        items = batches * timed.batch_size
        return meas(RATES[label], label, items=items), 0.25

    monkeypatch.setattr(window, "measure_window", fake)
    monkeypatch.setattr(window, "gc", types.SimpleNamespace(collect=lambda: 0))
    monkeypatch.setenv("COURSE_QUICK", "0")                # 4 rounds
    return state


def pipe_without_images():
    return types.SimpleNamespace(base=None, size=16, dataset=TinyDataset(64), collate_fn=None)


def test_later_rounds_split_what_is_left_over_the_rounds_left_and_the_rows(windows):
    notes = []
    side = SideBySide(pipe_without_images(), LoaderSettings(batch_size=32), 32, notes)
    assert [label for label, _, _ in side.entries] == ["defaults", "tuned"]
    assert "compared with defaults only" in notes[0]
    windows.search = search = FakeSearch(budget_s=100.0, t0=40.0)     # 60 s left
    side.measure(search, min_batches=3)
    # round 1: 3 batches each (2 s a window: 4 s a round). round 2: spent 4 s a round,
    # (60 - 4) / 3 rounds left - 4 = 14.667 s for 2 rows: 7.333 s a row;
    # defaults 7.333 x 320 / 32 = 73.3 -> 73 batches, tuned 7.333 x 640 / 32 = 146.7 -> 147.
    # round 3: (60 - 8) / 2 - 4 = 22 -> 11 s a row: 110, 220. round 4: (60 - 12) / 1 - 4 = 44
    # -> 22 s a row: 220, 440.
    assert [(label, b) for label, b, _ in windows.asked] == [
        ("defaults", 3), ("tuned", 3), ("defaults", 73), ("tuned", 147),
        ("defaults", 110), ("tuned", 220), ("defaults", 220), ("tuned", 440)]
    assert len(side.runs["defaults"]) == 4 and len(search.ticks) == 8
    assert search.ticks[0] == "side by side, round 1: defaults"


def test_a_window_never_falls_below_the_minimum_batches(windows):
    side = SideBySide(pipe_without_images(), LoaderSettings(batch_size=32), 32, [])
    windows.search = search = FakeSearch(budget_s=100.0, t0=99.5)     # 0.5 s left: tiny windows
    windows.cost = lambda label: 0.0
    side.measure(search, min_batches=5)
    # no time spent: every round runs; round 4's windows are 0.5 / 2 rows = 0.25 s: defaults
    # 2.5 -> 2 batches, tuned 5: the minimum of 5 everywhere
    assert [b for _, b, _ in windows.asked] == [5] * 8


def test_the_side_by_side_stops_when_a_round_no_longer_fits_but_not_before_round_two(windows):
    # 60 s left; each window takes 10 s then 10.5 s: round 1 costs 20 s, round 2 21 s.
    side = SideBySide(pipe_without_images(), LoaderSettings(batch_size=32), 32, [])
    windows.search = search = FakeSearch(budget_s=100.0, t0=40.0)
    costs = iter([10.0, 10.0, 10.5, 10.5, 10.0, 10.0])
    windows.cost = lambda label: next(costs)
    side.measure(search, min_batches=3)
    # round 2 runs (two rounds at least) with 0 s windows: (40 / 3 - 20) < 0; before round 3:
    # 41 s spent, 20.5 s a round, 19 s left < 20.5 -> stop
    assert len(windows.asked) == 4


def test_a_round_that_fits_exactly_still_runs(windows):
    side = SideBySide(pipe_without_images(), LoaderSettings(batch_size=32), 32, [])
    windows.search = search = FakeSearch(budget_s=100.0, t0=40.0)
    costs = iter([10.0] * 4 + [1.0] * 4)
    windows.cost = lambda label: next(costs)
    side.measure(search, min_batches=3)
    # before round 3: spent 40 s, 20 s a round, 20 s left: not less -> round 3 runs (0 s
    # windows: the minimum); before round 4: 42 s spent, 14 s a round, 18 s left -> runs with
    # (18 / 1 - 14) / 2 rows = 2 s a row: defaults 2 x 320 / 32 = 20 batches, tuned 40
    assert [b for _, b, _ in windows.asked] == [3, 3, 3, 3, 3, 3, 20, 40]


def test_round_two_runs_even_when_round_one_ate_the_budget(windows):
    side = SideBySide(pipe_without_images(), LoaderSettings(batch_size=32), 32, [])
    windows.search = search = FakeSearch(budget_s=100.0, t0=40.0)
    costs = iter([20.0, 20.0, 1.0, 1.0])
    windows.cost = lambda label: next(costs)
    side.measure(search, min_batches=3)
    # round 2: 40 s spent, 20 s left < 40 s a round, but two rounds at least; then 42 s
    # spent, 21 s a round, 18 s left -> stop
    assert [b for _, b, _ in windows.asked] == [3, 3, 3, 3]


def test_the_windows_of_a_budget_already_spent_are_the_minimum(windows):
    side = SideBySide(pipe_without_images(), LoaderSettings(batch_size=32), 32, [])
    windows.search = search = FakeSearch(budget_s=100.0, t0=120.0)    # over: nothing left
    windows.cost = lambda label: 0.5
    side.measure(search, min_batches=4)
    # left_s = max(0, -20) = 0: round 2's windows are 0 s; before round 3: 2 s spent, 1 s a
    # round, 0 - 2 < 1 -> stop
    assert [b for _, b, _ in windows.asked] == [4, 4, 4, 4]


def test_quick_mode_measures_three_rounds(windows, monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    side = SideBySide(pipe_without_images(), LoaderSettings(batch_size=32), 32, [])
    windows.search = search = FakeSearch(budget_s=100.0, t0=40.0)
    side.measure(search, min_batches=3)
    # round 2: (60 - 4) / 2 - 4 = 24 -> 12 s a row: 120, 240; round 3: (60 - 8) / 1 - 4 = 48
    # -> 24 s a row: 240, 480
    assert [b for _, b, _ in windows.asked] == [3, 3, 120, 240, 240, 480]


def images():
    rng = np.random.default_rng(0)
    return [(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8), i % 2) for i in range(16)]


def test_the_recipe_row_runs_with_the_recipes_process_settings_and_is_the_baseline(windows):
    pipe = types.SimpleNamespace(base=images(), size=16, dataset=TinyDataset(16), collate_fn=None)
    tuned = LoaderSettings(num_workers=1, batch_size=8)
    side = SideBySide(pipe, tuned, 8, [])
    assert [label for label, _, _ in side.entries] == ["defaults", "common recipe", "tuned"]
    assert side.settings["tuned"] is tuned
    assert side.settings["common recipe"].num_workers == 4
    assert side.settings["defaults"] == LoaderSettings(num_workers=0, batch_size=8)
    assert side.summary() is None
    torch.set_num_threads(2)
    windows.search = search = FakeSearch(budget_s=100.0, t0=40.0)
    side.measure(search, min_batches=2)
    threads = {label: t for label, _, t in windows.asked}
    assert threads == {"defaults": 2, "common recipe": 1, "tuned": 2}
    comparison, startups = side.summary()
    assert comparison.rows[comparison.baseline].label == "common recipe"
    assert comparison.ratio("tuned") == pytest.approx(640.0 / 160.0)     # 4x the recipe
    assert startups == {"defaults": 0.25, "common recipe": 0.25, "tuned": 0.25}


def test_without_the_recipe_the_defaults_are_the_baseline(windows):
    side = SideBySide(pipe_without_images(), LoaderSettings(batch_size=32), 32, [])
    windows.search = search = FakeSearch(budget_s=100.0, t0=40.0)
    side.measure(search, min_batches=3)
    comparison, _ = side.summary()
    assert comparison.rows[comparison.baseline].label == "defaults"
    assert comparison.ratio("tuned") == pytest.approx(2.0)               # 640 / 320


def test_the_baselines_shuffle_at_the_given_batch_size_and_size():
    from torch.utils.data import RandomSampler
    pipe = types.SimpleNamespace(base=images(), size=12, dataset=TinyDataset(16), collate_fn=None)
    side = SideBySide(pipe, LoaderSettings(num_workers=1, batch_size=8), 4, [])
    loaders = {label: loader for label, loader, _ in side.entries}
    for label in ("defaults", "common recipe"):
        assert loaders[label].batch_size == 4 and isinstance(loaders[label].sampler, RandomSampler)
        assert loaders[label].dataset.transform.size == 12
    plain = SideBySide(pipe_without_images(), LoaderSettings(batch_size=8), 4, [])
    defaults = plain.entries[0][1]
    assert defaults.batch_size == 4 and isinstance(defaults.sampler, RandomSampler)
    assert defaults.dataset is plain.entries[1][1].dataset


def test_an_unexpected_error_in_a_worker_goes_to_the_usual_hook(monkeypatch):
    import sys
    seen = []
    monkeypatch.setattr(sys, "__excepthook__", lambda *a: seen.append(a))
    try:
        raise ValueError("x")
    except ValueError as exc:
        window.drop_fd_sharer_resets(ValueError, exc, exc.__traceback__)
        assert seen == [(ValueError, exc, exc.__traceback__)]
