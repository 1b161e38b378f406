"""The loader tuner: budget, early stopping, result consistency (the search and the side by side
score alike; the side by side's winner is recommended), the consumer (training step), the code
to paste (plain torch and the course's), Ctrl-C, image folders, CLI errors.

Tiny datasets and budgets keep every test to seconds; no timing claim is asserted (the one
overlap test rests on sleeps, with a 2x margin).
"""
from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import multiprocessing.resource_sharer
import os
import signal
import subprocess
import sys
import time
import warnings

import cv2
import matplotlib
import psutil
import pytest
import torch
from torch.utils.data import DataLoader

import course_utils.tools.tune.search as tuning
import course_utils.tools.tune.window as tune_window
from course_utils import JpegDataset
from course_utils.__main__ import main
from course_utils.data import LatencyDataset
from course_utils.tools import tune_loader
from course_utils.measurement import Measurement, compare
from course_utils.config import QUICK_STAMP, quick_mode
from course_utils.tools.tune.result import epoch_row
from course_utils.tools.tune.search import (LoaderSettings, TuningInterrupted,
                                            TuningResult, epoch_score)
from course_utils.tools.tune.window import (QuietInit, Timed, drop_fd_sharer_resets,
                                            measure_window, rebuilt)

from _helpers import ROOT, TinyDataset

matplotlib.use("Agg")
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def small_jpegs():
    return JpegDataset(n=64, min_side=48, max_side=96)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory, small_jpegs):
    root = tmp_path_factory.mktemp("images")
    for i in range(24):
        image, label = small_jpegs[i]
        (root / f"c{label % 2}").mkdir(exist_ok=True)
        cv2.imwrite(str(root / f"c{label % 2}" / f"{i}.jpg"), image[..., ::-1])
    return root


@pytest.fixture(scope="module")
def result(small_jpegs):
    return tune_loader(small_jpegs, budget_s=6, size=32, batch_size=8, worker_counts=[0, 1],
                       batch_sizes=[8, 16], progress=False)


def test_result_is_consistent(result):
    assert isinstance(result, TuningResult)
    assert isinstance(result.best, LoaderSettings)
    assert result.best_trial in result.trials and result.best_trial.complete
    complete = [t for t in result.trials if t.complete]
    assert result.best_trial.score == max(t.score for t in complete)
    # the side by side decides: its best row is recommended, never a worse one
    assert result.scores[result.winner] == max(result.scores.values())
    assert result.best == result.candidates[result.winner]
    assert result.candidates["tuned"] == result.best_trial.settings
    # every trial's settings appear in the table, in order
    table = result.table()
    for t in result.trials:
        assert t.settings.label() in table
    assert "<- best of the search" in table
    text = str(result)
    assert "Code to paste" in text and "pin_memory" in text and "Recommended:" in text
    # made in quick mode (as the suite runs), it says so on its first line and on its verdict
    assert result.quick == quick_mode() and text.startswith(QUICK_STAMP) == result.quick
    assert ("(quick mode) Recommended:" in text) == result.quick
    assert QUICK_STAMP not in str(dataclasses.replace(result, quick=False))
    assert "<- recommended" in str(result.side_by_side_rows())
    assert [t.index for t in result.trials] == list(range(1, len(result.trials) + 1))


def test_search_and_side_by_side_use_one_score(result):
    """Every trial and every side-by-side row: epoch_score of its own rate and start-up."""
    e = result.epoch_samples
    for t in result.trials:
        if t.measurement is not None:
            assert t.score == pytest.approx(epoch_score(t.samples_per_s, t.startup_s,
                                                        t.settings.batch_size, e))
    for m in result.comparison.rows:
        assert result.scores[m.label] == pytest.approx(epoch_score(
            m.samples_per_s, result.startups[m.label], result.candidates[m.label].batch_size, e))
    assert result.consumer.startswith("none")
    assert epoch_score(100.0, 1.0, 10, 110) == pytest.approx(110 / 2.0)
    assert epoch_score(0.0, 1.0, 10, 110) == 0.0


def test_an_epoch_row_is_the_score_with_the_windows_cpu():
    """64 samples in 0.5 s (128/s), a 1 s start-up, batches of 8, epochs of 1000: the epoch lasts
    1 + 992 / 128 = 8.75 s, so its row reads 1000 / 8.75 samples/s; CPU and memory carry over."""
    window = Measurement.from_times("w", [0.5], 64, cpu_s_per_sample=2e-3, peak_uss_bytes=10**6)
    row = epoch_row("w=1 bs=8", window, 1.0, 8, 1000)
    assert row.samples_per_s == pytest.approx(1000 / 8.75) == pytest.approx(epoch_score(128, 1, 8, 1000))
    assert row.times_s == [pytest.approx(8.75)] and row.items_per_repeat == 1000
    assert (row.cpu_s_per_sample, row.peak_uss_bytes, row.label) == (2e-3, 10**6, "w=1 bs=8")


def test_pin_memory_skip_is_explained_without_cuda(result):
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: pin_memory is tried")
    assert any("pin_memory=True" in s and "no CUDA" in s for s in result.skipped)
    assert not any(t.settings.pin_memory for t in result.trials)


def test_code_to_paste_builds_the_best_loader(result, small_jpegs):
    code = result.code_course()
    assert "DataLoader(" in code and f"batch_size={result.best.batch_size}" in code
    if result.best.num_workers and result.best.threads_per_worker:
        assert f"worker_init_fn=make_worker_init({result.best.threads_per_worker})" in code
    assert result.code_plain() in result.code() and code in result.code()
    scope = {"dataset": small_jpegs}
    exec(code, scope)
    loader = scope["loader"]
    assert isinstance(loader, DataLoader)
    assert loader.batch_size == result.best.batch_size
    assert loader.num_workers == result.best.num_workers
    images, labels = next(iter(loader))           # whichever row won: its pipeline, as measured
    expected = torch.uint8 if result.winner == "tuned" else torch.float32   # the baselines: float32
    assert images.dtype == expected and tuple(images.shape[1:]) == (3, 32, 32)
    assert len(labels) == result.best.batch_size


_PLAIN_SCRIPT = """
import sys
sys.modules["course_utils"] = None          # the pasted code must not need the course
import threadpoolctl
import torch
from torch.utils.data import Dataset


class Toy(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        blas = [p["num_threads"] for p in threadpoolctl.threadpool_info()] or [1]
        return torch.tensor([torch.get_num_threads(), max(blas)]), i


dataset = Toy()
{code}

if __name__ == "__main__":
    threads, labels = next(iter(loader))
    print("threads", sorted(set(threads[:, 0].tolist())), sorted(set(threads[:, 1].tolist())),
          "batch", len(labels), "workers", loader.num_workers)
"""


@pytest.mark.parametrize("settings", [
    LoaderSettings(num_workers=0, batch_size=4),
    LoaderSettings(num_workers=2, batch_size=4, persistent_workers=True, pin_memory=True),
    LoaderSettings(num_workers=1, batch_size=4, threads_per_worker=2,
                   multiprocessing_context="spawn"),
    LoaderSettings(num_workers=4, batch_size=4, threads_per_worker=None),
])
def test_plain_code_needs_no_course_utils(result, settings, monkeypatch):
    r = dataclasses.replace(result, best=settings)
    code = r.code_plain()
    assert "course_utils" not in code and "make_worker_init" not in code
    monkeypatch.setitem(sys.modules, "course_utils", None)    # importing it would fail now
    scope = {"dataset": list(range(8))}
    exec(compile(code, "<pasted>", "exec"), scope)
    loader = scope["loader"]
    assert (loader.batch_size, loader.num_workers) == (settings.batch_size, settings.num_workers)
    limited = bool(settings.num_workers and settings.threads_per_worker is not None)
    assert ("def worker_init_fn" in code) == limited
    assert (loader.worker_init_fn is not None) == limited
    assert f"num_workers={settings.num_workers}" in r.code()       # code() shows both versions
    assert ("make_worker_init" in r.code_course()) == limited


def test_plain_code_limits_threads_in_real_workers(result, tmp_path):
    """The pasted plain code, run as a script with course_utils blocked: workers at 1 thread."""
    r = dataclasses.replace(result, best=LoaderSettings(num_workers=2, batch_size=4))
    script = tmp_path / "pasted.py"
    script.write_text(_PLAIN_SCRIPT.format(code=r.code_plain()), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "threads [1] [1] batch 4 workers 2" in proc.stdout, proc.stdout


def test_comparison_ratios_are_computed(result):
    rows = [m.label for m in result.comparison.rows]
    assert rows == ["defaults", "common recipe", "tuned"]
    assert all(len(m.times_s) >= 2 for m in result.comparison.rows)   # interleaved rounds
    table = result.side_by_side_rows()       # per epoch: the samples/s column is the score
    assert [m.samples_per_s for m in table.rows] == [result.scores[k] for k in rows]
    assert table.rows[table.baseline].label.startswith("common recipe: w=4 bs=8")
    for other in ("common recipe", "defaults"):        # whichever row won: the same arithmetic
        assert result.ratio(other) == pytest.approx(result.scores["tuned"] / result.scores[other])
        cpu_tuned, cpu_other = (result.comparison.row(k).cpu_s_per_sample for k in ("tuned", other))
        expected = cpu_tuned / cpu_other if cpu_tuned is not None and cpu_other else math.nan
        assert result.ratio(other, "cpu_s_per_sample") == pytest.approx(expected, nan_ok=True)
    text = str(result)
    assert f"tuned vs common recipe: {result.ratio('common recipe'):.2f}x samples/s per epoch" in text
    assert result.candidates["common recipe"] == LoaderSettings(
        num_workers=4, batch_size=8, pin_memory=True, threads_per_worker=None)
    assert result.candidates["defaults"] == LoaderSettings(num_workers=0, batch_size=8)


def test_to_dict_is_json(result):
    data = json.loads(json.dumps(result.to_dict()))
    assert data["best"] == result.best.to_dict() and data["winner"] == result.winner
    assert len(data["trials"]) == len(result.trials)
    assert data["scores"] == result.scores and data["best_trial"] == result.best_trial.index
    assert "DataLoader(" in data["code"] and "course_utils" not in data["code_plain"]
    assert set(data["scores"]) == {"defaults", "common recipe", "tuned"}


def test_plot_returns_a_figure_with_machine_and_settings(result):
    from course_utils import machine_summary

    fig = result.plot()
    assert isinstance(fig, matplotlib.figure.Figure) and len(fig.axes) == 2
    title = fig.axes[0].get_title(loc="left")
    assert machine_summary() in title and result.best.label() in title
    bars = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert [b.split(":")[0] for b in bars] == ["defaults", "common recipe", "tuned"]
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_tiny_budget_stops_early_and_says_what_was_skipped(small_jpegs):
    r = tune_loader(small_jpegs, budget_s=2.0, size=32, batch_size=8, progress=False,
                    worker_counts=[0, 1, 2, 3], batch_sizes=[4, 8, 16, 32],
                    compare_with_baselines=False)
    assert r.trials, "the first trial always runs"
    assert r.not_tried, "a 2 s budget cannot try every setting"
    assert "Not tried (budget ran out)" in str(r)
    assert r.comparison is None and r.winner == "tuned" and "no side by side" in r.verdict()
    # the search starts a trial only while time is left: at most one trial past the budget
    assert r.search_s <= r.budget_s + max(t.seconds for t in r.trials) + 1.0


def test_early_stopping_marks_probes(monkeypatch, small_jpegs):
    """A probe far below the best is not timed fully (a fake score makes workers look slow)."""
    real = tuning.pooled

    def slow_workers(parts, label):          # workers' windows read 10x slower
        m, startup = real(parts, label)
        scale = 1 if label.startswith("w=0") else 10
        return Measurement.from_times(label, [t * scale for t in m.times_s], m.items_per_repeat), startup

    monkeypatch.setattr(tuning, "pooled", slow_workers)
    r = tune_loader(small_jpegs, budget_s=8, size=32, batch_size=8, worker_counts=[0, 1, 2],
                    batch_sizes=[8], compare_with_baselines=False, progress=False)
    assert r.trials[0].complete
    later = r.trials[1:]
    assert later and all(t.status == "stopped after probe" for t in later)
    # the num_workers ladder fell twice in a row and said so (or ran out of rungs)
    assert r.best == r.trials[0].settings


def test_a_baseline_that_wins_is_recommended(monkeypatch, small_jpegs):
    """Force the common recipe to win the side by side: it is recommended, said so, and its
    code is the code to paste; the search's best is still reported."""
    real = tune_window.SideBySide.summary

    def recipe_wins(self):          # the recipe's windows read 1000x faster, with no start-up
        comparison, startups = real(self)
        slow = comparison.row("common recipe")
        fast = Measurement.from_times(slow.label, [t / 1000 for t in slow.times_s],
                                      slow.items_per_repeat, cpu_s_per_sample=slow.cpu_s_per_sample)
        return (compare([fast if m is slow else m for m in comparison.rows]),
                {**startups, "common recipe": 0.0})

    monkeypatch.setattr(tune_window.SideBySide, "summary", recipe_wins)
    r = tune_loader(small_jpegs, budget_s=4, size=32, batch_size=8, worker_counts=[0],
                    batch_sizes=[8], progress=False)
    assert r.winner == "common recipe"
    assert r.best == r.candidates["common recipe"] == LoaderSettings(
        num_workers=4, batch_size=8, pin_memory=True, threads_per_worker=None)
    assert r.best_trial.settings == r.candidates["tuned"] == LoaderSettings(0, 8)
    assert r.ratio("common recipe") < 1
    text = str(r)
    assert "Recommended: the common recipe (w=4 bs=8 pf=2 unlimited pin" in text
    assert "beat the tuned setting (w=0 bs=8" in text
    plain, course = r.code_plain(), r.code_course()
    assert "num_workers=4" in plain and "pin_memory=True" in plain and "worker_init" not in plain
    assert "TransformedDataset(dataset, CommonRecipeTransform(32))" in course
    assert "make_worker_init" not in course and "keep_batch" not in course
    scope = {"dataset": small_jpegs}
    exec(course, scope)
    assert scope["loader"].num_workers == 4 and scope["loader"].dataset[0][0].dtype == torch.float32


def test_image_folder_works(image_folder):
    r = tune_loader(image_folder, budget_s=5, size=32, batch_size=8, worker_counts=[0, 1],
                    batch_sizes=[8], progress=False)
    assert "ImageFolderDataset" in r.dataset
    assert f"ImageFolderDataset({str(image_folder)!r}" in r.code_course()
    scope: dict = {}
    exec(r.code_course(), scope)
    images, labels = next(iter(scope["loader"]))
    expected = torch.uint8 if r.winner == "tuned" else torch.float32   # the recipe: float32
    assert images.dtype == expected and tuple(images.shape[1:]) == (3, 32, 32)


# ---- the consumer (training step) -----------------------------------------------------------

def test_a_sleeping_step_bounds_every_rate(small_jpegs):
    """Each timed batch is followed by the step, so no setting can beat batch / step_s."""
    r = tune_loader(small_jpegs, budget_s=4, size=32, batch_size=8, worker_counts=[0, 1],
                    batch_sizes=[8], step_s=0.04, compare_with_baselines=False, progress=False)
    assert "40 ms training step per batch (a sleep" in r.consumer and r.consumer in str(r)
    measured = [t for t in r.trials if t.measurement is not None]
    assert measured and all(t.samples_per_s <= 8 / 0.04 * 1.001 for t in measured)


def test_a_step_function_is_called_on_every_batch(small_jpegs):
    seen = []

    def train_step(batch):
        images, labels = batch
        seen.append((images.dtype, images.shape[0]))

    r = tune_loader(small_jpegs, budget_s=3, size=32, batch_size=8, worker_counts=[0],
                    batch_sizes=[8], step=train_step, compare_with_baselines=False,
                    progress=False)
    assert r.consumer.startswith("train_step(batch)")
    timed = sum(round(m.items_per_repeat / 8) * m.repeats for m in
                (t.measurement for t in r.trials) if m is not None)
    assert len(seen) >= timed > 0 and set(seen) == {(torch.uint8, 8)}


def test_loading_that_overlaps_the_step_wins():
    """Latency-bound loading (10 ms per sample, sleeps) and an 80 ms step per batch of 8: in
    the main process they add up (160 ms per batch), in workers they overlap (80 ms), so the
    tuner must not pick num_workers=0."""
    data = LatencyDataset(n=64, latency_s=0.01, item_shape=(3, 8, 8))
    r = tune_loader(data, budget_s=8, batch_size=8, worker_counts=[0, 1, 2], batch_sizes=[8],
                    step_s=0.08, epoch_samples=10**6, compare_with_baselines=False,
                    progress=False)
    assert r.epoch_samples == 10**6
    assert r.best.num_workers >= 1, r.table()


@pytest.mark.parametrize("kwargs, error, word", [
    ({"step_s": -1}, ValueError, "step_s"),
    ({"step_s": float("nan")}, ValueError, "step_s"),
    ({"step_s": "50"}, ValueError, "step_s"),
    ({"step": 3}, TypeError, "step must be a function"),
    ({"step_s": 0.1, "step": print}, ValueError, "not both"),
    ({"epoch_samples": 0}, ValueError, "epoch_samples"),
])
def test_bad_consumer_arguments(kwargs, error, word, small_jpegs):
    with pytest.raises(error, match=word):
        tune_loader(small_jpegs, budget_s=5, progress=False, **kwargs)


# ---- Ctrl-C ---------------------------------------------------------------------------------

def _children() -> set[int]:
    """Live descendants, less multiprocessing's own helpers (the resource tracker and the
    forkserver, which live as long as this process; a forkserver's workers do count)."""
    me, alive = psutil.Process(), set()
    for p in me.children(recursive=True):
        try:
            helper = p.ppid() == me.pid and any(
                "resource_tracker import" in a or "forkserver import" in a for a in p.cmdline())
            if p.status() != psutil.STATUS_ZOMBIE and not helper:
                alive.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _interrupt_second_trial(monkeypatch):
    """measure_window raises KeyboardInterrupt in the second trial, its workers running."""
    real, calls = tuning.measure_window, []

    def interrupting(timed, batches, label):
        calls.append(label)
        if len(calls) == 3:            # trial 1 had a probe and a full window
            it = iter(timed)
            next(it)                   # workers started, batches in flight, `it` kept alive
            raise KeyboardInterrupt
        return real(timed, batches, label)

    monkeypatch.setattr(tuning, "measure_window", interrupting)


def test_ctrl_c_stops_cleanly_with_the_best_so_far(monkeypatch, small_jpegs):
    before, mp_before = _children(), set(multiprocessing.active_children())
    _interrupt_second_trial(monkeypatch)
    with pytest.raises(TuningInterrupted) as info:
        tune_loader(small_jpegs, budget_s=20, size=32, batch_size=8, worker_counts=[0, 2],
                    batch_sizes=[8], progress=False)
    assert isinstance(info.value, KeyboardInterrupt)
    partial = info.value.result
    assert len(partial.trials) == 1 and partial.best == LoaderSettings(0, 8)
    assert partial.comparison is None and "interrupted during the search" in partial.notes
    line = str(info.value)
    assert "\n" not in line and "best measured so far: w=0 bs=8 ->" in line
    assert "samples/s per epoch" in line and "CPU per sample" in line
    # no worker left behind, although the interrupted frame still holds its iterator
    assert not set(multiprocessing.active_children()) - mp_before
    assert not _children() - before


def test_cli_ctrl_c_prints_one_line_exit_130(monkeypatch, image_folder, capsys):
    before = _children()
    _interrupt_second_trial(monkeypatch)
    code = main(["tune", str(image_folder), "--budget", "20", "--size", "32", "--batch-size",
                 "8", "--no-progress"])
    assert code == 130
    out = capsys.readouterr()
    assert out.out == "" and "Traceback" not in out.err
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m course_utils tune: interrupted")
    assert "best measured so far: w=0 bs=" in lines[0]
    assert not _children() - before


def _error_from(exc: BaseException, filename: str) -> tuple:
    """What sys.excepthook gets for ``exc`` raised by code from ``filename``."""
    try:
        exec(compile("raise exc", filename, "exec"), {"exc": exc})
    except BaseException as raised:
        return type(raised), raised, raised.__traceback__


def test_tuner_workers_drop_only_the_fd_sharers_closed_connections(capsys):
    """After Ctrl-C the main process is gone mid-handover: multiprocessing's resource_sharer
    thread in a worker meets a reset connection and hands it to sys.excepthook. That is not
    printed; any other error is."""
    sharer = multiprocessing.resource_sharer.__file__
    drop_fd_sharer_resets(*_error_from(ConnectionResetError(104, "reset"), sharer))
    drop_fd_sharer_resets(*_error_from(EOFError(), sharer))
    assert capsys.readouterr().err == ""
    drop_fd_sharer_resets(*_error_from(ValueError("a real bug"), sharer))
    drop_fd_sharer_resets(*_error_from(ConnectionResetError(104, "reset"), "mine.py"))
    err = capsys.readouterr().err
    assert "a real bug" in err and "ConnectionResetError" in err


def test_a_tuner_worker_starts_deaf_to_ctrl_c_with_the_quiet_hook(monkeypatch):
    """QuietInit is what each worker runs first: SIGINT ignored, the fd-sharer hook installed,
    then the learner's own worker_init_fn."""
    seen = []
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    old = signal.getsignal(signal.SIGINT)
    try:
        QuietInit(seen.append)(3)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert sys.excepthook is drop_fd_sharer_resets and seen == [3]
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_a_ctrl_c_while_a_windows_workers_stop_is_raised_once_they_are_stopped(monkeypatch):
    """A real SIGINT arriving while a window's workers are joined: in an iterator's __del__ it
    would be printed as "Exception ignored" and the tuner would go on. Timed stops them itself
    at the window's end, with Ctrl-C held back until they are gone, then raises it."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
    real, stopped, armed = _MultiProcessingDataLoaderIter._shutdown_workers, [], []

    def ctrl_c_then_stop(self):
        if self._shutdown:       # stopped already: torch's own second call, from __del__
            return real(self)
        if armed:
            os.kill(os.getpid(), signal.SIGINT)
        real(self)
        stopped.append((sys._getframe(2).f_code.co_name, list(self._workers)))
    monkeypatch.setattr(_MultiProcessingDataLoaderIter, "_shutdown_workers", ctrl_c_then_stop)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timed = Timed(rebuilt(DataLoader(TinyDataset(64), batch_size=2, num_workers=1)))
    try:
        measure_window(timed, 2, "w=1")
        # "in": under make mutation the method's frame is mutmut's copy of it, named after it
        assert len(stopped) == 1 and "end_epochs" in stopped[0][0], "stopped by Timed, not by a __del__"
        armed.append(True)
        with pytest.raises(KeyboardInterrupt):
            measure_window(timed, 2, "w=1")
        assert len(stopped) == 2 and not any(w.is_alive() for _, ws in stopped for w in ws)
    finally:
        timed.close()
        signal.signal(signal.SIGINT, old)
        del timed       # before the patch is undone


def test_more_workers_than_cpus_is_tuned_without_dataloaders_warning(small_jpegs):
    """The tuner tries worker counts past the CPU count on purpose; DataLoader's warning about
    it is the tuner's business, not the learner's."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tune_loader(small_jpegs, budget_s=2.0, size=32, batch_size=8, progress=False,
                    worker_counts=[cpus + 1], batch_sizes=[8], compare_with_baselines=False)
    assert not [w for w in seen if "This DataLoader will create" in str(w.message)]


@pytest.mark.skipif(os.name != "posix", reason="POSIX process groups and signals")
def test_real_ctrl_c_in_a_terminal():
    """SIGINT to the whole process group (what a terminal does), after the first trial: one
    line, exit 130, no process of the group left (the workers get the signal too)."""
    # A terminal's program starts with Ctrl-C at its default; a child of this test process would
    # inherit whatever this process has (a blocked or ignored SIGINT is kept across exec, and
    # Python then never raises KeyboardInterrupt), so the child sets the terminal's state itself.
    parent_state = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    terminal_like = ("import runpy, signal, sys\n"
                     "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})\n"
                     "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                     "sys.argv = ['course_utils'] + sys.argv[1:]\n"
                     "runpy.run_module('course_utils', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", terminal_like, "tune", "--images", "64", "--size", "32",
         "--batch-size", "8", "--budget", "60"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True, env={**os.environ, "COURSE_QUICK": "1"})
    seen, t0 = b"", time.monotonic()
    try:
        while b"best w=" not in seen and time.monotonic() - t0 < 90:   # the bar: a trial done
            chunk = os.read(proc.stderr.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
        assert b"best w=" in seen, seen.decode(errors="replace")
        time.sleep(0.5)                         # inside the next trial, most likely
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    err = (seen + err).decode(errors="replace")
    assert proc.returncode == 130, f"{err}\n(this test process's SIGINT handler and mask: {parent_state})"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("python -m course_utils tune: interrupted during the"), err
    for _ in range(20):   # multiprocessing's helpers (resource tracker, forkserver) end too
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True)
        if not left.stdout.strip():
            break
        time.sleep(0.5)
    assert left.stdout.strip() == "", f"processes left in the group: {left.stdout}"


# ---- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, word", [
    ({"budget_s": 0}, "budget_s"),
    ({"budget_s": -5}, "budget_s"),
    ({"budget_s": 0.5}, "budget_s"),
    ({"budget_s": "60"}, "budget_s"),
    ({"budget_s": 10, "size": 0}, "size"),
    ({"budget_s": 10, "batch_size": 0}, "batch_size"),
    ({"budget_s": 10, "worker_counts": [-1]}, "worker_counts"),
    ({"budget_s": 10, "batch_sizes": []}, "batch_sizes"),
])
def test_bad_arguments_name_the_argument(kwargs, word, small_jpegs):
    with pytest.raises((ValueError, TypeError)) as info:
        tune_loader(small_jpegs, progress=False, **kwargs)
    assert word in str(info.value)


def test_bad_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="data="):
        tune_loader(tmp_path / "missing", budget_s=5, progress=False)
    with pytest.raises(ValueError, match="no images"):
        tune_loader(tmp_path, budget_s=5, progress=False)
    with pytest.raises(TypeError, match="data must be"):
        tune_loader(42, budget_s=5, progress=False)


def test_settings_validate():
    assert LoaderSettings(num_workers=2).prefetch_factor == 2
    assert LoaderSettings(num_workers=0, prefetch_factor=4).prefetch_factor is None
    assert LoaderSettings(num_workers=2, threads_per_worker=None).loader_kwargs().get(
        "worker_init_fn") is None
    assert "unlimited" in LoaderSettings(num_workers=2, threads_per_worker=None).label()
    with pytest.raises(ValueError, match="num_workers"):
        LoaderSettings(num_workers=-1)
    with pytest.raises(ValueError, match="persistent_workers"):
        LoaderSettings(num_workers=0, persistent_workers=True)
    with pytest.raises(ValueError, match="threads_per_worker"):
        LoaderSettings(num_workers=1, threads_per_worker=0)


# ---- command line ---------------------------------------------------------------------------

def test_cli_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["tune", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "FOLDER" in out and "--budget" in out and "--course-data" in out
    assert "--step-ms" in out and "--epoch-images" in out


@pytest.mark.parametrize("args, word", [
    (["tune", "/no/such/folder"], "no such folder"),
    (["tune", "--budget", "0"], "--budget"),
    (["tune", "--budget", "-3"], "--budget"),
    (["tune", "--budget", "0.5"], "too small"),
    (["tune", "--step-ms", "-5"], "--step-ms"),
    (["tune", "--step-ms", "inf"], "--step-ms"),
])
def test_cli_errors_are_one_line_exit_2(args, word, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_empty_folder_and_both_sources(tmp_path, capsys):
    assert main(["tune", str(tmp_path)]) == 2
    assert "has no images" in capsys.readouterr().err
    assert main(["tune", str(tmp_path), "--course-data"]) == 2
    assert "not both" in capsys.readouterr().err


def test_cli_tunes_a_folder(image_folder, tmp_path, capsys):
    out_json = tmp_path / "r.json"
    code = main(["tune", str(image_folder), "--budget", "4", "--size", "32", "--batch-size", "8",
                 "--no-compare", "--no-progress", "--json", str(out_json), "--step-ms", "5",
                 "--epoch-images", "5000"])
    assert code == 0
    out = capsys.readouterr().out
    assert "loader = DataLoader(" in out and "5 ms training step per batch" in out
    data = json.loads(out_json.read_text())
    assert data["best"]["batch_size"] >= 1 and data["epoch_samples"] == 5000
