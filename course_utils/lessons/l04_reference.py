"""Lesson 04's reference results, measured on a real CUDA GPU by ``gpu-check``
(:func:`course_authoring.gpu_lesson04.run_lesson04`) and read with
``course_utils.reference.load_reference(LESSON04)``, summed up for the notebook."""
from __future__ import annotations

from collections.abc import Mapping

from ..reference import LESSON04, missing_reference_text
from ..measurement import fmt_time
from .l04_copies import H2D_MODES, MODES, BandwidthSweep, fmt_bytes

__all__ = ["reference_summary", "copy_mode_lines", "overlap_lines"]


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
        for mode in MODES:
            best = sweep.best(mode)
            if best:
                lines.append(f"  best {sweep.labels.get(mode, mode)}: {best[1]:.1f} GB/s at "
                             f"{fmt_bytes(best[0])}")
        lines += copy_mode_lines(sweep)
        frac = sweep.pinned_fraction_of_best()
        if frac is not None:
            lines.append(f"  best pinned copy = {frac:.0%} of the best host-to-device copy")
    demo = res.get("mismeasure")
    if isinstance(demo, Mapping):
        lines.append(f"  unsynchronised non_blocking copy of {fmt_bytes(demo['nbytes'])}: naive "
                     f"{fmt_time(demo['naive_s'])} vs honest {fmt_time(demo['honest_s'])} "
                     f"({demo['honest_s'] / demo['naive_s']:.0f}x too short)")
    ov = res.get("overlap")
    if isinstance(ov, Mapping):
        lines += overlap_lines(ov)
    dt = res.get("dtype")
    if isinstance(dt, Mapping):
        t = dt["times_s"]
        lines.append(f"  batch {tuple(dt['batch_shape'])}: float32 copy {fmt_time(t['float32 copy'])}, "
                     f"uint8 copy + normalise {fmt_time(t['uint8 copy + normalise on device'])}")
    pf = res.get("prefetch")
    if isinstance(pf, Mapping):
        lines.append(f"  DevicePrefetcher: {fmt_time(pf['prefetch_s_per_step'])}/step vs plain loop "
                     f"{fmt_time(pf['plain_s_per_step'])}/step")
    fork = res.get("forked_worker")
    if isinstance(fork, Mapping) and fork.get("worker_error"):
        lines.append(f"  a forked DataLoader worker touching CUDA raised: {fork['worker_error']}")
    for name, why in res.get("skipped", {}).items():
        lines.append(f"  (not measured: {name}: {why})")
    return "\n".join(lines)


def copy_mode_lines(sweep: BandwidthSweep) -> list[str]:
    """What pinning alone gave and what non_blocking added on top, as GB/s ratios at the largest
    and the smallest size where both copies were measured (no line for a pair not measured)."""
    lines = []
    for mode, baseline, what in (("pinned_blocking", "pageable", "pinning alone (blocking copy)"),
                                 ("pinned_non_blocking", "pinned_blocking", "non_blocking on top")):
        pairs = sweep.ratios(mode, baseline)
        if pairs:
            (small, r_small), (large, r_large) = pairs[0], pairs[-1]
            lines.append(f"  {what}: {r_large:.2f}x the GB/s of {H2D_MODES[baseline].label} at "
                         f"{fmt_bytes(large)}, {r_small:.2f}x at {fmt_bytes(small)}")
    return lines


def overlap_lines(overlap: Mapping) -> list[str]:
    """The share of each copy hidden behind compute, one line per copy mode, from what the
    notebook's ``measure_overlap`` returned (overlap[mode][arrangement], clipped to [0, 1])."""
    lines = []
    for mode, shares in overlap.get("overlap", {}).items():
        if isinstance(shares, Mapping):
            label = overlap.get("modes", {}).get(mode, mode)
            parts = ", ".join(f"{name} {min(1.0, max(0.0, v)):.0%}" for name, v in shares.items())
            lines.append(f"  overlap, {label}: {parts}")
        else:                                   # a file measured before the copy modes were swept
            lines.append(f"  overlap, {mode}: {min(1.0, max(0.0, shares)):.0%}")
    return lines
