"""Lesson 04's reference results, measured on a real CUDA GPU by ``gpu-check``
(:func:`course_authoring.gpu_lesson04.run_lesson04`), read back for the notebook.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..measurement import _fmt_time
from ..reference import LESSON04, load_reference, missing_reference_text
from .l04_copies import BandwidthSweep, _fmt_bytes

__all__ = ["load_lesson04_reference", "reference_summary"]


def load_lesson04_reference() -> dict | None:
    """The lesson-04 reference document measured on a CUDA GPU, or None if none was measured.

    ``{"name", "measured_at", "machine", "results"}``; ``results`` is what
    :func:`course_authoring.gpu_lesson04.run_lesson04` returned. See :mod:`course_utils.reference`.
    """
    return load_reference(LESSON04)


def reference_summary(reference: Mapping | None) -> str:
    """What the reference GPU measured, in a few lines (or how to produce it when absent)."""

    if reference is None:
        return missing_reference_text(LESSON04)
    res = reference.get("results", {})
    machine = reference.get("machine", {})
    lines = [f"Reference results: {machine.get('gpu_name')} (torch {machine.get('torch_version')}, "
             f"CUDA {machine.get('cuda_version')}), measured {reference.get('measured_at')} "
             f"by gpu-check in {res.get('mode', '?')} mode."]
    if isinstance(res.get("sweep"), Mapping):
        sweep = BandwidthSweep.from_dict(res["sweep"])
        for mode in ("pageable", "pinned", "device"):
            best = sweep.best(mode)
            if best:
                lines.append(f"  best {sweep.labels.get(mode, mode)}: {best[1]:.1f} GB/s at "
                             f"{_fmt_bytes(best[0])}")
        frac = sweep.pinned_fraction_of_best()
        if frac is not None:
            lines.append(f"  best pinned copy = {frac:.0%} of the best host-to-device copy")
    demo = res.get("mismeasure")
    if isinstance(demo, Mapping):
        lines.append(f"  unsynchronised non_blocking copy of {_fmt_bytes(demo['nbytes'])}: naive "
                     f"{_fmt_time(demo['naive_s'])} vs honest {_fmt_time(demo['honest_s'])} "
                     f"({demo['honest_s'] / demo['naive_s']:.0f}x too short)")
    ov = res.get("overlap")
    if isinstance(ov, Mapping):
        for name, value in ov.get("overlap", {}).items():
            lines.append(f"  overlap, {name}: {min(1.0, max(0.0, value)):.0%}")
    dt = res.get("dtype")
    if isinstance(dt, Mapping):
        t = dt["times_s"]
        lines.append(f"  batch {tuple(dt['batch_shape'])}: float32 copy {_fmt_time(t['float32 copy'])}, "
                     f"uint8 copy + normalise {_fmt_time(t['uint8 copy + normalise on device'])}")
    pf = res.get("prefetch")
    if isinstance(pf, Mapping):
        lines.append(f"  DevicePrefetcher: {_fmt_time(pf['prefetch_s_per_step'])}/step vs plain loop "
                     f"{_fmt_time(pf['plain_s_per_step'])}/step")
    fork = res.get("forked_worker")
    if isinstance(fork, Mapping) and fork.get("worker_error"):
        lines.append(f"  a forked DataLoader worker touching CUDA raised: {fork['worker_error']}")
    for name, why in res.get("skipped", {}).items():
        lines.append(f"  (not measured: {name}: {why})")
    return "\n".join(lines)
