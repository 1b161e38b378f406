"""Checks on what gpu-check's lesson 04 part returns when it runs on the CPU (the notebook's
%%writefile modules, imported as gpu-check imports them, then the prefetcher step).
tests/test_gpu_rehearsal.py applies them to the rehearsal's lesson04_transfer.json, so the
sections run once per `make test`, in the rehearsal that runs them anyway."""
from __future__ import annotations

import multiprocessing

import torch

from course_utils.lessons import l04_reference as G
from course_utils.lessons.l04_copies import KIB, MIB, MODES, BandwidthSweep

HAS_FORK = "fork" in multiprocessing.get_all_start_methods()


def check_cpu_run(cpu_run: dict) -> None:
    """Every section of lesson 04 ran on the CPU in quick mode, each saying what it could not
    measure there."""
    assert cpu_run["skipped"] == {}, cpu_run["skipped"]
    assert cpu_run["mode"] == "quick" and cpu_run["device"] == "cpu"
    sweep = BandwidthSweep.from_dict(cpu_run["sweep"])
    assert sweep.sizes_bytes[0] == KIB and sweep.sizes_bytes[-1] <= 16 * MIB
    assert all(v > 0 for v in sweep.gbps["pageable"]) and sweep.pinned_fraction_of_best() is None
    assert set(sweep.gbps) == set(MODES)                          # every copy mode is recorded
    for mode in ("pinned_blocking", "pinned_non_blocking"):      # each says why it was not measured
        assert not sweep.measured(mode) and "not measurable" in sweep.notes[mode]
    assert cpu_run["targets"]["pinned_h2d"]["met"] is None
    demo = cpu_run["mismeasure"]
    assert demo["honest_s"] > 0 and demo["naive_s"] > 0 and not demo["pinned"]
    ov = cpu_run["overlap"]                                      # no pinning: the pageable copies
    assert not ov["streams"] and set(ov["overlap"]) == {"pageable", "pageable_non_blocking"}
    assert set(ov["notes"]) == {"pinned_blocking", "pinned_non_blocking"}
    for shares in ov["overlap"].values():                        # no streams: one arrangement
        (variant,) = shares
        assert "no streams" in variant
    dtype = cpu_run["dtype"]
    assert dtype["bytes_float32"] == 4 * dtype["bytes_uint8"] and dtype["max_abs_diff"] == 0.0
    plan = cpu_run["pin_plan"]                                   # fitted to /dev/shm first
    assert plan["plan"]["need_bytes"] <= 0.8 * plan["shm_free_bytes"], plan
    pin = cpu_run["pin_cost"]
    assert (pin["batch_size"], pin["num_workers"]) == (plan["plan"]["batch_size"], plan["plan"]["num_workers"])
    assert not pin["meaningful"] and [m["settings"]["pin_memory"] for m in pin["measurements"]] == [False]
    assert pin["measurements"][0]["samples_per_s"] > 0 and pin["memcpy_s_per_batch"] > 0
    assert cpu_run["prefetch"]["steps"] > 0 and cpu_run["prefetch"]["prefetch_s_per_step"] > 0
    fork = cpu_run["forked_worker"]
    if HAS_FORK:
        assert not fork["timed_out"] and fork["right_ok"] and fork["worker_error"]
        # the CUDA fork error needs CUDA initialised in the parent: by using it, or (a CUDA build
        # of torch, GPU or not) by torch.cuda.is_available() alone; a CPU build never gives it
        if torch.version.cuda is None:
            assert not fork["reproduced_cuda_error"]
        assert fork["lock_held_in_child"] is True


def check_reference_summary(cpu_run: dict) -> None:
    """The GPU reference's summary reads what run_lesson04 returns (CPU data as a stand-in)."""
    results = dict(cpu_run, skipped={"pin_cost": "budget"})
    doc = {"name": "lesson04_transfer", "measured_at": "2025-01-01", "results": results,
           "machine": {"gpu_name": "stand-in (CPU data, test only)", "summary": "test"}}
    text = G.reference_summary(doc)
    for part in ("stand-in (CPU data, test only)", "best pageable, blocking -> CPU", "naive",
                 "overlap, pageable, blocking: one after the other",
                 "float32 copy", "DevicePrefetcher", "not measured: pin_cost"):
        assert part in text, part
    if HAS_FORK:
        assert cpu_run["forked_worker"]["worker_error"] in text
    assert "gpu-check" in G.reference_summary(None)
