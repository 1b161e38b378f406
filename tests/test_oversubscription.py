"""Tests for lesson 02's harness (course_utils.lessons.l02_*): the OpenCV-heavy workload, the grid, the
environment-variable subprocesses and the fork demo. Behaviour and structure only: no timing
is asserted. Everything that starts processes has a timeout."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import threading

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

from course_utils.lessons import l02_grid, l02_workload
from course_utils.lessons.l02_grid import (GridCell, GridResult, default_grid, involuntary_switches,
                                           plot_grid, run_grid, switches_between)
from course_utils.lessons.l02_workload import (OpenCVHeavyTransform, close_loader,
                                               opencv_heavy_dataset)

LINUX_PROC = os.path.isdir("/proc/self/task")
HAS_FORK = "fork" in mp.get_all_start_methods()


def _image(h: int = 60, w: int = 80) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)


# ----------------------------------------------------------------------------- workload
def test_heavy_transform_output_and_pickling():
    t = OpenCVHeavyTransform(size=32, work_side=64, blur_ksize=5)
    out = t(_image())
    assert isinstance(out, torch.Tensor) and out.dtype == torch.uint8
    assert tuple(out.shape) == (3, 32, 32) and out.is_contiguous()
    assert pickle.loads(pickle.dumps(t)) == t


@pytest.mark.parametrize("kwargs, error, message", [
    ({"blur_ksize": 8}, ValueError, "blur_ksize must be odd"),
    ({"size": 0}, ValueError, "size must be >= 8"),
    ({"work_side": 2.5}, TypeError, "work_side must be an int"),
    ({"angle": "ten"}, TypeError, "angle must be a number"),
])
def test_heavy_transform_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        OpenCVHeavyTransform(**kwargs)


def test_heavy_transform_rejects_bad_image():
    with pytest.raises(ValueError, match=r"\(H, W, 3\) uint8"):
        OpenCVHeavyTransform()(np.zeros((10, 10), dtype=np.uint8))


def test_heavy_dataset_items(monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    ds = opencv_heavy_dataset(n=3, work_side=64)
    image, label = ds[0]
    assert tuple(image.shape) == (3, 224, 224) and image.dtype == torch.uint8
    assert label == 0 and len(ds) == 3
    assert ds.transform.work_side == 64 and int(ds.shapes.max()) <= 320  # quick: small JPEGs


# ----------------------------------------------------------------------------- grid layout
@pytest.mark.parametrize("quick", ["0", "1"])
def test_default_grid_on_small_and_large_machines(monkeypatch, quick):
    monkeypatch.setenv("COURSE_QUICK", quick)
    workers, threads = default_grid(usable=2)
    assert workers == [1, 2, 4] and threads == [1, 2]
    workers, threads = default_grid(usable=64)
    assert workers[0] == 1 and max(workers) == 128 and len(workers) <= 6
    assert threads[0] == 1 and max(threads) == 64 and len(threads) <= 5
    assert workers == sorted(workers) and threads == sorted(threads)
    w1, t1 = default_grid(usable=1)
    assert w1 == [1, 2] and 1 in t1


def test_default_grid_rejects_bad_usable():
    with pytest.raises(ValueError, match="usable must be >= 1"):
        default_grid(usable=0)


# ----------------------------------------------------------------------------- context switches
@pytest.mark.skipif(not LINUX_PROC, reason="per-thread counts need Linux /proc")
def test_involuntary_switches_sees_every_thread():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        snap = involuntary_switches()
        assert snap is not None
        tids = {tid for pid, tid in snap if pid == os.getpid()}
        assert t.native_id in tids and threading.main_thread().native_id in tids
        assert all(isinstance(v, int) and v >= 0 for v in snap.values())
    finally:
        stop.set()
        t.join()


def test_switches_between_counts_new_threads_from_zero():
    before = {(1, 1): 10, (1, 2): 5}
    after = {(1, 1): 15, (1, 3): 7}           # thread 2 ended, thread 3 was born
    assert switches_between(before, after) == 5 + 7
    assert switches_between(None, after) is None and switches_between(before, None) is None


class _FakeLoader:
    num_workers = 0
    batch_size = 2

    def __init__(self, n: int) -> None:
        self.n = n
        self.iterators = 0

    def __iter__(self):
        self.iterators += 1
        return iter([torch.zeros(2, 1)] * self.n)

    def __len__(self) -> int:
        return self.n


def test_switch_window_starts_the_loader_eagerly_and_records_one_window_per_pass():
    fake = _FakeLoader(6)
    window = l02_grid._SwitchWindow(fake, warmup=2, timed=3)
    it = iter(window)
    assert fake.iterators == 1, "iter() must start the loader now (measure_loader lists workers then)"
    batches = list(it)
    assert len(batches) == 5 and len(window.windows) == 1
    assert window.num_workers == 0 and len(window) == 6


@pytest.mark.timeout(60)
def test_close_loader_stops_persistent_workers_and_ignores_others():
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(8.0))
    close_loader(DataLoader(data, batch_size=4))  # no workers: nothing to do
    method = "fork" if HAS_FORK else "spawn"
    loader = DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True,
                        multiprocessing_context=method, timeout=60)
    list(loader)
    workers = list(loader._iterator._workers)
    close_loader(loader)
    assert loader._iterator is None and not any(w.is_alive() for w in workers)


# ----------------------------------------------------------------------------- run_grid
@pytest.fixture(scope="module")
def small_grid() -> GridResult:
    ds = opencv_heavy_dataset(n=40, work_side=96, max_side=128)
    return run_grid([1, 2], [1, 2], dataset=ds, batch_size=2, batches=2, repeats=1,
                    progress=False, timeout_s=120)


@pytest.mark.timeout(180)
def test_run_grid_structure(small_grid):
    g = small_grid
    assert g.worker_counts == [1, 2] and g.thread_counts == [1, 2] and len(g.cells) == 4
    for c in g.cells:
        assert c.samples_per_s > 0 and c.cpu_s_per_sample is not None and c.cpu_s_per_sample > 0
        assert c.measurement.settings["threads_per_pool"] == c.threads
        assert c.measurement.settings["num_workers"] == c.workers
        if LINUX_PROC:
            assert c.ctx_per_1k is not None and c.ctx_per_1k >= 0
    assert g.matrix("samples_per_s").shape == (2, 2)
    assert g.best("samples_per_s").samples_per_s == max(c.samples_per_s for c in g.cells)
    assert g.best("cpu_s_per_sample").cpu_s_per_sample == min(c.cpu_s_per_sample for c in g.cells)
    assert all(c.total_threads > g.usable_cpus for c in g.oversubscribed())
    assert g.settings["start_method"] in ("forkserver", "spawn")
    text = str(g)
    assert "samples per second" in text and "context switches" in text
    json.dumps(g.to_dict())  # serialisable, for shipping results


@pytest.mark.timeout(180)
def test_run_grid_workers_really_have_the_threads_asked(small_grid):
    """Under the grid's start method a worker asked for k threads reports k in every pool."""
    from course_utils.threads import make_worker_init, pools_in_workers

    context = l02_workload.grid_context()
    for k in (1, 2):
        pools = pools_in_workers(make_worker_init(k), num_workers=1, multiprocessing_context=context)[0]
        assert pools.total_max == k and pools.torch_intra == k


def test_plot_grid(small_grid):
    import matplotlib.pyplot as plt

    axes = plot_grid(small_grid)
    assert len(axes) == 3
    assert "threads per library pool" in axes[0].get_xlabel()
    assert small_grid.machine in axes[0].figure._suptitle.get_text()
    plt.close("all")
    with pytest.raises(ValueError, match="metrics must be"):
        plot_grid(small_grid, metrics=["speed"])
    with pytest.raises(TypeError, match="GridResult"):
        plot_grid({"cells": []})


def test_grid_result_errors():
    g = GridResult([1], [1], [GridCell(1, 1, 10.0, 0.01, None)], usable_cpus=2)
    with pytest.raises(KeyError, match="no cell for workers=2"):
        g.cell(2, 1)
    with pytest.raises(ValueError, match="not a grid metric"):
        g.matrix("speed")
    with pytest.raises(ValueError, match="not measured in any cell"):
        g.best("ctx_per_1k")
    assert "n/a" in g.table("ctx_per_1k")


@pytest.mark.parametrize("kwargs, error, message", [
    ({"worker_counts": []}, ValueError, "worker_counts is empty"),
    ({"worker_counts": [1, 1]}, ValueError, "repeated values"),
    ({"worker_counts": [0]}, ValueError, r"worker_counts\[0\] must be >= 1"),
    ({"worker_counts": "12"}, TypeError, "list of ints"),
    ({"thread_counts": [1.5]}, TypeError, r"thread_counts\[0\] must be an int"),
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
    ({"timeout_s": 0}, ValueError, "timeout_s must be a number of seconds"),
])
def test_run_grid_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        run_grid(**{"worker_counts": [1], "thread_counts": [1], **kwargs})


@pytest.mark.skipif(not HAS_FORK, reason="fork only")
def test_run_grid_refuses_threads_in_forked_workers():
    with pytest.raises(ValueError, match="forkserver"):
        run_grid([1], [1, 2], multiprocessing_context="fork")


def test_run_grid_refuses_a_dataset_too_small():
    ds = opencv_heavy_dataset(n=4, work_side=32, max_side=64)
    with pytest.raises(ValueError, match="give at least"):
        run_grid([2], [1], dataset=ds, batch_size=2, batches=4)


def test_import_has_no_side_effects():
    """Re-running the modules' code changes no pool and no start-method setting."""
    import importlib

    import cv2

    from course_utils.graders import ex02_worker_init

    def preload():
        try:
            import multiprocessing.forkserver as fs
        except ImportError:  # Windows
            return None
        return list(fs._forkserver._preload_modules)

    before = (torch.get_num_threads(), cv2.getNumThreads(), dict(os.environ), preload())
    for module in (l02_workload, l02_grid):
        importlib.reload(module)
    importlib.reload(ex02_worker_init)
    after = (torch.get_num_threads(), cv2.getNumThreads(), dict(os.environ), preload())
    assert before == after
