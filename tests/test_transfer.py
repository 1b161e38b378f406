"""Lesson 04's harness (course_utils.lessons.l04_*) and the prefetcher: structure and behaviour on any device (no timing claims asserted)."""
from __future__ import annotations

import json
import multiprocessing
from collections import namedtuple

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from course_authoring.gpu_lesson04 import run_lesson04
from course_utils.device import move_to_device, resolve_device, try_pin
from course_utils.lessons import l04_copies as C
from course_utils.lessons import l04_reference as G
from course_utils.lessons.l04_copies import (KIB, MIB, BandwidthSweep, bandwidth_sweep,
                                             max_transfer_bytes, mismeasured_copy, sweep_sizes,
                                             time_op)
from course_utils.lessons.l04_overlap import measure_overlap, uint8_vs_float32
from course_utils.lessons.l04_workers import (ForkedCudaDemo, cuda_in_forked_worker,
                                              pin_memory_cost, torch_fork_error_message)
from course_utils.prefetch import DevicePrefetcher, compare_prefetch

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


def test_what_is_measured_says_memcpy_on_cpu():
    assert "memcpy" in C.what_is_measured("cpu")


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


def test_sweep_sizes_are_log_spaced_and_include_the_maximum():
    assert sweep_sizes(64 * KIB) == [KIB, 4 * KIB, 16 * KIB, 64 * KIB]
    assert sweep_sizes(100 * KIB)[-1] == 100 * KIB
    with pytest.raises(ValueError, match="min_bytes"):
        sweep_sizes(512)
    with pytest.raises(ValueError, match="factor"):
        sweep_sizes(MIB, factor=1)


def test_max_transfer_bytes_is_capped_in_quick_mode(monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    n = max_transfer_bytes("cpu")
    assert n <= 16 * MIB and n & (n - 1) == 0


# ---- bandwidth sweep -------------------------------------------------------------------------

def test_bandwidth_sweep_structure_and_round_trip():
    sweep = bandwidth_sweep([KIB, 64 * KIB], device="cpu", repeats=2, progress=False)
    assert sweep.sizes_bytes == [KIB, 64 * KIB]
    assert all(v is not None and v > 0 for v in sweep.gbps["pageable"])
    # no accelerator: pinned memory cannot be measured, and the sweep says why
    assert all(v is None for v in sweep.gbps["pinned"]) and "pinned" in sweep.notes
    assert sweep.pinned_fraction_of_best() is None
    assert sweep.best("pageable")[0] in sweep.sizes_bytes
    assert sweep.best_h2d()[0] == "pageable"
    assert "memcpy" in sweep.measured
    again = BandwidthSweep.from_dict(json.loads(json.dumps(sweep.to_dict())))
    assert again.gbps == sweep.gbps and again.labels == sweep.labels
    assert "64 KiB" in str(sweep)
    ax = sweep.plot()
    assert ax.get_lines() and ax.get_xscale() == "log"


def test_pinned_fraction_is_best_pinned_over_best_host_to_device():
    sweep = BandwidthSweep.from_dict({
        "device": "cuda:0", "sizes_bytes": [KIB, MIB],
        "gbps": {"pageable": [0.5, 12.0], "pinned": [0.8, 10.0], "device": [1.0, 500.0]}})
    assert sweep.best_h2d() == ("pageable", MIB, 12.0)
    assert sweep.pinned_fraction_of_best() == pytest.approx(10.0 / 12.0)
    assert sweep.at("pinned", MIB) == 10.0
    with pytest.raises(ValueError, match="was not measured"):
        sweep.at("pinned", 3)
    with pytest.raises(ValueError, match="mode"):
        sweep.best("bogus")


def test_bandwidth_sweep_bad_arguments():
    with pytest.raises(ValueError, match="modes"):
        bandwidth_sweep([KIB], device="cpu", modes=("sideways",), progress=False)
    with pytest.raises(ValueError, match="sizes"):
        bandwidth_sweep([0], device="cpu", progress=False)
    with pytest.raises(TypeError, match="BandwidthSweep.to_dict"):
        BandwidthSweep.from_dict([1])
    with pytest.raises(ValueError, match="lacks"):
        BandwidthSweep.from_dict({"device": "cpu"})


# ---- the other measurements ------------------------------------------------------------------

def test_mismeasured_copy_on_cpu():
    demo = mismeasured_copy(256 * KIB, device="cpu", repeats=3)
    assert demo.nbytes == 256 * KIB and not demo.pinned
    assert demo.naive_s > 0 and demo.honest_s > 0 and demo.ratio > 0
    assert "launch" in demo.note
    json.dumps(demo.to_dict())
    assert "naive" in str(demo)


def test_measure_overlap_on_cpu_has_no_streams():
    result = measure_overlap(256 * KIB, device="cpu", repeats=2, matmul_n=64)
    assert not result.streams
    assert {"copy alone", "compute alone"} <= set(result.times_s)
    (variant,) = result.overlap
    assert 0.0 <= result.fraction(variant) <= 1.0
    assert "No CUDA streams" in result.note
    with pytest.raises(ValueError, match="variant"):
        result.fraction("nope")
    json.dumps(result.to_dict())
    assert result.plot() is not None


def test_uint8_vs_float32_moves_a_quarter_of_the_bytes_and_the_same_values():
    result = uint8_vs_float32(4, image_shape=(3, 16, 16), device="cpu", repeats=2)
    assert result.bytes_float32 == 4 * result.bytes_uint8
    assert result.max_abs_diff == 0.0
    assert set(result.times_s) == {"float32 copy", "uint8 copy", "uint8 copy + normalise on device"}
    assert result.speedup > 0
    json.dumps(result.to_dict())
    with pytest.raises(ValueError, match="image_shape"):
        uint8_vs_float32(2, image_shape=(1, 8, 8), device="cpu")


def test_pin_memory_cost_is_not_meaningful_on_cpu():
    from course_utils.data import ArrayDataset

    if CUDA:
        pytest.skip("on CUDA this runs both loaders")
    ds = ArrayDataset(n=40, shape=(3, 16, 16))
    cost = pin_memory_cost(ds, batch_size=4, num_workers=0, batches=3, repeats=1, device="cpu",
                           progress=False)
    assert not cost.meaningful and len(cost.measurements) == 1
    assert cost.measurement(False).samples_per_s > 0 and cost.measurement(True) is None
    assert cost.memcpy_s_per_batch > 0 and cost.batch_bytes == 4 * 3 * 16 * 16
    assert "Not meaningful" in cost.note
    json.dumps(cost.to_dict())
    with pytest.raises(ValueError, match="fewer than batch_size"):
        pin_memory_cost(ds, batch_size=8, num_workers=0, batches=10, device="cpu", progress=False)


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


# ---- CUDA in a forked worker -----------------------------------------------------------------

def test_torch_fork_error_message_is_read_from_the_installed_source():
    message = torch_fork_error_message()
    assert message is not None and message.startswith("Cannot re-initialize CUDA in forked subprocess")


@pytest.mark.skipif(not HAS_FORK, reason="no fork on this platform")
@pytest.mark.timeout(240)
def test_cuda_in_forked_worker_runs_in_a_subprocess():
    demo = cuda_in_forked_worker(timeout_s=180)
    assert not demo.timed_out and demo.fork_available
    assert demo.worker_error                       # the exact text the worker raised here
    assert demo.right_pattern_ok
    assert demo.parent_used_cuda == CUDA           # what the parent really did
    assert demo.cuda_build == torch.version.cuda
    # The CUDA fork error needs CUDA initialised in the parent: by using it, or (a CUDA build of
    # torch, GPU or not) by torch.cuda.is_available() alone. A CPU build can never produce it.
    if CUDA:
        assert demo.reproduced_cuda_error
    if torch.version.cuda is None:
        assert not demo.reproduced_cuda_error
    text = str(demo)
    if demo.reproduced_cuda_error and not demo.parent_used_cuda:
        assert "never used CUDA" in text and "the parent used CUDA" not in text
    if not demo.reproduced_cuda_error:
        assert "QUOTED FROM" in text and "not produced here" in text
    if not CUDA:
        assert demo.lock_held_in_child is True
    json.dumps(demo.to_dict())


_CUDA_FORK_ERROR = ("RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                    "multiprocessing, you must use the 'spawn' start method")


@pytest.mark.parametrize("parent_used_cuda, build, words, not_words", [
    (True, "13.0", ["the parent used CUDA"], ["never used CUDA"]),
    (False, "13.0", ["never used CUDA", "CUDA 13.0 build", "torch.cuda.is_available()"],
     ["the parent used CUDA"]),
])
def test_fork_demo_text_says_what_the_parent_really_did(parent_used_cuda, build, words, not_words):
    # a CUDA build of torch on a GPU-less laptop (the default `pip install torch` on Linux)
    # produces the CUDA fork error although the parent never used CUDA: the text must say so
    demo = ForkedCudaDemo(cuda_available=parent_used_cuda, fork_available=True,
                          parent_used_cuda=parent_used_cuda, worker_error=_CUDA_FORK_ERROR,
                          worker_error_full=_CUDA_FORK_ERROR, torch_message=None,
                          torch_message_source="torch/cuda/__init__.py", right_pattern_ok=True,
                          right_pattern_text="2 forked workers returned CPU tensors",
                          lock_held_in_child=None, fork_warning=None, cuda_build=build)
    assert demo.reproduced_cuda_error
    text = str(demo)
    for word in words:
        assert word in text, text
    for word in not_words:
        assert word not in text, text


def test_fork_demo_text_on_a_cpu_build_quotes_the_error():
    demo = ForkedCudaDemo(cuda_available=False, fork_available=True, parent_used_cuda=False,
                          worker_error="AssertionError: Torch not compiled with CUDA enabled",
                          worker_error_full=None, torch_message="Cannot re-initialize CUDA in forked subprocess.",
                          torch_message_source="torch/cuda/__init__.py", right_pattern_ok=True,
                          right_pattern_text="ok", lock_held_in_child=True, fork_warning=None,
                          cuda_build=None)
    text = str(demo)
    assert "CPU-only build" in text and "QUOTED FROM" in text and "never used CUDA" not in text


def test_cuda_in_forked_worker_never_hangs():
    demo = cuda_in_forked_worker(timeout_s=0.05)
    assert demo.timed_out and "timed out" in str(demo)
    with pytest.raises(ValueError, match="timeout_s"):
        cuda_in_forked_worker(timeout_s=0)


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
def test_gpu_benchmarks_refuse_without_cuda():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        run_lesson04(10)


# ---- the reference beside this machine (structure only; the stand-in is CPU data, labelled) ----

def _stand_in_reference():
    sweep = bandwidth_sweep([KIB, 16 * KIB], device="cpu", repeats=1, progress=False)
    results = {
        "mode": "quick",
        "sweep": sweep.to_dict(),
        "mismeasure": mismeasured_copy(64 * KIB, device="cpu", repeats=1).to_dict(),
        "overlap": measure_overlap(64 * KIB, device="cpu", repeats=1, matmul_n=32).to_dict(),
        "dtype": uint8_vs_float32(2, image_shape=(3, 8, 8), device="cpu", repeats=1).to_dict(),
        "prefetch": compare_prefetch([(torch.zeros(1), torch.zeros(1))], lambda b: None,
                                     device="cpu", repeats=1).to_dict(),
        "forked_worker": {"worker_error": "RuntimeError: stand-in text"},
        "skipped": {"pin_cost": "budget"},
    }
    return {"name": "lesson04_transfer", "measured_at": "2025-01-01",
            "machine": {"gpu_name": "stand-in (CPU data, test only)", "summary": "test"},
            "results": json.loads(json.dumps(results))}


def test_plot_sweeps_and_reference_summary():
    sweep = bandwidth_sweep([KIB, 16 * KIB], device="cpu", repeats=1, progress=False)
    assert len(C.plot_sweeps(sweep, None).axes) == 1
    doc = _stand_in_reference()
    assert len(C.plot_sweeps(sweep, doc).axes) == 2
    text = G.reference_summary(doc)
    for part in ("stand-in (CPU data, test only)", "best host memcpy", "naive", "overlap",
                 "float32 copy", "DevicePrefetcher", "stand-in text", "not measured: pin_cost"):
        assert part in text, part
    assert "gpu-check" in G.reference_summary(None)


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
    monkeypatch.setattr(C.torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(C.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(C, "synchronize", lambda device: synced.append(torch.device(device)))
    times = time_op(lambda: None, device="cuda:1", repeats=3, warmup=1, inner=2)
    assert times == [pytest.approx(1e-3)] * 3                 # 2 ms per repeat, 2 calls each
    assert len(recorded) == 6 and all(s is streams["cuda:1"] for s in recorded)
    assert list(streams) == ["cuda:1"]
    assert synced == [torch.device("cuda:1")]
