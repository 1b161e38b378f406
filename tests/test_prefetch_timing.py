"""course_utils.prefetch: DevicePrefetcher's order and look-ahead on the CPU and 'meta', and
compare_prefetch's arithmetic (median per pass over the steps, plain over prefetch) fed
hand-made timings instead of a clock."""
from __future__ import annotations

import math

import pytest
import torch

from course_utils import prefetch
from course_utils.prefetch import DevicePrefetcher, PrefetchTiming, compare_prefetch

pytestmark = pytest.mark.timeout(60)


class CountingLoader:
    """Yields batches (x, {"y": y}) and logs every pull, so the look-ahead can be seen."""

    def __init__(self, n):
        self.n = n
        self.pulled = []

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            self.pulled.append(i)
            yield torch.full((2,), float(i)), {"y": torch.tensor([i])}


def test_prefetcher_yields_every_batch_in_order_one_ahead():
    loader = CountingLoader(3)
    it = iter(DevicePrefetcher(loader, "cpu"))
    first = next(it)
    assert loader.pulled == [0, 1]                    # batch 1 is loaded while batch 0 is used
    second = next(it)
    assert loader.pulled == [0, 1, 2]
    third = next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert [float(b[0][0]) for b in (first, second, third)] == [0.0, 1.0, 2.0]
    assert [int(b[1]["y"]) for b in (first, second, third)] == [0, 1, 2]
    assert len(DevicePrefetcher(loader, "cpu")) == 3


def test_prefetcher_moves_to_meta_and_handles_one_and_zero_batches():
    out = list(DevicePrefetcher(CountingLoader(1), "meta"))
    assert len(out) == 1 and out[0][0].device.type == "meta" and out[0][1]["y"].device.type == "meta"
    assert list(DevicePrefetcher(CountingLoader(0), "cpu")) == []
    assert list(DevicePrefetcher([], "cpu")) == []


def test_prefetcher_copies_synchronously_off_cuda(monkeypatch):
    seen = []
    real = prefetch.move_to_device

    def spy(batch, device, *, non_blocking=None):
        seen.append(non_blocking)
        return real(batch, device, non_blocking=non_blocking)

    monkeypatch.setattr(prefetch, "move_to_device", spy)
    p = DevicePrefetcher(CountingLoader(2), "cpu", non_blocking=True)
    assert p.non_blocking is True and p.device == torch.device("cpu")
    assert len(list(p)) == 2 and seen == [False, False]


def test_prefetcher_refuses_what_is_not_iterable_and_unknown_devices():
    with pytest.raises(TypeError, match="iterable"):
        DevicePrefetcher(3, "cpu")
    with pytest.raises(ValueError):
        DevicePrefetcher([], "tpu")
    assert DevicePrefetcher([], "cpu", non_blocking=0).non_blocking is False


# --- PrefetchTiming ----------------------------------------------------------------------------

def test_speedup_is_plain_over_prefetch():
    t = PrefetchTiming(device="cpu", steps=4, plain_s_per_step=0.03, prefetch_s_per_step=0.02)
    assert t.speedup == pytest.approx(1.5)              # 0.03 / 0.02, not 0.02 / 0.03
    assert t.to_dict()["speedup"] == pytest.approx(1.5) and t.to_dict()["steps"] == 4
    assert "1.50x" in str(t)
    zero = PrefetchTiming(device="cpu", steps=1, plain_s_per_step=0.01, prefetch_s_per_step=0.0)
    assert zero.speedup == math.inf
    tiny = PrefetchTiming(device="cpu", steps=1, plain_s_per_step=0.01, prefetch_s_per_step=1e-12)
    assert tiny.speedup == pytest.approx(1e10)          # just above 0: a ratio, not inf


def test_str_shows_the_alone_line_only_with_both_copy_and_step():
    both = PrefetchTiming("cuda:0", 2, 0.02, 0.01, copy_s_per_batch=0.004, step_s=0.008, note="n")
    assert "alone:" in str(both) and str(both).endswith("\n  n")
    for copy_s, step_s in ((0.004, None), (None, 0.008), (None, None)):
        t = PrefetchTiming("cuda:0", 2, 0.02, 0.01, copy_s_per_batch=copy_s, step_s=step_s)
        assert "alone:" not in str(t) and "\n" not in str(t)


# --- compare_prefetch with hand-made timings ---------------------------------------------------------

@pytest.fixture
def fake_time_op(monkeypatch):
    """time_op that runs fn once and returns the next scripted time; logs its keyword arguments."""
    def install(times):
        times = list(times)
        calls = []

        def time_op(fn, **kwargs):
            calls.append(kwargs)
            fn()
            return [times.pop(0)]

        monkeypatch.setattr(prefetch, "time_op", time_op)
        return calls

    return install


def test_compare_prefetch_takes_the_median_pass_per_step(fake_time_op):
    # passes alternate plain, prefetch: plain 0.9, 0.3, 0.4 -> median 0.4 (mean 0.533);
    # prefetch 0.2, 0.6, 0.25 -> median 0.25; 2 steps a pass: 0.2 and 0.125 s/step, speed-up 1.6
    calls = fake_time_op([0.9, 0.2, 0.3, 0.6, 0.4, 0.25])
    steps = []
    r = compare_prefetch([torch.zeros(1), torch.ones(1)], steps.append, device="cpu", repeats=3)
    assert r.steps == 2 and r.device == "cpu"
    assert r.plain_s_per_step == pytest.approx(0.2)
    assert r.prefetch_s_per_step == pytest.approx(0.125)
    assert r.speedup == pytest.approx(1.6)
    assert len(calls) == 6 and all(c["repeats"] == 1 and c["warmup"] == 0 for c in calls)
    assert all(c["device"] == torch.device("cpu") and c["events"] is False for c in calls)
    # one untimed pass of each, then 3 timed of each: 8 passes of 2 steps
    assert len(steps) == 16
    assert "No CUDA streams" in r.note


def test_compare_prefetch_counts_steps_with_an_odd_count(fake_time_op):
    # 3 batches a pass; plain 0.6, 0.3 -> median 0.45 -> 0.15/step; prefetch 0.3, 0.3 -> 0.1/step
    fake_time_op([0.6, 0.3, 0.3, 0.3])
    r = compare_prefetch([torch.zeros(1)] * 3, lambda b: None, device="cpu", repeats=2)
    assert r.steps == 3
    assert r.plain_s_per_step == pytest.approx(0.15) and r.prefetch_s_per_step == pytest.approx(0.1)


def test_compare_prefetch_runs_the_real_timer_one_pass_per_repeat():
    calls = []
    r = compare_prefetch([torch.zeros(1)] * 3, calls.append, device="cpu", repeats=1)
    assert r.steps == 3 and len(calls) == 3 * 4            # warm plain, warm prefetch, 1 + 1 timed
    assert r.plain_s_per_step > 0 and r.prefetch_s_per_step > 0


def test_compare_prefetch_default_repeats_follow_the_mode(monkeypatch, fake_time_op):
    monkeypatch.setenv("COURSE_QUICK", "1")
    calls = fake_time_op([0.1] * 20)
    compare_prefetch([torch.zeros(1)], lambda b: None, device="cpu")
    assert len(calls) == 2 * 2                                 # quick: 2 repeats of each
    monkeypatch.delenv("COURSE_QUICK")
    calls = fake_time_op([0.1] * 20)
    compare_prefetch([torch.zeros(1)], lambda b: None, device="cpu")
    assert len(calls) == 2 * 5                                 # full: 5 repeats of each


def test_compare_prefetch_refuses_bad_input():
    with pytest.raises(ValueError, match="no batches"):
        compare_prefetch([], lambda b: None, device="cpu", repeats=1)
    with pytest.raises(TypeError, match="step_fn"):
        compare_prefetch([torch.zeros(1)], "step", device="cpu")
    with pytest.raises(ValueError, match="repeats"):
        compare_prefetch([torch.zeros(1)], lambda b: None, device="cpu", repeats=0)


def test_prefetcher_copies_asynchronously_by_default():
    assert DevicePrefetcher([], "cpu").non_blocking is True


def test_str_starts_with_the_two_loops():
    t = PrefetchTiming("cpu", 2, 0.02, 0.01, copy_s_per_batch=0.004, step_s=0.008)
    assert str(t).startswith("2 steps on cpu: plain loop") and "alone:" in str(t)


def test_compare_prefetch_times_plain_then_prefetch_on_the_device_asked_for(monkeypatch, fake_time_op):
    """The plain loop copies each batch with non_blocking=True; DevicePrefetcher (off CUDA)
    synchronously: one untimed pass of each, then plain and prefetch alternated, all on the
    device given (the machine's default, made 'meta' here, is never used)."""
    from course_utils import device as device_mod
    monkeypatch.setattr(device_mod, "default_device", lambda: torch.device("meta"))
    seen = []
    real = prefetch.move_to_device

    def spy(batch, device, *, non_blocking=None):
        seen.append((str(torch.device(device)), non_blocking))
        return real(batch, device, non_blocking=non_blocking)

    monkeypatch.setattr(prefetch, "move_to_device", spy)
    calls = fake_time_op([0.3, 0.2, 0.5, 0.1])
    r = compare_prefetch([torch.zeros(1), torch.ones(1)], lambda b: None, device="cpu", repeats=2)
    assert [nb for _, nb in seen] == [True, True, False, False] * 3
    assert {dev for dev, _ in seen} == {"cpu"} and all(c["device"] == torch.device("cpu") for c in calls)
    # plain 0.3, 0.5 -> median 0.4 / 2 steps = 0.2; prefetch 0.2, 0.1 -> 0.15 / 2 = 0.075
    assert r.plain_s_per_step == pytest.approx(0.2) and r.prefetch_s_per_step == pytest.approx(0.075)


class FakeStream:
    def __init__(self, device=None, log=None):
        self.device, self.log = device, log

    def wait_stream(self, other):
        self.log.append(("wait", other))


class CudaLooking(torch.Tensor):
    """A CPU tensor that says it is on CUDA and logs record_stream."""
    log: list = []

    @property
    def device(self):
        return torch.device("cuda:0")

    def record_stream(self, stream):
        CudaLooking.log.append(("record", stream))


def test_prefetcher_on_cuda_copies_on_a_side_stream_and_waits_for_it(monkeypatch):
    """CUDA replaced by fakes: the copy runs inside the side stream's context, the current
    stream waits for the side stream before each batch and records every CUDA tensor on it."""
    log = []
    CudaLooking.log = log
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    side = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda dev: side.append(FakeStream(dev, log)) or side[-1])
    current = FakeStream("current", log)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev: (log.append(("current", dev)), current)[1])

    class Ctx:
        def __init__(self, s):
            self.s = s

        def __enter__(self):
            log.append(("enter", self.s))

        def __exit__(self, *a):
            log.append(("exit", self.s))

    monkeypatch.setattr(torch.cuda, "stream", Ctx)

    def move(batch, device, *, non_blocking=None):
        log.append(("copy", str(device), non_blocking))
        return (batch[0].as_subclass(CudaLooking), "label")

    monkeypatch.setattr(prefetch, "move_to_device", move)
    p = DevicePrefetcher([(torch.zeros(1),)], "cuda:0")
    out = list(p)
    assert len(out) == 1 and len(side) == 1 and side[0].device == torch.device("cuda:0")
    s = side[0]
    assert log == [("enter", s), ("copy", "cuda:0", True), ("exit", s),
                   ("current", torch.device("cuda:0")), ("wait", s), ("record", current)]


def test_compare_prefetch_on_cuda_has_no_cpu_note(monkeypatch, fake_time_op):
    """On CUDA (faked: copies and the prefetcher replaced by pass-throughs) the note that both
    loops should take the same time is left out."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(prefetch, "move_to_device", lambda b, d, non_blocking=None: b)
    monkeypatch.setattr(prefetch, "DevicePrefetcher", lambda loader, dev: iter(loader))
    fake_time_op([0.2, 0.1])
    r = compare_prefetch([torch.zeros(1)], lambda b: None, device="cuda:0", repeats=1)
    assert r.device == "cuda:0" and r.note == "" and r.speedup == pytest.approx(2.0)
