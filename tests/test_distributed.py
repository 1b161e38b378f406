"""What lesson 07's notebook, exercise 07's grader and the ranks share (course_utils.lessons.l07_scaling_out,
l07_launch): sharding checks on hand-made records, simulated ranks, and the torchrun launcher.

Three real torchrun launches (a few seconds each): the sampler under every worker start
method, a rank that crashes, and a rank that never finishes (the timeout).
"""
from __future__ import annotations

import multiprocessing
import os
import time

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from course_utils.lessons.l07_scaling_out import (IndexDataset, indices_of, sharding_report,
                                               simulate_ranks)
from course_utils.tools.ddp.launch import DistributedError, launch, pick_backend

pytestmark = pytest.mark.timeout(240)


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


# ---- launch: arguments (no processes) ----------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, match", [
    ({"task": "train"}, ValueError, "task='train'"),
    ({"task": "sampler", "nproc": 0}, ValueError, "nproc"),
    ({"task": "sampler", "timeout_s": 0}, ValueError, "timeout_s"),
    ({"task": "sampler", "backend": "mpi"}, ValueError, "backend='mpi'"),
    ({"task": "sampler", "config": {"x": object()}}, TypeError, "JSON"),
    ({"task": "sampler", "config": [1]}, TypeError, "config must be a dict"),
])
def test_launch_bad_arguments_are_named(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        launch(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() >= 2,
                    reason="this machine can run nccl")
def test_nccl_without_gpus_is_refused_and_gloo_is_picked():
    assert pick_backend(2) == "gloo"
    with pytest.raises(ValueError, match="nccl"):
        launch("sampler", backend="nccl")


# ---- launch: real ranks -------------------------------------------------------------------------

def test_ranks_shard_with_workers_under_every_start_method():
    methods = multiprocessing.get_all_start_methods()
    variants = [{"name": "main", "epochs": [0, 1], "batch_size": 3}]
    variants += [{"name": m, "epochs": [1], "num_workers": 1, "start_method": m} for m in methods]
    run = launch("sampler", {"n": 11, "variants": variants}, nproc=2, timeout_s=200)
    assert len(run.ranks) == 2 and run.backend == "gloo" and "2 rank(s)" in str(run)

    def report(variant):
        return sharding_report([{"rank": r["rank"], "epochs": r["variants"][variant]}
                                for r in run.ranks], 11)

    main = report("main")
    assert all("plus 1 repeated as padding" in e.verdict() for e in main.epochs)
    assert main.order_changes_every_epoch
    for m in methods:  # workers give the same indices as the main process, whatever the method
        assert report(m).epochs[0].per_rank == main.epochs[1].per_rank, m
    # torchrun sets OMP_NUM_THREADS=1 for each rank when it starts more than one
    for r in run.ranks:
        if "OMP_NUM_THREADS" not in os.environ:
            assert r["omp_num_threads_env"] == "1" and r["pools_at_start"]["torch_intra"] == 1
        assert r["all_reduce_total"] == sum(x["drawn"] for x in run.ranks)


def test_a_crashing_rank_gives_its_traceback():
    with pytest.raises(DistributedError) as info:
        launch("fail", {"rank": 1, "wait_s": 30}, nproc=2, timeout_s=120)
    err = info.value
    assert "failed on purpose" in str(err) and 1 in err.rank_errors and not err.timed_out
    assert "rank(s) [1] raised an error" in str(err)


def test_a_stuck_rank_is_killed_at_the_timeout():
    t0 = time.perf_counter()
    with pytest.raises(DistributedError, match="did not finish within timeout_s=5") as info:
        launch("sleep", {"rank": 0, "seconds": 600}, nproc=2, timeout_s=5)
    assert info.value.timed_out and time.perf_counter() - t0 < 40
    time.sleep(0.5)
    leftovers = []
    for p in psutil.process_iter(["cmdline", "ppid"]):
        cmd = p.info["cmdline"] or []
        # orphans of this test: ranks of the 'sleep' task re-parented to init (or to us)
        if "course_utils.tools.ddp.rank" in cmd and "sleep" in cmd and p.info["ppid"] in (1, os.getpid()):
            leftovers.append(p)
    assert not leftovers
