"""Lesson 04's three host-to-device copies (pageable, pinned blocking, pinned non_blocking),
swept side by side: the mode table, the notebook's ``copy_sources`` / ``bandwidth_sweep`` /
``copy_while_computing`` / ``measure_overlap`` (imported from the notebook's ``%%writefile``
cells, as gpu-check imports them) and what reads their results back. Without a GPU, a stand-in
``pin`` (a plain copy of the buffer) lets every mode run through the code path CUDA runs. No timing
claims are asserted."""
from __future__ import annotations

import json

import pytest
import torch

from course_authoring import gpu_lesson04
from course_utils.lessons import l04_reference as R
from course_utils.lessons.l04_copies import (H2D_MODES, KIB, MIB, MODES, BandwidthSweep, CopyMode,
                                             fmt_bytes)
from course_utils.measurement import fmt_time

pytestmark = pytest.mark.timeout(120)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def lesson():
    """The notebook's lesson04_* modules, written out and imported as gpu-check does."""
    return gpu_lesson04._lesson_modules()


@pytest.fixture(scope="module")
def overlap_module(lesson):
    import lesson04_overlap       # written into the same folder by gpu_lesson04._lesson_modules
    return lesson04_overlap


@pytest.fixture(scope="module")
def streams_module(lesson):
    import lesson04_streams       # written into the same folder by gpu_lesson04._lesson_modules
    return lesson04_streams


class StandInPin:
    """pin(host, device) for a machine without pinned memory: a plain copy, remembered."""

    def __init__(self):
        self.host = self.pinned = None

    def __call__(self, host, device):
        self.host, self.pinned = host, host.clone()
        return self.pinned, ""


def test_the_three_copies_and_their_flags():
    assert list(H2D_MODES) == ["pageable", "pinned_blocking", "pinned_non_blocking"]
    assert [tuple(m) for m in H2D_MODES.values()] == [(False, False), (True, False), (True, True)]
    assert [m.label for m in H2D_MODES.values()] == [
        "pageable, blocking", "pinned, blocking", "pinned, non_blocking"]
    assert MODES == ("pageable", "pinned_blocking", "pinned_non_blocking", "device")
    assert CopyMode(pinned=False, non_blocking=True).label == "pageable, non_blocking"


def test_copy_sources_pairs_each_mode_with_its_buffer_and_flag(lesson):
    host, pin = torch.arange(16, dtype=torch.uint8), StandInPin()
    sources, missing = lesson.sweep.copy_sources(host, CPU, pin=pin)
    assert missing == {} and list(sources) == list(H2D_MODES)
    assert sources["pageable"][0] is host and sources["pageable"][1] is False
    assert sources["pinned_blocking"][0] is pin.pinned and sources["pinned_blocking"][1] is False
    assert sources["pinned_non_blocking"][0] is pin.pinned and sources["pinned_non_blocking"][1] is True


def test_copy_sources_without_pinned_memory_says_why(lesson):
    sources, missing = lesson.sweep.copy_sources(torch.zeros(4, dtype=torch.uint8), CPU)
    assert list(sources) == ["pageable"]                  # the CPU cannot pin (try_pin says why)
    assert set(missing) == {"pinned_blocking", "pinned_non_blocking"}
    assert all(why.startswith("not measurable here: ") and len(why) > 25 for why in missing.values())


def test_the_sweep_copies_every_mode_with_its_own_flag(lesson, monkeypatch):
    # a spy on Tensor.copy_ sees which buffer each timed copy read and with which flag
    calls, original = [], torch.Tensor.copy_

    def spy(self, src, non_blocking=False):
        calls.append((src.untyped_storage().data_ptr(), non_blocking))
        return original(self, src, non_blocking=non_blocking)

    pin = StandInPin()
    monkeypatch.setattr(torch.Tensor, "copy_", spy)
    sweep = lesson.sweep.bandwidth_sweep(CPU, [KIB, 4 * KIB], repeats=1, progress=False, pin=pin)
    monkeypatch.undo()
    host, pinned = pin.host.untyped_storage().data_ptr(), pin.pinned.untyped_storage().data_ptr()
    assert {nb for ptr, nb in calls if ptr == host} == {False}             # pageable: blocking
    from_pinned = [nb for ptr, nb in calls if ptr == pinned]
    assert from_pinned.count(True) == from_pinned.count(False) > 0         # pinned: both, side by side
    for mode in H2D_MODES:
        assert sweep.measured(mode) and all(v > 0 for v in sweep.gbps[mode])
        assert sweep.labels[mode] == f"{H2D_MODES[mode].label} -> CPU"
    assert not sweep.measured("device") and "device" in sweep.notes
    assert [s for s, _ in sweep.ratios("pinned_blocking", "pageable")] == [KIB, 4 * KIB]
    assert gpu_lesson04.copy_modes_missing(sweep) is None
    assert BandwidthSweep.from_dict(json.loads(json.dumps(sweep.to_dict()))).ratios(
        "pinned_non_blocking", "pinned_blocking") == sweep.ratios("pinned_non_blocking", "pinned_blocking")


def test_a_sweep_without_pinned_copies_is_a_failure_for_gpu_check(lesson):
    sweep = lesson.sweep.bandwidth_sweep(CPU, [KIB], repeats=1, progress=False)
    assert sweep.measured("pageable") and sweep.ratios("pinned_blocking", "pageable") == []
    why = gpu_lesson04.copy_modes_missing(sweep)
    assert "pinned_blocking (not measurable here" in why and "pinned_non_blocking" in why
    assert R.copy_mode_lines(sweep) == []


def test_ratios_and_the_lines_the_reference_summary_prints():
    sweep = BandwidthSweep("cuda:0", [KIB, MIB], {
        "pageable": [0.5, 10.0], "pinned_blocking": [0.4, 20.0], "pinned_non_blocking": [0.8, 21.0],
        "device": [None, None]})
    assert sweep.ratios("pinned_blocking", "pageable") == [(KIB, pytest.approx(0.8)),
                                                           (MIB, pytest.approx(2.0))]
    assert sweep.best_pinned() == ("pinned_non_blocking", MIB, 21.0)
    lines = R.copy_mode_lines(sweep)
    assert lines == ["  pinning alone (blocking copy): 2.00x the GB/s of pageable, blocking at 1 MiB, "
                     "0.80x at 1 KiB",
                     "  non_blocking on top: 1.05x the GB/s of pinned, blocking at 1 MiB, 2.00x at 1 KiB"]
    with pytest.raises(ValueError, match="mode"):
        sweep.ratios("pinned", "pageable")


def test_overlap_lines_read_both_the_grid_and_an_old_flat_file():
    grid = {"modes": {"pinned_non_blocking": "pinned, non_blocking"},
            "overlap": {"pinned_non_blocking": {"copy first, side stream": 0.93,
                                                "compute first, same stream": -0.1}}}
    assert R.overlap_lines(grid) == [
        "  overlap, pinned, non_blocking: copy first, side stream 93%, compute first, same stream 0%"]
    assert R.overlap_lines({"overlap": {"copy on a side stream": 1.2}}) == [
        "  overlap, copy on a side stream: 100%"]


@pytest.mark.parametrize("compute_first", [False, True])
def test_copy_while_computing_queues_in_the_order_asked(streams_module, compute_first):
    streams = streams_module
    src, dst = torch.arange(8.0), torch.zeros(8)
    seen = []
    out = streams.copy_while_computing(dst, src, lambda: seen.append(dst.clone()) or "done",
                                       non_blocking=True, compute_first=compute_first)
    assert out == "done" and torch.equal(dst, src)
    assert torch.equal(seen[0], torch.zeros(8) if compute_first else src)   # what compute saw


def test_measure_overlap_times_every_mode_in_every_arrangement(overlap_module):
    ov = overlap_module.measure_overlap(CPU, 256 * KIB, repeats=1, matmul_n=32, pin=StandInPin())
    modes = overlap_module.OVERLAP_MODES
    assert list(modes) == [*H2D_MODES, "pageable_non_blocking"] and ov["notes"] == {}
    assert set(ov["overlap"]) == set(modes) == set(ov["times_s"]["together"]) == set(ov["held"])
    assert all(list(shares) == ["one after the other (no streams)"] for shares in ov["overlap"].values())
    assert all(0 < ov["held"][m] <= 1.0 + 1e-9 for m in modes)    # CPU: the copy is done on return
    assert ov["modes"]["pageable_non_blocking"] == "pageable, non_blocking" and not ov["streams"]
    json.dumps(ov)
    lines = R.overlap_lines(ov)
    assert len(lines) == 4 and lines[0].startswith("  overlap, pageable, blocking: one after the other")


def test_measure_overlap_without_pinned_memory_says_why(overlap_module):
    ov = overlap_module.measure_overlap(CPU, 64 * KIB, repeats=1, matmul_n=32)
    assert set(ov["overlap"]) == {"pageable", "pageable_non_blocking"}
    assert set(ov["notes"]) == {"pinned_blocking", "pinned_non_blocking"}


def test_formatting_helpers():
    assert [fmt_bytes(n) for n in (512, KIB, 1536, 16 * MIB, 2**30)] == [
        "512 B", "1 KiB", "1.5 KiB", "16 MiB", "1 GiB"]
    assert [fmt_time(s) for s in (2.5, 0.0125, 3e-6, None, float("nan"))] == [
        "2.5 s", "12.5 ms", "3 us", "n/a", "n/a"]


def test_the_reference_summary_says_every_part_a_gpu_run_measured():
    KIB_, MIB_ = 1024, 1024 * 1024
    sweep = BandwidthSweep("cuda:0", [KIB_, MIB_], {
        "pageable": [0.5, 10.0], "pinned_blocking": [0.4, 20.0], "pinned_non_blocking": [0.8, 24.0],
        "device": [None, None]}, labels={"pageable": "pageable -> GPU"})
    doc = {"measured_at": "2026-12-01", "machine": {"gpu_name": "H9", "torch_version": "2.9",
                                                     "cuda_version": "12.8"},
           "results": {"mode": "quick", "sweep": sweep.to_dict(),
                       "mismeasure": {"nbytes": MIB_, "naive_s": 2e-5, "honest_s": 1e-3},
                       "overlap": {"overlap": {"pinned_non_blocking": 0.75}},
                       "dtype": {"batch_shape": [8, 3, 4, 4], "times_s": {
                           "float32 copy": 0.004, "uint8 copy + normalise on device": 0.001}},
                       "prefetch": {"prefetch_s_per_step": 0.002, "plain_s_per_step": 0.003},
                       "forked_worker": {"worker_error": "Cannot re-initialize CUDA"},
                       "skipped": {"streams": "one stream only"}}}
    lines = R.reference_summary(doc).split("\n")
    assert lines[0] == "Reference results: H9 (torch 2.9, CUDA 12.8), measured 2026-12-01 by gpu-check in quick mode."
    assert "  best pageable -> GPU: 10.0 GB/s at 1 MiB" in lines
    assert "  best pinned_non_blocking: 24.0 GB/s at 1 MiB" in lines       # no label: the mode
    assert R.copy_mode_lines(sweep)[0] in lines and R.copy_mode_lines(sweep)[1] in lines
    assert "  best pinned copy = 100% of the best host-to-device copy" in lines
    assert any(l.startswith("  unsynchronised non_blocking copy of 1 MiB: naive") and l.endswith("(50x too short)")
               for l in lines)
    assert "  overlap, pinned_non_blocking: 75%" in lines
    assert "  batch (8, 3, 4, 4): float32 copy 4 ms, uint8 copy + normalise 1 ms" in lines
    assert "  DevicePrefetcher: 2 ms/step vs plain loop 3 ms/step" in lines
    assert "  a forked DataLoader worker touching CUDA raised: Cannot re-initialize CUDA" in lines
    assert lines[-1] == "  (not measured: streams: one stream only)"
    assert "gpu-check" in R.reference_summary(None)
    # a run that measured only some parts says only those
    assert R.reference_summary({"results": {}, "machine": {}}).count("\n") == 0
