"""Grader of exercise 09 passes the reference (and file_system sharing set in the workers) and
fails the typical wrong answers with a teaching message; bad input says what to do."""
from __future__ import annotations

import torch
import torch.multiprocessing as torch_mp
import pytest
from torch.utils.data import DataLoader

from course_utils.grading.checker import ExerciseFailed, check, exercise_ids
from course_utils.process_tree import stop_workers

pytestmark = pytest.mark.timeout(120)
LIMITS = "09.survive_the_limits"
FD_SHARING = "file_descriptor" in torch_mp.get_all_sharing_strategies()


def detection_collate(batch):
    return tuple(zip(*batch))


def fewer_tensors(batch):
    images, targets = zip(*batch)
    return (torch.stack(images), torch.cat([t["boxes"] for t in targets]),
            torch.cat([t["labels"] for t in targets]), torch.tensor([len(t["labels"]) for t in targets]))


def file_system_sharing(worker_id):
    torch_mp.set_sharing_strategy("file_system")


def reference(dataset):
    return DataLoader(dataset, batch_size=10, num_workers=2, prefetch_factor=2, collate_fn=fewer_tensors)


def in_workers(dataset):
    return DataLoader(dataset, batch_size=10, num_workers=2, prefetch_factor=2,
                      collate_fn=detection_collate, worker_init_fn=file_system_sharing)


def recipe(dataset):
    return DataLoader(dataset, batch_size=10, num_workers=2, prefetch_factor=16, collate_fn=detection_collate)


def main_only(dataset):
    torch_mp.set_sharing_strategy("file_system")
    return DataLoader(dataset, batch_size=10, num_workers=2, prefetch_factor=2, collate_fn=detection_collate)


def too_many(dataset):
    return DataLoader(dataset, batch_size=10, num_workers=2, prefetch_factor=16, collate_fn=fewer_tensors)


def drops(dataset):
    return DataLoader(dataset, batch_size=12, num_workers=2, prefetch_factor=2, collate_fn=fewer_tensors,
                      drop_last=True)


def failure(answer, **options) -> ExerciseFailed:
    with pytest.raises(ExerciseFailed) as info:
        check(LIMITS, answer, **options)
    return info.value


@pytest.mark.parametrize("answer", [reference, in_workers])
def test_the_reference_and_file_system_in_the_workers_pass(answer):
    assert LIMITS in exercise_ids()
    strategy = torch_mp.get_sharing_strategy()
    result = check(LIMITS, answer)
    assert result.details["in_flight"] <= 256 * 1024 and result.details["limited"] == FD_SHARING
    assert torch_mp.get_sharing_strategy() == strategy


@pytest.mark.skipif(not FD_SHARING, reason="the descriptor limit needs file_descriptor sharing (Linux)")
@pytest.mark.parametrize("answer, words", [
    (recipe, ["section 3", "few tensors", "RuntimeError"]),
    (main_only, ["this process only", "worker_init_fn"])])
def test_too_many_open_files_fails_and_the_limit_is_restored(answer, words):
    import resource
    limit, strategy = resource.getrlimit(resource.RLIMIT_NOFILE), torch_mp.get_sharing_strategy()
    message = str(failure(answer))
    assert all(w in message for w in words), message
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == limit
    assert torch_mp.get_sharing_strategy() == strategy


@pytest.mark.parametrize("answer, words", [
    (too_many, ["section 1", "2 x 16 x", "prefetch_factor"]),
    (drops, ["never arrived", "missing [72", "drop_last"])])
def test_budget_and_lost_samples_fail(answer, words):
    message = str(failure(answer))
    assert all(w in message for w in words), message


def test_bad_input_says_what_to_do():
    for options in ({"fd_spare": 0}, {"shm_budget": -1}):
        with pytest.raises(ValueError, match="positive whole numbers"):
            check(LIMITS, reference, **options)
    assert "with workers" in str(failure(lambda dataset: [dataset[0]]))
    assert "with workers" in str(failure(lambda dataset: DataLoader(dataset)))
    assert "1 argument" in str(failure(lambda: None))
    assert "course's own" in str(failure(stop_workers))


def test_a_stub_is_not_done_yet():
    def stub(dataset):
        raise NotImplementedError
    assert "not done yet" in str(failure(stub))
