"""Lesson 07's sharding report as the learner reads it (course_utils/lessons/l07_scaling_out.py):
one line per loader call with its counts, verdict and rank 0's first six indices; each epoch
compared with the one before (the same order on every rank, changed on every rank, or the ranks
that kept it), a replayed epoch with its first call; long index lists cut after eight."""
from __future__ import annotations

from course_utils.lessons.l07_scaling_out import sharding_report, shorten


def records(*epochs_per_rank):
    """epochs_per_rank[r] = [(epoch, indices), ...] for rank r."""
    return [{"rank": r, "world_size": len(epochs_per_rank),
             "epochs": [{"epoch": ep, "indices": list(ix)} for ep, ix in calls]}
            for r, calls in enumerate(epochs_per_rank)]


def test_each_call_is_one_line_compared_with_the_epoch_before_and_its_replay():
    rank0 = [(0, [9, 2, 7, 4, 1, 3, 8]), (1, [3, 8, 1, 9, 2, 4, 7]), (1, [3, 8, 1, 9, 2, 4, 7]),
             (2, [3, 8, 1, 9, 2, 4, 7])]
    rank1 = [(0, [0, 5, 6, 10, 11, 12, 13]), (1, [6, 0, 5, 13, 12, 11, 10]),
             (1, [0, 5, 6, 10, 11, 12, 13]), (2, [0, 5, 6, 10, 11, 12, 13])]
    text = str(sharding_report(records(rank0, rank1), 14))
    lines = text.split("\n")
    assert lines[0] == "2 ranks, 14 samples, 4 epoch(s) recorded" and len(lines) == 5
    assert lines[1] == "  epoch 0: counts [7, 7]; every index exactly once; rank 0 starts [9, 2, 7, 4, 1, 3, ...]"
    assert lines[2].endswith("rank 0 starts [3, 8, 1, 9, 2, 4, ...] | vs epoch 0: order changed")
    assert lines[3].endswith(" | replay: DIFFERENT order")          # rank 1 drew epoch 1 otherwise
    assert lines[4].endswith(" | vs epoch 1: same order on ranks [0]")


def test_the_same_order_on_every_rank_and_a_faithful_replay_are_said_so():
    calls = [(0, [0, 1, 2]), (0, [0, 1, 2]), (1, [0, 1, 2])]
    lines = str(sharding_report(records(calls, [(e, [x + 3 for x in ix]) for e, ix in calls]), 6)).split("\n")
    assert lines[2].endswith(" | replay: same order") and lines[3].endswith(" | vs epoch 0: same order on every rank")


def test_shorten_cuts_after_eight():
    assert shorten(list(range(8))) == "[0, 1, 2, 3, 4, 5, 6, 7]"
    assert shorten(list(range(9))) == "[0, 1, 2, 3, 4, 5, 6, 7, ...]"
    assert shorten([4, 5, 6], k=2) == "[4, 5, ...]"
