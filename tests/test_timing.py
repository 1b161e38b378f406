"""Tests for course_utils.timing (and the Measurement it returns): structure, arithmetic and bad
input — never speed claims.

The arithmetic is pinned with a fake clock (and a fake CPU monitor) on hand-computed, asymmetric
cases; real timings are only checked against bounds no busy machine can break (a 10 ms sleep
takes at least 10 ms; CPU time cannot exceed wall time x processes).
"""
from __future__ import annotations

import functools
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from collections import namedtuple
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from course_utils import timing
from course_utils.measurement import (MIN_REPEATS, NOISY_IQR_FRACTION, SHORT_REPEAT_S, Comparison,
                                      Measurement, compare)
from course_utils.plots import plot_measurements
from course_utils.process_tree import loader_worker_pids
from course_utils.start_methods import start_method
from course_utils.timing import DataWait, batch_size_of, measure, measure_data_wait, measure_loader

from _helpers import TinyDataset


# ---------------------------------------------------------------------------------------
# datasets used by the tests (module level, so DataLoader workers can use them)
# ---------------------------------------------------------------------------------------

class SleepDataset(Dataset):
    """Sleeps ``latency_s`` per item; item 0 (the first of each sequential epoch) also sleeps
    ``first_s``: a slow start that warm-up must keep out of the timing."""

    def __init__(self, n: int, latency_s: float = 0.0, first_s: float = 0.0) -> None:
        self.n, self.latency_s, self.first_s = n, latency_s, first_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == 0 and self.first_s:
            time.sleep(self.first_s)
        if self.latency_s:
            time.sleep(self.latency_s)
        return torch.zeros(2, dtype=torch.uint8), i


class BusyDataset(Dataset):
    """Burns ``cpu_s`` of CPU (a busy loop, not a sleep) per item."""

    def __init__(self, n: int, cpu_s: float) -> None:
        self.n, self.cpu_s = n, cpu_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        end = time.process_time() + self.cpu_s
        x = 0
        while time.process_time() < end:
            x += 1
        return torch.zeros(2), i


class CountingStream(IterableDataset):
    """An iterable dataset without len()."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class FakeClock:
    """Replaces timing._now; the measured function advances it by a planned duration."""

    def __init__(self, durations):
        self.t = 100.0
        self.durations = list(durations)

    def __call__(self) -> float:
        return self.t

    def work(self) -> None:
        self.t += self.durations.pop(0) if self.durations else 0.0


class FakeMonitor:
    """Replaces timing.TreeMonitor: window ``i`` reads ``windows[i]`` = (CPU seconds, context
    switches) of the whole tree; no memory is sampled."""

    def __init__(self, windows) -> None:
        self.windows = list(windows)

    def list_tree(self) -> list:
        return []

    def start(self, procs=None) -> None:
        pass

    def stop(self) -> None:
        pass

    def snapshot(self, fresh: bool = False) -> dict:
        return {}

    def window(self, before, after):
        return self.windows.pop(0)

    def peaks(self):
        return None, None


class PlannedEpochs:
    """A loader (no len) whose epoch ``r`` yields the batches ``epochs[r]`` plans, as
    (samples, seconds): pulling a batch advances ``clock`` by its seconds."""

    def __init__(self, clock: FakeClock, epochs) -> None:
        self.clock, self.epochs = clock, [list(e) for e in epochs]

    def __iter__(self):
        for samples, seconds in self.epochs.pop(0):
            self.clock.t += seconds
            yield torch.zeros(samples, 2)


class ClockDataset(Dataset):
    """Item ``i`` advances ``clock`` by ``(i + 1)`` ms when fetched (in this process)."""

    def __init__(self, n: int, clock: FakeClock) -> None:
        self.n, self.clock = n, clock

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.clock.t += (i + 1) * 1e-3
        return torch.zeros(2), i


# ---------------------------------------------------------------------------------------
# Measurement arithmetic
# ---------------------------------------------------------------------------------------

def test_measure_with_fake_clock_computes_median_iqr_and_rate(monkeypatch):
    # warm-up call first (0.0 s), then five repeats of known length
    clock = FakeClock([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    monkeypatch.setattr(timing, "_now", clock)
    m = measure(clock.work, items=6, warmup=1, repeats=5, label="fake")
    assert m.times_s == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert m.median_s == pytest.approx(0.3)
    assert m.iqr_s == pytest.approx(0.4 - 0.2)
    assert m.samples_per_s == 6 / m.median_s
    assert m.items_per_repeat == 6
    assert m.label == "fake"
    assert m.noisy  # IQR is 67 % of the median
    assert any(w.startswith("noisy") for w in m.warnings)
    assert m.repeats == 5


def test_from_times_quiet_and_warnings():
    m = Measurement.from_times("q", [0.2, 0.2, 0.2], 10, machine="test machine")
    assert m.median_s == 0.2 and m.iqr_s == 0.0
    assert m.samples_per_s == 10 / 0.2
    assert not m.noisy
    assert m.warnings == []
    few = Measurement.from_times("few", [0.2, 0.2], 10, machine="m")
    assert any("few repeats" in w for w in few.warnings)
    short = Measurement.from_times("short", [1e-5] * 3, 1, machine="m")
    assert any("short repeats" in w for w in short.warnings)
    with pytest.raises(ValueError, match="times_s"):
        Measurement.from_times("x", [], 1, machine="m")
    with pytest.raises(ValueError, match="items_per_repeat"):
        Measurement.from_times("x", [0.1], 0, machine="m")


def test_from_times_on_asymmetric_times_uses_the_median_and_numpy_quartiles():
    # sorted 0.1, 0.2, 0.3, 0.9: median 0.25 (the mean would be 0.375)
    m = Measurement.from_times("asym", [0.3, 0.9, 0.1, 0.2], 50, machine="m")
    assert m.median_s == pytest.approx(0.25)
    # numpy's linear percentiles: 25th at position 0.75 -> 0.1 + 0.75 x 0.1,
    # 75th at position 2.25 -> 0.3 + 0.25 x 0.6
    assert m.quartiles_s == pytest.approx((0.175, 0.45))
    assert m.iqr_s == pytest.approx(0.45 - 0.175)
    assert m.samples_per_s == pytest.approx(50 / 0.25)
    # odd count, skewed by one slow repeat: median 2 (mean 4.33), quartiles 1.5 and 6
    m = Measurement.from_times("skew", [2.0, 10.0, 1.0], 8, machine="m")
    assert (m.median_s, m.iqr_s, m.samples_per_s) == pytest.approx((2.0, 4.5, 4.0))


@pytest.mark.parametrize("scale, noisy", [(0.99, False), (1.01, True)])
def test_noisy_warning_starts_just_above_the_threshold(scale, noisy):
    # five repeats: numpy's quartiles are the 2nd and 4th times exactly; median 1.0
    iqr = NOISY_IQR_FRACTION * scale
    times = [0.5, 1.0 - 0.3 * iqr, 1.0, 1.0 + 0.7 * iqr, 3.0]
    m = Measurement.from_times("n", times, 10, machine="m")
    assert m.median_s == 1.0 and m.iqr_s == pytest.approx(iqr)
    assert m.noisy is noisy
    assert any(w.startswith("noisy:") for w in m.warnings) is noisy
    assert (" *" in str(compare([m]))) is noisy


@pytest.mark.parametrize("repeats, warned", [(MIN_REPEATS - 1, True), (MIN_REPEATS, False)])
def test_few_repeats_warning(repeats, warned):
    m = Measurement.from_times("r", [0.2] * repeats, 10, machine="m")
    assert [w.startswith("few repeats:") for w in m.warnings] == ([True] if warned else [])


@pytest.mark.parametrize("scale, warned", [(0.99, True), (1.01, False)])
def test_short_repeats_warning_below_the_threshold(scale, warned):
    m = Measurement.from_times("s", [SHORT_REPEAT_S * scale] * 3, 1, machine="m")
    assert [w.startswith("short repeats:") for w in m.warnings] == ([True] if warned else [])


def test_measure_cpu_per_sample_is_the_cpu_total_over_every_sample(monkeypatch):
    clock = FakeClock([0.0, 0.2, 0.6])                  # warm-up, then two repeats
    monkeypatch.setattr(timing, "_now", clock)
    monkeypatch.setattr(timing, "TreeMonitor", lambda: FakeMonitor([(0.2, 1), (0.6, 4)]))
    m = measure(clock.work, items=5, warmup=1, repeats=2)
    assert m.times_s == pytest.approx([0.2, 0.6])
    assert m.cpu_s_per_sample == pytest.approx((0.2 + 0.6) / (5 * 2))
    assert m.involuntary_ctx_switches == 5


def test_measure_loader_scales_uneven_repeats_and_divides_cpu_by_every_sample(monkeypatch):
    """Three repeats of 4, 6 and 4 samples (a partial batch in the last), fake clock and CPU."""
    clock = FakeClock([])
    monkeypatch.setattr(timing, "_now", clock)
    monkeypatch.setattr(timing, "TreeMonitor", lambda: FakeMonitor([(0.3, 2), (0.5, 3), (0.6, 4)]))
    loader = PlannedEpochs(clock, [[(2, 0.1), (2, 0.3)],             # 4 samples in 0.4 s
                                   [(2, 0.2), (2, 0.3), (2, 0.4)],   # 6 samples in 0.9 s
                                   [(3, 0.3), (1, 0.4)]])            # 4 samples in 0.7 s
    m = measure_loader(loader, warmup_batches=0, repeats=3, progress=False)
    assert m.items_per_repeat == 4                       # the first repeat's count
    assert m.times_s == pytest.approx([0.4, 0.9 * 4 / 6, 0.7])   # scaled to 4 samples
    assert m.median_s == pytest.approx(0.6)              # unscaled, the median would be 0.7
    assert m.samples_per_s == pytest.approx(4 / 0.6)
    assert m.cpu_s_per_sample == pytest.approx((0.3 + 0.5 + 0.6) / (4 + 6 + 4))
    assert m.involuntary_ctx_switches == 2 + 3 + 4
    assert any("different numbers of samples ([4, 6, 4])" in w for w in m.warnings)


def test_measure_data_wait_fraction_is_total_wait_over_total_loop_time(monkeypatch):
    """Per step (fake seconds): wait 0.1, 0.3, 0.2 and compute 0.5, 0.1, 0.8, after a warm-up
    step of 5 s + 5 s that must not count: 0.6 s of 2.0 s waited."""
    clock = FakeClock([])
    monkeypatch.setattr(timing, "_now", clock)
    waits, computes = [5.0, 0.1, 0.3, 0.2], [5.0, 0.5, 0.1, 0.8]

    class Loader:
        def __iter__(self):
            for seconds in waits:
                clock.t += seconds
                yield torch.zeros(1)

    def step(batch) -> None:
        clock.t += computes.pop(0)

    w = measure_data_wait(Loader(), step, steps=3, warmup_steps=1)
    assert w.wait_s == pytest.approx([0.1, 0.3, 0.2])
    assert w.step_s == pytest.approx([0.5, 0.1, 0.8])     # the step alone, the wait apart
    assert w.iteration_s == pytest.approx([0.6, 0.4, 1.0])
    assert w.wait_fraction == pytest.approx(0.6 / 2.0)    # not the mean of per-step fractions
    assert (w.median_wait_s, w.median_step_s, w.median_iteration_s) == pytest.approx((0.2, 0.5, 0.6))


def test_measure_real_sleep_lower_bound_and_fields():
    calls = []

    def work():
        calls.append(1)
        time.sleep(0.010)

    m = measure(work, items=4, warmup=2, repeats=3, settings={"kind": "sleep"})
    assert len(calls) == 2 + 3  # warm-up calls are made but not timed
    assert len(m.times_s) == 3
    assert m.median_s >= 0.010  # a sleep never takes less than asked
    assert m.samples_per_s == 4 / m.median_s
    assert m.label == "work"
    assert m.settings == {"kind": "sleep"}
    assert m.cpu_s_per_sample is not None and m.cpu_s_per_sample >= 0
    if m.involuntary_ctx_switches is not None:
        assert m.involuntary_ctx_switches >= 0
    if m.peak_uss_bytes is not None:
        assert m.peak_uss_bytes > 0
    assert isinstance(m.machine, str) and m.machine
    text = str(m)
    assert "work" in text and "samples/s" in text and "median" in text
    assert 3 <= len(text.splitlines()) <= 6


def test_to_dict_is_json_with_the_raw_and_the_derived_figures():
    """What reference files and --json hold: every key a reader looks up, in this order."""
    m = Measurement.from_times("a", [0.1, 0.12, 0.11], 32, cpu_s_per_sample=0.002,
                               settings={"device": torch.device("cpu"), "n": np.int64(3)},
                               machine="test machine", warnings=["mine"])
    d = json.loads(json.dumps(m.to_dict()))
    assert list(d) == ["label", "times_s", "items_per_repeat", "median_s", "iqr_s", "samples_per_s",
                       "cpu_s_per_sample", "involuntary_ctx_switches", "peak_uss_bytes",
                       "peak_pss_bytes", "settings", "machine", "warnings", "noisy"]
    assert d["settings"] == {"device": "cpu", "n": 3} and d["warnings"] == ["mine"]
    assert (d["median_s"], d["iqr_s"], d["samples_per_s"]) == pytest.approx((0.11, 0.01, 32 / 0.11))
    assert d["noisy"] is False and d["times_s"] == [0.1, 0.12, 0.11]
    assert Measurement.from_times("z", [0.0] * 3, 1, machine="m").to_dict()["samples_per_s"] is None


@pytest.mark.parametrize("kwargs, exc, word", [
    ({"items": 0}, ValueError, "items"),
    ({"warmup": -1}, ValueError, "warmup"),
    ({"repeats": 0}, ValueError, "repeats"),
    ({"repeats": 2.5}, TypeError, "repeats"),
    ({"repeats": True}, TypeError, "repeats"),
    ({"settings": [1, 2]}, TypeError, "settings"),
    ({"device": "not-a-device"}, ValueError, "device"),
])
def test_measure_bad_arguments(kwargs, exc, word):
    with pytest.raises(exc) as info:
        measure(lambda: None, **kwargs)
    assert _names(str(info.value), word), str(info.value)     # the argument, spelled as it is


def _names(message: str, word: str) -> bool:
    """Whether ``message`` names ``word`` as a whole word (not inside another)."""
    return re.search(rf"(?<![A-Za-z_]){re.escape(word)}(?![A-Za-z_])", message) is not None


def test_measure_rejects_non_callable():
    with pytest.raises(TypeError, match="fn must be a callable.*got int"):
        measure(42)
    with pytest.raises(TypeError, match="settings must be a dict.*got list"):
        measure(lambda: None, settings=[1])


def test_the_smallest_valid_window_is_accepted():
    """Each lower bound is inclusive: no warm-up, one repeat, one item; one step, no warm-up."""
    m = measure(lambda: None, items=1, warmup=0, repeats=1)
    assert m.repeats == 1 and m.items_per_repeat == 1
    assert measure(lambda: None, label="named").label == "named"
    assert measure(lambda: None, device="cpu").settings["device"] == "cpu"
    w = measure_data_wait(DataLoader(TinyDataset(4)), lambda batch: None, steps=1, warmup_steps=0)
    assert w.steps == 1


@pytest.mark.parametrize("kwargs, word", [
    ({"steps": 0}, "steps"), ({"warmup_steps": -1}, "warmup_steps"),
])
def test_measure_data_wait_names_a_bad_argument(kwargs, word):
    with pytest.raises(ValueError) as info:
        measure_data_wait(DataLoader(TinyDataset(40)), lambda batch: None, **kwargs)
    assert str(info.value).startswith(f"{word}="), str(info.value)
    with pytest.raises(TypeError, match="step_fn must be a callable.*got int"):
        measure_data_wait(DataLoader(TinyDataset(40)), 3)
    with pytest.raises(TypeError, match="loader must be iterable.*got int"):
        measure_data_wait(5, lambda batch: None)


# ---------------------------------------------------------------------------------------
# batch_size_of
# ---------------------------------------------------------------------------------------

Pair = namedtuple("Pair", "image label")


@pytest.mark.parametrize("batch, expected", [
    (torch.zeros(5, 3, 8, 8), 5),
    (np.zeros((7, 2)), 7),
    ((torch.zeros(4, 3), torch.arange(4)), 4),
    ([torch.zeros(2, 3), torch.arange(2)], 2),
    ({"image": torch.zeros(6, 1), "label": torch.arange(6)}, 6),
    (((torch.zeros(3, 1), torch.zeros(3, 1)), torch.arange(3)), 3),
    ([{"x": torch.zeros(9)}, torch.arange(9)], 9),
    (Pair(torch.zeros(8, 2), torch.arange(8)), 8),
    (["a.jpg", "b.jpg"], 2),
    ([1, 2, 3], 3),
])
def test_batch_size_of(batch, expected):
    assert batch_size_of(batch) == expected


def test_batch_size_of_bad_batches():
    with pytest.raises(ValueError, match="0-dimensional"):
        batch_size_of(torch.tensor(3.0))
    with pytest.raises(TypeError, match="object"):
        batch_size_of(object())
    with pytest.raises(ValueError, match="empty dict"):
        batch_size_of({})


# ---------------------------------------------------------------------------------------
# measure_loader
# ---------------------------------------------------------------------------------------

def test_measure_loader_counts_a_last_partial_batch_exactly():
    loader = DataLoader(TinyDataset(10), batch_size=4)  # batches of 4, 4, 2
    m = measure_loader(loader, warmup_batches=0, repeats=2, progress=False)
    assert m.items_per_repeat == 10
    m = measure_loader(loader, warmup_batches=1, repeats=2, progress=False)
    assert m.items_per_repeat == 4 + 2
    m = measure_loader(loader, warmup_batches=1, batches=1, repeats=2, progress=False)
    assert m.items_per_repeat == 4
    assert m.samples_per_s == m.items_per_repeat / m.median_s
    assert m.settings["num_workers"] == 0 and m.settings["batch_size"] == 4
    assert m.settings["pin_memory"] is False
    assert "start_method" not in m.settings  # no workers, no start method
    assert m.label == "DataLoader(num_workers=0, batch_size=4)"


def test_measure_loader_settings_are_merged_and_labelled():
    loader = DataLoader(TinyDataset(8), batch_size=2)
    m = measure_loader(loader, warmup_batches=0, repeats=1, label="tiny",
                       settings={"transform": "none", "batch_size": 2}, progress=False)
    assert m.label == "tiny"
    assert m.settings["transform"] == "none" and m.settings["num_workers"] == 0
    assert any("few repeats" in w for w in m.warnings)
    json.dumps(m.to_dict())


def test_measure_loader_quick_mode_caps_batches(monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    loader = DataLoader(TinyDataset(50), batch_size=1)
    m = measure_loader(loader, warmup_batches=2, repeats=1, progress=False)
    assert m.items_per_repeat == 10


def test_measure_loader_too_few_batches_is_a_clear_error():
    loader = DataLoader(TinyDataset(10), batch_size=4)  # 3 batches
    with pytest.raises(ValueError, match="warmup_batches"):
        measure_loader(loader, warmup_batches=3, progress=False)
    with pytest.raises(ValueError, match="batches"):
        measure_loader(loader, warmup_batches=1, batches=5, progress=False)
    # without len(): the error comes when the stream runs out
    stream = DataLoader(CountingStream(5), batch_size=2)  # 3 batches, len unknown to us
    with pytest.raises(ValueError, match="ran out"):
        measure_loader(iter_only(stream), warmup_batches=1, batches=5, progress=False)


class iter_only:
    """Hides len() of a loader."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)


@pytest.mark.parametrize("kwargs, exc, word", [
    ({"batches": 0}, ValueError, "batches"),
    ({"warmup_batches": -1}, ValueError, "warmup_batches"),
    ({"repeats": 0}, ValueError, "repeats"),
    ({"batches": "all"}, TypeError, "batches"),
])
def test_measure_loader_bad_arguments(kwargs, exc, word):
    loader = DataLoader(TinyDataset(8), batch_size=2)
    with pytest.raises(exc, match=word):
        measure_loader(loader, progress=False, **kwargs)


def test_measure_loader_rejects_non_iterables():
    with pytest.raises(TypeError, match="loader"):
        measure_loader(3, progress=False)


def test_measure_loader_without_len_runs_to_the_end():
    loader = iter_only(DataLoader(CountingStream(7), batch_size=2))  # 2, 2, 2, 1
    m = measure_loader(loader, warmup_batches=1, repeats=2, progress=False)
    assert m.items_per_repeat == 2 + 2 + 1


def test_warm_up_is_excluded_from_the_timing():
    # every epoch's first fetch sleeps 0.5 s; the others take about 1 ms
    loader = DataLoader(SleepDataset(12, latency_s=0.001, first_s=0.5), batch_size=2)
    warm = measure_loader(loader, warmup_batches=1, repeats=3, progress=False)
    assert warm.median_s < 0.5  # the slow first batch was not timed
    cold = measure_loader(loader, warmup_batches=0, batches=2, repeats=1, progress=False)
    assert cold.median_s >= 0.5  # ...and it is there when warm-up is skipped


def test_progress_bar_runs(capsys):
    loader = DataLoader(TinyDataset(6), batch_size=2)
    m = measure_loader(loader, warmup_batches=1, repeats=1, progress=True)
    assert m.items_per_repeat == 4


@pytest.mark.timeout(60)
def test_cpu_time_includes_the_workers():
    # workers burn 20 ms CPU per sample; the main process mostly waits on a queue
    loader = DataLoader(BusyDataset(40, cpu_s=0.020), batch_size=2, num_workers=2)
    m = measure_loader(loader, repeats=2, progress=False)
    assert m.settings["num_workers"] == 2
    assert m.settings["start_method"] in ("fork", "spawn", "forkserver")
    assert m.settings["prefetch_factor"] == 2
    assert m.cpu_s_per_sample is not None
    assert m.cpu_s_per_sample >= 0.010  # only possible if the workers' CPU time is counted
    # ...and at most what the main process and 2 workers could burn in the timed windows
    # (every repeat timed the same samples; 1.25: CPU clock ticks and the last snapshot)
    assert not any("different numbers" in w for w in m.warnings)
    cpu_total = m.cpu_s_per_sample * m.items_per_repeat * m.repeats
    assert cpu_total <= sum(m.times_s) * (2 + 1) * 1.25
    if m.peak_uss_bytes is not None:
        assert m.peak_uss_bytes > 0
    if m.peak_pss_bytes is not None:
        assert m.peak_pss_bytes > 0


def test_another_loaders_workers_do_not_count(tmp_path):
    """Only the measured loader's workers count: a busy child process (as another loader's
    persistent workers finishing their prefetched batches) is not charged to this loader."""
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 20\n"
                                "open(%r, 'w').close()\nwhile time.time() < end: pass" % str(tmp_path / "up")])
    try:
        while not (tmp_path / "up").exists():
            time.sleep(0.01)
        for workers in (0, 1):
            loader = DataLoader(SleepDataset(60, latency_s=0.01), batch_size=2, num_workers=workers)
            m = measure_loader(loader, batches=10, warmup_batches=2, repeats=2, progress=False)
            cores = m.cpu_s_per_sample * m.samples_per_s    # the spinner alone would add ~1 core
            assert cores < 0.5, (workers, cores)
        assert spinner.poll() is None, "the spinner ended before the loaders were measured"
    finally:
        spinner.kill()
        spinner.wait()


def test_loader_worker_pids_reads_torch_iterators_and_nothing_else():
    assert loader_worker_pids(iter([1, 2])) is None                 # not a DataLoader iterator
    assert loader_worker_pids(iter(DataLoader(TinyDataset(4)))) == []   # num_workers=0: none
    it = iter(DataLoader(TinyDataset(8), batch_size=2, num_workers=2))
    try:
        pids = loader_worker_pids(it)
        assert len(pids) == 2 and all(p > 0 for p in pids) and os.getpid() not in pids
    finally:
        del it


def test_default_warm_up_covers_every_batch_in_flight():
    # num_workers * prefetch_factor batches before the clock starts, however short the epoch
    assert timing.default_warmup(DataLoader(TinyDataset(4), num_workers=0)) == 2
    assert timing.default_warmup(SimpleNamespace(num_workers=5)) == 10  # prefetch_factor 2
    assert timing.default_warmup(SimpleNamespace(num_workers=3, prefetch_factor=4)) == 12
    assert timing.default_warmup(DataLoader(TinyDataset(10), num_workers=2)) == 4
    assert timing.default_warmup(DataLoader(TinyDataset(4), num_workers=4)) == 8  # no cap
    assert timing.default_warmup(SimpleNamespace(num_workers=1, prefetch_factor=1)) == 2


def test_batches_in_flight_is_workers_times_prefetch():
    assert timing.batches_in_flight(DataLoader(TinyDataset(4))) == 0
    assert timing.batches_in_flight(DataLoader(TinyDataset(4), num_workers=3)) == 6
    assert timing.batches_in_flight(DataLoader(TinyDataset(4), num_workers=3, prefetch_factor=5)) == 15
    assert timing.batches_in_flight(SimpleNamespace()) == 0           # not a DataLoader: nothing ahead


class FakeWorkersLoader:
    """A loader that claims workers (so the default warm-up is num_workers x prefetch) but makes
    its ``n`` batches in this process: the window rules are judged from counts, not timings."""

    def __init__(self, n: int, num_workers: int, prefetch_factor: int = 2) -> None:
        self.n, self.num_workers, self.prefetch_factor, self.batch_size = n, num_workers, prefetch_factor, 4

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return (torch.zeros(4) for _ in range(self.n))


@pytest.mark.parametrize("n, refused", [(8 + 9, True), (8 + 10, False)])
def test_a_default_window_needs_the_batches_in_flight_and_ten_more(n, refused):
    """4 workers x prefetch 2: 8 untimed, then at least 10 timed. Lesson 00's quick run had 13
    batches: its warm-up stopped at 6 and the timed batches had mostly been made before."""
    loader = FakeWorkersLoader(n, num_workers=4)
    if refused:
        with pytest.raises(ValueError, match=r"only 17 batches.*needs 18 \(at least 72 samples"):
            measure_loader(loader, repeats=1, progress=False)
        with pytest.raises(ValueError, match="needs 18"):
            measure_data_wait(loader, lambda batch: None)
    else:
        m = measure_loader(loader, repeats=1, progress=False)
        assert m.items_per_repeat == 10 * 4 and not any("in flight" in w for w in m.warnings)
        assert measure_data_wait(loader, lambda batch: None).steps == 10


def test_a_default_window_over_an_iterable_that_ends_early_is_refused():
    class Unsized:
        num_workers, prefetch_factor = 1, 2

        def __iter__(self):
            return (torch.zeros(2) for _ in range(2 + 9))      # 2 in flight + 9: one short
    with pytest.raises(ValueError, match="ended after 11 batches.*at least 10"):
        measure_loader(Unsized(), repeats=1, progress=False)
    with pytest.raises(ValueError, match="ended after 11 batches.*at least 10 steps"):
        measure_data_wait(Unsized(), lambda batch: None)


@pytest.mark.parametrize("warmup, timed, flags", [
    (8, 10, []),
    (7, 10, ["1 of the 10 timed batches were made before the clock"]),
    (0, 3, ["3 of the 3 timed batches were made before", "only 3 batches timed"]),
    (8, 9, ["only 9 batches timed per repeat, fewer than 10"]),
])
def test_a_window_set_by_hand_is_flagged_from_its_counts(warmup, timed, flags):
    loader = FakeWorkersLoader(40, num_workers=4)
    assert [f for f in flags if not any(f in w for w in timing.window_warnings(loader, warmup, timed))] == []
    assert len(timing.window_warnings(loader, warmup, timed)) == len(flags)
    m = measure_loader(loader, warmup_batches=warmup, batches=timed, repeats=1, progress=False)
    assert all(any(f in w for w in m.warnings) for f in flags)


def test_no_workers_means_nothing_in_flight_to_flag():
    assert timing.window_warnings(DataLoader(TinyDataset(40)), 0, 10) == []


def test_measure_loader_times_exactly_the_batches_after_warm_up(monkeypatch):
    """A fake clock advanced by each item (item i: i + 1 ms): each repeat's time is the sum
    over the timed items, the warm-up batch (items 0-3) left out, nothing else in the window."""
    clock = FakeClock([])
    monkeypatch.setattr(timing, "_now", clock)
    loader = DataLoader(ClockDataset(40, clock), batch_size=4)      # 10 batches
    m = measure_loader(loader, warmup_batches=1, repeats=3, progress=False)
    timed_s = sum(range(5, 41)) * 1e-3                  # items 4..39 cost 5..40 ms
    assert m.items_per_repeat == 36
    assert m.times_s == pytest.approx([timed_s] * 3)
    assert m.samples_per_s == pytest.approx(36 / timed_s)


# ---------------------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------------------

def _m(label, seconds, items=100, cpu=None, machine="test machine"):
    return Measurement.from_times(label, [seconds] * 3, items, cpu_s_per_sample=cpu,
                                  machine=machine)


def test_compare_ratios_and_table():
    slow = _m("common recipe", 1.0, cpu=0.004)
    fast = _m("tuned", 0.5, cpu=0.001)
    c = compare([slow, fast])
    assert isinstance(c, Comparison) and c.baseline == 0
    assert c.ratio("tuned") == pytest.approx(2.0)
    assert c.ratio(1, "cpu_s_per_sample") == pytest.approx(0.25)
    assert c.ratio("common recipe") == 1.0
    text = str(c)
    lines = text.splitlines()
    assert "samples/s" in lines[0] and "CPU ms/sample" in lines[0]
    assert "2.00x" in text and "0.25x" in text and "(baseline)" in text
    assert "test machine" in text
    # columns line up: every table row as wide as the header
    assert len({len(line) for line in lines[:4]}) == 1
    c2 = compare([slow, fast], baseline="tuned")
    assert c2.baseline == 1 and c2.ratio("common recipe") == pytest.approx(0.5)
    assert compare([slow, fast], baseline=-1).baseline == 1
    json.dumps(c.to_dict())


def test_compare_missing_metric_and_noisy_rows():
    a = _m("a", 1.0)  # no CPU time
    b = Measurement.from_times("b", [0.5, 1.0, 1.5], 100, machine="test machine")
    c = compare([a, b])
    with pytest.raises(ValueError, match="cpu_s_per_sample"):
        c.ratio("b", "cpu_s_per_sample")
    with pytest.raises(ValueError, match="metric"):
        c.ratio("b", "speed")
    text = str(c)
    assert "n/a" in text and "b *" in text and "noisy" in text


@pytest.mark.parametrize("measurements, baseline, exc, word", [
    ([], 0, ValueError, "empty"),
    ("not a list", 0, TypeError, "Measurement"),
    ([_m("a", 1.0)], 3, ValueError, "out of range"),
    ([_m("a", 1.0)], "zzz", ValueError, "zzz"),
    ([_m("a", 1.0), _m("a", 2.0)], "a", ValueError, "index"),
    ([_m("a", 1.0)], 1.5, TypeError, "baseline"),
])
def test_compare_bad_input(measurements, baseline, exc, word):
    with pytest.raises(exc, match=word):
        compare(measurements, baseline=baseline)


def test_compare_rejects_a_single_measurement():
    with pytest.raises(TypeError, match="list"):
        compare(_m("a", 1.0))


def test_a_comparison_plots_with_its_baseline():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = compare([_m("slow", 1.0, cpu=0.002), _m("fast", 0.25, cpu=0.001)], baseline="slow")
    ax = plot_measurements(c)                      # a Comparison plots with its own baseline
    assert len(ax.patches) == 2
    assert "4.00x" in " ".join(t.get_text() for t in ax.texts)
    ax2 = plot_measurements(c, metric="cpu_s_per_sample")
    assert ax2.get_xlabel().startswith("CPU")
    plt.close("all")


# ---------------------------------------------------------------------------------------
# measure_data_wait
# ---------------------------------------------------------------------------------------

class DoNothing:
    def __call__(self, batch) -> None:
        return None


class SleepStep:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, batch) -> None:
        time.sleep(self.seconds)


def test_data_wait_near_one_when_data_is_slow():
    loader = DataLoader(SleepDataset(8, latency_s=0.02), batch_size=1)
    w = measure_data_wait(loader, DoNothing(), steps=5, warmup_steps=1, device="cpu")
    assert isinstance(w, DataWait)
    assert w.steps == 5 and len(w.wait_s) == 5 and len(w.step_s) == 5
    assert min(w.wait_s) >= 0.02 and min(w.step_s) >= 0      # each batch slept 20 ms
    assert 0.5 < w.wait_fraction <= 1.0
    assert w.wait_fraction == pytest.approx(sum(w.wait_s) / (sum(w.wait_s) + sum(w.step_s)))
    text = str(w)
    assert text.startswith("data wait: ") and "% of the loop's time" in text and "5 steps" in text


def test_data_wait_near_zero_when_the_step_is_slow():
    loader = DataLoader(TinyDataset(8), batch_size=2)
    w = measure_data_wait(loader, SleepStep(0.02), warmup_steps=1)
    assert w.steps == 3  # the rest of the epoch after one warm-up step
    assert 0.0 <= w.wait_fraction < 0.5
    assert w.median_step_s >= 0.02 and w.median_iteration_s >= w.median_step_s


def test_data_wait_without_len_runs_to_the_end():
    loader = iter_only(DataLoader(CountingStream(7), batch_size=2))  # 4 batches
    w = measure_data_wait(loader, DoNothing(), warmup_steps=1)
    assert w.steps == 3


def test_data_wait_bad_input():
    loader = DataLoader(TinyDataset(8), batch_size=2)
    with pytest.raises(TypeError, match="step_fn"):
        measure_data_wait(loader, "train")
    with pytest.raises(ValueError, match="steps"):
        measure_data_wait(loader, DoNothing(), steps=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        measure_data_wait(loader, DoNothing(), warmup_steps=4)
    with pytest.raises(TypeError, match="loader"):
        measure_data_wait(None, DoNothing())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_asking_for_cuda_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA"):
        measure(lambda: None, device="cuda")
    loader = DataLoader(TinyDataset(8), batch_size=2)
    with pytest.raises(ValueError, match="CUDA"):
        measure_data_wait(loader, DoNothing(), device="cuda")


def test_merge_pools_repeats_of_interleaved_runs():
    from course_utils.measurement import Measurement
    a = Measurement.from_times("x", [1.0, 2.0], 10, cpu_s_per_sample=0.1, involuntary_ctx_switches=5,
                               peak_uss_bytes=100, machine="m")
    b = Measurement.from_times("x", [3.0], 10, cpu_s_per_sample=0.4, involuntary_ctx_switches=7,
                               peak_uss_bytes=300, machine="m")
    merged = Measurement.merge([a, b])
    assert merged.times_s == [1.0, 2.0, 3.0] and merged.median_s == 2.0
    assert merged.cpu_s_per_sample == pytest.approx((0.1 * 20 + 0.4 * 10) / 30)
    assert merged.involuntary_ctx_switches == 12 and merged.peak_uss_bytes == 300
    with pytest.raises(ValueError, match="non-empty list of Measurement"):
        Measurement.merge([])


def test_merge_scales_uneven_parts_and_keeps_only_their_own_warnings():
    """Parts of different sizes: times scaled to the first part's samples, CPU weighted by the
    samples each part timed, a missing counter makes the total unknown, the first part names the
    result, and the merged result derives its own noise warnings instead of inheriting them."""
    a = Measurement.from_times("first", [1.0, 2.0], 10, cpu_s_per_sample=0.01,
                               involuntary_ctx_switches=5, peak_uss_bytes=100, machine="m1",
                               settings={"w": 1}, warnings=["mine"])
    assert any(w.startswith("few repeats:") for w in a.warnings)          # 2 repeats
    b = Measurement.from_times("second", [3.0], 20, cpu_s_per_sample=0.04,
                               involuntary_ctx_switches=None, peak_uss_bytes=300,
                               peak_pss_bytes=50, machine="m2", settings={"w": 2},
                               warnings=["mine", "other"])
    merged = Measurement.merge([a, b])
    assert merged.label == "first" and merged.items_per_repeat == 10
    assert merged.times_s == pytest.approx([1.0, 2.0, 1.5]) and merged.median_s == pytest.approx(1.5)
    assert merged.cpu_s_per_sample == pytest.approx((0.01 * 20 + 0.04 * 20) / 40)
    assert merged.involuntary_ctx_switches is None
    assert merged.peak_uss_bytes == 300 and merged.peak_pss_bytes == 50
    assert merged.settings == {"w": 1} and merged.machine == "m1"
    assert "mine" in merged.warnings and "other" in merged.warnings
    assert merged.warnings.count("mine") == 1
    assert not any(w.startswith("few repeats:") for w in merged.warnings)   # 3 repeats pooled
    assert Measurement.merge([a, b], label="pooled").label == "pooled"
    no_cpu = Measurement.from_times("x", [1.0], 10, cpu_s_per_sample=None)
    assert Measurement.merge([a, no_cpu]).cpu_s_per_sample is None
    assert Measurement.merge([a, b]).peak_pss_bytes == 50            # the one part that knew it
    with pytest.raises(ValueError, match="non-empty list of Measurement"):
        Measurement.merge([a, "not a measurement"])


# ---- measure_data_wait: what the step receives, and loaders that run out ---------------------------

class NumberedBatches:
    """An iterable without __len__ that yields batches [0], [1], ... [n - 1]."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return (torch.tensor([i]) for i in range(self.n))


def test_every_step_gets_its_batch_in_order_on_the_device_asked_for():
    seen = []
    w = measure_data_wait(NumberedBatches(6), lambda batch: seen.append(batch), steps=4, warmup_steps=2,
                          device="meta")
    assert w.steps == 4 and len(seen) == 6                     # 2 warm-up steps + 4 timed
    assert all(b.device.type == "meta" for b in seen)
    plain = []
    measure_data_wait(NumberedBatches(6), lambda batch: plain.append(batch.item()), steps=4, warmup_steps=2)
    assert plain == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 3, "warmup_steps": 4},
     r"ran out after 3 batches of warmup_steps=4: ask for fewer"),
    ({"steps": 4, "warmup_steps": 1},
     r"ran out after 3 batches of warmup_steps=1 \+ steps=4: ask for fewer"),
])
def test_a_loader_that_runs_out_says_how_far_it_got(kwargs, message):
    with pytest.raises(ValueError, match=message):
        measure_data_wait(NumberedBatches(3), lambda batch: None, **kwargs)


def test_a_default_window_that_ends_during_warm_up_or_early_is_explained():
    with pytest.raises(ValueError, match="no steps were timed: the loader had no batches left"):
        measure_data_wait(NumberedBatches(2), lambda batch: None)              # warm-up of 2 eats it all
    with pytest.raises(ValueError, match=r"epoch ended after 5 batches: .* pulls the 2 in flight untimed"):
        measure_data_wait(NumberedBatches(5), lambda batch: None)              # 3 timed, fewer than 10


def test_a_loop_that_took_no_time_waited_for_nothing(monkeypatch):
    monkeypatch.setattr(timing, "_now", lambda: 7.0)                # a clock that never moves
    w = measure_data_wait(NumberedBatches(3), lambda batch: None, steps=2, warmup_steps=1)
    assert w.wait_fraction == 0.0 and w.step_s == [0.0, 0.0]


def test_a_data_wait_derives_its_figures_from_the_waits_and_steps():
    w = DataWait(wait_s=[0.1, 0.3], step_s=[0.4, 0.2])
    assert (w.steps, sum(w.iteration_s), w.wait_fraction) == pytest.approx((2, 1.0, 0.4))
    assert str(w) == ("data wait: 40% of the loop's time (median wait 200 ms, median step 300 ms "
                      "without it, 2 steps)")


# ---- what a measurement records about the loader and the callable -------------------------------

class FakeLoader:
    """Looks like a DataLoader to measure_loader (settings as attributes), makes no workers."""

    def __init__(self, **settings) -> None:
        self.__dict__.update(settings)

    def __iter__(self):
        return (torch.zeros(2) for _ in range(20))


@pytest.mark.parametrize("settings, start", [
    ({"num_workers": 2, "multiprocessing_context": "forkserver"}, "forkserver"),
    ({"num_workers": 2, "multiprocessing_context": multiprocessing.get_context("spawn")}, "spawn"),
    ({"num_workers": 1}, "the default"),
    ({"num_workers": 0, "multiprocessing_context": "spawn"}, None),
    ({}, None),
], ids=["str", "context", "default", "no-workers", "no-attribute"])
def test_a_loaders_start_method_is_recorded_only_where_it_has_workers(settings, start):
    m = measure_loader(FakeLoader(batch_size=2, persistent_workers=True, **settings), batches=3,
                       warmup_batches=0, repeats=1, progress=False)
    expected = start_method() if start == "the default" else start
    assert m.settings.get("start_method") == expected
    assert m.settings["persistent_workers"] is True and m.settings["batch_size"] == 2


def test_measure_loader_repeats_three_times_by_default():
    assert measure_loader(FakeLoader(), batches=2, warmup_batches=0, progress=False).repeats == 3


@pytest.mark.parametrize("settings, text", [({"batch_size": 2}, " (at least 24 samples at batch_size=2)"),
                                            ({"batch_size": None}, ""), ({}, "")],
                         ids=["batch-size", "none", "no-attribute"])
def test_a_loader_too_short_for_an_honest_window_says_what_it_needs(settings, text):
    class Short(FakeLoader):
        def __len__(self):
            return 4
    with pytest.raises(ValueError) as info:
        measure_loader(Short(**settings), progress=False)
    message = str(info.value)
    assert message.startswith("the loader has only 4 batches per epoch: an honest timing pulls "
                              "warmup_batches=2 untimed")
    assert f"so it needs 12{text}. Use more data" in message


def test_measure_labels_a_callable_without_a_name_by_its_type_and_reads_memory():
    m = measure(functools.partial(sum, [1, 2]), repeats=3)
    assert m.label == "partial"
    assert measure(sum_of_two, repeats=3).label == "sum_of_two"
    if sys.platform.startswith("linux"):
        assert m.peak_uss_bytes > 0 and m.peak_pss_bytes > 0


def sum_of_two() -> int:
    return 1 + 1


def test_measure_defaults_one_warm_up_then_five_repeats_of_one_item():
    calls = []
    m = measure(lambda: calls.append(1))
    assert len(calls) == 1 + 5 and m.repeats == 5 and m.items_per_repeat == 1


def test_a_loader_is_labelled_by_its_settings_and_settings_must_be_a_dict():
    loader = DataLoader(TinyDataset(40), batch_size=2)
    m = measure_loader(loader, batches=2, warmup_batches=0, repeats=1, progress=False)
    assert m.label == "DataLoader(num_workers=0, batch_size=2)"
    plain = measure_loader(FakeLoader(), batches=2, warmup_batches=0, repeats=1, progress=False)
    assert plain.label == "FakeLoader"
    with pytest.raises(TypeError, match="settings must be a dict of names to values, got list"):
        measure_loader(loader, settings=["a"], progress=False)
    with pytest.raises(TypeError, match=r"loader must be iterable .*got int\."):
        measure_loader(3, progress=False)


def _ctrl_c_while_workers_stop(monkeypatch) -> list:
    """The first shutdown of a loader's workers finishes, then meets a Ctrl-C (as if it had
    arrived during the join). Returns a list that gets each shut down iterator's workers."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
    real, calls = _MultiProcessingDataLoaderIter._shutdown_workers, []

    def interrupted(self):
        real(self)
        calls.append(list(self._workers))
        if len(calls) == 1:
            raise KeyboardInterrupt
    monkeypatch.setattr(_MultiProcessingDataLoaderIter, "_shutdown_workers", interrupted)
    return calls


@pytest.mark.parametrize("measure_one", [
    lambda loader: measure_loader(loader, batches=2, warmup_batches=1, repeats=1),
    lambda loader: measure_data_wait(loader, lambda batch: None, steps=2, warmup_steps=1),
], ids=["measure_loader", "measure_data_wait"])
def test_a_ctrl_c_while_the_workers_stop_is_raised_not_lost(monkeypatch, measure_one):
    """Shut down by the iterator's __del__, a Ctrl-C during the join would be printed as
    "Exception ignored" and the measurement would go on: the workers are stopped in the
    measuring frame instead."""
    calls = _ctrl_c_while_workers_stop(monkeypatch)
    loader = DataLoader(TinyDataset(16), batch_size=2, num_workers=1)
    with pytest.raises(KeyboardInterrupt):
        measure_one(loader)
    assert calls and not any(w.is_alive() for w in calls[0])


def test_persistent_workers_outlive_a_measurement(monkeypatch):
    calls = _ctrl_c_while_workers_stop(monkeypatch)
    loader = DataLoader(TinyDataset(16), batch_size=2, num_workers=1, persistent_workers=True)
    measure_loader(loader, batches=2, warmup_batches=1, repeats=2)
    assert calls == [] and all(w.is_alive() for w in loader._iterator._workers)
    with pytest.raises(KeyboardInterrupt):
        loader._iterator._shutdown_workers()
    del loader          # before the patch is undone
