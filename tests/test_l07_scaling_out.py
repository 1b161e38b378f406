"""Lesson 07's sharding checks (course_utils.lessons.l07_scaling_out): indices_of, the
sharding report on hand-made records, and simulate_ranks with the real DistributedSampler; and the
lesson's measure_ddp (its %%writefile module), which gives every run of a comparison one backend."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from course_utils.lessons.l07_scaling_out import (IndexDataset, indices_of, sharding_report,
                                                  simulate_ranks)


# ---- indices and the report -----------------------------------------------------------------

def test_indices_of_flattens_batches():
    assert indices_of([torch.tensor([3, 1]), [4, torch.tensor(5)], 7, (8,)]) == [3, 1, 4, 5, 7, 8]
    assert indices_of(DataLoader(IndexDataset(5), batch_size=2)) == [0, 1, 2, 3, 4]
    with pytest.raises(TypeError, match="not indices"):
        indices_of(["a"])
    with pytest.raises(TypeError, match="bool"):
        indices_of([True])
    with pytest.raises(IndexError, match="out of range"):
        IndexDataset(3)[3]
    with pytest.raises(ValueError, match="n must be"):
        IndexDataset(0)


def _records(*per_epoch_per_rank, epochs=None):
    """per_epoch_per_rank: for each epoch a list of per-rank index lists."""
    world = len(per_epoch_per_rank[0])
    epochs = epochs or list(range(len(per_epoch_per_rank)))
    return [{"rank": r, "world_size": world,
             "epochs": [{"epoch": e, "indices": shards[r]}
                        for e, shards in zip(epochs, per_epoch_per_rank)]}
            for r in range(world)]


def test_report_exact_padding_and_drop_last():
    exact = sharding_report(_records([[0, 2], [1, 3]]), 4).epochs[0]
    assert exact.verdict() == "every index exactly once" and exact.padding == 0
    padded = sharding_report(_records([[4, 0, 2], [1, 3, 4]]), 5).epochs[0]
    assert padded.repeated == {4: 2} and padded.on_several_ranks == [4] and padded.padding == 1
    assert "every index once, plus 1 repeated as padding ([4])" in padded.verdict()
    dropped = sharding_report(_records([[0, 2], [1, 3]]), 5).epochs[0]
    assert dropped.missing == [4] and dropped.tail == 1
    assert "no repeats; the 1 index(es) [4] dropped" in dropped.verdict()


def test_report_finds_overlap_missing_unequal_and_out_of_range():
    overlap = sharding_report(_records([[0, 1, 2], [2, 3, 4]]), 5).epochs[0]
    # one repeat, but not DistributedSampler's padding: it is an overlap of equal shards
    assert overlap.extra == 1 and overlap.on_several_ranks == [2]
    everything = sharding_report(_records([[0, 1, 2, 3], [3, 2, 1, 0]]), 4).epochs[0]
    assert everything.extra == 4 and "padding" not in everything.verdict()
    unequal = sharding_report(_records([[0, 1, 2], [3]]), 4).epochs[0]
    assert not unequal.equal_counts and "unequal counts [3, 1]" in unequal.verdict()
    missing = sharding_report(_records([[0], [1]]), 4).epochs[0]
    assert missing.missing == [2, 3] and "2 never drawn" in missing.verdict()
    bad = sharding_report(_records([[0, 9], [1, 2]]), 3).epochs[0]
    assert bad.out_of_range == [9] and "not indices" in bad.verdict()


def test_report_compares_orders_between_epochs_and_replays():
    same = sharding_report(_records([[0, 2], [1, 3]], [[0, 2], [1, 3]]), 4)
    assert same.same_order(0, 1) == [True, True] and not same.order_changes_every_epoch
    assert "same order on every rank" in str(same)
    changed = sharding_report(_records([[0, 2], [1, 3]], [[3, 1], [2, 0]], [[0, 2], [1, 3]],
                                       epochs=[0, 1, 0]), 4)
    assert changed.order_changes_every_epoch and [e.epoch for e in changed.firsts()] == [0, 1]
    assert changed.same_order(changed.epochs[0], changed.epochs[2]) == [True, True]
    assert "replay: same order" in str(changed)
    with pytest.raises(KeyError, match="epoch 5"):
        changed.same_order(0, 5)


@pytest.mark.parametrize("records, n, match", [
    ([], 4, "non-empty list"),
    ({"rank": 0}, 4, "non-empty list"),
    ([{"rank": 1, "epochs": []}], 4, "ranks 0..0"),
    ([{"rank": 0, "other": []}], 4, "no 'epochs' entry"),
    (_records([[0], [1]]), 0, "n must be"),
])
def test_report_bad_input_is_explained(records, n, match):
    with pytest.raises(ValueError, match=match):
        sharding_report(records, n)


def test_report_needs_the_same_epochs_on_every_rank():
    recs = _records([[0], [1]], [[1], [0]])
    recs[1]["epochs"] = recs[1]["epochs"][:1]
    with pytest.raises(ValueError, match="different numbers of epochs"):
        sharding_report(recs, 2)
    recs = _records([[0], [1]])
    recs[1]["epochs"][0]["epoch"] = 3
    with pytest.raises(ValueError, match="call 0 is epoch"):
        sharding_report(recs, 2)


# ---- simulate_ranks with the real DistributedSampler -----------------------------------------

def _with_set_epoch(dataset, epoch, rank, world_size):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=0)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=4, sampler=sampler)


def _without_set_epoch(dataset, epoch, rank, world_size):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=0)
    return DataLoader(dataset, batch_size=4, sampler=sampler)


def test_simulated_distributed_sampler_pads_and_reshuffles_only_with_set_epoch():
    state = torch.random.get_rng_state()
    good = sharding_report(simulate_ranks(_with_set_epoch, 11, 2, [0, 1, 2]), 11)
    assert all(e.verdict().startswith("every index once, plus 1 repeated") for e in good.epochs)
    assert good.order_changes_every_epoch
    stale = sharding_report(simulate_ranks(_without_set_epoch, 11, 2, [0, 1, 2]), 11)
    assert stale.same_order(0, 1) == [True, True] and stale.same_order(1, 2) == [True, True]
    three = sharding_report(simulate_ranks(_with_set_epoch, 10, 3, [0]), 10).epochs[0]
    assert three.padding == 2 and three.extra == 2 and three.counts == [4, 4, 4] and not three.missing
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG left as it was
    with pytest.raises(TypeError, match="make_loader"):
        simulate_ranks("not a function", 4)


# ---- lesson 07's measure_ddp: one backend for every run of the comparison -----------------------

@pytest.fixture(scope="module")
def ddp():
    from course_authoring.notebook_modules import notebook_module
    return notebook_module("07_scaling_out.ipynb", "lesson07_ddp")


def _bench_record(rank):
    return {"rank": rank, "step_times": [0.1, 0.2, 0.3], "step_samples": [4, 4, 4], "cpu_s": 1.2,
            "samples": 12, "wait_fraction": 0.25, "pools": {"torch_intra": 1},
            "pools_at_start": {"torch_intra": 1}, "omp_num_threads_env": "1"}


@pytest.mark.parametrize("gpus, nccl, expected", [
    (0, True, "gloo"),
    (1, True, "gloo"),       # nccl would fit the 1-rank run only: the 2-rank runs decide
    (2, True, "nccl"),
    (2, False, "gloo"),      # GPUs, but a torch without NCCL
])
def test_every_run_of_the_comparison_gets_one_backend(monkeypatch, ddp, gpus, nccl, expected):
    """Issue 38 N3: on 1 GPU the 1-rank run once got nccl on cuda:0 and the 2-rank runs gloo on
    the CPU. The choice follows the largest run, is passed to every launch, and says why."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: nccl)
    monkeypatch.setattr("course_utils.measurement.machine_summary", lambda: "a patched machine")
    launched = []

    def launch(task, cfg, *, nproc, timeout_s, backend):
        launched.append((nproc, backend))
        return SimpleNamespace(backend=backend or "picked", wall_s=3.0,
                               ranks=[_bench_record(r) for r in range(nproc)])

    monkeypatch.setattr(ddp, "launch", launch)
    backend, why = ddp.comparison_backend([1, 2, 2, 1])
    assert backend == expected and why.startswith(expected)
    assert (f"there are {gpus} here" in why) == (expected == "gloo")
    assert ("NCCL (not in this torch)" in why) == (not nccl)
    results = [ddp.measure_ddp(n, 1, 1, backend=backend) for n in (1, 2, 2, 1)]
    assert launched == [(n, expected) for n in (1, 2, 2, 1)]
    assert {r.backend for r in results} == {expected}
    assert f"({expected}, {'GPU per rank' if expected == 'nccl' else 'CPU'})" in str(results[1])
    ddp.measure_ddp(1, 1, 1)        # a run alone (the GPU check's) leaves the choice to launch
    assert launched[-1] == (1, None)
