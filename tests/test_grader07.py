"""Grader of exercise 07 passes the reference answer and fails plausible wrong ones, teaching why.

Two answers go through real torchrun ranks (the reference, and one that only ranks can run);
the other wrong answers are caught by the in-process simulation the grader runs first.
"""
from __future__ import annotations

import collections
import itertools
import math
import os
import types

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from course_utils.grading.checker import CheckResult, ExerciseFailed, check, exercise_ids
from course_utils.grading.ex07_fix_sharding import EPOCHS, module_of
from course_utils.lessons.l07_scaling_out import simulate_ranks

pytestmark = pytest.mark.timeout(240)
BATCH_SIZE = 8
SEED = 0


def reference(dataset, epoch, rank, world_size):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=SEED)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)


def by_hand(dataset, epoch, rank, world_size):
    """Correct without DistributedSampler: seed + epoch, round up, pad from the front."""
    g = torch.Generator().manual_seed(SEED + epoch)
    order = torch.randperm(len(dataset), generator=g).tolist()
    total = math.ceil(len(dataset) / world_size) * world_size
    order += order[:total - len(order)]
    return DataLoader(Subset(dataset, order[rank:total:world_size]), batch_size=BATCH_SIZE)


def original_bug(dataset, epoch, rank, world_size):
    g = torch.Generator().manual_seed(SEED)
    order = torch.randperm(len(dataset), generator=g).tolist()
    per_rank = math.ceil(len(dataset) / world_size)
    mine = order[rank * per_rank:(rank + 1) * per_rank + 1]
    return DataLoader(Subset(dataset, mine), batch_size=BATCH_SIZE)


def no_set_epoch(dataset, epoch, rank, world_size):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=SEED)
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)


def no_shuffle(dataset, epoch, rank, world_size):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)


def not_sharded(dataset, epoch, rank, world_size):
    g = torch.Generator().manual_seed(SEED + epoch)
    return DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, generator=g)


def floor_split(dataset, epoch, rank, world_size):
    g = torch.Generator().manual_seed(SEED + epoch)
    order = torch.randperm(len(dataset), generator=g).tolist()
    per_rank = len(dataset) // world_size
    return DataLoader(Subset(dataset, order[rank * per_rank:(rank + 1) * per_rank]),
                      batch_size=BATCH_SIZE)


def drop_last(dataset, epoch, rank, world_size):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=SEED,
                                 drop_last=True)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)


def seeds_per_rank(dataset, epoch, rank, world_size):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=rank)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)


_calls = collections.defaultdict(itertools.count)


def counter_epoch(dataset, epoch, rank, world_size):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=SEED)
    sampler.set_epoch(next(_calls[rank]))  # counts calls, not epochs: a replay differs
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)


def from_process_group_without_set_epoch(dataset, epoch, rank, world_size):
    sampler = DistributedSampler(dataset)          # rank and world size from the process group
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)


def returns_the_sampler_list(dataset, epoch, rank, world_size):
    return "not a loader"


def three_args(dataset, epoch, rank):
    return reference(dataset, epoch, rank, 2)


def stub(dataset, epoch, rank, world_size):
    raise NotImplementedError("Exercise: replace this line with your code")


def test_known_id():
    assert "07.sharding" in exercise_ids()


def test_reference_passes_under_torchrun():
    result = check("07.sharding", reference)
    assert isinstance(result, CheckResult) and "torchrun" in result.summary
    ranks = result.details["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [c["epoch"] for c in ranks[0]["epochs"]] == list(EPOCHS)


def test_correct_answer_by_hand_passes_the_simulation():
    assert "every sample once" in check("07.sharding", by_hand, torchrun=False).summary


def test_only_ranks_can_run_a_process_group_sampler_and_they_find_the_stale_order():
    with pytest.raises(ExerciseFailed, match="torchrun: epochs 0 and 1 drew the same") as info:
        check("07.sharding", from_process_group_without_set_epoch)
    assert "set_epoch" in info.value.hint


@pytest.mark.parametrize("answer, problem, hint", [
    (original_bug, "different numbers of samples", "the others do not"),
    (no_set_epoch, "same order", "set_epoch"),
    (no_shuffle, "same order", "shuffle=False"),
    (not_sharded, "shards overlap", "whole dataset"),
    (seeds_per_rank, "never drawn", "same seed"),
    (floor_split, "never drawn", "len(dataset) // world_size"),
    (drop_last, "never drawn", "drop_last=True"),
    (counter_epoch, "second time, gave a different order", "fixed seed and the epoch"),
    (returns_the_sampler_list, "not a loader", "DataLoader"),
])
def test_wrong_answers_fail_with_a_teaching_message(answer, problem, hint):
    with pytest.raises(ExerciseFailed) as info:
        check("07.sharding", answer, torchrun=False)
    err = info.value
    assert problem in err.problem and hint in err.hint, str(err)
    assert err.expected and err.seen


@pytest.mark.parametrize("answer, problem", [
    (None, "not a function"),
    (DataLoader, "not a function"),
    (three_args, "does not take 4 arguments"),
])
def test_not_a_four_argument_function(answer, problem):
    with pytest.raises(ExerciseFailed, match=problem):
        check("07.sharding", answer, torchrun=False)


def test_the_stub_is_not_done_yet():
    with pytest.raises(ExerciseFailed, match="not done yet"):
        check("07.sharding", stub)


def test_the_ranks_get_the_module_and_folder_that_define_the_function():
    assert module_of(reference) == (__name__, os.path.dirname(os.path.abspath(__file__)))
    local = lambda d, e, r, w: reference(d, e, r, w)  # noqa: E731 - not a module's top-level name
    with pytest.raises(ExerciseFailed, match="not a top-level function of a module") as info:
        module_of(local)
    assert "%%writefile" in info.value.hint and "lesson 00, deep dive 7" in info.value.hint


def test_a_notebook_function_passes_the_simulation_and_is_sent_to_write_a_module():
    notebook = types.FunctionType(reference.__code__, reference.__globals__, "reference")
    notebook.__module__ = "__main__"
    with pytest.raises(ExerciseFailed, match="cannot import make_epoch_loader"):
        check("07.sharding", notebook)


def test_a_copy_of_the_course_helper_is_refused():
    with pytest.raises(ExerciseFailed, match=r"course's own `simulate_ranks` \(course_utils\."):
        check("07.sharding", simulate_ranks, torchrun=False)
