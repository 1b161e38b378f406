"""Exercise 07's judging code (course_utils.grading.ex07_fix_sharding.judge and grade_sharding)
on hand-made draws: 7 samples over 3 ranks, so the padding (ceil(7/3) * 3 - 7 = 2) differs from
drop_last's tail (7 % 3 = 1) and from 7 // 3 = 2 samples per rank only where a rule mixes them up;
each rule is tried just inside and just outside. The torchrun launch is replaced by hand-made
rank records, so no process is started."""
from __future__ import annotations

import pytest

from course_utils.grading import ex07_fix_sharding as ex07
from course_utils.grading.checker import ExerciseFailed, check
from course_utils.lessons.l07_scaling_out import sharding_report
from course_utils.tools.ddp.launch import DistributedError, DistributedRun

N, W = 7, 3
# three shuffled epochs, each a permutation of 0..6 padded (DistributedSampler-style) with its
# first two items: rank r takes order[r::3], 3 samples each
ORDERS = {0: [3, 0, 6, 1, 5, 2, 4], 1: [6, 2, 0, 4, 1, 3, 5], 2: [1, 4, 3, 5, 0, 6, 2]}


def shards(order, world=W, pad=2):
    order = list(order) + list(order[:pad])
    return [order[r::world] for r in range(world)]


def report(calls, n=N):
    """calls: [(epoch, [rank 0's indices, rank 1's, ...]), ...] -> a ShardingReport."""
    world = len(calls[0][1])
    records = [{"rank": r, "world_size": world,
                "epochs": [{"epoch": e, "indices": per_rank[r]} for e, per_rank in calls]}
               for r in range(world)]
    return sharding_report(records, n)


def good_calls():
    return [(0, shards(ORDERS[0])), (1, shards(ORDERS[1])), (2, shards(ORDERS[2])),
            (1, shards(ORDERS[1]))]


def failure(calls, n=N):
    with pytest.raises(ExerciseFailed) as info:
        ex07.judge(report(calls, n), "here")
    return info.value


def test_right_draws_pass_and_the_summary_counts_padding_and_shard_size():
    summary = ex07.judge(report(good_calls()), "here")
    assert summary.startswith("7 samples over 3 ranks: every sample once per epoch (2 repeated "
                              "as padding), disjoint shards of 3")


def test_values_outside_the_dataset_fail_first():
    calls = good_calls()
    calls[0] = (0, [[3, 1, 4], [0, 5, 7], [6, 2, 3]])            # 7 is not an index of 0..6
    err = failure(calls)
    assert "epoch 0 drew values that are not indices of the dataset (0..6)" in err.problem
    assert err.seen == "[7]"


def test_drop_last_loses_the_tail_and_is_told_the_padding_it_would_get():
    # each rank 2 = 7 // 3 samples, 6 distinct: the 1 (= 7 % 3) left over is never drawn
    calls = [(0, [[3, 1], [0, 5], [6, 2]])] + good_calls()[1:]
    err = failure(calls)
    assert "in epoch 0, 1 of 7 samples were never drawn by any rank" in err.problem
    assert "each rank took 2 = len(dataset) // world_size samples" in err.hint
    assert "the 1 that do not divide evenly between 3 ranks" in err.hint
    assert "drop_last=True" in err.hint and "repeats 2 sample(s)" in err.hint
    assert err.seen == "never drawn: [4]; samples per rank [2, 2, 2]"


def test_a_floor_split_with_a_repeat_is_told_to_round_up():
    # 2 per rank with one sample twice: 2 missing, so not drop_last's tail of 1
    err = failure([(0, [[3, 1], [0, 3], [6, 2]])] + good_calls()[1:])
    assert "2 of 7 samples were never drawn" in err.problem
    assert "7 samples over 3 ranks is 2.33333 each" in err.hint and "Round up" in err.hint


def test_a_floor_split_that_divides_evenly_is_told_to_round_up_too():
    # 6 samples, 3 ranks, 2 each as 6 // 3, but sample 0 twice: all counts are n // world
    err = failure([(0, [[0, 1], [0, 3], [4, 5]])], n=6)
    assert "1 of 6 samples were never drawn" in err.problem and "Round up" in err.hint


def test_too_few_draws_in_all_are_told_to_round_up():
    # unequal counts 3, 3, 0 (sum 6 < 7), no repeats: neither drop_last's nor 7 // 3 each
    err = failure([(0, [[3, 1, 4], [0, 5, 6], []])] + good_calls()[1:])
    assert "Round up" in err.hint


def test_ranks_with_different_permutations_are_told_to_share_the_seed():
    # 3 per rank, 9 draws (sum >= 7), sample 2 missing: each rank sliced its own shuffle
    err = failure([(0, [[3, 1, 4], [0, 5, 3], [6, 1, 0]])] + good_calls()[1:])
    assert "1 of 7 samples were never drawn" in err.problem
    assert "same seed" in err.hint


def test_overlap_is_allowed_up_to_the_padding_and_not_one_draw_more():
    # padding 2: two extra draws pass (the good calls); three fail
    calls = good_calls()
    calls[0] = (0, [[3, 1, 4], [0, 5, 3], [6, 2, 3]])            # 3 drawn three times: 2 extra
    assert ex07.judge(report(calls), "here")
    calls[0] = (0, [[3, 1, 4], [0, 5, 3], [6, 2, 4]])            # 3 twice, 4 twice: 2 extra
    assert ex07.judge(report(calls), "here")
    calls[0] = (0, [[3, 1, 4, 5], [0, 5, 3, 1], [6, 2, 4, 0]])   # 5 extra draws
    err = failure(calls)
    assert "in epoch 0 the shards overlap: 5 draws beyond one per sample, 5 sample(s) on more " \
           "than one rank" in err.problem
    assert "at most 2 sample(s) repeated as padding (7 samples, 3 ranks)" in err.expected
    assert "slice bounds" in err.hint


def test_every_rank_drawing_the_whole_dataset_is_told_it_is_not_sharded():
    everything = [[3, 0, 6, 1, 5, 2, 4], [6, 2, 0, 4, 1, 3, 5], [1, 4, 3, 5, 0, 6, 2]]
    err = failure([(0, everything)] + good_calls()[1:])
    assert "the shards overlap" in err.problem and "whole dataset" in err.hint


def test_unequal_counts_fail_with_the_rounded_up_count():
    # no sample missing, padding 2 as extra draws, but 4 + 3 + 2 draws
    err = failure([(0, [[3, 1, 4, 3], [0, 5, 6], [2, 1]])] + good_calls()[1:])
    assert "in epoch 0 the ranks drew different numbers of samples" in err.problem
    assert err.expected == "the same number on every rank (3)"
    assert err.seen == "samples per rank [4, 3, 2]; drawn more than once: [1, 3]"
    assert "all-reduce" in err.hint


def test_the_same_order_in_two_consecutive_epochs_names_the_ranks():
    calls = good_calls()
    zero = shards(ORDERS[0])                   # [3, 1, 4], [0, 5, 3], [6, 2, 0]
    # epoch 1: ranks 0 and 2 reorder their epoch-0 samples, rank 1 repeats its order
    calls[1] = calls[3] = (1, [zero[0][::-1], zero[1], zero[2][::-1]])
    err = failure(calls)
    assert "epochs 0 and 1 drew the same samples in the same order on rank(s) [1]" in err.problem
    assert err.seen.startswith("rank 1 in epoch 0: ")
    assert "set_epoch" in err.hint and "shuffle=False" not in err.hint


def test_the_later_pair_of_epochs_is_compared_too():
    calls = good_calls()
    calls[2] = (2, shards(ORDERS[1]))                              # epoch 2 repeats epoch 1
    err = failure(calls)
    assert "epochs 1 and 2 drew the same samples" in err.problem and "[0, 1, 2]" in err.problem


def test_an_unshuffled_order_is_told_shuffle_false():
    plain = shards(range(7))        # [0, 3, 6], [1, 4, 0], [2, 5, 1]: sorted but for the padding
    err = failure([(0, plain), (1, plain), (2, shards(ORDERS[2]))])
    assert "shuffle=False" in err.hint


def test_one_rank_in_index_order_is_not_called_unshuffled():
    # rank 0 sorted, ranks 1 and 2 not: the order repeats because of the seed, not shuffle=False
    same = [[0, 3, 6], [4, 1, 0], [5, 2, 1]]
    err = failure([(0, same), (1, same), (2, shards(ORDERS[2]))])
    assert "set_epoch" in err.hint and "shuffle=False" not in err.hint


def test_a_replayed_epoch_must_repeat_its_order_on_every_rank():
    calls = good_calls()
    changed = shards(ORDERS[1])
    changed[2] = list(reversed(changed[2]))                        # rank 2 only
    calls[3] = (1, changed)
    err = failure(calls)
    assert "epoch 1, asked for a second time, gave a different order on rank 2" in err.problem
    first = shards(ORDERS[1])[2]
    assert err.seen == f"first time {first}; second time {list(reversed(first))}"


# ---- grade_sharding around the judge, with the torchrun launch replaced -----------------------

def reference(dataset, epoch, rank, world_size):
    from torch.utils.data import DataLoader, DistributedSampler
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=8, sampler=sampler)


def needs_a_process_group(dataset, epoch, rank, world_size):
    raise RuntimeError("Default process group has not been initialized")


def raises_value_error(dataset, epoch, rank, world_size):
    raise ValueError("bad value")


def fake_ranks(monkeypatch, records, backend="gloo"):
    seen = {}

    def run_in_ranks(fn, *, timeout_s):
        seen["fn"], seen["timeout_s"] = fn, timeout_s
        return records, backend

    monkeypatch.setattr(ex07, "_run_in_ranks", run_in_ranks)
    return seen


def rank_records(calls, world=2):
    return [{"rank": r, "world_size": world,
             "epochs": [{"epoch": e, "indices": per_rank[r]} for e, per_rank in calls]}
            for r in range(world)]


def test_the_ranks_records_are_judged_and_named_in_the_summary(monkeypatch):
    import random
    rng = random.Random(1)
    orders = {e: rng.sample(range(103), 103) for e in (0, 1, 2)}
    calls = [(e, shards(orders[e], world=2, pad=1)) for e in ex07.EPOCHS]
    seen = fake_ranks(monkeypatch, rank_records(calls), backend="nccl")
    result = check("07.sharding", reference, timeout_s=42)
    assert seen["timeout_s"] == 42 and seen["fn"] is reference
    assert result.summary.endswith("- in 2 ranks under torchrun (nccl).")
    assert "103 samples over 2 ranks" in result.summary and "(1 repeated as padding)" in result.summary
    assert result.details["ranks"][0]["rank"] == 0 and result.details["simulated"]


def test_the_ranks_draws_are_judged_even_when_the_simulation_passed(monkeypatch):
    lost = [(e, [list(range(0, 51)), list(range(51, 102))]) for e in ex07.EPOCHS]   # 102 lost
    fake_ranks(monkeypatch, rank_records(lost))
    with pytest.raises(ExerciseFailed) as info:
        check("07.sharding", reference)
    assert info.value.problem.startswith("2 ranks started by torchrun: in epoch 0, 1 of 103")


def test_a_process_group_error_waits_for_the_ranks_only_under_torchrun(monkeypatch):
    good = [(e, shards(list(range(103)) if e != 1 else list(range(102, -1, -1)), world=2, pad=1))
            for e in ex07.EPOCHS]
    fake_ranks(monkeypatch, rank_records(good))      # ranks that would pass, were they asked
    with pytest.raises(ExerciseFailed) as info:
        check("07.sharding", needs_a_process_group, torchrun=False)
    assert "make_epoch_loader raised RuntimeError: Default process group" in info.value.problem
    with pytest.raises(ExerciseFailed, match="raised ValueError: bad value"):
        check("07.sharding", raises_value_error)                 # not a process-group error
    calls = [(e, shards(list(range(103)) if e == 0 else list(range(102, -1, -1)), world=2, pad=1))
             for e in ex07.EPOCHS]
    fake_ranks(monkeypatch, rank_records([(e, s) for e, s in calls]))
    with pytest.raises(ExerciseFailed) as info:                  # epochs 1 and 2 alike
        check("07.sharding", needs_a_process_group)
    assert info.value.problem.startswith("2 ranks started by torchrun: epochs 1 and 2")


def _failing_launch(message, errors, timed_out=False):
    def launch(*args, **kwargs):
        raise DistributedError(message, rank_errors=errors, timed_out=timed_out)
    return launch


def test_a_rank_s_last_traceback_line_is_what_the_learner_sees(monkeypatch):
    monkeypatch.setattr(ex07, "launch", _failing_launch(
        "rank 0 failed", {0: "Traceback (most recent call last):\n  File x\nNameError: name 'np'\n\n"}))
    with pytest.raises(ExerciseFailed) as info:
        ex07._run_in_ranks(reference, timeout_s=5)
    err = info.value
    assert (err.exercise, err.problem) == ("07.sharding", "make_epoch_loader failed in the ranks "
                                                          "started by torchrun.")
    assert err.expected == "the same result as in this process"
    assert err.seen == "NameError: name 'np'" and "rank 0 failed" in err.hint
    assert err.hint.startswith("the ranks are fresh processes that import your module")


def test_ranks_that_time_out_say_so_and_a_rank_s_stub_is_not_done(monkeypatch):
    monkeypatch.setattr(ex07, "launch", _failing_launch("timed out", {}, timed_out=True))
    with pytest.raises(ExerciseFailed) as info:
        ex07._run_in_ranks(reference, timeout_s=5)
    assert info.value.seen == "the ranks did not finish in time"
    monkeypatch.setattr(ex07, "launch", _failing_launch(
        "x", {1: "Traceback\nNotImplementedError: Exercise"}))
    with pytest.raises(NotImplementedError):
        ex07._run_in_ranks(reference, timeout_s=5)


def test_the_ranks_are_launched_with_the_exercise_s_module_and_epochs(monkeypatch):
    got = {}

    def launch(task, config, **kw):
        got.update(task=task, config=config, **kw)
        return DistributedRun(task, 2, "gloo", [{"rank": 0}], 0.0, "")

    monkeypatch.setattr(ex07, "launch", launch)
    assert ex07._run_in_ranks(reference, timeout_s=7) == ([{"rank": 0}], "gloo")
    assert got["config"] == {"module": __name__, "name": "reference", "n": 103,
                             "epochs": [0, 1, 2, 1]}
    assert got["nproc"] == 2 and got["timeout_s"] == 7 and got["backend"] == "gloo"
    assert got["pythonpath"] == [ex07.module_of(reference)[1]]


def test_a_function_of_a_module_without_a_file_cannot_go_to_the_ranks():
    with pytest.raises(ExerciseFailed, match="not a top-level function") as info:
        ex07.module_of(len)                                       # builtins has no __file__
    err = info.value
    assert err.exercise == "07.sharding" and err.seen == "'len' in 'builtins'"
    assert "(exercise07_sharding.py)" in err.expected


def test_one_rank_drawing_everything_is_an_overlap_of_slices_not_an_unsharded_loader():
    # rank 0 drew all 7 samples, ranks 1 and 2 drew a share each: the slices overlap
    err = failure([(0, [[3, 0, 6, 1, 5, 2, 4], [0, 5, 3], [6, 2, 1]])] + good_calls()[1:])
    assert "the shards overlap" in err.problem and "slice bounds" in err.hint


def test_the_simulation_alone_says_where_it_ran():
    result = check("07.sharding", reference, torchrun=False)
    assert result.summary.endswith("a replayed epoch identical - in this process.")
    assert "ranks" not in result.details and result.details["simulated"][1]["rank"] == 1


def test_a_failed_launch_without_a_traceback_says_so(monkeypatch):
    # 1508 characters: the hint shows the last 1500, from the first "y" on, indented
    monkeypatch.setattr(ex07, "launch", _failing_launch("A" * 7 + "B" + "y" * 1492 + " the end", {}))
    with pytest.raises(ExerciseFailed) as info:
        ex07._run_in_ranks(reference, timeout_s=5)
    assert info.value.seen == "(no traceback)"
    assert info.value.hint.endswith("output:\n      " + "y" * 1492 + " the end")
