"""Exercise 06's side by side, without timing anything: the loader each round measures keeps the
learner's settings (workers, pinning, worker_init_fn, prefetching, start method; its own timeout),
draws enough samples for the warm-up, the window and one batch more, whole batches only; each
round measures both loaders with their own warm-up, one repeat, the window asked for, quietly."""
from __future__ import annotations

import multiprocessing

import torch
from torch.utils.data import BatchSampler, DataLoader

from course_utils.grading import ex06_tune_pipeline as G
from _helpers import TinyDataset


def _init(worker_id):          # a worker_init_fn the resampled loader must keep
    pass


def learner_loader(**kw):
    base = dict(batch_size=4, num_workers=2, pin_memory=True, worker_init_fn=_init,
                prefetch_factor=5, multiprocessing_context=multiprocessing.get_context("spawn"),
                timeout=7.0)
    return DataLoader(TinyDataset(10), **(base | kw))


def test_the_resampled_loader_keeps_the_learners_settings_and_draws_whole_batches():
    ld = G._resampled(learner_loader(), batch_size=4, samples=26, keep_workers=False)
    assert (ld.num_workers, ld.pin_memory, ld.worker_init_fn, ld.prefetch_factor) == (2, True, _init, 5)
    assert ld.multiprocessing_context.get_start_method() == "spawn" and ld.timeout == 7.0
    assert ld.persistent_workers is False
    assert ld.sampler.num_samples == 26 and ld.drop_last is False
    # the reference's workers are kept between rounds
    assert G._resampled(learner_loader(), 4, 26, keep_workers=True).persistent_workers is True


def test_a_loader_with_its_own_batch_sampler_gets_whole_batches_of_the_size_asked():
    base = DataLoader(TinyDataset(10), batch_size=None, num_workers=0,
                      sampler=BatchSampler(range(10), 3, drop_last=True))
    ld = G._resampled(base, batch_size=4, samples=9, keep_workers=False)
    assert ld.batch_size is None and ld.sampler.drop_last is False and ld.sampler.batch_size == 4
    assert ld.sampler.sampler.num_samples == 10            # at least the dataset once
    assert sum(len(b) for b in ld.sampler) == 10           # 4 + 4 + 2: the last batch kept


def test_each_round_measures_both_loaders_with_their_own_warm_up(monkeypatch):
    calls = []

    def fake_measure(ld, **kwargs):
        calls.append((ld.num_workers, kwargs))
        return f"m{len(calls)}"
    monkeypatch.setattr(G, "measure_loader", fake_measure)
    made = []
    real = G._resampled
    monkeypatch.setattr(G, "_resampled", lambda ld, b, samples, keep: made.append((samples, keep))
                        or real(ld, b, samples, keep))
    mine = DataLoader(TinyDataset(40), batch_size=4, num_workers=2, prefetch_factor=3,
                      multiprocessing_context="spawn")
    ref = DataLoader(TinyDataset(40), batch_size=4, num_workers=1, prefetch_factor=2,
                     multiprocessing_context="spawn")
    runs = G._side_by_side(mine, ref, batch_size=4, window=5, rounds=2)
    assert runs == {"your loader": ["m1", "m3"], "reference": ["m2", "m4"]}
    # warm-ups: 2 x 3 = 6 and max(2, 1 x 2) = 2 batches; samples (warm + 5 + 1) x 4
    assert made == [((6 + 5 + 1) * 4, False), ((2 + 5 + 1) * 4, True)]
    for (workers, kw), label, warm in zip(calls, ["your loader", "reference"] * 2, [6, 2] * 2):
        assert kw == dict(batches=5, warmup_batches=warm, repeats=1, label=label, progress=False)
    assert [w for w, _ in calls] == [2, 1, 2, 1]
