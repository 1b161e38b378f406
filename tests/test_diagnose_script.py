"""``diagnose train.py``: learner scripts of each common shape, run unchanged, timed right.

Each script lives in tests/diagnose_scripts/ and knows nothing of the course. Each run is a
child process of a couple of seconds (see the budgets), so the shapes share runs where they can.
"""
from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from course_utils.tools.diagnose import DATA_BOUND_FRACTION
from course_utils.tools.diagnose.probe import BudgetSpent, GpuSteps, LoaderRecord, Probe, busy_s
from course_utils.tools.diagnose.rules import LOAD_BUSY
from course_utils.tools.diagnose.script import ScriptDiagnosis, likely_causes, run_script

SCRIPTS = Path(__file__).parent / "diagnose_scripts"


def _run(name, *argv, budget=2.0, **kw):
    return run_script(str(SCRIPTS / name), list(argv), module=False, budget_s=budget, **kw)


@pytest.fixture(scope="module")
def plain():
    """A plain loop with argparse, main(), training and validation loaders, no workers."""
    return _run("plain_loop.py", "--sample-ms", "3")


def test_a_plain_script_with_a_validation_loader(plain):
    assert plain.end == "the budget was spent" and plain.status == 0
    train, val = plain.loaders
    assert plain.main_loader() is train
    s = train.raw["settings"]
    assert (s["num_workers"], s["batch_size"], s["dataset"], s["start_method"]) == (
        0, 8, "SlowSamples", "main process")
    made = {line.split(" = ")[0].strip(): k for k, line in
            enumerate((SCRIPTS / "plain_loop.py").read_text().splitlines(), 1) if "= DataLoader(" in line}
    assert train.raw["where"].endswith(f"plain_loop.py:{made['train']}")
    assert val.raw["where"].endswith(f"plain_loop.py:{made['val']}") and val.raw["settings"]["batch_size"] == 8
    assert train.raw["epochs"] > 1 and train.timed_batches == train.raw["batches"] - 2
    assert train.raw["batch"] == "float32 (8, 3, 8, 8)"
    # 8 samples x 3 ms to load, about 1 ms of step: the wait is most of the loop
    assert train.wait_fraction > 0.6
    assert ScriptDiagnosis("plain", plain, "data-bound", []).main() is train
    # its samples sleep: the loop thread waited without computing, so CPU is not the cause
    assert train.load_busy() < LOAD_BUSY
    assert not any("per-sample CPU cost" in c for c in likely_causes(train, cuda=False))


def test_a_dataset_that_computes_is_named_as_the_cause():
    run = _run("plain_loop.py", "--sample-ms", "3", "--spin")
    train = run.main_loader()
    assert train.load_busy() > LOAD_BUSY and train.wait_fraction > 0.6
    assert 1e-3 < train.cpu_per_sample_s() < 15e-3  # 3 ms spun per sample (+ queueing on a busy
    # machine: schedstat counts it), not per batch of 8 (24 ms and more)
    causes = likely_causes(train, cuda=False)
    assert causes[0].startswith("the per-sample CPU cost in SlowSamples (decode, transforms, "
                                "conversions): ")
    assert not any("float32" in c for c in causes)        # no device: nothing about copies to one


def test_a_short_validation_loader_gets_no_figures_and_not_the_verdict():
    """A Lightning-style trainer validates (6 batches) before it trains: 4 timed after warm-up."""
    run = _run("trainer_with_validation.py", budget=3.0)
    train, val = run.loaders
    assert (val.raw["batches"], val.timed_batches, val.measured) == (6, 4, False)
    assert val.wait_fraction is None and val.samples_per_s is None
    assert run.main_loader() is train and train.measured
    text = str(ScriptDiagnosis("t.py", run, "compute-bound", []))
    assert ("  no figures: 6 batch(es), 4 timed after the 2 of warm-up, fewer than the 10 a figure "
            "needs (a batch is timed once its step has ended)") in text.splitlines()
    assert "loader 0 (the loop)" in text and "loader 1 (the loop)" not in text


def test_a_fix_is_applied_where_the_loader_is_made_and_measured(plain):
    changes = {"num_workers": 2, "persistent_workers": True}
    fixed = _run("plain_loop.py", "--sample-ms", "3", overrides={0: changes}, label="2 workers")
    train, val = fixed.loaders
    s = train.raw["settings"]
    assert (s["num_workers"], s["persistent_workers"]) == (2, True) and train.raw["overridden"] == changes
    assert val.raw["settings"]["num_workers"] == 0 and val.raw["overridden"] == {}
    assert train.raw["workers_seen"] == 2 and train.raw["epochs"] > 1       # kept across epochs
    # the fix's figure is measured (no wall-clock speed asserted: on a shared 2-core machine
    # the samples' 3 ms sleeps do not guarantee a margin; the gain's arithmetic is pinned in
    # tests/test_diagnose_cli.py on hand-made figures)
    gain = ScriptDiagnosis("plain", plain, "data-bound", [], fixes=[fixed]).gain(fixed)
    assert gain is not None and gain > 0


def test_a_trainer_class_with_persistent_workers_across_epochs_is_compute_bound():
    run = _run("trainer_class.py", budget=4.0)
    [loader] = run.loaders
    assert loader.raw["settings"]["persistent_workers"] is True
    assert loader.raw["epochs"] >= 2 and loader.raw["workers_seen"] == 1  # the same worker
    assert loader.wait_fraction < DATA_BOUND_FRACTION
    assert 0.095 < loader.mean_step_s() < 0.5                               # its 100 ms step


def test_an_iterable_dataset_is_timed():
    run = _run("iterable_stream.py")
    [loader] = run.loaders
    assert loader.raw["settings"]["iterable_dataset"] is True
    assert loader.raw["settings"]["dataset"] == "Stream"
    assert loader.timed_batches > 10 and loader.wait_fraction > 0.6


@pytest.mark.parametrize("method, spin", [("spawn", False), ("forkserver", True)])
def test_workers_import_the_scripts_classes_under(method, spin):
    # the budget includes the worker's own start-up (it imports torch under spawn and
    # forkserver), which takes seconds on a busy 2-core machine: 3 s could leave no batch timed
    run = _run("plain_loop.py", "--workers", "1", "--start", method, "--persistent",
               *["--spin"] * spin, budget=5.0)
    train = run.main_loader()
    assert run.status == 0 and train is not None, (run.end, run.status, run.loaders)
    assert train.raw["settings"]["start_method"] == method
    assert train.timed_batches > 5 and train.raw["workers_seen"] == 1
    assert train.wait_fraction > DATA_BOUND_FRACTION
    # the worker's CPU over its sampled time: spinning samples keep it busy, sleeping ones not
    assert (train.load_busy() > LOAD_BUSY) is spin, train.load_busy()


def test_the_wait_agrees_with_the_scripts_own_data_time_meter(tmp_path):
    """pytorch/examples' ImageNet script keeps ``data_time``: the time before each batch came."""
    meter = tmp_path / "meter.json"
    run = _run("data_time_meter.py", "--meter", str(meter))
    loader = run.main_loader()
    ours = np.asarray(loader.raw["waits_s"])
    theirs = np.asarray(json.loads(meter.read_text()))
    skip = loader.raw["warmup_batches"]                    # the start-up's batch among them
    theirs = theirs[skip:skip + len(ours)]
    assert len(ours) > 20 and len(theirs) == len(ours)
    assert abs(ours.mean() - theirs.mean()) <= max(0.10 * theirs.mean(), 1e-3)


# ---- the probe in this process: what it counts, what it changes ---------------------------
def _loader(**kw):
    return DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2, **kw)


def test_the_record_counts_after_start_up_and_warm_up():
    r = LoaderRecord(0, _loader(), "t.py:1", {})           # no workers: default_warmup's 2
    r.epoch_starts(9.9)                                     # iter(): the start-up runs from here
    for t0, t1 in ((10.0, 10.5), (10.6, 10.7), (10.8, 10.85)):  # start-up, warm-up, first timed
        r.step_ends(t0)
        r.arrived(t0, t1, (torch.zeros(2, 2),), busy=0.03)
    r.step_ends(11.0)                                       # the loop body on the timed batch
    r.epoch_ends()
    r.epoch_starts(11.1)
    r.step_ends(11.2)                                       # nothing was in flight: no step
    assert r.arrived(11.2, 11.5, (torch.zeros(3, 2),), busy=0.2) is True  # an epoch's first
    r.step_ends(11.9)
    r.arrived(11.9, 11.95, (torch.zeros(2, 2),), busy=0.01)    # its step never ends: not timed
    r.epoch_starts(12.0)                                    # a loop that broke out of its epoch
    assert r.startup_s == pytest.approx(0.6) and r.epochs == 3 and r.batches == 5
    assert r.batch == "float32 (2, 2)"
    assert r.waits == pytest.approx([0.05, 0.4])            # an epoch's first wait runs from iter()
    assert r.steps == pytest.approx([0.15, 0.4]) and r.samples == 5
    assert r.wait_busy_s == pytest.approx(0.23) and r.epoch_start_wait_s == pytest.approx(0.4)
    assert LoaderRecord(1, _loader(num_workers=1, prefetch_factor=1), "", {}).warmup == 2
    r = LoaderRecord(1, _loader(num_workers=2, prefetch_factor=3), "", {})
    r.epoch_starts(0.0)
    for k in range(8):
        r.step_ends(float(k))
        r.arrived(float(k), k + 0.5, (torch.zeros(2, 2),))
    assert r.warmup == 6 and len(r.waits) == 1          # timing.default_warmup: 6 in flight


def test_overrides_apply_where_the_loader_is_made_and_are_undone():
    class MyLoader(DataLoader):                             # a subclass is recorded once
        def __init__(self, data, **kw):
            super().__init__(data, batch_size=2, **kw)

    probe = Probe(budget_s=60, overrides={1: {"num_workers": 0}})
    probe.install()
    try:
        first = MyLoader(TensorDataset(torch.zeros(8, 2)))
        second = _loader(num_workers=2, prefetch_factor=4, persistent_workers=True)
        assert second.num_workers == 0 and second.prefetch_factor is None
        assert not second.persistent_workers                  # what num_workers=0 requires
        assert [len(list(loader)) for loader in (first, second, second)] == [4, 4, 4]
    finally:
        probe.stop()
        probe.uninstall()
    assert [r.overridden for r in probe.records] == [{}, {"num_workers": 0}]
    assert probe.records[0].settings["dataset"] == "TensorDataset"
    assert [r.epochs for r in probe.records] == [1, 2] and probe.records[1].batches == 8
    assert _loader(num_workers=2).num_workers == 2 and not hasattr(_loader(), "_course_probe")


def test_busy_seconds_count_computing_not_sleeping():
    """The probe's busy clock: a thread that sleeps is idle, one that spins is busy all along
    (running or queued for a CPU on a loaded machine, still computing)."""
    def busy_over(work):
        b0, t0 = busy_s(), time.perf_counter()
        work()
        return (busy_s() - b0) / (time.perf_counter() - t0)

    def spin():
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:
            pass
    assert busy_over(lambda: time.sleep(0.05)) < 0.3 and busy_over(spin) > 0.7
    assert busy_s(str(os.getpid())) > 0                   # a process: its main thread


def test_a_fix_that_exceeds_torchs_suggested_workers_prints_no_warning():
    many = 4 * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    probe = Probe(budget_s=60, overrides={0: {"num_workers": many}})
    probe.install()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fixed = _loader()                                # overridden: made with `many` workers
            theirs = _loader(num_workers=many)               # the script's own: torch warns
    finally:
        probe.uninstall()
    assert fixed.num_workers == theirs.num_workers == many
    assert [str(w.message).startswith("This DataLoader will create") for w in caught] == [True]


def test_the_probe_samples_each_workers_cpu_and_threads_and_leaves_older_loaders_alone():
    before = _loader()                                      # made before the probe: not timed
    probe = Probe(budget_s=60)
    probe.install()
    try:
        assert len(list(before)) == 4 and probe.records == []
        loader = _loader(num_workers=1, persistent_workers=True)
        for _ in range(2):
            assert len(list(loader)) == 4
    finally:
        probe.stop()
        probe.uninstall()
    [r] = probe.records
    data = r.to_dict()
    assert data["workers_seen"] == 1 and len(data["worker_threads"]) == 1   # the same worker, twice
    assert data["worker_threads"][0] >= 1 and data["worker_busy_s"] >= 0
    assert data["gpu_busy"] is None
    assert data["settings"]["start_method"] not in ("main process", None)


def test_past_the_deadline_the_next_batch_ends_the_run():
    probe = Probe(budget_s=0)
    probe.install()
    try:
        it = iter(_loader(num_workers=1))
        with pytest.raises(BudgetSpent):
            next(it)
    finally:
        probe.uninstall()
    assert probe.records[0].batches == 0
    assert it._shutdown and not any(w.is_alive() for w in it._workers)   # stopped, not left to __del__


class FakeEvent:
    """A CUDA event stand-in: stamped from a list of times (ms) when recorded."""
    clock: list = []

    def __init__(self):
        self.at = FakeEvent.clock.pop(0)

    def elapsed_time(self, other):
        return other.at - self.at


@pytest.mark.parametrize("stamps, share", [
    ([0, 8, 10, 18], 16 / 18),        # two 8 ms steps with a 2 ms wait between them
    ([0, 8, 10, 18, 20, 28], 24 / 28),
    ([0, 0.2, 0.3, 0.5], 0.8),        # short steps count too
    ([0, 10, 5, 8], 1.0),             # overlapping stamps never read above 1
    ([5, 5, 5, 5], None),             # no time passed: no share
    ([0, 8], None),                   # one step: no share
])
def test_the_gpu_busy_share_from_events_around_each_step(monkeypatch, stamps, share):
    monkeypatch.setattr(GpuSteps, "active", staticmethod(lambda: True))
    monkeypatch.setattr(GpuSteps, "event", staticmethod(FakeEvent))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    FakeEvent.clock = list(stamps)
    steps = GpuSteps()
    for _ in range(len(stamps) // 2):
        steps.started()
        steps.ended()
    assert len(steps.pairs) == len(stamps) // 2
    steps.ended()                     # no open step: nothing recorded
    assert steps.busy_share() == (None if share is None else pytest.approx(share))
