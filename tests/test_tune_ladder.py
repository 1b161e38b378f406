"""Pins ``course_utils.tools.tune.search``: the trial plan and its time estimate, the budget gate
(both sides of it), the probe threshold, the ladders' stopping rule (non-contiguous worker
counts, both sides of 95 %), the four stages' order and the threads-per-worker fit, and
``tune_loader``'s own arithmetic (budget split, batch-size grid), on hand-made trials and a
fake clock: no DataLoader is iterated and no worker is started here."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import course_utils.tools.tune.search as tuning
from course_utils.measurement import Measurement
from course_utils.tools.tune.result import Trial, TuningResult
from course_utils.tools.tune.search import LoaderSettings

from _helpers import TinyDataset


@pytest.fixture(autouse=True)
def no_full_collections(monkeypatch):
    """gc.collect() after each trial costs a quarter second with torch loaded; nothing to free here."""
    monkeypatch.setattr(tuning, "gc", SimpleNamespace(collect=lambda: 0))


def meas(sps: float, label: str = "x", items: int = 128) -> Measurement:
    """A one-repeat Measurement of ``sps`` samples/s (``items`` samples in items/sps seconds)."""
    return Measurement.from_times(label, [items / sps], items, cpu_s_per_sample=0.001,
                                  machine="test machine")


def make_search(search_s: float = 48.0, budget_s: float = 64.0, epoch_samples: int = 1000,
                device=None, n: int = 40) -> tuning._Search:
    pipe = tuning._Pipeline(TinyDataset(n), None, None, "tiny", "dataset", [], 32, [])
    s = tuning._Search(pipe, budget_s=budget_s, search_s=search_s, epoch_samples=epoch_samples,
                       device=device, consumer=(None, "none"), progress=False)
    s.clock = 0.0
    s.elapsed = lambda: s.clock
    return s


def done(s: tuning._Search, settings: LoaderSettings, score: float, sps: float | None = None,
         status: str = "full") -> Trial:
    t = Trial(len(s.trials) + 1, "x", settings, status, meas(sps or score), 0.1, score)
    s.trials.append(t)
    s.tried[settings] = t
    return t


# ---- plan and estimate -----------------------------------------------------------------

def test_the_first_trial_calibrates_on_two_and_four_batches():
    s = make_search()
    w3 = LoaderSettings(num_workers=3, batch_size=64)        # warm-up 3 x 2 = 6 batches
    assert s.plan(w3) == (6, 2, 4)
    assert s.plan(LoaderSettings(num_workers=0, batch_size=64)) == (2, 2, 4)
    assert s.estimate_s(w3, s.plan(w3)) == 1.0


def test_a_full_window_lasts_trial_s_at_the_best_rate_and_a_probe_a_quarter_of_it():
    s = make_search(search_s=48.0)           # trial_s = 48 / 16 = 3 s
    assert s.trial_s == 3.0
    s.rate_est = 1024.0
    # full = 1024 samples/s x 3 s / 64 per batch = 48 batches, probe = 48 / 4 = 12
    assert s.plan(LoaderSettings(num_workers=3, batch_size=64)) == (6, 12, 48)
    # batch 32: 96 batches, probe 24
    assert s.plan(LoaderSettings(num_workers=0, batch_size=32)) == (2, 24, 96)


def test_trial_s_is_clamped_to_between_0_3_and_8_seconds():
    assert make_search(search_s=200.0).trial_s == 8.0        # 200 / 16 = 12.5 -> 8
    assert make_search(search_s=64.0).trial_s == 4.0         # 64 / 16, inside the clamp
    assert make_search(search_s=1.6).trial_s == 0.3          # 0.1 -> 0.3


def test_a_slow_rate_still_plans_two_full_batches_and_one_probe():
    s = make_search(search_s=48.0)
    s.rate_est = 10.0          # 10 x 3 / 64 = 0.47 batches -> at least 2, probe at least 1
    assert s.plan(LoaderSettings(batch_size=64)) == (2, 1, 2)


def test_the_estimate_counts_two_start_ups_two_warm_ups_a_probe_and_a_full_window():
    s = make_search(search_s=48.0)
    s.rate_est, s.startup_est = 1024.0, 0.5
    w3 = LoaderSettings(num_workers=3, batch_size=64)
    # 2 x 0.5 s + (2 x 6 + 12 + 48) batches x 64 / 1024 s = 1 + 72 / 16 = 5.5 s
    assert s.estimate_s(w3, s.plan(w3)) == 5.5
    w0 = LoaderSettings(num_workers=0, batch_size=64)
    # no workers: no start-up; (2 x 2 + 12 + 48) / 16 = 4.0 s
    assert s.estimate_s(w0, s.plan(w0)) == 4.0


def test_spawned_workers_are_estimated_to_start_in_three_seconds_at_least():
    s = make_search(search_s=48.0)
    s.rate_est, s.startup_est = 1024.0, 0.5
    for ctx in ("forkserver", "spawn"):
        w3 = LoaderSettings(num_workers=3, batch_size=64, multiprocessing_context=ctx)
        assert s.estimate_s(w3, s.plan(w3)) == 2 * 3.0 + 4.5
    s.startup_est = 4.0                              # a measured start-up above 3 s stays
    w3 = LoaderSettings(num_workers=3, batch_size=64, multiprocessing_context="spawn")
    assert s.estimate_s(w3, s.plan(w3)) == 2 * 4.0 + 4.5
    fork = LoaderSettings(num_workers=3, batch_size=64, multiprocessing_context="fork")
    assert s.estimate_s(fork, s.plan(fork)) == 2 * 4.0 + 4.5


def test_the_score_is_the_epoch_score_of_the_settings_batch_size():
    s = make_search(epoch_samples=210)
    # 100 samples/s, 2 s start-up, batch 10: 210 / (2 + 200 / 100) = 52.5
    assert s.score(LoaderSettings(batch_size=10), meas(100.0), 2.0) == pytest.approx(52.5)


# ---- one trial: the budget gate, the probe threshold, the estimates it updates ----------

@pytest.fixture
def windows(monkeypatch):
    """measure_window replaced: each call takes the next (samples/s, start-up) and records the
    batches it was asked for."""
    queue, asked = [], []

    def fake(timed, batches, label):
        asked.append(batches)
        sps, startup = queue.pop(0)
        if isinstance(sps, Exception):
            raise sps
        return meas(sps, label, items=batches * timed.batch_size), startup

    monkeypatch.setattr(tuning, "measure_window", fake)
    return queue, asked


def test_a_trial_whose_estimate_fits_exactly_what_is_left_runs(windows):
    queue, asked = windows
    s = make_search(search_s=48.0)
    done(s, LoaderSettings(num_workers=1, batch_size=64), 500.0)
    s.rate_est = 1024.0
    s.clock = 44.0                    # 4.0 s left, and the estimate is 4.0 s (above)
    queue += [(1024.0, 0.2), (1024.0, 0.2)]
    t = s.run("num_workers", LoaderSettings(num_workers=0, batch_size=64))
    assert t is not None and t.complete and not s.out_of_budget
    assert asked == [12, 48]                         # the probe, then the full window


def test_a_trial_whose_estimate_is_over_what_is_left_is_not_tried_and_nothing_after_it(windows):
    queue, asked = windows
    s = make_search(search_s=48.0)
    done(s, LoaderSettings(num_workers=1, batch_size=64), 500.0)
    s.rate_est = 1024.0
    s.clock = 44.25                   # 3.75 s left < 4.0 s
    w0 = LoaderSettings(num_workers=0, batch_size=64)
    assert s.run("num_workers", w0) is None
    assert s.out_of_budget and s.not_tried == ["num_workers: w=0 bs=64"]
    s.clock = 0.0                      # even with time back, the search has ended
    assert s.run("batch_size", LoaderSettings(num_workers=0, batch_size=8)) is None
    assert s.not_tried == ["num_workers: w=0 bs=64", "batch_size: w=0 bs=8"]
    assert asked == [] and len(s.trials) == 1


def test_nothing_left_stops_the_search_but_the_first_trial_always_runs(windows):
    queue, asked = windows
    s = make_search(search_s=48.0)
    s.clock = 50.0                     # already past the search's share
    queue += [(200.0, 0.0), (200.0, 0.0)]
    assert s.run("num_workers", LoaderSettings(batch_size=8)) is not None
    assert asked == [2, 4]             # the calibrating plan
    s.clock = 48.0                     # exactly nothing left
    assert s.run("num_workers", LoaderSettings(num_workers=1, batch_size=8)) is None
    assert s.out_of_budget


def test_a_setting_is_tried_once(windows):
    queue, asked = windows
    s = make_search()
    queue += [(200.0, 0.0), (200.0, 0.0)]
    w0 = LoaderSettings(batch_size=8)
    first = s.run("num_workers", w0)
    assert s.run("batch_size", LoaderSettings(batch_size=8)) is first
    assert len(s.trials) == 1 and len(asked) == 2 and first.index == 1


def _threshold_search(windows, probe_sps):
    queue, asked = windows
    s = make_search(search_s=48.0)
    s.score = lambda settings, m, startup: m.samples_per_s        # score = samples/s
    done(s, LoaderSettings(num_workers=1, batch_size=64), 100.0)
    s.rate_est = 1024.0
    queue += [(probe_sps, 0.1), (probe_sps, 0.3)]
    return s.run("num_workers", LoaderSettings(num_workers=2, batch_size=64)), asked


def test_a_probe_at_80_percent_of_the_best_gets_its_full_window(windows):
    t, asked = _threshold_search(windows, 80.0)
    assert t.status == "full" and asked == [12, 48] and t.index == 2
    assert t.startup_s == pytest.approx(0.2)        # the median of the two windows' 0.1, 0.3


def test_a_probe_just_under_80_percent_of_the_best_stops_there(windows):
    t, asked = _threshold_search(windows, 79.9)
    assert t.status == "stopped after probe" and asked == [12] and not t.complete
    assert t.startup_s == pytest.approx(0.1) and t.score == pytest.approx(79.9)


def test_the_best_rate_and_the_start_up_estimate_follow_the_trials(windows):
    queue, asked = windows
    s = make_search()
    queue += [(400.0, 0.0), (400.0, 0.0)]
    s.run("num_workers", LoaderSettings(batch_size=8))
    assert s.rate_est == pytest.approx(400.0) and s.startup_est == 0.5   # no workers: kept
    queue += [(350.0, 0.1), (350.0, 0.1)]
    assert s.run("num_workers", LoaderSettings(num_workers=1, batch_size=8)).complete
    # the rate is the best so far (400, not 350); the start-up halves towards 0.1: max(0.25, 0.1)
    assert s.rate_est == pytest.approx(400.0) and s.startup_est == pytest.approx(0.25)
    queue += [(900.0, 0.8), (900.0, 0.8)]
    s.run("num_workers", LoaderSettings(num_workers=3, batch_size=8))
    assert s.rate_est == pytest.approx(900.0) and s.startup_est == pytest.approx(0.8)
    queue += [(900.0, 2.0), (900.0, 2.0)]
    s.run("x", LoaderSettings(num_workers=3, batch_size=8, persistent_workers=True))
    assert s.startup_est == pytest.approx(0.8)       # a persistent restart says nothing of it


def test_a_broken_setting_is_recorded_after_the_first_and_raised_as_the_first(windows):
    queue, asked = windows
    s = make_search()
    queue.append((RuntimeError("boom\nsecond line"), 0.0))
    with pytest.raises(RuntimeError, match="boom"):
        s.run("num_workers", LoaderSettings(batch_size=8))
    queue += [(400.0, 0.0), (400.0, 0.0), (ValueError("bad worker\nmore"), 0.0)]
    s.run("num_workers", LoaderSettings(batch_size=16))
    t = s.run("num_workers", LoaderSettings(num_workers=1, batch_size=16))
    assert t.status == "failed: ValueError: bad worker" and t.measurement is None
    assert t.score is None and s.rate_est == pytest.approx(400.0) and t.index == 2


# ---- the ladders -------------------------------------------------------------------------

def ladder_run(s, scores, complete=()):
    """``s.run`` replaced: the trial of a value scores ``scores[value]`` (None: not tried)."""
    calls = []

    def run(stage, settings):
        v = settings.num_workers if stage == "num_workers" else settings.batch_size
        calls.append(v)
        if scores[v] is None:
            return None
        return Trial(len(calls), stage, settings, "stopped after probe" if v in complete else "full",
                     meas(scores[v]), 0.1, scores[v])

    s.run = run
    return calls


def test_the_worker_ladder_stops_after_two_falls_in_a_row_not_one():
    s = make_search()
    # 0: 100 best; 1: 80 falls; 3: 96 is within 95 % -> the count starts again; 6: 90 falls;
    # 9: 94.9 falls (second in a row) -> stop, 12 never tried
    calls = ladder_run(s, {0: 100, 1: 80, 3: 96, 6: 90, 9: 94.9, 12: 500})
    s.ladder("num_workers", LoaderSettings(), "num_workers", [0, 1, 3, 6, 9, 12], 2)
    assert calls == [0, 1, 3, 6, 9]
    assert len(s.skipped) == 1 and "num_workers in [12]" in s.skipped[0]
    assert "2 time(s) in a row, the last at num_workers=9" in s.skipped[0]


def test_a_rung_at_exactly_95_percent_of_the_best_is_not_a_fall():
    s = make_search()
    calls = ladder_run(s, {1: 100, 3: 95, 6: 10})
    s.ladder("num_workers", LoaderSettings(), "num_workers", [1, 3, 6], 1)
    assert calls == [1, 3, 6]
    s = make_search()
    calls = ladder_run(s, {1: 100, 3: 94.99, 6: 10})
    s.ladder("num_workers", LoaderSettings(), "num_workers", [1, 3, 6], 1)
    assert calls == [1, 3] and "num_workers in [6]" in s.skipped[0]


def test_the_ladder_compares_with_its_best_rung_not_the_last():
    s = make_search()
    # 100, then 96 (no fall), then 91.5: 95.3 % of the last but 91.5 % of the best -> falls
    calls = ladder_run(s, {1: 100, 3: 96, 6: 91.5, 9: 1})
    s.ladder("num_workers", LoaderSettings(), "num_workers", [1, 3, 6, 9], 1)
    assert calls == [1, 3, 6]


def test_a_new_best_resets_the_falls():
    s = make_search()
    calls = ladder_run(s, {0: 100, 1: 50, 3: 200, 6: 150, 9: 300, 12: 1})
    s.ladder("num_workers", LoaderSettings(), "num_workers", [0, 1, 3, 6, 9, 12], 2)
    assert calls == [0, 1, 3, 6, 9, 12] and s.skipped == []   # never two falls in a row


def test_a_probe_only_rung_within_95_percent_counts_as_a_fall():
    s = make_search()
    calls = ladder_run(s, {1: 100, 3: 99, 6: 1}, complete={3})
    s.ladder("num_workers", LoaderSettings(), "num_workers", [1, 3, 6], 1)
    assert calls == [1, 3]


def test_an_untried_rung_neither_falls_nor_resets():
    s = make_search()
    calls = ladder_run(s, {0: 100, 1: 50, 3: None, 6: 40, 9: 1})
    s.ladder("num_workers", LoaderSettings(), "num_workers", [0, 1, 3, 6, 9], 2)
    assert calls == [0, 1, 3, 6] and "num_workers in [9]" in s.skipped[0]


def test_a_falling_ladder_downwards_skips_the_smaller_values():
    s = make_search()
    calls = ladder_run(s, {64: 100, 32: 50, 16: 500, 8: 500})
    s.ladder("batch_size", LoaderSettings(), "batch_size", [64, 32, 16, 8], 1)
    assert calls == [64, 32]
    assert "batch_size in [16, 8]" in s.skipped[0] and "1 time(s)" in s.skipped[0]
    assert "the last at batch_size=32" in s.skipped[0] and "95%" in s.skipped[0]


def test_a_ladder_that_falls_on_its_last_rung_skips_nothing():
    s = make_search()
    ladder_run(s, {1: 100, 3: 10})
    s.ladder("num_workers", LoaderSettings(), "num_workers", [1, 3], 1)
    assert s.skipped == []


# ---- the stages --------------------------------------------------------------------------

def stage_run(s, score_of, sps_of=None, probe_only=()):
    """``s.run`` replaced by a bookkeeping one: ``score_of(settings)`` is its score."""
    calls = []

    def run(stage, settings):
        if settings in s.tried:
            return s.tried[settings]
        calls.append((stage, settings))
        score = score_of(settings)
        sps = sps_of(settings) if sps_of else score
        t = Trial(len(s.trials) + 1, stage, settings,
                  "stopped after probe" if settings in probe_only else "full", meas(sps), 0.1, score)
        s.trials.append(t)
        s.tried[settings] = t
        return t

    s.run = run
    return calls


def workers_win(x: LoaderSettings) -> float:
    return ({0: 100, 1: 150, 3: 300, 6: 250}[x.num_workers]
            * {16: 0.9, 32: 1.0, 64: 1.1, 128: 1.05}[x.batch_size]
            * {None: 1.0, 1: 0.99, 2: 1.0, 4: 1.02}[x.prefetch_factor]
            * (1.03 if x.persistent_workers else 1.0)
            * (1.01 if x.threads_per_worker == 2 else 0.98 if x.threads_per_worker == 3 else 1.0)
            * (1.2 if x.pin_memory else 1.0))


def test_the_stages_in_order_from_the_best_so_far(monkeypatch):
    monkeypatch.setattr(tuning, "start_method", lambda: "fork")
    s = make_search()
    calls = stage_run(s, workers_win)
    start = LoaderSettings(num_workers=0, batch_size=32)
    s.stages(start, [0, 1, 3, 6], [16, 32, 64, 128], usable=7)
    w3 = LoaderSettings(num_workers=3, batch_size=64)
    w3pf4 = w3.replace(prefetch_factor=4)
    assert calls == [
        ("num_workers", start), ("num_workers", start.replace(num_workers=1)),
        ("num_workers", start.replace(num_workers=3)), ("num_workers", start.replace(num_workers=6)),
        # 6 workers fell once only: the worker ladder ends on its last rung; best w=3 bs=32
        ("batch_size", w3.replace(batch_size=64)), ("batch_size", w3.replace(batch_size=128)),
        # downwards from the new best (bs=64), below the old best's 32: 16, which falls
        ("batch_size", w3.replace(batch_size=16)),
        ("prefetch/persistent", w3.replace(prefetch_factor=1)), ("prefetch/persistent", w3pf4),
        ("prefetch/persistent", w3pf4.replace(persistent_workers=True)),
        # 3 workers x 2 threads = 6 <= 7 usable CPUs; 3 threads (9) would not fit
        ("pin_memory/threads", w3pf4.replace(persistent_workers=True, threads_per_worker=2,
                                             multiprocessing_context="forkserver")),
    ]
    assert any("pin_memory=True (no CUDA device here" in x for x in s.skipped)
    assert s.best_trial.settings == calls[-1][1]


def test_with_cuda_pin_memory_is_tried_on_the_best(monkeypatch):
    monkeypatch.setattr(tuning, "start_method", lambda: "spawn")
    s = make_search(device="cuda")
    calls = stage_run(s, workers_win)
    s.stages(LoaderSettings(batch_size=32), [0, 1, 3, 6], [16, 32, 64, 128], usable=6)
    best = LoaderSettings(num_workers=3, batch_size=64, prefetch_factor=4, persistent_workers=True)
    assert ("pin_memory/threads", best.replace(pin_memory=True)) in calls
    # 3 x 2 = 6 <= 6 usable: threads 2, on the pinned best, no forkserver outside fork
    assert calls[-1] == ("pin_memory/threads", best.replace(pin_memory=True, threads_per_worker=2))
    assert not any("pin_memory=True" in x for x in s.skipped)


def test_more_threads_per_worker_only_where_they_fit_the_usable_cpus(monkeypatch):
    monkeypatch.setattr(tuning, "start_method", lambda: "spawn")
    s = make_search()
    calls = stage_run(s, workers_win)
    s.stages(LoaderSettings(batch_size=32), [0, 1, 3, 6], [16, 32, 64, 128], usable=5)
    assert not any(st == "pin_memory/threads" for st, _ in calls)
    assert ("pin_memory/threads: more than 1 thread per worker (3 workers x 2 threads would "
            "exceed the 5 usable CPUs)") in s.skipped


def test_two_workers_on_seven_cpus_try_two_and_three_threads(monkeypatch):
    monkeypatch.setattr(tuning, "start_method", lambda: "spawn")
    s = make_search()
    calls = stage_run(s, lambda x: {0: 100, 2: 200}[x.num_workers]
                      * (1.0 + 0.01 * (x.threads_per_worker or 0)))
    s.stages(LoaderSettings(batch_size=32), [0, 2], [32], usable=7)
    threads = [x.threads_per_worker for st, x in calls if st == "pin_memory/threads"]
    assert threads == [2, 3]                      # 7 // 2 = 3 threads at most


def test_when_no_workers_win_the_best_steady_worker_count_goes_persistent():
    s = make_search()
    # scores: no workers best; workers lost by their start-up. 1 worker: full trial, steady 120/s;
    # 3 workers: probe only, steady 500/s -> full trials first: 1 goes persistent
    calls = stage_run(s, lambda x: {0: 200, 1: 100, 3: 150}[x.num_workers] * (
        0.5 if x.persistent_workers else 1.0) * (0.5 if x.batch_size != 32 else 1.0),
        sps_of=lambda x: {0: 210, 1: 120, 3: 500}[x.num_workers],
        probe_only={LoaderSettings(num_workers=3, batch_size=32)})
    s.stages(LoaderSettings(batch_size=32), [0, 1, 3], [16, 32, 64], usable=8)
    persistent = [x for st, x in calls if st == "prefetch/persistent"]
    assert persistent == [LoaderSettings(num_workers=1, batch_size=32, persistent_workers=True)]
    assert ("prefetch/persistent: prefetch_factor (the best had no workers; persistent_workers "
            "was tried with 1)") in s.skipped
    assert "pin_memory/threads: threads per worker (the best had no workers)" in s.skipped


def test_without_any_worker_trial_prefetch_and_persistent_are_skipped():
    s = make_search()
    calls = stage_run(s, lambda x: 100.0 * {16: 0.9, 32: 1.0}[x.batch_size])
    s.stages(LoaderSettings(batch_size=32), [0], [16, 32], usable=8)
    assert [x.batch_size for _, x in calls] == [32, 16]
    assert any(x.startswith("prefetch/persistent: prefetch_factor and persistent_workers (they "
                            "need num_workers >= 1") for x in s.skipped)


# ---- the lists of ints -------------------------------------------------------------------

def test_int_lists_are_sorted_and_deduplicated():
    assert tuning._check_int_list("worker_counts", None, 0) is None
    assert tuning._check_int_list("worker_counts", [6, 1, 3, 1, 0], 0) == [0, 1, 3, 6]
    assert tuning._check_int_list("worker_counts", (0,), 0) == [0]
    with pytest.raises(ValueError):
        tuning._check_int_list("batch_sizes", [0, 8], 1)
    with pytest.raises(ValueError, match="empty"):
        tuning._check_int_list("batch_sizes", [], 1)
    with pytest.raises(TypeError):
        tuning._check_int_list("batch_sizes", "8,16", 1)
    with pytest.raises(TypeError):
        tuning._check_int_list("batch_sizes", 8, 1)


# ---- tune_loader's own arithmetic, the search replaced -----------------------------------

@pytest.fixture
def fake_stages(monkeypatch):
    """_Search.stages replaced: records its arguments and measures one trial (no workers)."""
    seen = {}

    def stages(self, start, worker_counts, batch_sizes, usable):
        seen.update(start=start, worker_counts=worker_counts, batch_sizes=batch_sizes,
                    usable=usable, search_s=self.search_s, budget_s=self.budget_s,
                    epoch_samples=self.epoch_samples)
        t = Trial(1, "num_workers", start, "full", meas(500.0), 0.2, 400.0)
        self.trials.append(t)

    monkeypatch.setattr(tuning._Search, "stages", stages)
    monkeypatch.setattr(tuning, "usable_cpus", lambda: 3)
    monkeypatch.setenv("COURSE_QUICK", "0")
    return seen


def test_the_search_gets_three_quarters_of_a_budget_above_one(fake_stages, monkeypatch):
    monkeypatch.setattr(tuning, "SideBySide", FakeSide)
    FakeSide.end = 0.0
    r = tuning.tune_loader(TinyDataset(300), budget_s=40.0, device=None, progress=False)
    # 40 s x (1 - 0.25) = 30 s (an allowance written as budget - 0.25 would give 39.75)
    assert fake_stages["search_s"] == 30.0 and fake_stages["budget_s"] == 40.0
    assert isinstance(r, TuningResult) and r.budget_s == 40.0


def test_without_baselines_the_search_gets_the_whole_budget(fake_stages):
    tuning.tune_loader(TinyDataset(300), budget_s=40.0, compare_with_baselines=False,
                       device=None, progress=False)
    assert fake_stages["search_s"] == 40.0


def test_default_grids_from_the_usable_cpus_and_the_dataset(fake_stages):
    tuning.tune_loader(TinyDataset(300), budget_s=10.0, compare_with_baselines=False,
                       device=None, progress=False)
    # 2 x 3 usable CPUs = 6 workers at most; batch 64 (full mode) and the powers up to 300 samples
    assert fake_stages["worker_counts"] == [0, 1, 2, 3, 4, 5, 6]
    assert fake_stages["batch_sizes"] == [8, 16, 32, 64, 128, 256]
    assert fake_stages["start"] == LoaderSettings(num_workers=0, batch_size=64)
    assert fake_stages["usable"] == 3 and fake_stages["epoch_samples"] == 300


def test_a_dataset_under_two_batches_starts_at_a_quarter_of_it(fake_stages):
    tuning.tune_loader(TinyDataset(100), budget_s=10.0, compare_with_baselines=False,
                       device=None, progress=False)
    # 100 < 2 x 64: batch 100 // 4 = 25, and the grid keeps powers up to 100
    assert fake_stages["start"].batch_size == 25
    assert fake_stages["batch_sizes"] == [8, 16, 25, 32, 64]
    tuning.tune_loader(TinyDataset(128), budget_s=10.0, compare_with_baselines=False,
                       device=None, progress=False)
    assert fake_stages["start"].batch_size == 64               # exactly two batches: kept


def test_given_grids_and_epoch(fake_stages):
    tuning.tune_loader(TinyDataset(300), budget_s=10.0, batch_size=48, worker_counts=[6, 1, 3],
                       batch_sizes=[32, 16], epoch_samples=1000, compare_with_baselines=False,
                       device=None, progress=False)
    assert fake_stages["worker_counts"] == [1, 3, 6]
    assert fake_stages["batch_sizes"] == [16, 32, 48]          # the start joins the grid
    assert fake_stages["start"] == LoaderSettings(num_workers=1, batch_size=48)
    assert fake_stages["epoch_samples"] == 1000
    tuning.tune_loader(TinyDataset(300), budget_s=10.0, batch_size=48, batch_sizes=[16],
                       compare_with_baselines=False, device=None, progress=False)
    assert fake_stages["batch_sizes"] == [16] and fake_stages["start"].batch_size == 16
    tuning.tune_loader(TinyDataset(30), budget_s=10.0, batch_sizes=[16, 32],
                       compare_with_baselines=False, device=None, progress=False)
    assert fake_stages["start"].batch_size == 64                # given grids: no quarter rule


def test_the_smallest_budget_is_two_seconds(fake_stages):
    with pytest.raises(ValueError, match="too small"):
        tuning.tune_loader(TinyDataset(300), budget_s=1.99, compare_with_baselines=False,
                           device=None, progress=False)
    tuning.tune_loader(TinyDataset(300), budget_s=2.0, compare_with_baselines=False,
                       device=None, progress=False)
    assert fake_stages["budget_s"] == 2.0


class FakeSide:
    """SideBySide replaced: its measure moves the search's clock to ``end``."""
    end = 0.0

    def __init__(self, pipe, tuned, batch_size, notes):
        self.settings = {"tuned": tuned}

    def measure(self, search, min_batches):
        search.clock = FakeSide.end

    def summary(self):
        return None


@pytest.mark.parametrize("end, noted", [(44.0, False), (44.5, True)])
def test_a_side_by_side_over_a_tenth_of_the_budget_late_is_noted(fake_stages, monkeypatch,
                                                                  end, noted):
    monkeypatch.setattr(tuning, "SideBySide", FakeSide)
    monkeypatch.setattr(tuning._Search, "elapsed", lambda self: getattr(self, "clock", 0.0))
    FakeSide.end = end             # budget 40: 4.0 s over is a tenth exactly, 4.5 s is over it
    r = tuning.tune_loader(TinyDataset(300), budget_s=40.0, device=None, progress=False)
    assert fake_stages["search_s"] == 30.0
    assert any("ran 4 s past the budget" in n or "ran 5 s past the budget" in n
               for n in r.notes) is noted
