"""Grader 03 (course_utils/grading/ex03_num_workers.py) with its measurements faked: the real
curve's sweep (worker grid 0..min(2 x usable CPUs, 6), its settings) and the copy-on-read memory
figures (the verdict's numbers in the failure, the list version measured once per (records, seed,
workers), the no-fork and too-little branches), so every figure a learner reads is pinned on
hand-made numbers without starting a worker."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import course_utils.grading.ex03_num_workers as G
from course_utils.grading.checker import ExerciseFailed

pytestmark = pytest.mark.timeout(60)
MB = 1e6


def reference_choose(workers, samples_per_s):
    best = max(samples_per_s)
    return min(w for w, r in zip(workers, samples_per_s) if r >= 0.9 * best)


# ---- the curve measured here, faked ---------------------------------------------------------------

@pytest.fixture
def sweeps(monkeypatch):
    """sweep_workers replaced: records its arguments, answers a plateau over the grid asked for."""
    calls = []

    def sweep(dataset, workers, **kwargs):
        calls.append({"workers": list(workers), **kwargs})
        rates = [100.0 * min(w + 1, 3) for w in workers]   # 100, 200, 300, 300, ...
        return types.SimpleNamespace(workers=list(workers), samples_per_s=rates)

    monkeypatch.setattr(G, "sweep_workers", sweep)
    monkeypatch.setattr(G, "JpegDataset", lambda **kwargs: kwargs)
    return calls


@pytest.mark.parametrize("cpus, grid", [(1, [0, 1, 2]), (2, [0, 1, 2, 3, 4]), (3, list(range(7))),
                                        (8, list(range(7)))],
                         ids=["1-cpu", "2-cpus", "3-cpus-capped", "8-cpus-capped"])
def test_the_measured_grid_is_twice_the_usable_cpus_capped_at_six(monkeypatch, sweeps, cpus, grid):
    monkeypatch.setattr(G, "usable_cpus", lambda: cpus)
    curve = G._measured_curve()
    assert sweeps[0]["workers"] == grid
    assert curve["workers"] == grid and curve["truth"] == curve["measured"]
    assert sweeps[0]["batch_size"] == 8 and sweeps[0]["repeats"] == 1


def test_the_measured_curve_is_judged_at_its_own_saturation_fraction(monkeypatch, sweeps):
    # plateau 100, 200, 300, 300, 300 on workers 0..4 (2 CPUs): 95 % of 300 is first reached at 2
    monkeypatch.setattr(G, "usable_cpus", lambda: 2)
    result = G.grade_choose_workers(reference_choose, measure_real_curve=True)
    assert result.details["measured here"] == 2
    assert result.details["measured curve"] == {"workers": [0, 1, 2, 3, 4],
                                                "samples_per_s": [100.0, 200.0, 300.0, 300.0, 300.0]}
    assert "measured here (0: 100, 1: 200, 2: 300, 3: 300, 4: 300 samples/s): 2" in result.summary


def test_without_the_real_curve_the_summary_lists_each_synthetic_answer(sweeps):
    result = G.grade_choose_workers(reference_choose, measure_real_curve=False)
    assert sweeps == []
    names = [c["name"] for c in G.synthetic_curves()]
    assert list(result.details) == names
    assert result.summary.startswith("good choices on every curve (" + names[0] + ": ")


# ---- copy-on-read: the memory figures, faked --------------------------------------------------------

class Packed(torch.utils.data.Dataset):
    """A right answer: the records in arrays."""

    def __init__(self, records):
        self.boxes = np.array([r["box"] for r in records], np.float32)
        self.labels = np.array([r["label"] for r in records], np.int64)
        self.paths = np.array([r["path"] for r in records])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return torch.from_numpy(self.boxes[i].copy()), int(self.labels[i]), str(self.paths[i])


def memory(*growth_mb):
    growth = [int(g * MB) for g in growth_mb]
    return types.SimpleNamespace(growth_bytes=growth, mean_growth_bytes=float(np.mean(growth)))


@pytest.fixture
def measured(monkeypatch):
    """worker_memory replaced: the list version grows ``figures['list']``, the answer
    ``figures['answer']`` (MB per worker); each call's label is kept."""
    figures = {"list": (20.0, 20.0), "answer": (1.0, 1.0), "labels": []}

    def worker_memory(dataset, num_workers, *, multiprocessing_context, label):
        figures["labels"].append((label, num_workers, multiprocessing_context))
        return memory(*figures["list" if label == "list of dicts" else "answer"])

    monkeypatch.setattr(G, "worker_memory", worker_memory)
    monkeypatch.setattr(G, "_LIST_BASELINE", {})
    return figures


def copy_on_read(**kwargs):
    return G.grade_copy_on_read(Packed, n_records=300, **kwargs)


def test_the_pass_reports_each_workers_growth_against_the_list_version(measured):
    measured["list"], measured["answer"] = (20.0, 22.0), (1.0, 2.5)
    result = copy_on_read()
    assert result.summary == ("items equal; over one epoch in 2 forked workers each worker's "
                              "private memory grew 1.0 / 2.5 MB per worker, vs 20.0 / 22.0 MB per "
                              "worker for the list of dicts.")
    assert result.details == {"list_growth_bytes": [20_000_000, 22_000_000],
                              "answer_growth_bytes": [1_000_000, 2_500_000]}
    assert measured["labels"] == [("list of dicts", 2, "fork"), ("Packed", 2, "fork")]


def test_a_worker_over_the_limit_fails_with_the_limit_in_megabytes(measured):
    # list mean (20 + 22) / 2 = 21 MB; the limit 0.15 x 21 = 3.15 MB; one worker grew 3.2 MB
    measured["list"], measured["answer"] = (20.0, 22.0), (1.0, 3.2)
    with pytest.raises(ExerciseFailed) as info:
        copy_on_read()
    err = info.value
    assert err.problem == "reading your dataset still copies memory into every worker."
    assert err.expected == ("each worker's private memory to grow by at most 3.1 MB over an epoch "
                            "(15% of the list version's growth)")  # 3.15 printed :.1f -> 3.1
    assert err.seen == "your dataset: 1.0 / 3.2 MB per worker; the list of dicts: 20.0 / 22.0 MB per worker"


def test_too_little_list_growth_is_said_with_its_size(measured):
    measured["list"], measured["answer"] = (7.0, 8.9), (30.0, 30.0)   # mean 7.95 MB < 8 MB
    result = copy_on_read()
    assert "even the list version grew only 8.0 MB per worker, too little to compare" in result.summary


def test_the_list_version_is_measured_once_per_records_seed_and_workers(measured):
    copy_on_read()
    copy_on_read()
    assert [label for label, _, _ in measured["labels"]] == ["list of dicts", "Packed", "Packed"]
    copy_on_read(num_workers=3)                              # another key: measured again
    copy_on_read(seed=2)
    assert [label for label, _, _ in measured["labels"]].count("list of dicts") == 3
    assert measured["labels"][-3][1] == 3


def test_without_fork_no_memory_is_measured(measured, monkeypatch):
    monkeypatch.setattr(G.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    result = copy_on_read()
    assert result.details == {"measured": False} and "no 'fork'" in result.summary
    assert measured["labels"] == []


@pytest.mark.parametrize("quick, images, batches", [(False, 320, 24), (True, 160, 12)],
                         ids=["full", "quick"])
def test_the_real_curve_times_jpeg_decoding_in_one_thread_workers(monkeypatch, quick, images, batches):
    made, is_quick = {}, quick
    monkeypatch.setattr(G, "usable_cpus", lambda: 1)
    monkeypatch.setattr(G, "pick", lambda full, quick: quick if is_quick else full)
    monkeypatch.setattr(G, "JpegDataset", lambda **kwargs: made.update(kwargs) or "jpegs")

    def sweep(dataset, workers, **kwargs):
        made.update(dataset=dataset, workers=workers, **kwargs)
        return types.SimpleNamespace(workers=list(workers), samples_per_s=[1.0] * len(workers))

    monkeypatch.setattr(G, "sweep_workers", sweep)
    G._measured_curve()
    init = made.pop("worker_init_fn")
    assert isinstance(init, G.make_worker_init(1).__class__) and init.n_threads == 1
    assert made.pop("transform").size == 160
    assert made == {"n": images, "min_side": 320, "max_side": 640, "dataset": "jpegs",
                    "workers": [0, 1, 2], "batch_size": 8, "batches": batches, "repeats": 1,
                    "progress": False, "label": "JPEG decode (measured now)"}


# ---- judge_choice and shuffled on made-up curves -------------------------------------------------

def test_a_one_or_two_count_curve_is_shuffled_without_looping():
    one = {"workers": [3], "truth": [100.0], "measured": [100.0]}
    assert G.shuffled(one, 1) == one
    two = G.shuffled({"workers": [1, 3], "truth": [1.0, 2.0], "measured": [1.5, 2.5]}, 1)
    assert two == {"workers": [3, 1], "truth": [2.0, 1.0], "measured": [2.5, 1.5]}


def test_a_count_at_exactly_enough_below_the_best_but_past_the_window_is_more_than_needed():
    # workers 0..4, true rates 50, 97, 85, 85, 100: 97 % of the best (97) is first reached at 1,
    # so the window ends at 2; 3 workers reach 85 / 100 = 0.85 exactly (enough), below the best
    # count (4), but past the window: "more than needed", not "too few"
    curve = {"name": "dip", "workers": [0, 1, 2, 3, 4], "truth": [50, 97, 85, 85, 100],
             "measured": [50, 97, 85, 85, 100]}
    assert G.acceptable(curve["workers"], curve["truth"]) == [1, 2]
    with pytest.raises(ExerciseFailed) as info:
        G.judge_choice(curve, 3, "'dip'")
    assert info.value.problem.startswith("more workers than needed for the 'dip' curve: 1 workers")


def test_a_curve_without_a_story_names_only_the_curve():
    curve = {"name": "bare", "workers": [0, 1, 2], "truth": [100, 50, 40], "measured": [100, 50, 40]}
    with pytest.raises(ExerciseFailed) as info:
        G.judge_choice(curve, 2, "'bare'")
    assert info.value.problem == ("too many workers for the 'bare' curve: past the peak, 2 workers "
                                  "deliver only 40% of the best rate.")
    assert "more workers are not always faster" in info.value.hint


@pytest.mark.parametrize("answer", [2.5, 7], ids=["not-whole", "not-measured"])
def test_judge_choice_failures_belong_to_the_choose_exercise(answer):
    curve = {"name": "c", "workers": [0, 1, 2], "truth": [100, 50, 40], "measured": [100, 50, 40]}
    with pytest.raises(ExerciseFailed) as info:
        G.judge_choice(curve, answer, "'c'")
    assert info.value.exercise == G.CHOOSE


def test_an_order_dependent_answer_fails_under_the_choose_exercise():
    curve = G.synthetic_curves()[0]
    first_listed = lambda workers, rates: workers[0]          # noqa: E731  (0 in order: wrong)
    with pytest.raises(ExerciseFailed) as info:
        G._judge_shuffled(first_listed, curve, 8, seed=100)
    assert info.value.exercise == G.CHOOSE
    assert info.value.problem.startswith("the answer depends on the order of the measurements")
