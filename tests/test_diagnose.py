"""`diagnose`: the verdict on a data-bound and a compute-bound loop, measured fixes, bad input.

Every rule (verdict, thread pools, loader alone, step slowdown) is pinned just inside and just
outside its threshold on faked timings; real runs assert only what no busy machine can change."""
from __future__ import annotations

import json
import multiprocessing
import textwrap

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import course_utils.tools.diagnose.loop as d
from course_utils.__main__ import main
from course_utils.tools.diagnose import (DATA_BOUND_FRACTION, LOADER_ALONE_FACTOR, POOL_THREADS,
                                         STEP_SLOWDOWN_FACTOR, DiagnoseError, LoopTiming,
                                         build_loop, load_target, loader_barely_faster,
                                         runs_own_pools, step_slowed, time_loop, verdict)

from _helpers import ROOT


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _no_children_left(before: set[int]) -> None:
    """Nothing diagnose started is still running (a forkserver or resource tracker that another
    test started earlier in this process may be, and is not diagnose's)."""
    assert not multiprocessing.active_children()
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before
            and "resource_tracker" not in " ".join(p.cmdline())]   # multiprocessing's own helper
    assert not left, [p.cmdline() for p in left]


@pytest.mark.timeout(240)
def test_data_bound_example_is_data_bound_with_measured_fixes(tmp_path, capsys):
    before = _children()
    out = tmp_path / "d.json"
    assert main(["diagnose", "course_utils.tools.examples.data_bound:make_loop", "--budget", "8",
                 "--steps", "40", "--no-progress", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["verdict"] == "data-bound", result
    assert result["data_wait_fraction"] > 0.1
    assert any("too few workers" in c for c in result["causes"])
    assert any("float32" in c for c in result["causes"])
    changes = [s["change"] for s in result["suggestions"]]
    assert "num_workers=1" in changes or "num_workers=2" in changes, changes
    for s in result["suggestions"]:           # measured, not asserted: every figure is a timing
        assert s["seconds_per_step"] > 0 and s["gain"] > 0
    assert set(result["wait_tail_s"]) == {"p50", "p95", "p99"}
    text = capsys.readouterr().out
    assert "DATA-BOUND" in text and "measured on the same loop" in text
    _no_children_left(before)


@pytest.mark.timeout(240)
def test_compute_bound_example_is_compute_bound(tmp_path):
    out = tmp_path / "c.json"
    assert main(["diagnose", "course_utils.tools.examples.compute_bound:make_loop", "--budget", "6",
                 "--steps", "12", "--no-progress", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    # no timed threshold here (the rule is pinned on faked timings below): the verdict is the
    # rule applied to the fraction measured, and the fraction is far from a loop that waits
    # (its step is a CNN, its batches ready tensors; counting the step as wait would read ~1)
    assert result["verdict"] == verdict(result["data_wait_fraction"]), result
    assert 0 <= result["data_wait_fraction"] < 0.5, result
    assert (result["suggestions"] == []) == (result["verdict"] == "compute-bound"), result
    assert result["seconds_per_step_without_data"] > 0 and result["loader_samples_per_s"] > 0


SCRIPT = '''
import time

import torch
from torch.utils.data import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.full((4,), float(i * i))

class SlowSquares(Squares):
    def __len__(self):
        return 160                    # 20 batches: warm-up and the timed steps in one epoch
    def __getitem__(self, i):
        time.sleep(0.005)             # 40 ms per batch of 8, against a step of microseconds
        return super().__getitem__(i)

def make_loop():
    loader = DataLoader(SlowSquares(), batch_size=8, num_workers=1, multiprocessing_context="spawn")
    return loader, lambda batch: batch.sum().item()

def not_a_pair():
    return 1, 2, 3

def bad_step():
    return DataLoader(Squares(), batch_size=8), lambda batch: 1 / 0

def raises():
    raise RuntimeError("no data folder")
'''


@pytest.mark.timeout(240)
def test_a_file_target_with_its_own_dataset_runs_under_spawn(tmp_path, capsys):
    before = _children()
    script = tmp_path / "learner_train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "s.json"
    assert main(["diagnose", f"{script}:make_loop", "--budget", "4", "--steps", "10",
                 "--no-progress", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["start_method"] == "spawn"
    # the step takes microseconds, each batch 40 ms of sleeps: only data can be waited for
    assert result["verdict"] == "data-bound" and result["data_wait_fraction"] > 0.5, result
    assert len(result["worker_threads"]) == 1
    _no_children_left(before)


@pytest.mark.parametrize("target, message", [
    ("no_colon", "no such script; pass your training script"),
    ("surely_not_a_module_xyz:make", "cannot be imported"),
    ("{script}:missing", "has no 'missing'"),
    ("{script}:not_a_pair", "must return (loader, step)"),
    ("{script}:bad_step", "step(batch) raised ZeroDivisionError"),
    ("{script}:raises", "raises() raised RuntimeError: no data folder"),
    ("{dir}/nowhere.py:make", "no such file"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, target, message):
    script = tmp_path / "learner_bad.py"
    script.write_text(textwrap.dedent(SCRIPT))
    target = target.format(script=script, dir=tmp_path)
    assert main(["diagnose", target, "--budget", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert "Traceback" not in err


def test_bad_budget_and_steps(capsys):
    assert main(["diagnose", "x:y", "--budget", "0"]) == 2
    assert "--budget" in capsys.readouterr().err
    assert main(["diagnose", "x:y", "--steps", "0"]) == 2
    assert "--steps" in capsys.readouterr().err


def test_build_loop_checks_the_pieces():
    with pytest.raises(DiagnoseError, match="must be iterable"):
        build_loop(lambda: (3, print))
    with pytest.raises(DiagnoseError, match="must be a function step"):
        build_loop(lambda: ([1, 2], "step"))
    assert callable(load_target("course_utils.tools.examples.compute_bound:make_loop"))


class _SlowStartLoader:
    """A loader-like iterable: 12 batches an epoch, 16 workers x 2 prefetch slots, and a start-up
    per epoch (like starting worker processes) of ``startup_s`` seconds."""

    num_workers, prefetch_factor = 16, 2

    def __init__(self, startup_s: float) -> None:
        self.startup_s = startup_s

    def __len__(self) -> int:
        return 12

    def __iter__(self):
        import time
        import torch
        time.sleep(self.startup_s)
        for i in range(12):
            yield torch.full((4, 2), float(i))


def test_warmup_is_capped_by_the_epoch_so_steps_are_timed():
    from course_utils.tools.diagnose import time_loop
    timing = time_loop(_SlowStartLoader(0.25), lambda batch: None, max_steps=100, seconds=0.3,
                       label="num_workers=16")
    assert timing.warmup_steps == 6            # half of a 12-batch epoch, not 16 x 2 = 32
    assert timing.steps >= 1 and timing.seconds_per_step > 0


def _fake_timing(label: str, wait: float, step: float, steps: int, warmup: int = 2,
                 worker_threads: list[int] | None = None):
    return LoopTiming(label, [wait] * steps, [step] * steps, 8 * steps, 0.01, warmup,
                      worker_threads or [])


def _patched_diagnose(monkeypatch, fixes: dict, num_workers: int = 0):
    """``diagnose`` on a small DataLoader (never iterated with workers) with ``time_loop``
    faked: the loop is data-bound unless ``fixes`` says otherwise, and each run (by label) gets
    the timing in ``fixes`` (a fix not there: 4 ms wait + 1 ms step)."""
    import math
    import torch
    from torch.utils.data import DataLoader

    timings = {"your loop": _fake_timing("your loop", 0.009, 0.001, 20),
               "loader alone": _fake_timing("loader alone", 0.009, 0.0, 20), **fixes}
    seen = []

    def fake_time_loop(loader, step, *, max_steps, seconds, label, tick=None):
        seen.append((label, seconds))
        return timings.get(label) or _fake_timing(label, 0.004, 0.001, 20)

    monkeypatch.setattr(d, "time_loop", fake_time_loop)
    monkeypatch.setattr(d, "usable_cpus", lambda: 16)
    loader = DataLoader(torch.zeros(24, 4), batch_size=2, num_workers=num_workers)
    result = d.diagnose(loader, lambda batch: None, budget_s=10, progress=False)
    for s in result.suggestions:
        assert all(math.isfinite(v) for v in s.values() if isinstance(v, float)), s
    return result, dict(seen)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")   # none is started
def test_a_fix_that_timed_no_step_is_a_note_not_a_nan_suggestion(monkeypatch):
    from course_utils.tools.diagnose import LoopTiming
    result, seen = _patched_diagnose(monkeypatch, {
        "num_workers=1": _fake_timing("num_workers=1", 0.004, 0.001, 20),
        "num_workers=16": LoopTiming("num_workers=16", [], [], 0, 1.2, 32)})
    assert result.verdict == "data-bound"
    assert [s["change"] for s in result.suggestions] == ["num_workers=1"]
    assert result.suggestions[0]["gain"] == pytest.approx(2.0)
    note = [n for n in result.notes if n.startswith("not measured: num_workers=16")]
    assert note == [f"not measured: num_workers=16 timed no step in {seen['num_workers=16']:.1f} s "
                    f"(32 warm-up batches)"], result.notes
    assert "nan" not in str(result).lower()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")   # none is started
def test_a_zero_step_time_in_the_loop_does_not_divide_by_zero(monkeypatch):
    loop = _fake_timing("your loop", 0.009, 0.0, 20)            # step_s all 0: base_step is 0
    result, _ = _patched_diagnose(monkeypatch, {
        "num_workers=1": _fake_timing("num_workers=1", 0.004, 0.002, 20),
        "num_workers=16": _fake_timing("num_workers=16", 0.001, 0.003, 20)} | {"your loop": loop})
    assert [s["change"] for s in result.suggestions] == ["num_workers=1", "num_workers=16"]
    assert not any("x as long" in n for n in result.notes), result.notes


def test_json_output_is_strict_json_without_nan_or_infinity(tmp_path, capsys):
    from course_utils.tools.cli import print_and_save

    class Result:
        def __str__(self) -> str:
            return "a result"

        def to_dict(self) -> dict:
            return {"gain": float("nan"), "rows": [1.5, float("inf"), {"low": float("-inf")}],
                    "pair": (2.0, float("nan")), "name": "x", "n": 3}

    def no_constants(name: str):
        raise ValueError(f"{name} is not JSON")

    out = tmp_path / "r.json"
    print_and_save(Result(), str(out))
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text, parse_constant=no_constants) == {
        "gain": None, "rows": [1.5, None, {"low": None}], "pair": [2.0, None], "name": "x", "n": 3}
    assert "a result" in capsys.readouterr().out


# ---- the rules, just inside and just outside each threshold -------------------------------

def test_the_rules_flip_exactly_at_their_thresholds():
    assert verdict(DATA_BOUND_FRACTION * 1.01) == "data-bound"
    assert verdict(DATA_BOUND_FRACTION * 0.99) == verdict(0.0) == "compute-bound"
    assert runs_own_pools([1, POOL_THREADS + 1]) and not runs_own_pools([POOL_THREADS, 1])
    assert not runs_own_pools([])
    assert loader_barely_faster(100 * LOADER_ALONE_FACTOR * 0.99, 100)
    assert not loader_barely_faster(100 * LOADER_ALONE_FACTOR * 1.01, 100)
    assert step_slowed(0.010, 0.010 * STEP_SLOWDOWN_FACTOR * 1.01)
    assert not step_slowed(0.010, 0.010 * STEP_SLOWDOWN_FACTOR * 0.99)
    assert not step_slowed(0.0, 1.0)                        # no division by a zero step


def test_the_threshold_is_the_one_lesson_08_teaches():
    """Exercise 08 tells learners that its threshold=0.10 is diagnose's 10 %."""
    text = (ROOT / "solutions" / "08_find_the_stall.ipynb").read_text(encoding="utf-8")
    assert f"threshold={DATA_BOUND_FRACTION:.2f}" in text
    assert f"use the same {DATA_BOUND_FRACTION * 100:.0f} %" in text


def _loop_waiting(fraction: float, steps: int = 20) -> LoopTiming:
    """A loop of 10 ms steps that waited ``fraction`` of its time."""
    return _fake_timing("your loop", 0.010 * fraction, 0.010 * (1 - fraction), steps)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")   # none is started
@pytest.mark.parametrize("scale, bound", [(1.01, "data-bound"), (0.99, "compute-bound")])
def test_diagnose_gives_the_verdict_of_the_rule(monkeypatch, scale, bound):
    result, seen = _patched_diagnose(monkeypatch, {"your loop": _loop_waiting(
        DATA_BOUND_FRACTION * scale)})
    assert result.verdict == bound
    assert result.data_wait_fraction == pytest.approx(DATA_BOUND_FRACTION * scale)
    if bound == "compute-bound":                 # nothing to fix, nothing tried
        assert result.causes == [] and result.suggestions == []
        assert set(seen) == {"your loop", "loader alone"}
    else:
        assert result.suggestions and set(seen) > {"your loop", "loader alone"}


@pytest.mark.filterwarnings("ignore:This DataLoader will create")   # none is started
@pytest.mark.parametrize("threads, flagged", [(POOL_THREADS + 1, True), (POOL_THREADS, False)])
def test_pools_in_workers_are_a_cause_and_a_fix_above_pool_threads(monkeypatch, threads, flagged):
    loop = _fake_timing("your loop", 0.009, 0.001, 20, worker_threads=[1, threads])
    result, seen = _patched_diagnose(monkeypatch, {"your loop": loop}, num_workers=2)
    assert any("thread pools inside the workers" in c for c in result.causes) is flagged
    assert ("worker_init_fn limits pools to 1" in seen) is flagged


@pytest.mark.filterwarnings("ignore:This DataLoader will create")   # none is started
@pytest.mark.parametrize("scale, flagged", [(0.99, True), (1.01, False)])
def test_a_loader_alone_barely_faster_is_a_cause(monkeypatch, scale, flagged):
    # the loop: 160 samples in 20 x 10 ms = 800 samples/s; the loader alone: scale x 1.2 x that
    alone_s = 0.2 / (LOADER_ALONE_FACTOR * scale)
    alone = _fake_timing("loader alone", alone_s / 20, 0.0, 20)
    result, _ = _patched_diagnose(monkeypatch, {"loader alone": alone})
    assert alone.samples_per_s == pytest.approx(result.loop.samples_per_s * LOADER_ALONE_FACTOR
                                                * scale)
    assert any("barely faster than the loop" in c for c in result.causes) is flagged


@pytest.mark.filterwarnings("ignore:This DataLoader will create")   # none is started
@pytest.mark.parametrize("scale, noted", [(1.01, True), (0.99, False)])
def test_a_fix_that_slows_the_step_gets_a_note(monkeypatch, scale, noted):
    fixed = _fake_timing("num_workers=1", 0.001, 0.001 * STEP_SLOWDOWN_FACTOR * scale, 20)
    result, _ = _patched_diagnose(monkeypatch, {"num_workers=1": fixed})
    notes = [n for n in result.notes if n.startswith("with num_workers=1 the step itself took")]
    assert bool(notes) is noted, result.notes


def test_time_loop_splits_each_step_into_its_compute_and_the_next_wait(monkeypatch):
    """A fake clock: fetching batch i costs waits[i], stepping it computes[i] (seconds). Batch 0
    is the start-up, step 0 the warm-up; timed step i pairs its compute with the wait for the
    batch after it."""
    clock = [100.0]
    monkeypatch.setattr(d, "_now", lambda: clock[0])
    waits, computes, sizes = [2.0, 9.0, 0.1, 0.3, 0.2], [9.0, 0.5, 0.1, 0.8], [1, 2, 3, 4, 5]

    class Loader:                                        # no len, no workers: warm-up is 1 step
        def __iter__(self):
            for seconds, size in zip(waits, sizes):
                clock[0] += seconds
                yield d.torch.zeros(size, 1)

    def step(batch) -> None:
        clock[0] += computes.pop(0)

    t = time_loop(Loader(), step, max_steps=3, seconds=1e6, label="fake")
    assert (t.startup_s, t.warmup_steps, t.steps) == (pytest.approx(2.0), 1, 3)
    assert t.step_s == pytest.approx([0.5, 0.1, 0.8])
    assert t.wait_s == pytest.approx([0.1, 0.3, 0.2])
    assert t.wait_fraction == pytest.approx(0.6 / 2.0)
    assert t.seconds_per_step == pytest.approx(2.0 / 3)
    assert t.samples == 2 + 3 + 4 and t.samples_per_s == pytest.approx(9 / 2.0)


# ---- bad input: one line, exit 2 -------------------------------------------------------------

BROKEN = '''
from torch.utils.data import DataLoader, Dataset

class Broken(Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        raise ValueError(f"cannot decode image {i}")

def in_process():
    return DataLoader(Broken(), batch_size=4), lambda batch: None

def in_a_worker():
    return DataLoader(Broken(), batch_size=4, num_workers=1), lambda batch: None

def empty():
    return DataLoader([], batch_size=4), lambda batch: None
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("function, message", [
    ("in_process", "the loader raised ValueError while loading a batch: cannot decode image 0"),
    ("in_a_worker", "the loader raised ValueError in DataLoader worker process 0 while loading "
                    "a batch: cannot decode image 0"),
    ("empty", "the loader gave no batch"),
])
def test_a_loader_that_fails_is_one_line_and_exit_2(tmp_path, capsys, function, message):
    script = tmp_path / "learner_broken.py"
    script.write_text(textwrap.dedent(BROKEN))
    assert main(["diagnose", f"{script}:{function}", "--budget", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_folder_named_like_the_module_is_not_a_file_target(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "course_utils").mkdir()               # e.g. a checkout's folder of that name
    assert main(["diagnose", "course_utils:__version__", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no such file" not in err, err
    assert len(err.splitlines()) == 1 and "is a str, not a function" in err, err


def test_persistent_workers_across_an_epoch_end_do_not_crash_the_loop():
    """The loop used to shut the iterator down at each epoch end; a persistent-workers loader
    then handed the dead iterator back (``ValueError: Queue ... is closed``)."""
    data = TensorDataset(torch.arange(16.0))
    loader = DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)
    first = d.time_loop(loader, lambda batch: None, max_steps=10, seconds=30, label="x")
    assert first.steps == 10                           # 4 batches an epoch: crossed two ends
    again = d.time_loop(loader, lambda batch: None, max_steps=3, seconds=30, label="y")
    assert again.steps == 3                            # and the loader still works afterwards
