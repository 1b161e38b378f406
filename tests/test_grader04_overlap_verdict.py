"""Grader 04 (course_utils/grading/ex04_prefetcher.py): the CUDA overlap verdict judged on the CPU
with made-up timings (the copy, the step, the plain loop's and the prefetcher's passes fed in
through fakes of ``time_op``, ``_copy_s`` and ``calibrated_compute``): the share of the hideable
copy time saved, ``(plain - prefetcher) / (batches x min(copy, step))``, passes at the threshold
and fails just below it; each pass is the best of its repeats and the step the median of its;
and the look-ahead and order checks on made-up pull counts and batch orders."""
from __future__ import annotations

import pytest
import torch

import course_utils.grading.ex04_prefetcher as G
from course_utils.grading.checker import ExerciseFailed

pytestmark = pytest.mark.timeout(60)
CPU = torch.device("cpu")


class Plain:
    """A prefetcher that just moves each batch (what it does does not matter here)."""

    def __init__(self, loader, device):
        self.loader, self.device = loader, device

    def __iter__(self):
        for images, labels in self.loader:
            yield images.to(self.device), labels.to(self.device)


@pytest.fixture
def timings(monkeypatch):
    """Feed ``_cuda_overlap_check`` made-up figures: set ``copy_s``, ``step`` (5 step times),
    ``plain`` and ``learner`` (3 pass times each). 12 small batches on the CPU."""
    figures = {"copy_s": 0.25, "step": [0.5] * 5, "plain": [4.0] * 3, "learner": [3.0] * 3}
    calls: list[str] = []
    monkeypatch.setattr(G, "_big_loader", lambda n, mib, pin: G._RecordingLoader(n, 2))
    monkeypatch.setattr(G, "_copy_s", lambda loader, device, repeats: figures["copy_s"])
    monkeypatch.setattr(G, "calibrated_compute", lambda device, target_s: (lambda: None))

    def time_op(fn, *, device, repeats, events=True):
        fn()                                      # run it once: the answer is really iterated
        name = "step" if repeats == 5 else "plain" if "plain" not in calls else "learner"
        calls.append(name)
        return list(figures[name])

    monkeypatch.setattr(G, "time_op", time_op)
    figures["calls"] = calls
    return figures


def test_the_saved_share_is_over_the_smaller_of_copy_and_step(timings):
    # copy 0.25 s, step 0.5 s: hideable 12 x 0.25 = 3 s; plain 4 s, prefetcher 3 s: 1 / 3 saved
    out = G._cuda_overlap_check(Plain, CPU, 1, 0.3)
    assert out["overlap_saved"] == pytest.approx(1 / 3)
    assert out["copy_ms"] == 250.0 and out["step_ms"] == 500.0
    assert out["plain_ms"] == 4000.0 and out["prefetcher_ms"] == 3000.0
    assert timings["calls"] == ["step", "plain", "learner"]


def test_a_step_shorter_than_the_copy_bounds_what_can_be_hidden(timings):
    # step 0.125 s < copy 0.25 s: hideable 12 x 0.125 = 1.5 s; plain 4, prefetcher 3.25: 0.5 saved
    # (over the copy, 12 x 0.25 = 3 s, it would be 0.25 and fail a threshold of 0.4)
    timings["step"] = [0.125] * 5
    timings["learner"] = [3.25] * 3
    assert G._cuda_overlap_check(Plain, CPU, 1, 0.4)["overlap_saved"] == 0.5


@pytest.mark.parametrize("learner, passes", [(3.25, True), (3.375, False)],
                         ids=["at-threshold", "just-below"])
def test_saving_exactly_the_threshold_passes_and_less_fails(timings, learner, passes):
    # hideable 3 s; plain 4 s: prefetcher 3.25 saves 0.75 / 3 = 0.25 (the threshold), 3.375 saves
    # 0.625 / 3 = 0.208
    timings["learner"] = [learner] * 3
    if passes:
        assert G._cuda_overlap_check(Plain, CPU, 1, 0.25)["overlap_saved"] == 0.25
        return
    with pytest.raises(ExerciseFailed) as info:
        G._cuda_overlap_check(Plain, CPU, 1, 0.25)
    err = info.value
    assert err.problem == "the copies did not overlap the compute."
    assert err.expected == ("at least 25% of the hideable copy time hidden (12 batches: copy "
                            "250.00 ms, step 500.00 ms each)")
    assert err.seen == "plain loop 4000.0 ms, your prefetcher 3375.0 ms: 21% hidden"


def test_each_pass_is_its_best_repeat_and_the_step_its_median(timings):
    # step median of (0.5, 0.125, 2, 0.5, 4) = 0.5 (the mean would be 1.425); passes: the best of
    # 3: plain min(5, 4, 6) = 4, prefetcher min(3, 3.5, 9) = 3
    timings["step"] = [0.5, 0.125, 2.0, 0.5, 4.0]
    timings["plain"] = [5.0, 4.0, 6.0]
    timings["learner"] = [3.0, 3.5, 9.0]
    out = G._cuda_overlap_check(Plain, CPU, 1, 0.3)
    assert out["step_ms"] == 500.0 and out["plain_ms"] == 4000.0 and out["prefetcher_ms"] == 3000.0
    assert out["overlap_saved"] == pytest.approx(1 / 3)


def test_a_slower_prefetcher_saves_a_negative_share_and_fails(timings):
    timings["learner"] = [5.0] * 3                  # (4 - 5) / 3 = -33 %
    with pytest.raises(ExerciseFailed, match="did not overlap") as info:
        G._cuda_overlap_check(Plain, CPU, 1, 0.0)
    assert info.value.seen.endswith(": -33% hidden")


def test_nothing_to_hide_counts_as_nothing_saved(timings):
    timings["copy_s"] = 0.0                          # hideable 0: saved 0, not a division error
    assert G._cuda_overlap_check(Plain, CPU, 1, 0.0)["overlap_saved"] == 0.0
    with pytest.raises(ExerciseFailed):
        G._cuda_overlap_check(Plain, CPU, 1, 0.01)


# ---- look-ahead on made-up pull counts ---------------------------------------------------------

@pytest.mark.parametrize("pulled", [[2, 3, 4, 5, 5], [3, 4, 5, 5, 5]], ids=["one-ahead", "two-ahead"])
def test_one_batch_ahead_or_more_is_double_buffering(pulled):
    G._check_lookahead(pulled, 5)


def test_a_batch_handed_out_before_the_next_was_read_is_no_second_buffer():
    # batch 2 handed out when 3 batches were read: 3 < 2 + 2
    with pytest.raises(ExerciseFailed) as info:
        G._check_lookahead([2, 3, 3, 5, 5], 5)
    assert info.value.seen == "3 batches read when batch 2 was yielded"
    assert info.value.expected.startswith("the loader asked for batch 3 before batch 2 is yielded "
                                          "(at least 4 batches read)")


def test_the_last_batch_needs_no_batch_after_it():
    G._check_lookahead([2, 3, 4, 4], 4)              # batch 3 (the last) with 4 read: fine


@pytest.mark.parametrize("n, fails", [(3, False), (4, True), (6, True)])
def test_reading_the_whole_epoch_first_fails_from_four_batches(n, fails):
    pulled = [n] * n
    if not fails:
        G._check_lookahead(pulled, n)
        return
    with pytest.raises(ExerciseFailed, match="read the whole epoch") as info:
        G._check_lookahead(pulled, n)
    assert info.value.seen == f"all {n} batches read before batch 0 was yielded"


def test_short_loaders_are_not_judged_on_look_ahead():
    G._check_lookahead([1, 2], 2)                    # n < 3: nothing to overlap yet


def test_reading_one_short_of_the_epoch_first_is_not_the_whole_epoch():
    G._check_lookahead([5, 6, 6, 6, 6, 6], 6)        # 5 of 6 read first: still one ahead each


# ---- the CUDA checks' loaders and copy time, on the CPU ------------------------------------------

@pytest.mark.parametrize("mib, batch", [(1, 85), (32, 2730), (0, 1)])
def test_a_big_loaders_batch_holds_about_mib_mebibytes_of_64x64_images(mib, batch):
    # one image is 3 x 64 x 64 = 12,288 bytes: 1 MiB = 1,048,576 // 12,288 = 85 images;
    # 32 MiB -> 2,730; 0 MiB -> at least 1 image
    loader = G._big_loader(2, mib, pin=False)
    images, labels = loader.batches[1]
    assert images.shape == (batch, 3, 64, 64) and labels.shape == (batch,)
    assert bool((images == 2).all())                     # batch 1: every pixel (1 % 250) + 1


def test_the_copy_time_is_the_median_of_the_repeats(monkeypatch):
    seen = {}

    def time_op(fn, *, device, repeats):
        fn()
        seen["repeats"] = repeats
        return [0.004, 0.001, 0.009, 0.002, 0.003][:repeats]   # median of 5: 0.003 (mean 0.0038)

    monkeypatch.setattr(G, "time_op", time_op)
    assert G._copy_s(G._RecordingLoader(1, 2), CPU, 5) == 0.003
    assert seen["repeats"] == 5
    assert G._copy_s(G._RecordingLoader(1, 2), CPU, 3) == 0.004        # median of 0.004, 0.001, 0.009


class Endless:
    """Yields the loader's first batch for ever."""

    def __init__(self, loader, device):
        self.loader = loader

    def __iter__(self):
        first = self.loader.batches[0]
        while True:
            yield first


@pytest.mark.parametrize("n", [1, 4])
def test_a_prefetcher_that_never_stops_is_cut_after_three_times_the_batches_plus_three(n):
    loader = G._RecordingLoader(n, 2)
    with pytest.raises(ExerciseFailed) as info:
        G._run_pass(Endless(loader, CPU), loader, CPU)
    assert info.value.seen == f"more than {3 * n + 3}" and info.value.expected == f"{n} batches"


def test_three_times_the_batches_plus_three_is_still_allowed_by_the_pass():
    class Repeats(Endless):
        def __iter__(self):
            for _ in range(3 * self.loader.n + 3):
                yield self.loader.batches[0]

    loader = G._RecordingLoader(2, 2)
    out, pulled = G._run_pass(Repeats(loader, CPU), loader, CPU)
    assert len(out) == 9 and pulled == [0] * 9            # the loader itself was never read


@pytest.mark.parametrize("message, device, hint", [
    ("Cannot access accelerator device when none is available: pin_memory", "cpu",
     "leave pinning to the DataLoader"),
    ("pin_memory failed", "cuda", "read the traceback"),
    ("Torch not compiled with CUDA enabled", "cpu", "only on a CUDA device"),
    ("CUDA error", "cuda", "read the traceback"),
    ("index out of range", "cpu", "read the traceback"),
], ids=["pin-on-cpu", "pin-on-cuda", "cuda-on-cpu", "cuda-on-cuda", "other"])
def test_iteration_hints_follow_the_error_and_the_device(message, device, hint):
    assert hint in G._iteration_hint(RuntimeError(message), torch.device(device))


def test_three_batches_are_enough_to_judge_look_ahead():
    # n = 3, each batch handed out as soon as it was read: 1 < 0 + 2
    with pytest.raises(ExerciseFailed, match="no second buffer"):
        G._check_lookahead([1, 2, 3], 3)


def test_the_batch_before_the_last_is_judged_too():
    # n = 4: batches 0 and 1 one ahead, batch 2 handed out with only 3 read (3 < 2 + 2)
    with pytest.raises(ExerciseFailed) as info:
        G._check_lookahead([2, 3, 3, 4], 4)
    assert info.value.seen == "3 batches read when batch 2 was yielded"
