"""Tests for course_utils.timing: which processes each timed window reads (a fresh listing at
both ends, so a process started during a repeat counts once), how samples are counted in a batch
whose first element is the data, the batch a training loop's step receives when no device is
asked for, and whose workers a measurement stops. Fake processes, clocks and loaders: every figure
is worked out by hand below; nothing depends on this machine's speed."""
from __future__ import annotations

import contextlib
from collections import namedtuple

import pytest
import torch

from course_utils import process_tree, timing
from course_utils.process_tree import TreeMonitor
from course_utils.timing import batch_size_of, measure, measure_data_wait, measure_loader

Times = namedtuple("Times", "user system children_user children_system")
Ctx = namedtuple("Ctx", "voluntary involuntary")


class Proc:
    """A psutil.Process stand-in whose CPU seconds and involuntary switches the test sets."""

    def __init__(self, pid, cpu=0.0, ctx=0):
        self.pid, self.cpu, self.ctx = pid, cpu, ctx

    def oneshot(self):
        return contextlib.nullcontext()

    def create_time(self):
        return 1000.0

    def cpu_times(self):
        return Times(self.cpu, 0.0, 0.0, 0.0)

    def num_ctx_switches(self):
        return Ctx(0, self.ctx)

    def memory_full_info(self):
        raise NotImplementedError          # no memory figures here


class Clock:
    def __init__(self):
        self.t = 50.0

    def __call__(self):
        return self.t


def test_a_child_started_in_one_repeat_counts_once_in_each_window(monkeypatch):
    """measure() lists the tree afresh at both ends of every window: a worker the first call
    starts is new in window 1 (all its CPU counted there) and known in window 2 (only its growth)."""
    world = [Proc(1)]
    main, clock = world[0], Clock()

    class WorldMonitor(TreeMonitor):
        def list_tree(self):
            return list(world)

        def _run(self):                    # no sampler thread
            pass

    monkeypatch.setattr(timing, "TreeMonitor", WorldMonitor)
    monkeypatch.setattr(process_tree, "_involuntary_switches", lambda pid: None)
    calls = []

    def work():
        calls.append(1)
        clock.t += 0.5
        main.cpu += 0.1
        main.ctx += 1
        if len(calls) == 1:                # the first call starts a worker that keeps running
            world.append(Proc(2, cpu=0.3, ctx=2))
        else:
            world[1].cpu += 0.2
            world[1].ctx += 5

    monkeypatch.setattr(timing, "_now", clock)
    m = measure(work, items=1, warmup=0, repeats=2)
    # window 1: main 0 -> 0.1, worker new with 0.3 -> 0.4 s; switches 1 + 2 (new, from zero) = 3
    # window 2: main 0.1 -> 0.2, worker 0.3 -> 0.5 -> 0.3 s; switches 1 + 5 = 6
    assert m.cpu_s_per_sample == pytest.approx((0.4 + 0.3) / 2)
    assert m.involuntary_ctx_switches == 9
    assert m.times_s == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize("batch, samples", [
    ([torch.zeros(5, 3)], 5),                            # TensorDataset(x): a one-element list
    ((torch.zeros(4, 3), "a caption"), 4),               # data first, then something without a shape
    ((torch.zeros(6, 2), torch.zeros(3)), 6),            # the first element counts, not the second
    ([{"image": torch.zeros(7, 2)}, torch.zeros(2)], 7),
])
def test_samples_are_counted_from_the_first_element_of_a_tuple_or_list(batch, samples):
    assert batch_size_of(batch) == samples


class Encoding(dict):
    """A dict subclass with its own behaviour (as tokenizers' batch encodings are)."""

    def tokens(self):
        return len(self["ids"])


class Batches:
    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def test_without_a_device_the_step_gets_the_loaders_batch_untouched():
    batches = [Encoding(ids=torch.arange(i + 1)) for i in range(6)]
    seen = []
    measure_data_wait(Batches(batches), seen.append, steps=3, warmup_steps=2)
    assert len(seen) == 5 and all(got is made for got, made in zip(seen, batches))
    assert seen[4].tokens() == 5


class KeptIterator:
    """An endless iterator that records when its workers are shut down."""

    def __init__(self):
        self.shutdowns = 0

    def __iter__(self):
        return self

    def __next__(self):
        return torch.zeros(2)

    def _shutdown_workers(self):
        self.shutdowns += 1


class PersistentLoader:
    """With ``keep``, like a persistent-workers DataLoader: it hands out, and keeps for the
    next epoch, one iterator; otherwise each epoch gets a new one."""

    def __init__(self, keep):
        self.keep, self.made = keep, []
        self._iterator = KeptIterator() if keep else None

    def __iter__(self):
        self.made.append(self._iterator if self.keep else KeptIterator())
        return self.made[-1]


@pytest.mark.parametrize("keep, shutdowns", [(True, 0), (False, 1)])
def test_a_training_loop_stops_its_iterators_workers_unless_the_loader_keeps_them(keep, shutdowns):
    loader = PersistentLoader(keep)
    measure_data_wait(loader, lambda batch: None, steps=2, warmup_steps=1)
    assert [it.shutdowns for it in loader.made] == [shutdowns]


class Sized:
    """A loader without workers: ``n`` batches of 2 samples, and a length."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return (torch.zeros(2, 1) for _ in range(self.n))


def test_the_progress_bar_is_on_by_default_names_the_setup_and_counts_every_timed_batch(capsys):
    # 2 repeats x (5 batches - 1 warm-up) = 8 timed batches in all
    measure_loader(Sized(5), batches=4, warmup_batches=1, repeats=2,
                   label="a label longer than forty characters, cut at forty")
    err = capsys.readouterr().err
    assert "a label longer than forty characters, cu" in err and "cut at forty" not in err
    assert "0/8 " in err                                 # the total is known up front


def test_no_progress_bar_when_asked_for_none(capsys):
    measure_loader(Sized(5), batches=4, warmup_batches=1, repeats=2, progress=False)
    assert capsys.readouterr().err == ""
