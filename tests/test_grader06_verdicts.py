"""Exercise 06's judging code (course_utils.grading.ex06_tune_pipeline): speed_verdict and
over_cpu_budget on hand-made rates (exact edges, a budget of 3 so that 3 + 0.4 differs from
3 * 1.4), the loader checks on loaders that are built but never iterated, and grade_fast_pipeline
with the side-by-side measurement replaced by made-up Measurements (no worker is started)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

import course_utils.grading.ex06_tune_pipeline as G
from course_utils.grading.checker import ExerciseFailed, check
from course_utils.measurement import Measurement
from test_grader06 import Batches, pass_on


# ---- speed_verdict and over_cpu_budget --------------------------------------------------------

def test_the_pass_mark_is_reached_at_exactly_half_the_reference():
    assert G.speed_verdict([200.0], [400.0]) == ("pass", 0.5)            # 200 / 400, not 400 / 200
    assert G.speed_verdict([199.0], [400.0])[0] == "re-run"
    assert G.speed_verdict([800.0], [400.0]) == ("pass", 2.0)


def test_exactly_the_slow_mark_is_still_a_re_run():
    assert G.speed_verdict([120.0], [400.0]) == ("re-run", 0.3)          # 120 / 400
    assert G.speed_verdict([119.0], [400.0]) == ("slow", pytest.approx(0.2975))


def test_the_ratio_is_the_median_of_the_rounds_ratios_not_the_ratio_of_medians():
    # rounds: 100/200 = 0.5, 400/200 = 2.0, 150/600 = 0.25: median 0.5 ("pass");
    # the medians' ratio would be 150/200 = 0.75 and the mean of the ratios 0.917
    assert G.speed_verdict([100.0, 400.0, 150.0], [200.0, 200.0, 600.0]) == ("pass", 0.5)
    # 4 rounds: 0.2, 0.4, 1.0, 2.0: the median is (0.4 + 1.0) / 2 = 0.7
    assert G.speed_verdict([20.0, 40.0, 100.0, 200.0], [100.0] * 4) == ("pass", pytest.approx(0.7))


def test_no_reference_rate_or_no_round_is_slow_not_an_error():
    verdict, ratio = G.speed_verdict([100.0], [0.0])
    assert verdict == "slow" and math.isnan(ratio)
    verdict, ratio = G.speed_verdict([], [])
    assert verdict == "slow" and math.isnan(ratio)


def test_custom_marks_are_used():
    assert G.speed_verdict([90.0], [100.0], pass_ratio=0.9)[0] == "pass"
    assert G.speed_verdict([89.0], [100.0], pass_ratio=0.9)[0] == "re-run"
    assert G.speed_verdict([59.0], [100.0], pass_ratio=0.9, slow_ratio=0.6)[0] == "slow"


def test_the_cpu_allowance_is_added_to_a_budget_of_three():
    # 3 cores + 0.4 = 3.4 (as a fraction, 3 * 1.4 would be 4.2)
    assert not G.over_cpu_budget(3.39, 3) and not G.over_cpu_budget(3.4, 3)
    assert G.over_cpu_budget(3.41, 3) and G.over_cpu_budget(4.1, 3)


# ---- the loader checks, on loaders never iterated ---------------------------------------------

class Plain(Dataset):
    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i])


class Rows(Dataset):
    """A batched fetch whose images (N, 2) and labels (N,) default_collate cannot stack."""

    def __len__(self):
        return 10

    def __getitems__(self, indices):
        return torch.zeros(len(indices), 2), torch.zeros(len(indices), dtype=torch.int64)


class ItemsOnly(Dataset):
    def __len__(self):
        return 10

    def __getitems__(self, indices):
        return torch.tensor(indices), torch.zeros(len(indices), dtype=torch.int64)


def test_samples_per_batch_wherever_the_loader_decides_them():
    ds = Plain()
    assert G._per_batch(DataLoader(ds, batch_size=8)) == 8
    assert G._per_batch(DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 6, False))) == 6
    assert G._per_batch(DataLoader(ds, batch_size=None,
                                   sampler=BatchSampler(SequentialSampler(ds), 5, False))) == 5
    assert G._per_batch(DataLoader(ds, batch_size=None)) is None


def test_a_batch_size_other_than_the_given_one_fails_with_both():
    ds = Plain()
    with pytest.raises(ExerciseFailed) as info:
        G._check_loader(DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 6, False)), 8)
    assert "batch size is not the one you were given" in info.value.problem
    assert info.value.expected.startswith("8 samples per batch") and info.value.seen == "6 samples per batch"
    G._check_loader(DataLoader(ds, batch_size=None), 8)         # cannot be told: left to the fetch
    G._check_loader(DataLoader(ds, batch_size=8), 8)


def test_a_loader_without_automatic_batching_must_sample_lists():
    ds = Plain()
    with pytest.raises(ExerciseFailed) as info:
        G._first_indices(DataLoader(ds, batch_size=None), 4)
    assert "fetches one index at a time" in info.value.problem and "int: 0" in info.value.seen
    lists = DataLoader(ds, batch_size=None, sampler=BatchSampler(SequentialSampler(ds), 4, False))
    assert G._first_indices(lists, 4) == [0, 1, 2, 3]
    assert G._first_indices(DataLoader(ds, batch_size=3), 3) == [0, 1, 2]


def test_a_dataset_without_the_method_the_loader_calls_is_named():
    with pytest.raises(ExerciseFailed) as info:                  # no automatic batching: [indices]
        G._fetch(DataLoader(ItemsOnly(), batch_size=None,
                            sampler=BatchSampler(SequentialSampler(range(10)), 2, False)), [0, 1])
    assert "this loader calls dataset[indices] (__getitem__)" in info.value.problem
    assert info.value.seen == "ItemsOnly defines __getitems__ only"


def test_a_fetch_is_read_as_the_fetcher_reads_it():
    fetched, batch = G._fetch(DataLoader(ItemsOnly(), batch_size=3, collate_fn=pass_on), [4, 1, 7])
    assert fetched is batch and fetched[0].tolist() == [4, 1, 7]
    fetched, batch = G._fetch(DataLoader(Plain(), batch_size=2), [3, 5])
    assert [t.tolist() for t in fetched] == [[3], [5]] and batch.tolist() == [[3], [5]]
    # default_collate on a batch already made: the hint asks what a collate_fn should do with it
    with pytest.raises(ExerciseFailed) as info:
        G._fetch(DataLoader(Rows(), batch_size=3), [4, 1])
    err = info.value
    assert "collate_fn failed on what your __getitems__ returned" in err.problem
    assert "default_collate" in err.hint


def test_the_batch_must_be_the_fetch_s_own_memory_and_one_call():
    images = torch.zeros(3, 2)
    fetched = (images, torch.zeros(3, dtype=torch.int64))
    G._check_one_fetch(DataLoader(ItemsOnly(), batch_size=3), fetched, images, 3)
    with pytest.raises(ExerciseFailed, match="collate_fn made a copy"):
        G._check_one_fetch(DataLoader(ItemsOnly(), batch_size=3), fetched, images.clone(), 3)
    with pytest.raises(ExerciseFailed, match="fetches one sample at a time"):
        G._check_one_fetch(DataLoader(Plain(), batch_size=3), fetched, images, 3)
    # a batch of 2: (images, labels) is 2 items too, and is not 2 separate samples
    two = torch.zeros(2, 2)
    G._check_one_fetch(DataLoader(ItemsOnly(), batch_size=2), (two, torch.zeros(2)), two, 2)
    samples = [torch.zeros(2), torch.zeros(2), torch.zeros(2)]
    with pytest.raises(ExerciseFailed, match="returns the batch as separate samples"):
        G._check_one_fetch(DataLoader(ItemsOnly(), batch_size=3), samples, samples[0], 3)


def test_pointers_look_one_level_into_short_tuples():
    a, b = np.zeros(4), torch.zeros(4)
    view = b[1:]
    assert a.ctypes.data in G._pointers((a, b)) and b.data_ptr() in G._pointers([a, b])
    assert view.untyped_storage().data_ptr() in G._pointers(view) and view.data_ptr() in G._pointers(view)
    assert G._pointers((1, 2, 3, 4, b)) == set()                 # 5 items: not looked into
    assert b.data_ptr() in G._pointers((1, 2, 3, b))


def test_resampled_keeps_the_loader_s_settings_and_draws_enough_samples():
    ds = Plain(10)
    loader = DataLoader(ds, batch_size=4, num_workers=2, prefetch_factor=3, timeout=7,
                        collate_fn=pass_on, drop_last=True)
    out = G._resampled(loader, 4, 40, keep_workers=True)
    assert out.batch_size == 4 and out.drop_last and out.num_workers == 2
    assert out.prefetch_factor == 3 and out.timeout == 7 and out.persistent_workers
    assert out.collate_fn is pass_on and out.sampler.num_samples == 40
    assert not G._resampled(loader, 4, 40, keep_workers=False).persistent_workers
    assert G._resampled(loader, 4, 3, keep_workers=False).sampler.num_samples == 10  # the dataset's
    plain = G._resampled(DataLoader(ds, batch_size=None,
                                    sampler=BatchSampler(SequentialSampler(ds), 4, False)), 5, 20, False)
    assert plain.batch_size is None and plain.sampler.batch_size == 5
    assert plain.sampler.sampler.num_samples == 20 and plain.num_workers == 0


# ---- grade_fast_pipeline with made-up measurements ----------------------------------------------

def measured(rates, cpu_s_per_sample, label):
    """Rounds of 100 samples at each rate (samples/s)."""
    return [Measurement.from_times(label, [100 / r], 100, cpu_s_per_sample=cpu_s_per_sample,
                                   machine="test") for r in rates]


def fake_rounds(monkeypatch, mine, ref, mine_cpu=0.001, ref_cpu=0.01):
    seen = {}

    def side_by_side(loader, reference, batch_size, window, rounds):
        seen.update(loader=loader, reference=reference, batch_size=batch_size, window=window,
                    rounds=rounds)
        return {"your loader": measured(mine, mine_cpu, "your loader"),
                "reference": measured(ref, ref_cpu, "reference")}

    monkeypatch.setattr(G, "_side_by_side", side_by_side)
    return seen


def build(workers=None):
    def build_loader(dataset, *, batch_size, size, cpu_budget):
        n = cpu_budget if workers is None else workers
        return DataLoader(Batches(dataset, size), batch_size=batch_size, collate_fn=pass_on,
                          num_workers=n)
    return build_loader


SMALL = dict(n_images=8, batch_size=4, size=32, batches=5, rounds=3)


def test_the_loader_is_measured_at_the_budget_and_reported(monkeypatch):
    # 3 rounds: 200/400, 300/400, 500/400 -> median ratio 0.75; 0.0175 CPU-s per sample at
    # 300 samples/s (the merged median) is 5.25 cores; budget 6
    seen = fake_rounds(monkeypatch, [200.0, 300.0, 500.0], [400.0] * 3, mine_cpu=0.0175)
    result = check(G.FAST, build(), cpu_budget=6, **SMALL)
    assert seen["window"] == 5 and seen["rounds"] == 3 and seen["batch_size"] == 4
    assert seen["reference"].num_workers == 6 and seen["loader"].num_workers == 6
    assert result.details["ratio"] == 0.75 and result.details["cores"] == pytest.approx(5.25)
    assert result.details["reference_cores"] == pytest.approx(4.0) and result.details["cpu_budget"] == 6
    assert result.summary == ("right samples, one fetch per batch; 0.75x the reference's samples/s "
                              "(300 vs 400) using 5.25 cores of a budget of 6.")


def test_the_budget_defaults_to_half_the_usable_cpus_and_at_least_one(monkeypatch):
    fake_rounds(monkeypatch, [400.0], [400.0])
    monkeypatch.setattr(G, "usable_cpus", lambda: 7)
    assert check(G.FAST, build(), **SMALL).details["cpu_budget"] == 3       # 7 // 2
    monkeypatch.setattr(G, "usable_cpus", lambda: 1)
    assert check(G.FAST, build(), **SMALL).details["cpu_budget"] == 1


def test_more_workers_than_the_budget_fail_before_any_timing(monkeypatch):
    fake_rounds(monkeypatch, [400.0], [400.0])
    assert check(G.FAST, build(workers=3), cpu_budget=3, **SMALL)
    with pytest.raises(ExerciseFailed) as info:
        check(G.FAST, build(workers=4), cpu_budget=3, **SMALL)
    assert info.value.problem == "4 workers is over the CPU budget of 3 core(s)."
    assert info.value.expected == "num_workers <= 3"


def test_cores_over_the_budget_plus_the_allowance_fail_with_the_figures(monkeypatch):
    # 0.0175 CPU-s per sample at 200 samples/s = 3.5 cores > 3 + 0.4
    fake_rounds(monkeypatch, [200.0] * 3, [400.0] * 3, mine_cpu=0.0175, ref_cpu=0.005)
    with pytest.raises(ExerciseFailed) as info:
        check(G.FAST, build(workers=1), cpu_budget=3, **SMALL)
    err = info.value
    assert err.problem == "your loader kept 3.50 cores busy; the budget is 3."
    assert err.expected.startswith("at most 3 + 0.4 cores")
    assert err.seen == ("your loader 200 samples/s using 3.50 cores; reference 400 samples/s "
                        "using 2.00 cores (0.50x)")
    # 0.016 CPU-s per sample: 3.2 cores, inside 3.4
    fake_rounds(monkeypatch, [200.0] * 3, [400.0] * 3, mine_cpu=0.016)
    assert check(G.FAST, build(workers=1), cpu_budget=3, **SMALL).details["cores"] == pytest.approx(3.2)


def test_a_loader_without_cpu_figures_counts_no_cores(monkeypatch):
    fake_rounds(monkeypatch, [400.0], [400.0], mine_cpu=None)
    assert check(G.FAST, build(workers=1), cpu_budget=1, **SMALL).details["cores"] == 0.0


def test_too_slow_and_not_decided_say_the_ratio_and_the_marks(monkeypatch):
    fake_rounds(monkeypatch, [100.0] * 3, [400.0] * 3)                  # 0.25: slow
    with pytest.raises(ExerciseFailed) as info:
        check(G.FAST, build(workers=1), cpu_budget=1, **SMALL)
    assert info.value.problem == "your loader reached 0.25x the reference's samples/s: too slow."
    assert info.value.expected == ("at least 0.50x, measured side by side (the median of 3 "
                                   "interleaved rounds)")
    fake_rounds(monkeypatch, [160.0] * 3, [400.0] * 3)                  # 0.4: between
    with pytest.raises(ExerciseFailed) as info:
        check(G.FAST, build(workers=1), cpu_budget=1, **SMALL)
    assert info.value.problem.startswith("not decided: your loader reached 0.40x the reference's "
                                         "samples/s, between 0.30x (too slow) and 0.50x (passes)")


# ---- _check_batch on hand-made batches ---------------------------------------------------------

@pytest.fixture(scope="module")
def jpegs():
    from course_utils.data import JpegDataset
    return JpegDataset(n=6, min_side=200, max_side=480, seed=6)


def reference_batch(dataset, indices, size):
    from course_utils.data import ToTensorUint8
    images = torch.stack([ToTensorUint8(size)(dataset[i][0]) for i in indices])
    return images, torch.as_tensor(dataset.labels[list(indices)], dtype=torch.int64)


def batch_problem(batch, dataset, indices=(4, 0, 2), size=16):
    with pytest.raises(ExerciseFailed) as info:
        G._check_batch(batch, dataset, list(indices), size)
    return info.value


def test_a_right_batch_out_of_index_order_passes(jpegs):
    G._check_batch(reference_batch(jpegs, [4, 0, 2], 16), jpegs, [4, 0, 2], 16)
    G._check_batch(list(reference_batch(jpegs, [1], 16)), jpegs, [1], 16)


def test_a_batch_must_be_images_and_labels(jpegs):
    images, labels = reference_batch(jpegs, [4, 0, 2], 16)
    assert "not (images, labels)" in batch_problem((images, labels, labels), jpegs).problem
    assert "not (images, labels)" in batch_problem(images, jpegs).problem
    err = batch_problem((images.numpy(), labels), jpegs)
    assert "not a torch tensor" in err.problem and err.seen == "ndarray"


def test_the_images_shape_is_n_c_h_w(jpegs):
    images, labels = reference_batch(jpegs, [4, 0, 2], 16)
    err = batch_problem((images.permute(0, 2, 3, 1), labels), jpegs)
    assert err.problem == "the images have the wrong shape."
    assert err.expected == "(3, 3, 16, 16) (N, C, H, W)" and err.seen == "(3, 16, 16, 3)"
    assert "resized to 16x16" in err.hint


def test_one_value_off_by_one_is_counted(jpegs):
    images, labels = reference_batch(jpegs, [4, 0, 2], 16)
    off = images.clone()
    off[1, 2, 5, 7] = off[1, 2, 5, 7] + 1 if off[1, 2, 5, 7] < 255 else 254
    err = batch_problem((off, labels), jpegs)
    assert err.seen == "1 of 2,304 values differ (largest difference 1)"       # 3 * 3 * 16 * 16
    assert "BGR" not in err.hint
    assert "BGR order" in batch_problem((images.flip(1), labels), jpegs).hint


def test_the_labels_must_be_int64_in_the_order_asked(jpegs):
    images, labels = reference_batch(jpegs, [4, 0, 2], 16)
    err = batch_problem((images, labels.int()), jpegs)
    assert err.problem == "the labels differ from the dataset's."
    assert err.seen == f"torch.int32 {labels.tolist()}" and err.expected == str(labels.tolist())
    assert "labels differ" in batch_problem((images, labels.flip(0)), jpegs).problem
    assert "list: [" in batch_problem((images, labels.tolist()), jpegs).seen
