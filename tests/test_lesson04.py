"""Lesson 04's package parts: the bandwidth sweep's result (lessons.l04_copies), the calibrated
compute (lessons.l04_overlap), the device prefetcher and its comparison (course_utils.prefetch),
and gpu-check's lesson-04 run on the CPU. No timing claims asserted. (The device and time_op
tests here belong beside course_utils.device and course_utils.timing.)"""
from __future__ import annotations

import json
import multiprocessing
from collections import namedtuple

import pytest
import torch

from course_authoring import gpu_lesson04
from course_authoring.gpu_lesson04 import run_lesson04
from course_utils import timing
from course_utils.device import move_to_device, resolve_device, try_pin
from course_utils.lessons.l04_copies import KIB, MIB, BandwidthSweep
from course_utils.lessons.l04_overlap import calibrated_compute
from course_utils.prefetch import DevicePrefetcher, compare_prefetch
from course_utils.timing import time_op

pytestmark = pytest.mark.timeout(180)
CUDA = torch.cuda.is_available()
HAS_FORK = "fork" in multiprocessing.get_all_start_methods()


# ---- devices ---------------------------------------------------------------------------------

def test_resolve_device_defaults_and_errors():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None).type in ("cpu", "cuda", "mps")
    with pytest.raises(ValueError, match="not a device torch understands"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match="measures cpu, cuda, mps only"):
        resolve_device("meta")
    assert resolve_device("meta", allow_meta=True).type == "meta"


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
def test_resolve_device_refuses_cuda_without_cuda():
    with pytest.raises(ValueError, match="torch.cuda.is_available"):
        resolve_device("cuda")


def test_try_pin_on_cpu_explains():
    pinned, why = try_pin(torch.zeros(4), "cpu")
    assert pinned is None and why


# ---- timing ----------------------------------------------------------------------------------

def test_time_op_returns_seconds_per_call():
    calls = []
    times = time_op(lambda: calls.append(1), device="cpu", repeats=3, warmup=2, inner=4)
    assert len(times) == 3 and all(t >= 0 for t in times)
    assert len(calls) == 2 + 3 * 4


@pytest.mark.parametrize("kwargs, err", [
    (dict(repeats=0), ValueError), (dict(inner=0), ValueError), (dict(warmup=-1), ValueError),
    (dict(repeats=1.5), TypeError)])
def test_time_op_bad_arguments(kwargs, err):
    with pytest.raises(err, match=list(kwargs)[0]):
        time_op(lambda: None, device="cpu", **kwargs)
    with pytest.raises(TypeError, match="fn must be a callable"):
        time_op(3, device="cpu")


def test_pinned_fraction_is_best_pinned_over_best_host_to_device():
    sweep = BandwidthSweep.from_dict({
        "device": "cuda:0", "sizes_bytes": [KIB, MIB], "seconds": "an old key, ignored",
        "gbps": {"pageable": [0.5, 12.0], "pinned_blocking": [0.4, 9.0],
                 "pinned_non_blocking": [0.8, 10.0], "device": [1.0, 500.0]}})
    assert sweep.best_h2d() == ("pageable", MIB, 12.0)
    assert sweep.best("pinned_non_blocking") == (MIB, 10.0)
    assert sweep.best_pinned() == ("pinned_non_blocking", MIB, 10.0)
    assert sweep.pinned_fraction_of_best() == pytest.approx(10.0 / 12.0)
    assert BandwidthSweep.from_dict(json.loads(json.dumps(sweep.to_dict()))) == sweep
    with pytest.raises(ValueError, match="mode"):
        sweep.best("bogus")


def test_a_sweep_without_pinned_copies_has_no_pinned_fraction():
    sweep = BandwidthSweep("cpu", [KIB], {"pageable": [1.0], "pinned_blocking": [None]})
    assert sweep.best("pinned_blocking") is None and sweep.best("pinned_non_blocking") is None
    assert sweep.best_pinned() is None and sweep.pinned_fraction_of_best() is None
    assert sweep.best_h2d() == ("pageable", KIB, 1.0)


def test_bandwidth_sweep_from_bad_data():
    with pytest.raises(TypeError, match="BandwidthSweep.to_dict"):
        BandwidthSweep.from_dict([1])
    with pytest.raises(ValueError, match="lacks"):
        BandwidthSweep.from_dict({"device": "cpu"})


def test_calibrated_compute_is_a_chain_of_matmuls():
    chain = calibrated_compute(torch.device("cpu"), 1e-3, n=32)
    assert chain.k >= 1 and chain().shape == (32, 32)
    assert chain.describe() == f"{chain.k} x matmul(32x32, float32)"


# ---- moving batches and the prefetcher ---------------------------------------------------------

def test_move_to_device_keeps_structure_and_dtype():
    Pair = namedtuple("Pair", "x y")
    batch = {"a": (torch.zeros(2, dtype=torch.uint8), [torch.ones(1)]), "b": Pair(torch.zeros(1), 3)}
    out = move_to_device(batch, "meta")
    assert out["a"][0].device.type == "meta" and out["a"][0].dtype == torch.uint8
    assert isinstance(out["a"][1], list) and out["a"][1][0].device.type == "meta"
    assert isinstance(out["b"], Pair) and out["b"].y == 3


class Recording:
    def __init__(self, n):
        self.n, self.pulled = n, 0

    def __len__(self):
        return self.n

    def __iter__(self):
        self.pulled = 0
        for k in range(self.n):
            self.pulled += 1
            yield torch.full((2, 3), k, dtype=torch.uint8), torch.tensor([k])


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_device_prefetcher_order_lookahead_and_epochs(device):
    loader = Recording(5)
    pre = DevicePrefetcher(loader, device)
    assert len(pre) == 5
    for _ in range(2):  # two epochs
        seen = []
        for k, (x, y) in enumerate(pre):
            assert x.device.type == device and x.dtype == torch.uint8
            if k < 4:
                assert loader.pulled >= k + 2   # batch k+1 already fetched
            if device == "cpu":
                seen.append(int(y))
        if device == "cpu":
            assert seen == [0, 1, 2, 3, 4]
    assert list(DevicePrefetcher(Recording(0), device)) == []
    assert len(list(DevicePrefetcher(Recording(1), device))) == 1


def test_device_prefetcher_bad_input():
    with pytest.raises(TypeError, match="loader must be iterable"):
        DevicePrefetcher(3, "cpu")


def test_compare_prefetch_on_cpu():
    batches = [(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2)) for _ in range(4)]
    timing = compare_prefetch(batches, lambda b: b[0].float().sum(), device="cpu", repeats=1)
    assert timing.steps == 4 and timing.plain_s_per_step > 0 and timing.prefetch_s_per_step > 0
    assert "No CUDA streams" in timing.note
    json.dumps(timing.to_dict())
    with pytest.raises(ValueError, match="no batches"):
        compare_prefetch([], lambda b: None, device="cpu")
    with pytest.raises(TypeError, match="step_fn"):
        compare_prefetch(batches, None, device="cpu")


def test_compare_prefetch_times_alternate_passes_with_time_op(monkeypatch):
    import course_utils.prefetch as prefetch

    seconds = iter([0.8, 0.4, 0.6, 0.2, 1.0, 0.3])      # plain, prefetched, plain, ...
    calls = []

    def fake_time_op(fn, *, device, repeats, warmup, events):
        calls.append((device.type, repeats, warmup, events))
        fn()
        return [next(seconds)]

    monkeypatch.setattr(prefetch, "time_op", fake_time_op)
    steps = []
    timing = compare_prefetch([1, 2, 3, 4], steps.append, device="cpu", repeats=3)
    assert len(steps) == 4 * (2 + 6)                     # one untimed pass each, then 3 of each
    assert calls == [("cpu", 1, 0, False)] * 6
    assert timing.plain_s_per_step == pytest.approx(0.8 / 4)       # median of 0.8, 0.6, 1.0
    assert timing.prefetch_s_per_step == pytest.approx(0.3 / 4)    # median of 0.4, 0.2, 0.3
    assert timing.speedup == pytest.approx(0.8 / 0.3)


# ---- gpu-check's lesson 04 run: the notebook's modules, on the CPU ------------------------------

@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
def test_gpu_benchmarks_refuse_without_cuda():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        run_lesson04(10)


# run_lesson04's sections on the CPU (the notebook's %%writefile modules, imported as gpu-check
# imports them) are checked in tests/test_gpu_rehearsal.py, on what the rehearsal measured:
# tests/_lesson04_run.py holds those checks.


def test_the_forked_worker_experiment_never_hangs():
    fork = gpu_lesson04._lesson_modules().fork
    assert fork.cuda_in_forked_worker(timeout_s=0.05)["timed_out"]


def test_time_op_records_cuda_events_on_the_devices_own_stream(monkeypatch):
    # no GPU needed: stand-ins for the stream, the events and the synchronize show where
    # time_op records its events (cuda:1's current stream, not the current device's)
    streams: dict = {}
    recorded: list = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self, stream=None):
            recorded.append(stream)
            self.at = len(recorded)

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return 2.0 * (end.at - self.at)                    # milliseconds

    def current_stream(device=None):
        return streams.setdefault(str(device), object())

    synced = []
    monkeypatch.setattr(timing.torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(timing.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(timing, "synchronize", lambda device: synced.append(torch.device(device)))
    times = time_op(lambda: None, device="cuda:1", repeats=3, warmup=1, inner=2)
    assert times == [pytest.approx(1e-3)] * 3                 # 2 ms per repeat, 2 calls each
    assert len(recorded) == 6 and all(s is streams["cuda:1"] for s in recorded)
    assert list(streams) == ["cuda:1"]
    assert synced == [torch.device("cuda:1")]

    # events=False: the wall clock, with the whole device synchronised around every repeat
    recorded.clear(), synced.clear()
    clock = iter(range(100))
    monkeypatch.setattr(timing, "_now", lambda: float(next(clock)))
    times = time_op(lambda: None, device="cuda:1", repeats=3, warmup=1, inner=2, events=False)
    assert times == [0.5] * 3 and recorded == []
    assert synced == [torch.device("cuda:1")] * 7
