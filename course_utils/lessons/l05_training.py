"""Lesson 05's training loop, for every pipeline: a small real CNN fed by the common recipe, the
tuned CPU pipeline and the GPU pipeline; step time and data-wait fraction
(:func:`compare_training`, :func:`plot_training`). The notebook writes the loop itself first.
Nothing happens at import time.
"""
from __future__ import annotations

import contextlib
import numbers
import time
import warnings
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from ..augment import AugmentParams, _constants, augment_batch
from ..bench import measure, measure_data_wait
from ..config import pick
from ..data import JpegDataset
from ..device import resolve_device, synchronize
from ..machine import usable_cpus
from ..pipelines import common_recipe_loader, common_recipe_process_settings, tuned_loader
from ..threads import limit_threads
from .l05_measure import RepeatDataset, _axes, _generator_for, _plot_title

__all__ = [
    "SmallCNN",
    "TrainStep",
    "PIPELINES",
    "compare_training",
    "plot_training",
]



# --------------------------------------------------------------------------------------------
# a small CNN and its training step
# --------------------------------------------------------------------------------------------

class SmallCNN(nn.Module):
    """A small real CNN: 4 stages of (3x3 conv stride 2 + 3x3 conv), BatchNorm, ReLU; global
    average pooling; a linear classifier. Channels: width, 2 width, 4 width, 8 width.

    Forward cost: about 0.6 GFLOP per 224x224 image at width 16; it grows with width**2 and
    with the number of pixels (width 32: about 2.3 GFLOP; 64x64 images: 1/12 of that).
    """

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        if isinstance(width, bool) or not isinstance(width, numbers.Integral) or width < 1:
            raise ValueError(f"SmallCNN: width must be a positive int (channels of the first stage), got {width!r}.")
        if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
            raise ValueError(f"SmallCNN: num_classes must be a positive int, got {num_classes!r}.")
        layers: list[nn.Module] = []
        c_in = 3
        for stage in range(4):
            c = int(width) * 2 ** stage
            layers += [nn.Conv2d(c_in, c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                       nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
            c_in = c
        self.width = int(width)
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, int(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class TrainStep:
    """One plain-SGD training step of ``model`` on a batch ``(images, labels)`` already on the device.

    ``prepare(images)`` turns what the loader delivered into the model's input (identity for
    the common recipe's float batches, a normalisation for the tuned pipeline's uint8 batches,
    :func:`augment_batch` for the GPU pipeline's). Forward, cross-entropy, backward, then
    ``p -= lr * p.grad`` for every parameter (written out rather than ``torch.optim.SGD``,
    whose first use imports ``torch._dynamo``: seconds on a small machine, for nothing here).
    Returns the loss tensor (no ``.item()``: no host sync of its own).
    """

    def __init__(self, model: nn.Module, prepare: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 *, lr: float = 0.05) -> None:
        self.model = model
        self.prepare = prepare
        self.lr = float(lr)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def __call__(self, batch: Any) -> torch.Tensor:
        images, labels = batch
        x = images if self.prepare is None else self.prepare(images)
        loss = F.cross_entropy(self.model(x), labels)
        loss.backward()
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-self.lr)
                    p.grad = None
        return loss.detach()

#: The three pipelines of the training-loop comparison, in plotting order.
PIPELINES: tuple[str, ...] = ("common recipe", "tuned CPU pipeline", "GPU pipeline")


def _pipeline_loader(name: str, base: Dataset, *, batch_size: int, image_side: int, input_side: int,
                     num_workers: Optional[int]) -> DataLoader:

    if name == "common recipe":
        return common_recipe_loader(base, batch_size=batch_size, size=image_side)
    if name == "tuned CPU pipeline":
        return tuned_loader(base, batch_size=batch_size, size=image_side, num_workers=num_workers)
    if name == "GPU pipeline":
        return tuned_loader(base, batch_size=batch_size, size=input_side, num_workers=num_workers)
    raise ValueError(f"pipeline {name!r} is not known; use one of {PIPELINES}.")


class _Normalize:
    """uint8 batch on the device -> float32 normalised (the tuned pipeline's last step)."""

    def __init__(self, p: AugmentParams) -> None:
        self.p = p

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        scale, shift, _ = _constants(self.p, images.device)
        return images.to(torch.float32).mul_(scale).add_(shift)


class _Augment:
    def __init__(self, p: AugmentParams, device: torch.device) -> None:
        self.p, self.g = p, _generator_for(device, 0)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return augment_batch(images, self.p, generator=self.g)


def compare_training(base: Optional[Dataset] = None, *, device: Any = "cpu",
                     pipelines: Sequence[str] = PIPELINES, batch_size: Optional[int] = None,
                     steps: Optional[int] = None, image_side: Optional[int] = None,
                     input_side: Optional[int] = None, width: Optional[int] = None,
                     num_workers: Optional[int] = None, recipe_settings: bool = True,
                     main_threads: Optional[int] = None, progress: bool = True,
                     deadline: Optional[float] = None) -> dict:
    """A small CNN's training loop fed by each pipeline: step time and data-wait fraction.

    For every pipeline a fresh :class:`SmallCNN` (same seed) is trained for ``warm-up + steps``
    steps with :func:`course_utils.bench.measure_data_wait`: the wait is the time blocked on the
    loader plus the copy to ``device``; the step is the whole iteration. The pipelines:

    * ``"common recipe"``: :func:`course_utils.pipelines.common_recipe_loader` (4 workers,
      per-sample float32, pin_memory) with its process-wide settings (``torch.set_num_threads(1)``
      and the thread variables, undone afterwards) unless ``recipe_settings=False``;
    * ``"tuned CPU pipeline"``: :func:`course_utils.pipelines.tuned_loader` (uint8, limited
      pools, usable CPUs) + normalise on the device;
    * ``"GPU pipeline"``: the same uint8 loader at ``input_side`` + :func:`augment_batch`
      on the device (random resized crop to ``image_side``, flip, brightness, contrast, normalise).

    Also measured: ``compute_only``, the same training step on a batch already on the device
    (what the model alone needs per step; a step much longer than that was waiting for data).

    ``main_threads``: torch/BLAS threads of this process while measuring. Default: 1 when
    ``device`` is the CPU — the model then trains on the very cores the workers decode on, and a
    multi-threaded (OpenMP) step next to busy workers is oversubscribed (lesson 02), which would
    swamp every other difference — and unchanged on a GPU, where the step runs on the device.
    Returns a JSON-able dict (seconds; fractions 0..1). A pipeline not measured because
    ``deadline`` passed is left out and named in ``skipped``.
    """

    dev = resolve_device(device)
    batch_size = pick(full=32, quick=16) if batch_size is None else int(batch_size)
    steps = pick(full=8, quick=5) if steps is None else int(steps)
    image_side = pick(full=224, quick=64) if image_side is None else int(image_side)
    input_side = pick(full=256, quick=80) if input_side is None else int(input_side)
    width = pick(full=8, quick=8) if width is None else int(width)
    for name, v in (("batch_size", batch_size), ("steps", steps), ("image_side", image_side),
                    ("input_side", input_side), ("width", width)):
        if v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}.")
    unknown = [p for p in pipelines if p not in PIPELINES]
    if unknown or not pipelines:
        raise ValueError(f"pipelines must name some of {PIPELINES}, got {list(pipelines)!r}.")
    if base is None:
        base = JpegDataset(n=pick(full=512, quick=64), progress=False)
    p = AugmentParams(size=image_side)
    prepare: dict[str, Optional[Callable]] = {"common recipe": None, "tuned CPU pipeline": _Normalize(p),
                                              "GPU pipeline": _Augment(p, dev)}
    threads = (1 if dev.type == "cpu" else None) if main_threads is None else int(main_threads)
    if threads is not None and threads < 1:
        raise ValueError(f"main_threads must be a positive int or None, got {main_threads!r}.")
    out: dict[str, Any] = {"device": str(dev), "batch_size": batch_size, "steps": steps,
                           "image_side": image_side, "input_side": input_side,
                           "model": f"SmallCNN(width={width})", "pipelines": {}, "skipped": [],
                           "recipe_settings": bool(recipe_settings)}
    with (limit_threads(threads) if threads else contextlib.nullcontext()):
        out["main_threads"] = torch.get_num_threads()
        _compare_training(out, base, dev, pipelines, prepare, batch_size=batch_size, steps=steps,
                          image_side=image_side, input_side=input_side, width=width,
                          num_workers=num_workers, recipe_settings=recipe_settings,
                          progress=progress, deadline=deadline)
    return out


def _compare_training(out: dict, base: Dataset, dev: torch.device, pipelines: Sequence[str],
                      prepare: dict, *, batch_size: int, steps: int, image_side: int, input_side: int,
                      width: int, num_workers: Optional[int], recipe_settings: bool, progress: bool,
                      deadline: Optional[float]) -> None:

    def new_step(prep: Optional[Callable]) -> TrainStep:
        torch.manual_seed(0)
        return TrainStep(SmallCNN(width=width).to(dev), prep)

    # the model alone, on a batch already on the device (repeats bounded by the deadline)
    step = new_step(None)
    x = torch.randn(batch_size, 3, image_side, image_side, device=dev)
    y = torch.randint(0, 10, (batch_size,), device=dev)
    step((x, y))
    synchronize(dev)
    t0 = time.perf_counter()
    step((x, y))
    synchronize(dev)
    one_step = time.perf_counter() - t0
    repeats = max(3, steps)
    if deadline is not None:
        repeats = max(3, min(repeats, int(0.1 * (deadline - time.perf_counter()) / max(one_step, 1e-6))))
    m = measure(lambda: step((x, y)), items=batch_size, warmup=3, repeats=repeats, device=dev,
                label="compute only")
    out["compute_only"] = {"median_step_s": m.median_s, "samples_per_s": m.samples_per_s}
    del step, x, y

    bar = None
    if progress:
        bar = tqdm(total=len(pipelines), desc="training loop", leave=False)
    try:
        for name in pipelines:
            if deadline is not None and time.perf_counter() > deadline:
                out["skipped"].append(name)
                continue
            workers = 4 if name == "common recipe" else (usable_cpus() if num_workers is None else num_workers)
            warmup = max(2, int(workers))
            estimate = 1.5 * (warmup + steps) * out["compute_only"]["median_step_s"] + 2.0
            if deadline is not None and time.perf_counter() + estimate > deadline:
                out["skipped"].append(name)
                continue
            step = new_step(prepare[name])
            with warnings.catch_warnings():
                # the common recipe's 4 workers on a small machine, and its pin_memory=True without
                # a GPU, make DataLoader warn; that is the recipe, measured as it is
                warnings.filterwarnings("ignore", message=".*worker processes in total.*")
                warnings.filterwarnings("ignore", message=".*pin_memory.*")
                loader = _pipeline_loader(name, RepeatDataset(base, (warmup + steps + 1) * batch_size),
                                          batch_size=batch_size, image_side=image_side,
                                          input_side=input_side, num_workers=num_workers)
                if loader.num_workers:
                    loader.timeout = 300          # never hang: a stuck worker raises instead
                if name == "common recipe" and recipe_settings:
                    with common_recipe_process_settings():
                        wait = measure_data_wait(loader, step, steps=steps, warmup_steps=warmup, device=dev)
                else:
                    wait = measure_data_wait(loader, step, steps=steps, warmup_steps=warmup, device=dev)
            out["pipelines"][name] = {
                "median_step_s": wait.median_step_s, "median_wait_s": wait.median_wait_s,
                "wait_fraction": wait.wait_fraction,
                "samples_per_s": batch_size * wait.steps / sum(wait.step_s),
                "steps": wait.steps, "num_workers": int(loader.num_workers or 0)}
            del loader, step
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()


def plot_training(result: dict, ax: Any = None, *, title: str = "Training step: waiting for data vs computing",
                  machine: Optional[str] = None) -> Any:
    """Stacked bars per pipeline from :func:`compare_training`'s dict: median wait and the rest
    of the step (ms), the data-wait fraction written on each bar, and the model-alone step time
    as a dashed line. Returns the Axes."""
    ax = _axes(ax, (7, 4.0))
    names = [n for n in PIPELINES if n in result["pipelines"]]
    waits = np.array([result["pipelines"][n]["median_wait_s"] * 1e3 for n in names])
    steps = np.array([result["pipelines"][n]["median_step_s"] * 1e3 for n in names])
    rest = np.maximum(steps - waits, 0)
    y = np.arange(len(names))
    ax.barh(y, waits, color="tab:red", label="waiting for data (median)")
    ax.barh(y, rest, left=waits, color="tab:blue", label="rest of the step: prepare + forward + backward")
    for i, n in enumerate(names):
        frac = result["pipelines"][n]["wait_fraction"]
        ax.text(steps[i], y[i], f"  {frac:.0%} waiting", va="center", fontsize=8)
    compute = result.get("compute_only", {}).get("median_step_s")
    if compute:
        ax.axvline(compute * 1e3, color="k", linestyle="--", linewidth=1,
                   label=f"model alone, data already on the device: {compute * 1e3:.1f} ms")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per training step (median; lower is better)")
    ax.set_xlim(0, max(steps.max() if len(steps) else 1, (compute or 0) * 1e3) * 1.35)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    settings = {"model": result.get("model"), "batch": result.get("batch_size"),
                "image": f"{result.get('image_side')}px", "device": result.get("device"),
                "training threads": result.get("main_threads")}
    ax.set_title(_plot_title(title, machine, settings), fontsize=9, loc="left")
    return ax
