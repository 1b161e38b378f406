"""The loaders the package builds itself give a DataLoader ``timeout`` only under ``fork``: the
tuner's windows (``tune.window.rebuilt``), exercise 06's grader (``_resampled``) and lesson 03's
``worker_memory``. Under forkserver (and spawn on Windows) torch learns that a worker died only
when a timeout runs out, so one of minutes would delay a dead worker's error by as much (issue
38); under fork a SIGCHLD reports a death at once and the timeout guards against a hung worker.

No worker is started: the start method is patched where ``resolve_context`` reads it, and each
loader's ``timeout`` is read from the loader built (``worker_memory``'s from its DataLoader call).
"""
from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
from torch.utils.data import DataLoader, Dataset

import course_utils.grading.ex06_tune_pipeline as G
import course_utils.lessons.l03_num_workers as L03
import course_utils.start_methods as SM
from course_utils.tools.tune.window import WORKER_TIMEOUT_S, rebuilt

METHODS = multiprocessing.get_all_start_methods()
OTHER = [m for m in ("forkserver", "spawn") if m in METHODS]


class Items(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(3, i, dtype=np.int64)


@pytest.fixture
def method(monkeypatch):
    """Set this process's default start method (as ``start_method()`` reads it) for the test."""
    def set_to(name: str) -> None:
        monkeypatch.setattr(SM, "start_method", lambda: name)
    return set_to


def _tuner(loader: DataLoader) -> float:
    return rebuilt(loader).timeout


def _grader(loader: DataLoader) -> float:
    return G._resampled(loader, batch_size=4, samples=100, keep_workers=False).timeout


BUILDERS = {"tuner": _tuner, "grader 06": _grader}


def test_the_tuners_timeout_is_long_enough_to_tell_apart():
    assert WORKER_TIMEOUT_S == 120       # the values below would not tell 0 from a wrong constant


@pytest.mark.parametrize("who", BUILDERS)
def test_default_context_gets_a_timeout_only_under_fork(method, who):
    build = BUILDERS[who]
    method("fork")
    assert build(DataLoader(Items(), batch_size=4, num_workers=2)) == WORKER_TIMEOUT_S
    for other in ("forkserver", "spawn"):
        method(other)
        assert build(DataLoader(Items(), batch_size=4, num_workers=2)) == 0, other


@pytest.mark.parametrize("who", BUILDERS)
def test_the_loaders_own_context_decides_not_the_default(method, who):
    """A loader that names its context is judged by it, whichever the process's default is."""
    if "fork" not in METHODS or not OTHER:
        pytest.skip("needs fork and forkserver or spawn")
    build = BUILDERS[who]
    method(OTHER[0])
    forked = DataLoader(Items(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    assert build(forked) == WORKER_TIMEOUT_S
    method("fork")
    other = DataLoader(Items(), batch_size=4, num_workers=2, multiprocessing_context=OTHER[0])
    assert build(other) == 0


@pytest.mark.parametrize("who", BUILDERS)
@pytest.mark.parametrize("default", ["fork", "forkserver"])
def test_a_loaders_own_timeout_is_kept(method, who, default):
    method(default)
    assert BUILDERS[who](DataLoader(Items(), batch_size=4, num_workers=2, timeout=7)) == 7


@pytest.mark.parametrize("who", BUILDERS)
def test_no_workers_no_timeout(method, who):
    method("fork")
    assert BUILDERS[who](DataLoader(Items(), batch_size=4)) == 0


class _Built(Exception):
    """Raised by the patched DataLoader once worker_memory has built its loader."""


@pytest.mark.parametrize("default, context, expected", [
    ("fork", None, 37.0),
    ("forkserver", None, 0),
    ("spawn", None, 0),
    ("forkserver", "fork", 37.0),
    ("fork", "spawn", 0),
])
def test_worker_memory_times_out_only_under_fork(method, monkeypatch, default, context, expected):
    if context is not None and context not in METHODS:
        pytest.skip(f"{context} is not offered here")
    if L03.uss_bytes() is None:
        pytest.skip("worker_memory needs USS from psutil")
    method(default)
    seen = {}

    def fake_loader(*args, **kwargs):
        seen.update(kwargs)
        raise _Built

    monkeypatch.setattr(L03, "DataLoader", fake_loader)
    with pytest.raises(_Built):
        L03.worker_memory(Items(), 2, batch_size=4, multiprocessing_context=context, timeout_s=37)
    assert seen["timeout"] == expected


@pytest.mark.parametrize("default, context, expected", [
    ("fork", None, 37.0), ("forkserver", None, 0.0), ("spawn", None, 0.0),
    ("forkserver", "fork", 37.0), ("fork", "forkserver", 0.0)])
def test_the_one_rule_reads_the_loaders_context_before_the_default(method, default, context,
                                                                    expected):
    method(default)
    assert SM.worker_timeout(37, context) == expected
