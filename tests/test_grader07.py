"""Grader of exercise 07 passes the reference answer and fails plausible wrong ones, teaching why.

Two answers go through real torchrun ranks (the reference, and one that only ranks can run);
the other wrong answers are caught by the in-process simulation the grader runs first.
"""
from __future__ import annotations

import collections
import itertools
import math

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from course_utils.grading.checker import CheckResult, ExerciseFailed, check, exercise_ids
from course_utils.grading.ex07_fix_sharding import EPOCHS, function_module_source

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
    (original_bug, "different numbers of samples", "waits for ever"),
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
    (three_args, "takes 3 argument"),
    (lambda d, e, r, w: reference(d, e, r, w), None),
])
def test_not_a_four_argument_function(answer, problem):
    if problem is None:  # a lambda passes the simulation but cannot be shipped to ranks
        with pytest.raises(ExerciseFailed, match="lambda"):
            function_module_source(answer)
        return
    with pytest.raises(ExerciseFailed, match=problem):
        check("07.sharding", answer, torchrun=False)


def test_the_stub_is_not_done_yet():
    with pytest.raises(ExerciseFailed, match="not done yet"):
        check("07.sharding", stub)


UNSENDABLE = {"seed": 0}


def uses_a_notebook_dict(dataset, epoch, rank, world_size):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank,
                                 seed=UNSENDABLE["seed"])
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)


def test_the_shipped_module_has_imports_constants_and_helpers():
    source = function_module_source(by_hand)
    assert "import torch" in source and "SEED = 0" in source and "BATCH_SIZE = 8" in source
    assert "from torch.utils.data.dataset import Subset" in source
    assert "import math" in source
    namespace: dict = {}
    exec(compile(source, "<shipped>", "exec"), namespace)
    assert callable(namespace["by_hand"])
    with pytest.raises(ExerciseFailed, match="notebook variable 'UNSENDABLE'") as info:
        function_module_source(uses_a_notebook_dict)
    assert "inside the function" in info.value.hint
