"""Tests for course_utils.scaling and what lesson 03 keeps in the package (course_utils.lessons.l03_*:
the epoch timer, the records and the worker-memory probe the graders use): behaviour, structure and
bad input — never speed claims. What the notebook writes itself is checked by its own asserts.

Memory assertions are loose (the list-of-dicts dataset must grow a worker's private memory
several times more than the same records in arrays); timings are only checked to be positive.
Every test that starts worker processes has a timeout.
"""
from __future__ import annotations

import gc
import multiprocessing
import os

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

from course_utils import compare
from course_utils.lessons.l03_num_workers import (RECORD_CLASSES, RecordArrayDataset, RecordListDataset,
                                                   WorkerMemory, WorkerUss, make_records, uss_bytes,
                                                   worker_memory)
from course_utils.measurement import Measurement
from course_utils.scaling import (CurveShape, WorkerSweep, default_worker_counts, describe_curve,
                                  find_knee, plot_sweeps, sweep_workers)

from _helpers import TinyDataset

pytestmark = pytest.mark.timeout(120)
HAS_FORK = "fork" in multiprocessing.get_all_start_methods()


# ---- worker counts ---------------------------------------------------------------------------

def test_default_worker_counts_small_machines_list_every_count():
    assert default_worker_counts(4) == [0, 1, 2, 3, 4]
    assert default_worker_counts(0) == [0]


def test_default_worker_counts_default_is_twice_usable_capped(monkeypatch):
    import course_utils.scaling as scaling

    monkeypatch.setattr(scaling, "usable_cpus", lambda: 2)
    assert default_worker_counts() == [0, 1, 2, 3, 4]
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 64)
    counts = default_worker_counts()
    assert counts[0] == 0 and counts[-1] == 32 and counts == sorted(set(counts))
    assert len(counts) <= 12
    monkeypatch.setattr(scaling, "usable_cpus", lambda: 10)
    counts = default_worker_counts()
    assert counts[-1] == 20 and 10 in counts


@pytest.mark.parametrize("kwargs, error", [({"max_workers": -1}, ValueError),
                                           ({"max_workers": 2.5}, TypeError),
                                           ({"cap": 0}, ValueError)])
def test_default_worker_counts_bad_input(kwargs, error):
    with pytest.raises(error, match="default_worker_counts"):
        default_worker_counts(**kwargs)


# ---- the knee -------------------------------------------------------------------------------

def test_find_knee_smallest_count_within_tolerance():
    workers = [0, 1, 2, 3, 4, 5, 6]
    rates = [100, 95, 190, 280, 300, 310, 305]
    assert find_knee(workers, rates) == 3          # 280 >= 0.9 * 310
    assert find_knee(workers, rates, tolerance=0.95) == 4
    assert find_knee(workers, rates, tolerance=1.0) == 5  # the best itself


def test_find_knee_accepts_unsorted_numpy_and_grids():
    workers = np.array([8, 0, 2, 1, 4])
    rates = np.array([400.0, 100.0, 200.0, 100.0, 390.0])
    assert find_knee(workers, rates) == 4
    assert isinstance(find_knee(workers, rates), int)


def test_find_knee_flat_curve_gives_fewest_workers():
    assert find_knee([0, 1, 2], [1000, 600, 700]) == 0


@pytest.mark.parametrize("workers, rates, tolerance, message", [
    ([], [], 0.9, "empty"),
    ([0, 1], [1.0], 0.9, "one rate"),
    ([0, 0], [1.0, 2.0], 0.9, "more than once"),
    ([-1, 1], [1.0, 2.0], 0.9, "whole numbers >= 0"),
    ([0.5, 1], [1.0, 2.0], 0.9, "whole numbers >= 0"),
    ([True, 2], [1.0, 2.0], 0.9, "whole numbers >= 0"),
    ([0, 1], [1.0, float("nan")], 0.9, "finite"),
    ([0, 1], [1.0, -2.0], 0.9, "finite numbers >= 0"),
    ([0, 1], [0.0, 0.0], 0.9, "every rate is 0"),
    ([0, 1], [1.0, 2.0], 0.0, "tolerance"),
    ([0, 1], [1.0, 2.0], 1.5, "tolerance"),
])
def test_find_knee_bad_curves_are_clear_errors(workers, rates, tolerance, message):
    with pytest.raises(ValueError, match=message):
        find_knee(workers, rates, tolerance)


def test_find_knee_type_errors_name_the_argument():
    with pytest.raises(TypeError, match="rates must be a sequence"):
        find_knee([0, 1], 5)
    with pytest.raises(TypeError, match="tolerance"):
        find_knee([0, 1], [1, 2], "high")


@pytest.mark.parametrize("rates, kind", [
    ([100, 95, 190, 200, 205], "plateau"),
    ([100, 95, 190, 280, 380], "rising"),
    ([1000, 400, 500, 520, 510], "flat"),
    ([100, 95, 190, 280, 150], "peaked"),
])
def test_describe_curve_kinds(rates, kind):
    shape = describe_curve([0, 1, 2, 3, 4], rates)
    assert isinstance(shape, CurveShape)
    assert shape.kind == kind
    assert shape.knee == find_knee([0, 1, 2, 3, 4], rates)
    assert shape.best_rate == max(rates)
    assert kind.split()[0] in str(shape) or "knee" in str(shape)


def test_describe_curve_numbers():
    shape = describe_curve([0, 1, 2, 3], [100, 90, 200, 150])
    assert shape.kind == "peaked" and shape.knee == 2 and shape.best_workers == 2
    assert shape.speedup_at_knee == pytest.approx(2.0)
    assert "75%" in str(shape)


# ---- sweeping ---------------------------------------------------------------------------------

def test_sweep_workers_structure():
    sweep = sweep_workers(TinyDataset(64), [1, 0], batch_size=4, batches=4, repeats=1, progress=False,
                          label="tiny", prefetch_factor=2)
    assert isinstance(sweep, WorkerSweep)
    assert sweep.workers == [0, 1] and len(sweep) == 2
    assert all(isinstance(m, Measurement) for m in sweep)
    assert sweep.at(1) is sweep[1]
    assert sweep[0].settings["num_workers"] == 0 and sweep[1].settings["num_workers"] == 1
    assert sweep[1].settings["prefetch_factor"] == 2
    assert sweep.knee() in (0, 1)
    assert sweep.speedups()[0] == pytest.approx(1.0)
    assert "tiny" in str(sweep) and "workers" in str(sweep)
    assert compare(sweep).rows == sweep.measurements
    assert sweep.to_dict()["workers"] == [0, 1]
    with pytest.raises(ValueError, match="were not measured"):
        sweep.at(7)


def test_sweep_workers_rounds_timed_batches_to_whole_rounds():
    sweep = sweep_workers(TinyDataset(200), [3], batch_size=4, batches=4, repeats=1, progress=False)
    assert sweep[0].items_per_repeat == 6 * 4  # 4 rounded up to 2 rounds of 3 workers


@pytest.mark.parametrize("kwargs, error, message", [
    ({"worker_counts": []}, ValueError, "empty"),
    ({"worker_counts": [1, 1]}, ValueError, "repeats"),
    ({"worker_counts": [-1]}, ValueError, "worker_counts"),
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"num_workers": 2}, ValueError, "num_workers"),
    ({"timeout_s": 0}, ValueError, "timeout_s"),
])
def test_sweep_workers_bad_input(kwargs, error, message):
    kwargs.setdefault("worker_counts", [0])
    with pytest.raises(error, match=message):
        sweep_workers(TinyDataset(32), progress=False, **kwargs)


def test_sweep_workers_rejects_non_datasets_and_tiny_epochs():
    with pytest.raises(TypeError, match="map-style Dataset"):
        sweep_workers(iter(range(3)), [0], progress=False)
    with pytest.raises(ValueError, match="bigger dataset"):
        sweep_workers(TinyDataset(8), [4], batch_size=4, progress=False)


def test_plot_sweeps_returns_axes_and_checks_metric():
    import matplotlib.pyplot as plt

    sweep = sweep_workers(TinyDataset(48), [0, 1], batch_size=4, batches=2, repeats=1, progress=False)
    for metric in ("speedup", "samples_per_s", "cpu_s_per_sample"):
        ax = plot_sweeps([sweep], metric=metric)
        assert ax.get_xlabel() == "num_workers"
        plt.close(ax.figure)
    with pytest.raises(ValueError, match="metric"):
        plot_sweeps([sweep], metric="speed")
    with pytest.raises(TypeError, match="WorkerSweep"):
        plot_sweeps([1, 2])


# ---- epochs -------------------------------------------------------------------------------------

def test_uss_bytes():
    value = uss_bytes()
    if value is None:
        pytest.skip("USS not reported on this platform")
    assert value > 0


# ---- records: list vs arrays ---------------------------------------------------------------------

def test_make_records_structure_and_seed():
    records = make_records(50, seed=2)
    assert len(records) == 50
    r = records[7]
    assert set(r) == {"path", "label", "box"}
    assert r["path"].startswith("train/") and r["path"].endswith("0000007.jpg")
    assert 0 <= r["label"] < 10 and len(r["box"]) == 4
    assert r["box"][0] <= r["box"][2] and r["box"][1] <= r["box"][3]
    assert make_records(50, seed=2) == records and make_records(50, seed=3) != records


def test_make_records_refuses_more_than_the_ram_budget(monkeypatch):
    import course_utils.lessons.l03_num_workers as l03_num_workers

    monkeypatch.setattr(l03_num_workers, "ram_budget_bytes", lambda fraction=0.25: 1000)
    with pytest.raises(ValueError, match="smaller n"):
        make_records(100)
    with pytest.raises(ValueError, match="n="):
        make_records(0)


def test_list_and_array_datasets_give_equal_items():
    records = make_records(300, seed=1)
    lst, arr = RecordListDataset(records), RecordArrayDataset(records)
    assert len(lst) == len(arr) == 300
    for i in range(300):
        a, b = lst[i], arr[i]
        assert torch.equal(a[0], b[0]) and a[0].dtype == b[0].dtype == torch.float32
        assert a[1] == b[1] and isinstance(b[1], int)
        assert a[2] == b[2] and isinstance(b[2], str)
    assert arr[-1][2] == records[-1]["path"]
    assert 0 < arr.nbytes < 300 * 100
    # items are copies: changing one does not change the dataset
    box = arr[0][0]
    box += 1
    assert torch.equal(arr[0][0], lst[0][0])


def test_record_datasets_bad_input():
    with pytest.raises(ValueError, match="empty"):
        RecordArrayDataset([])
    with pytest.raises(IndexError):
        RecordArrayDataset(make_records(3))[3]


@pytest.mark.skipif(not HAS_FORK, reason="copy-on-read needs fork")
def test_worker_memory_list_grows_arrays_do_not():
    records = make_records(30_000, seed=0)
    lst = worker_memory(RecordListDataset(records), 2, multiprocessing_context="fork",
                        label="list")
    arr = worker_memory(RecordArrayDataset(records), 2, multiprocessing_context="fork")
    for res in (lst, arr):
        assert isinstance(res, WorkerMemory)
        assert res.num_workers == 2 and len(res.workers) == 2 and res.start_method == "fork"
        assert {w.worker_id for w in res.workers} == {0, 1}
        assert all(w.start_uss_bytes > 0 and w.timeline for w in res.workers)
        assert sum(w.timeline[-1][0] for w in res.workers) == 30_000
    assert lst.label == "list" and arr.label == "RecordArrayDataset"
    assert lst.mean_growth_bytes > 3 * max(arr.max_growth_bytes, 1_000_000)
    assert lst.total_growth_bytes == sum(lst.growth_bytes)
    assert "USS growth per worker" in str(lst)


@pytest.mark.skipif(not HAS_FORK, reason="needs fork")
def test_worker_memory_freeze_gc_is_undone():
    before = gc.get_freeze_count()
    res = worker_memory(RecordArrayDataset(make_records(2_000)), 1, batch_size=100,
                        multiprocessing_context="fork", freeze_gc=True)
    assert res.gc_frozen
    assert gc.get_freeze_count() == before


def test_worker_memory_bad_input():
    ds = RecordArrayDataset(make_records(100))
    with pytest.raises(ValueError, match="num_workers"):
        worker_memory(ds, 0)
    with pytest.raises(ValueError, match="smaller batch_size"):
        worker_memory(ds, 2, batch_size=64)
    with pytest.raises(TypeError, match="map-style"):
        worker_memory(5)
    with pytest.raises(ValueError, match="multiprocessing_context"):
        worker_memory(ds, 1, batch_size=10, multiprocessing_context="teleport")


# ---- worker_memory's requests, pinned on a worked example; the records it is run on ---------------

@pytest.mark.skipif(not HAS_FORK, reason="needs fork")
def test_worker_memory_reads_each_worker_where_the_plan_says():
    # 1,000 samples in 20 batches of 50, 2 workers (worker 0 gets the even batches), readings=2:
    # a reading every 20 // (2 x 2) = 5 batches, and the last 2 batches of each worker always.
    # Worker 0 reads after batches 0, 10, 16, 18; worker 1 after 5, 15, 17, 19; a worker has
    # then fetched (its batches so far) x 50 samples.
    res = worker_memory(RecordArrayDataset(make_records(1_000)), batch_size=50, readings=2,
                        multiprocessing_context="fork", label="plan")
    assert [[fetched for fetched, _ in w.timeline] for w in res.workers] == [
        [50, 300, 450, 500], [150, 400, 450, 500]]
    assert all(uss > 0 for w in res.workers for _, uss in w.timeline)
    assert [w.worker_id for w in res.workers] == [0, 1] and res.num_workers == 2
    assert len({w.pid for w in res.workers} | {os.getpid()}) == 3
    assert (res.label, res.start_method, res.samples, res.gc_frozen) == ("plan", "fork", 1_000, False)


def test_worker_memory_prints_each_workers_growth_and_start():
    workers = [WorkerUss(worker_id=0, pid=11, start_uss_bytes=int(20e6), timeline=[(5, int(22.5e6))]),
               WorkerUss(worker_id=1, pid=12, start_uss_bytes=int(21e6), timeline=[(5, int(21e6))])]
    res = WorkerMemory(label="list", start_method="fork", num_workers=2, samples=12_345, workers=workers)
    assert str(res) == ("list (fork, 2 workers, 12,345 samples): USS growth per worker 2.5 / 0.0 MB "
                        "(total 2.5 MB); USS at start 20.0 / 21.0 MB")


def test_records_are_seeded_valid_boxes_and_every_class():
    records = make_records(2_000)
    assert records == make_records(2_000, seed=0) != make_records(2_000, seed=1)
    assert {r["label"] for r in records} == set(range(len(RECORD_CLASSES)))
    boxes = np.array([r["box"] for r in records])               # x0, y0, x1, y1 in [0, 1]
    assert ((0 <= boxes) & (boxes <= 1)).all()
    assert (boxes[:, 0] <= boxes[:, 2]).all() and (boxes[:, 1] <= boxes[:, 3]).all()
    assert (boxes[:, 0] < boxes[:, 2]).mean() > 0.99 and (boxes[:, 1] < boxes[:, 3]).mean() > 0.99


def test_both_record_datasets_give_float32_boxes_and_int_labels_even_for_one_record():
    records = make_records(1)
    for ds in (RecordListDataset(records), RecordArrayDataset(records),
               RecordArrayDataset(RecordListDataset(records))):
        box, label, path = ds[0]
        assert box.dtype == torch.float32 and box.tolist() == pytest.approx(records[0]["box"])
        assert type(label) is int and label == records[0]["label"] and path == records[0]["path"]
    packed = RecordArrayDataset(make_records(10))
    assert (packed.labels.dtype, packed.boxes.dtype, packed.path_offsets.dtype) == (
        np.int64, np.float32, np.int64)
    with pytest.raises(ValueError, match=r"RecordArrayDataset: records is empty; pass the list from "
                                         r"make_records\(\)"):
        RecordArrayDataset([])
    with pytest.raises(IndexError, match="RecordArrayDataset"):
        packed[10]
