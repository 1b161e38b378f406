"""course_utils.lessons.l03_num_workers: the annotation records (a list of dicts and the same in
NumPy arrays) and the worker-memory probe the 03.copy_on_read grader runs. Memory assertions are
loose (the list must grow a worker's private memory several times more than the arrays)."""
from __future__ import annotations

import gc
import multiprocessing
import os

import numpy as np
import pytest
import torch

from course_utils.lessons.l03_num_workers import (RECORD_CLASSES, RecordArrayDataset, RecordListDataset,
                                                   WorkerMemory, WorkerUss, make_records, uss_bytes,
                                                   worker_memory)

pytestmark = pytest.mark.timeout(120)
HAS_FORK = "fork" in multiprocessing.get_all_start_methods()


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
    assert lst.mean_growth_bytes > 3 * max(*arr.growth_bytes, 1_000_000)
    assert lst.total_growth_bytes == sum(lst.growth_bytes)
    assert "USS growth per worker" in str(lst)


@pytest.mark.skipif(not HAS_FORK, reason="needs fork")
def test_worker_memory_freeze_gc_is_undone():
    before = gc.get_freeze_count()
    res = worker_memory(RecordArrayDataset(make_records(2_000)), 1, batch_size=100,
                        multiprocessing_context="fork", freeze_gc=True)
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
    assert (res.label, res.start_method, res.samples) == ("plan", "fork", 1_000)


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
