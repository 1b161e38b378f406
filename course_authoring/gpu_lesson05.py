"""Lesson 05's measurements on a real CUDA GPU, for ``gpu-check`` (:func:`run_lesson05`:
augmentation throughput and the training loop, with their targets). It returns a JSON-able dict
that ``gpu-check`` writes into ``course_utils/reference_results/`` for lesson 05 to show beside a
learner's own figures.

Authors' tooling: it runs the lesson's own harness in full mode within a budget, so it lives
here, out of the learner's package. The harness is the notebook's: its ``%%writefile
lesson05_throughput.py`` and ``lesson05_training.py`` cells, imported without Jupyter by
:func:`course_authoring.notebook_modules.notebook_module`.
"""
from __future__ import annotations

import math
import numbers
import os
import time
import traceback
from typing import Any, Callable, Mapping, Optional

import torch

from course_authoring.notebook_modules import notebook_module
from course_utils.augment import AugmentParams
from course_utils.data import JpegDataset
from course_utils.device import resolve_device, synchronize
from course_utils.jpeg_decoders import tensor_decoder
from course_utils.lessons.l05_measure import DecodedImages
from course_utils.machine import usable_cpus
from course_utils.reference import LESSON05, describe_machine

from .gpu_preflight import toolchain

#: The notebook whose %%writefile cells hold the harness run here.
NOTEBOOK = "05_gpu_augmentation.ipynb"


#: Targets of issue 4 measured by :func:`run_lesson05`.
AUGMENT_SPEEDUP_TARGET = 10.0
#: ``tuned_data_wait``: the tuned CPU pipeline keeps up (waits < DATA_WAIT_TARGET of the step, the
#: lesson's "keeps up") OR waits at most DATA_WAIT_CUT of what the common recipe waits, measured
#: side by side (same model, batch, JPEGs, machine). Why not "< 5 %" alone: the wait is the
#: workers' CPU time per batch against the GPU's step, and this check's SmallCNN steps in a few
#: ms on a datacenter GPU, faster than any CPU pipeline decodes 64 JPEGs, so "< 5 %" would judge
#: the model's size, not the pipeline; what the run can judge is the lesson's claim that tuning
#: cuts the wait (to half or less), or that it leaves none to cut.
DATA_WAIT_TARGET = 0.05
DATA_WAIT_CUT = 0.5
#: Batches each per-sample worker holds in /dev/shm at once, counted high: the one queued
#: (lesson 05's loaders use prefetch_factor=1) and the one it is filling.
PREFETCH = 2
#: Share of the free /dev/shm the per-sample loaders may fill (the rest: the training loaders).
SHM_SHARE = 0.5


def workers_that_fit(shm_bytes: int, batch_size: int, side: int, wanted: int) -> int:
    """How many per-sample float32 workers (``PREFETCH`` batches of ``batch_size`` images of
    ``side`` px each, in /dev/shm) fit in ``SHM_SHARE`` of ``shm_bytes``: at most ``wanted``,
    at least 1."""
    per_worker = PREFETCH * batch_size * 3 * side * side * 4
    return max(1, min(wanted, math.floor(SHM_SHARE * shm_bytes / per_worker)))


def compile_probe(device: Any, tools: Optional[Mapping] = None) -> dict:
    """``torch.compile`` of a tiny function on ``device`` (Triton on CUDA, Inductor's C++ backend on
    the CPU), checked against eager: the compile path lesson 05's compile cell takes, at the least
    cost (a cold first call took 12.9-18 s, measured on a 2-CPU machine). Where the toolchain
    (:func:`toolchain`: lesson 05's own check) is missing it compiles nothing: ``skipped`` says
    why. Raises what the compile raises."""
    dev = torch.device(device)
    tools = toolchain() if tools is None else tools
    key = "cuda" if dev.type == "cuda" else "cpu"
    out = {"device": str(dev), "toolchain": dict(tools), "skipped": None}
    if not tools[f"ok_{key}"]:
        out["skipped"] = f"torch.compile on {dev.type} not tried: {tools[f'why_not_{key}']}"
        return out

    def eager(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2 + 1).sum(dim=-1)

    x = torch.randn(64, 128, device=dev)
    t0 = time.perf_counter()
    compiled = torch.compile(eager)
    y = compiled(x)
    synchronize(dev)
    out["first_call_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled(x)
    synchronize(dev)
    out["second_call_s"] = time.perf_counter() - t0
    out["max_abs_diff"] = float((y - eager(x)).abs().max())
    return out


def jpeg_decode_check(device: Any, data: list, decoder_for: Callable[[Any], Any] = tensor_decoder) -> tuple[dict, Optional[str]]:
    """Decode ``data`` (JPEG bytes as 1-D uint8 tensors) in one call with the decoder lesson 05
    uses for ``device``: (what ran and how long, after a first call; a skip reason or None). No
    decoder for ``device`` (torchvision without nvJPEG, TorchCodec without CUDA) or one that fails
    on a batch is a skip with its reason, not a failure: lesson 05 then decodes on the CPU."""
    dev = torch.device(device)
    decoder = decoder_for(dev)
    info = {"asked": str(dev), "decoder": str(decoder), "ran_on": decoder.device, "images": len(data)}
    if torch.device(decoder.device).type != dev.type:
        return info, f"JPEG decode on {dev.type}: not available here ({decoder.why})"
    try:
        decoder.decode(data, device=decoder.device)
        synchronize(dev)
        t0 = time.perf_counter()
        images = decoder.decode(data, device=decoder.device)
        synchronize(dev)
        info["seconds"] = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - any failure: the lesson falls back, the check goes on
        return info, (f"JPEG decode on {dev.type}: {decoder} raised on a batch of {len(data)}: "
                      f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
    info["samples_per_s"] = len(images) / max(info["seconds"], 1e-9)
    return info, None


def tuned_wait_met(tuned: Optional[float], recipe: Optional[float]) -> Optional[bool]:
    """``tuned_data_wait``'s verdict (see :data:`DATA_WAIT_CUT`): None when the tuned pipeline was
    not measured; True when it waits < DATA_WAIT_TARGET, or at most DATA_WAIT_CUT x the common
    recipe's wait (when that was measured)."""
    if tuned is None:
        return None
    return bool(tuned < DATA_WAIT_TARGET or (recipe is not None and tuned <= DATA_WAIT_CUT * recipe))


def _guarded(name: str, result: dict, part: Callable[[], Any]) -> Any:
    """Run one part; a part that raises is recorded as ``failed: ...`` in ``result["skipped"]``
    (gpu-check counts it as a failure) and the other parts still run."""
    try:
        return part()
    except Exception as exc:  # a bus error in a worker, CUDA out of memory, ...
        traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        result["skipped"].append(f"failed: {name}: {type(exc).__name__}: {first}")
        return None


def run_lesson05(budget_s: float = 300, *, device: Any = "cuda", quick: Optional[bool] = None,
                 progress: bool = False, shm_bytes: Optional[int] = None) -> dict:
    """Lesson 05's GPU measurements, for the gpu-check command; returns a JSON-able dict.

    Measured side by side in one run on ``device`` (CUDA; ``device='cpu'`` with ``quick=True``
    runs every code path on a CPU-only machine, for tests):

    1. augmentation throughput vs batch size (the notebook's ``measure_augment_throughput``):
       batched on the GPU vs per sample in DataLoader workers using all usable CPUs. Target: the
       best GPU samples/s >= 10x the best per-sample CPU samples/s;
    2. the training loop (the notebook's ``compare_training``) with the common recipe, the tuned
       CPU pipeline and the GPU pipeline. Target: the tuned pipeline waits for data < 5% of the
       step, or half the common recipe's wait or less (:data:`DATA_WAIT_CUT` says why).

    First, a batch of JPEGs decoded on ``device`` (:func:`jpeg_decode_check`; no decoder there
    is a skip with its reason).

    Full sizes unless ``quick`` (default: full, whatever quick mode says). Each part checks the
    time left: what would not fit in ``budget_s`` seconds is skipped and listed in ``skipped``
    (its target reads ``met: None``); a part that raises is listed there as ``failed: ...`` and
    the other part still runs. ``shm_bytes`` (free bytes in /dev/shm, where given) caps the
    per-sample workers so their batches fit (:func:`workers_that_fit`; ``shm`` says what was
    shrunk). Keys: name, mode, device, machine, budget_s, elapsed_s, augmentation, training,
    targets, skipped, shm, jpeg_decode.
    """

    if isinstance(budget_s, bool) or not isinstance(budget_s, numbers.Real) or budget_s <= 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}.")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("run_gpu_benchmarks needs a CUDA GPU (torch.cuda.is_available() is False). "
                           "Run `python -m course_authoring gpu-check` on a machine with an NVIDIA GPU; "
                           "on this machine, lesson 05 measures the CPU instead.")
    dev = resolve_device(dev)
    quick = False if quick is None else bool(quick)
    throughput = notebook_module(NOTEBOOK, "lesson05_throughput")
    training = notebook_module(NOTEBOOK, "lesson05_training")
    start = time.perf_counter()
    deadline = start + float(budget_s)
    if quick:
        plan = dict(n_images=8, input_side=48, output=32, batch_sizes=[4, 8], repeats=1,
                    worker_samples=16, target_s=0.01, n_jpeg=24, train_batch=4, steps=2, width=2,
                    num_workers=min(2, os.cpu_count() or 1))
    else:
        plan = dict(n_images=256, input_side=256, output=224, batch_sizes=[16, 32, 64, 128, 256],
                    repeats=3, worker_samples=2048, target_s=0.2, n_jpeg=1000, train_batch=64,
                    steps=30, width=32, num_workers=None)
    result: dict[str, Any] = {"name": LESSON05, "mode": "quick" if quick else "full",
                              "device": str(dev), "machine": describe_machine(), "budget_s": float(budget_s),
                              "plan": {k: v for k, v in plan.items()}, "augmentation": None, "training": None,
                              "skipped": [], "shm": None}
    if shm_bytes is not None:
        wanted = plan["num_workers"] or usable_cpus()
        fit = workers_that_fit(shm_bytes, max(plan["batch_sizes"]), plan["output"], wanted)
        result["shm"] = {"free_bytes": int(shm_bytes), "workers_wanted": wanted, "workers": fit,
                         "shrunk": fit < wanted}
        if fit < wanted:
            plan["num_workers"] = result["plan"]["num_workers"] = fit
            print(f"[lesson05] /dev/shm has {shm_bytes / 2 ** 30:.1f} GiB free: the per-sample "
                  f"loaders run {fit} workers, not {wanted}, so their batches fit")
    if dev.type == "cuda":
        result["machine"]["cuda_device"] = torch.cuda.get_device_name(dev)

    # 0. JPEG decode on the device (lesson 05's decode section): missing is a skip, with why
    jpegs = JpegDataset(n=16, progress=False)
    decode = _guarded("JPEG decode", result, lambda: jpeg_decode_check(
        dev, [torch.from_numpy(jpegs.encoded(i).copy()) for i in range(len(jpegs))]))
    if decode is not None:
        result["jpeg_decode"], why = decode
        if why:
            print(f"[lesson05] skipped: {why}")
            result["skipped"].append(why)

    # 1. throughput (keep about 55% of the budget for the training loop)
    params = AugmentParams(size=plan["output"])
    images = DecodedImages(n=plan["n_images"], side=plan["input_side"])
    aug_deadline = start + 0.45 * float(budget_s)
    result["augmentation"] = _guarded("augmentation", result, lambda: throughput.measure_augment_throughput(
        images, plan["batch_sizes"], params, dev, num_workers=plan["num_workers"],
        repeats=plan["repeats"], worker_samples=plan["worker_samples"], target_s=plan["target_s"],
        progress=progress, deadline=aug_deadline))
    missing = [b for b, v in zip(plan["batch_sizes"], (result["augmentation"] or {}).get(
        "device_samples_per_s", plan["batch_sizes"])) if v is None]
    if missing:
        result["skipped"].append(f"augmentation at batch sizes {missing} (budget)")
    images = None                    # the decoded images go before the training loop

    # 2. training loop (a dataset of real JPEGs first: a few seconds to encode)
    if time.perf_counter() < deadline - 20:
        result["training"] = _guarded("training loop", result, lambda: training.compare_training(
            JpegDataset(n=plan["n_jpeg"], progress=progress), dev, batch_size=plan["train_batch"],
            steps=plan["steps"], image_side=plan["output"], input_side=plan["input_side"],
            width=plan["width"], num_workers=plan["num_workers"], progress=progress,
            deadline=deadline - 5))
        if result["training"] is not None:
            result["skipped"] += [f"training loop: {n} (budget)" for n in result["training"]["skipped"]]
    else:
        result["skipped"].append("training loop (budget)")

    aug = result["augmentation"]
    ratio = aug.get("best_ratio") if aug else None
    pipelines = (result["training"] or {}).get("pipelines", {})
    tuned, recipe = pipelines.get("tuned CPU pipeline"), pipelines.get("common recipe")
    wait = None if tuned is None else tuned["wait_fraction"]
    wait_met = tuned_wait_met(wait, None if recipe is None else recipe["wait_fraction"])
    result["targets"] = {
        "augment_speedup": {
            "description": "best samples/s of batched on-device augmentation / best samples/s of "
                           "per-sample CPU augmentation in DataLoader workers using all usable CPUs",
            "value": ratio, "target": f">= {AUGMENT_SPEEDUP_TARGET:g}",
            "met": None if ratio is None else bool(ratio >= AUGMENT_SPEEDUP_TARGET),
            "detail": (f"(batch sizes {missing} not measured: budget)" if missing and ratio is not None else "")},
        "tuned_data_wait": {
            "description": "data-wait fraction of the training step, tuned CPU pipeline "
                           f"({(result['training'] or {}).get('model')}, batch {plan['train_batch']})",
            "value": wait, "target": f"< {DATA_WAIT_TARGET:g}, or <= {DATA_WAIT_CUT:g} x the common "
                                     f"recipe's, side by side",
            "met": wait_met,
            "detail": ("" if tuned is None else f"(step {tuned['median_step_s'] * 1e3:.1f} ms, model alone "
                       f"{result['training']['compute_only']['median_step_s'] * 1e3:.1f} ms; common "
                       + ("recipe not measured" if recipe is None else
                          f"recipe waits {recipe['wait_fraction']:.1%}") + ")")},
    }
    result["elapsed_s"] = time.perf_counter() - start
    return result
