"""course_utils.lessons.l03_num_workers: the records' random boxes and labels (each box from its own
draws, columns not swapped), the RAM guard on both sides, the packed arrays (byte offsets of UTF-8
paths), the memory probe's request plan and reports, and how worker_memory gathers each worker's
readings, all on hand-worked values with a recording DataLoader: no worker starts."""
from __future__ import annotations

import math
import os
import types

import numpy as np
import psutil
import pytest
import torch

from course_utils.lessons import l03_num_workers as l03
from course_utils.lessons.l03_num_workers import (RECORD_CLASSES, RecordArrayDataset, RecordListDataset,
                                                   WorkerMemory, WorkerUss, make_records, uss_bytes,
                                                   worker_memory)


# ---- records -----------------------------------------------------------------------------------

def test_each_box_is_the_sorted_pair_of_its_own_x_and_y_draws():
    records = make_records(4, seed=5)
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 10, size=4)
    draws = rng.random((4, 2, 2))                  # record i: two corners (x, y)
    for i, r in enumerate(records):
        (xa, ya), (xb, yb) = draws[i]
        assert r["box"] == [min(xa, xb), min(ya, yb), max(xa, xb), max(ya, yb)]
        assert r["label"] == labels[i]
        assert r["path"] == f"train/{RECORD_CLASSES[labels[i]]}/{i:07d}.jpg"


def test_the_ram_guard_allows_exactly_the_budget_and_refuses_one_byte_less(monkeypatch):
    asked = []
    monkeypatch.setattr(l03, "ram_budget_bytes", lambda fraction: asked.append(fraction) or 6000)
    assert len(make_records(10)) == 10                              # 10 x 600 = 6,000 bytes
    assert asked == [0.25]
    monkeypatch.setattr(l03, "ram_budget_bytes", lambda fraction: 5999)
    with pytest.raises(ValueError, match=r"n=10 records would take about 0 MB .* budget of 0 MB"):
        make_records(10)


def test_the_default_count_follows_quick_mode(monkeypatch):
    asked = []
    monkeypatch.setattr(l03, "pick", lambda full, quick: asked.append((full, quick)) or 3)
    assert len(make_records()) == 3 and asked == [(200_000, 60_000)]


# ---- the packed arrays -------------------------------------------------------------------------

RECORDS = [{"path": "a/é.jpg", "label": 7, "box": [0.1, 0.2, 0.3, 0.4]},
           {"path": "bb.jpg", "label": 2, "box": [0.5, 0.6, 0.7, 0.8]},
           {"path": "ç/ü/ccc.jpg", "label": 9, "box": [0.0, 0.25, 0.5, 0.75]}]


def test_paths_are_cut_at_byte_offsets_not_character_counts():
    packed = RecordArrayDataset(RECORDS)
    # UTF-8 lengths: "a/é.jpg" 8 bytes (7 characters), "bb.jpg" 6, "ç/ü/ccc.jpg" 13
    assert packed.path_offsets.tolist() == [0, 8, 14, 27]
    assert [packed[i][2] for i in range(3)] == ["a/é.jpg", "bb.jpg", "ç/ü/ccc.jpg"]
    assert packed[-1][2] == "ç/ü/ccc.jpg" and packed[-3][1] == 7


def test_packed_items_equal_the_records_and_count_their_bytes():
    packed = RecordArrayDataset(RecordListDataset(RECORDS))
    box, label, _ = packed[2]
    assert box.tolist() == [0.0, 0.25, 0.5, 0.75] and label == 9 and type(label) is int
    assert packed.labels.tolist() == [7, 2, 9] and packed.boxes.shape == (3, 4)
    # labels 3 x 8 + boxes 12 x 4 + offsets 4 x 8 + 27 path bytes = 24 + 48 + 32 + 27
    assert packed.nbytes == 131 and len(packed) == 3


def test_a_list_item_is_box_label_path():
    box, label, path = RecordListDataset(RECORDS)[1]
    assert box.dtype == torch.float32 and box.tolist() == pytest.approx([0.5, 0.6, 0.7, 0.8])
    assert (label, path) == (2, "bb.jpg")


def test_boxes_are_float32_whatever_torchs_default_dtype():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert RecordListDataset(RECORDS)[0][0].dtype == torch.float32
        assert RecordArrayDataset(RECORDS)[0][0].dtype == torch.float32
    finally:
        torch.set_default_dtype(before)


# ---- USS ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("error", [psutil.AccessDenied(1), AttributeError("uss"), NotImplementedError(),
                                   OSError("no smaps")])
def test_uss_is_none_where_the_platform_cannot_tell(monkeypatch, error):
    def fails():
        raise error

    monkeypatch.setattr(l03.psutil, "Process", lambda: types.SimpleNamespace(memory_full_info=fails))
    assert uss_bytes() is None


def test_uss_is_read_in_bytes(monkeypatch):
    monkeypatch.setattr(l03.psutil, "Process", lambda: types.SimpleNamespace(
        memory_full_info=lambda: types.SimpleNamespace(uss=1234.0)))
    assert uss_bytes() == 1234 and type(uss_bytes()) is int


# ---- the probe and its requests ----------------------------------------------------------------

def test_the_probe_reports_its_start_once_and_reads_after_fetching_when_asked(monkeypatch):
    readings = iter([100, 150, 170])
    monkeypatch.setattr(l03, "uss_bytes", lambda: next(readings))
    fetched = []
    probe = l03._MemoryProbe(_Recording(fetched))
    first = probe[([4, 1, 3], True)]
    second = probe[([0, 2], False)]
    third = probe[([5], True)]
    assert fetched == [4, 1, 3, 0, 2, 5]
    assert {k: v for k, v in first.items() if k != "pid"} == {"start_uss": 100, "worker_id": None,
                                                               "fetched": 3, "uss": 150}
    assert {k: v for k, v in second.items() if k != "pid"} == {"worker_id": None, "fetched": 5}
    assert third["fetched"] == 6 and third["uss"] == 170 and "start_uss" not in third


class _Recording:
    def __init__(self, seen):
        self.seen = seen

    def __getitem__(self, i):
        self.seen.append(i)
        return i


def test_the_probe_reports_its_process_and_worker_id(monkeypatch):
    monkeypatch.setattr(l03, "uss_bytes", lambda: 7)
    monkeypatch.setattr(l03, "get_worker_info", lambda: types.SimpleNamespace(id=4))
    probe = l03._MemoryProbe(_Recording([]))
    first, second = probe[([0], True)], probe[([1], False)]
    assert first["pid"] == second["pid"] == os.getpid()
    assert first["worker_id"] == second["worker_id"] == 4 and second["fetched"] == 2


def test_the_requests_read_every_few_batches_and_each_workers_last_two():
    plan = l03._ProbeRequests(23, 2, shuffle=False, seed=0, num_workers=2, readings=2)
    requests = list(plan)
    assert len(plan) == 12 == len(requests)                     # ceil(23 / 2)
    assert requests[0] == ([0, 1], True) and requests[-1] == ([22], True)
    # every 12 // (2 x 2) = 3 batches (0, 3, 6, 9) and the last 2 x 2 (8 .. 11)
    assert [read for _, read in requests] == [True, False, False, True, False, False, True, False,
                                              True, True, True, True]


def test_more_readings_than_batches_read_every_batch():
    plan = l03._ProbeRequests(6, 1, shuffle=False, seed=0, num_workers=1, readings=10)
    assert all(read for _, read in plan)


def test_a_single_worker_reads_its_last_two_batches():
    reads = [read for _, read in l03._ProbeRequests(10, 1, shuffle=False, seed=0, num_workers=1,
                                                    readings=2)]
    # every 10 // 2 = 5: batches 0 and 5; the last 2: 8 and 9
    assert reads == [True, False, False, False, False, True, False, False, True, True]


def test_shuffled_requests_are_a_seeded_permutation():
    def order(seed):
        return [i for chunk, _ in l03._ProbeRequests(50, 8, shuffle=True, seed=seed, num_workers=2,
                                                    readings=1) for i in chunk]

    assert sorted(order(3)) == list(range(50)) and order(3) == order(3)
    assert order(3) != list(range(50)) and order(3) != order(4)


# ---- what worker_memory gathers ----------------------------------------------------------------

def test_growth_is_the_last_reading_minus_the_start():
    worker = WorkerUss(0, 11, start_uss_bytes=20, timeline=[(5, 35), (10, 26)])
    assert worker.growth_bytes == 6                            # 26 - 20, not 35 - 20
    assert WorkerUss(0, 11, start_uss_bytes=20, timeline=[]).growth_bytes == 0
    memory = WorkerMemory("x", "fork", 3, 30, [worker, WorkerUss(1, 12, 10, [(5, 19)]),
                                               WorkerUss(2, 13, 10, [(5, 10)])])
    assert memory.growth_bytes == [6, 9, 0]
    assert memory.mean_growth_bytes == 5.0 and memory.total_growth_bytes == 15


class FakeLoader:
    """Records how it was made and hands back ``reports`` (or raises ``error``)."""

    made: list = []
    reports: list = []
    error: Exception | None = None

    def __init__(self, dataset, **kwargs):
        FakeLoader.made.append((dataset, kwargs))

    def __iter__(self):
        def items():
            yield from FakeLoader.reports
            if FakeLoader.error is not None:
                raise FakeLoader.error
        return items()


@pytest.fixture
def loader(monkeypatch):
    FakeLoader.made, FakeLoader.reports, FakeLoader.error = [], [], None
    stopped = []
    monkeypatch.setattr(l03, "DataLoader", FakeLoader)
    monkeypatch.setattr(l03, "stop_workers", lambda it: stopped.append(it))
    monkeypatch.setattr(l03, "uss_bytes", lambda: 1)
    FakeLoader.stopped = stopped
    return FakeLoader


def test_worker_memory_groups_readings_by_process_in_worker_order(loader):
    loader.reports = [
        {"pid": 52, "worker_id": 1, "start_uss": 30, "fetched": 10, "uss": 31},
        {"pid": 51, "worker_id": 0, "start_uss": 20, "fetched": 10},
        {"pid": 52, "worker_id": 1, "fetched": 20, "uss": None},
        {"pid": 51, "worker_id": 0, "fetched": 20, "uss": 27},
        {"pid": 52, "worker_id": 1, "fetched": 30, "uss": 36}]
    memory = worker_memory(RecordArrayDataset(RECORDS * 20), 2, batch_size=10,
                           multiprocessing_context="fork", timeout_s=30, readings=3)
    assert [(w.worker_id, w.pid, w.start_uss_bytes, w.timeline) for w in memory.workers] == [
        (0, 51, 20, [(20, 27)]), (1, 52, 30, [(10, 31), (30, 36)])]
    assert memory.growth_bytes == [7, 6]
    assert (memory.label, memory.start_method, memory.num_workers, memory.samples) == (
        "RecordArrayDataset", "fork", 2, 60)
    ((probe, kwargs),) = loader.made
    assert kwargs["batch_size"] is None and kwargs["num_workers"] == 2 and kwargs["timeout"] == 30.0
    plan = kwargs["sampler"]
    assert (plan.n, plan.batch_size, plan.shuffle, plan.seed, plan.num_workers, plan.readings) == (
        60, 10, True, 0, 2, 3)
    assert kwargs["multiprocessing_context"].get_start_method() == "fork"
    assert len(loader.stopped) == 1


def test_worker_memory_passes_its_options_on(loader):
    worker_memory(RecordArrayDataset(RECORDS), 1, batch_size=3, shuffle=False, seed=9, readings=1,
                  multiprocessing_context="spawn", label="mine")
    plan = loader.made[0][1]["sampler"]
    assert (plan.shuffle, plan.seed, plan.readings) == (False, 9, 1)
    assert loader.made[0][1]["timeout"] == 0.0                   # not fork: no timeout


def test_a_process_outside_the_workers_sorts_last(loader):
    loader.reports = [{"pid": 9, "worker_id": None, "start_uss": 5, "fetched": 3, "uss": 6},
                      {"pid": 8, "worker_id": 0, "start_uss": 5, "fetched": 3, "uss": 7}]
    memory = worker_memory(RecordArrayDataset(RECORDS), 1, batch_size=3, label="mine")
    assert [w.worker_id for w in memory.workers] == [0, None] and memory.label == "mine"


def test_the_dataset_must_give_each_worker_a_batch(loader):
    worker_memory(RecordArrayDataset(RECORDS * 2), 2, batch_size=3)   # 6 = 2 x 3: enough
    with pytest.raises(ValueError, match="has 6 samples, fewer than num_workers x batch_size = 8"):
        worker_memory(RecordArrayDataset(RECORDS * 2), 2, batch_size=4)


def test_worker_memory_needs_uss(loader, monkeypatch):
    monkeypatch.setattr(l03, "uss_bytes", lambda: None)
    with pytest.raises(RuntimeError, match="does not report USS"):
        worker_memory(RecordArrayDataset(RECORDS), 1, batch_size=3)
    assert loader.made == []


@pytest.mark.parametrize("kwargs", [{"readings": 0}, {"timeout_s": 0}, {"batch_size": 0}])
def test_worker_memory_refuses_zero_sizes(loader, kwargs):
    with pytest.raises(ValueError):
        worker_memory(RecordArrayDataset(RECORDS), 1, **{"batch_size": 3, **kwargs})


def test_a_stuck_worker_is_explained_and_other_errors_pass(loader):
    loader.error = RuntimeError("DataLoader worker (pid 3) timed out after 4 seconds")
    with pytest.raises(RuntimeError, match="did not answer within timeout_s=4.0 s"):
        worker_memory(RecordArrayDataset(RECORDS), 1, batch_size=3, timeout_s=4)
    loader.error = RuntimeError("something else")
    with pytest.raises(RuntimeError, match="^something else$"):
        worker_memory(RecordArrayDataset(RECORDS), 1, batch_size=3)
    assert len(loader.stopped) == 2


def test_freeze_gc_freezes_while_the_workers_run_and_undoes_it(loader, monkeypatch):
    calls = []
    monkeypatch.setattr(l03.gc, "collect", lambda: calls.append("collect"))
    monkeypatch.setattr(l03.gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(l03.gc, "unfreeze", lambda: calls.append("unfreeze"))
    worker_memory(RecordArrayDataset(RECORDS), 1, batch_size=3)
    assert calls == []
    loader.error = RuntimeError("boom")
    with pytest.raises(RuntimeError):
        worker_memory(RecordArrayDataset(RECORDS), 1, batch_size=3, freeze_gc=True)
    assert calls == ["collect", "freeze", "unfreeze"]
