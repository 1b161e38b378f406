"""Grader for exercise 01: resize, crop, flip, to_tensor (per sample) stay uint8 until normalize
(per batch); each stage judged on real JPEGs against :func:`~course_utils.transforms.exact_pipeline`,
then the four worker stages run in real DataLoader workers."""
from __future__ import annotations

import functools
import multiprocessing
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from course_utils.data import JpegDataset
from course_utils.machine import start_method
from course_utils.threads import make_worker_init
from course_utils.transforms import (MAX_DIFF_LEVELS, MEAN_DIFF_LEVELS, PipelineParams, center_crop,
                                     exact_pipeline, numpy_resize, output_difference)

from .checker import CheckResult, ExerciseFailed, call_answer, describe, grader

EXERCISE = "01.uint8_pipeline"
STAGES = ("resize", "crop", "flip", "to_tensor", "normalize")
_WHY_UINT8 = ("uint8 is 1 byte per value and float32 is 4: every stage after the conversion "
              "reads and writes 4x the bytes, and the batch crosses from the worker to the main "
              "process (shared memory, collation) and later to the GPU 4x bigger")
_fail = functools.partial(ExerciseFailed, EXERCISE)


def _hint_for(stage: str, exc: Exception) -> str:
    text = str(exc)
    if "negative stride" in text:
        return ("torch.from_numpy cannot wrap a view with negative strides, such as a "
                "reversed slice: give it a contiguous copy of the array (NumPy has a function "
                "for exactly that), or flip with OpenCV, which returns a new array.")
    if "size" in text.lower() and stage == "normalize":
        return ("the batch is (N, 3, H, W): shape mean and std as (1, 3, 1, 1) so they "
                "broadcast over the channel axis.")
    return "run the stage on one image in a cell of its own and read the traceback."


def _call(stage: str, fn: Callable, *args: Any) -> Any:
    """Run one of the learner's stages (an error becomes a teaching failure)."""
    return call_answer(EXERCISE, fn, *args, what=f"`{stage}`",
                       expected=f"`{stage}` to run on {describe(args[0])}",
                       hint=lambda exc: _hint_for(stage, exc))


def _not_uint8(stage: str, out: Any, expected: str) -> ExerciseFailed:
    dtype = out.dtype
    floaty = np.dtype(dtype).kind == "f" if isinstance(out, np.ndarray) else out.is_floating_point()
    if stage == "to_tensor" and floaty:
        hint = ("this looks like normalising per sample in the worker. to_tensor is the last "
                "stage in the worker: return the uint8 pixels as a (3, H, W) tensor and do the "
                "float conversion and normalisation in normalize(batch), once per batch (on the "
                f"GPU in training). Why: {_WHY_UINT8}.")
    elif floaty:
        hint = (f"keep the image uint8 here: {_WHY_UINT8}. cv2.resize, slicing and flipping all work on "
                "uint8 directly (cv2.resize rounds for you); convert to float only in normalize.")
    else:
        hint = f"return uint8 pixels (0..255) from `{stage}`; only normalize returns float32."
    return _fail(f"`{stage}` returned {dtype}: every stage before normalize must stay uint8.",
                 expected=expected, seen=describe(out), hint=hint)


def _check_image_stage(stage: str, out: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 NumPy image of ``shape``."""
    expected = f"NumPy uint8 array of shape {shape}"
    shown = dict(expected=expected, seen=describe(out))
    if isinstance(out, torch.Tensor):
        raise _fail(f"`{stage}` returned a torch tensor; the image stays a NumPy (H, W, 3) "
                    f"array until to_tensor.", **shown, hint="return a NumPy array here (cv2 "
                    "and slicing give you one); make the tensor in to_tensor.")
    if not isinstance(out, np.ndarray):
        raise _fail(f"`{stage}` must return a NumPy array.", **shown,
                    hint=f"did `{stage}` forget a `return`?")
    if out.dtype != np.uint8:
        raise _not_uint8(stage, out, expected)
    if out.shape != shape:
        raise _fail(f"`{stage}` returned the wrong shape.", **shown, hint=(
            "height and width are swapped: cv2.resize takes dsize=(width, height), while NumPy "
            "shapes are (height, width, channels)." if stage == "resize" and
            out.shape == (shape[1], shape[0], 3) else f"`{stage}` should give {shape}."))
    return out


def _check_resize_values(out: np.ndarray, image: np.ndarray) -> None:
    d = out.astype(np.float64) - numpy_resize(image.astype(np.float32), out.shape[:2])
    worst, bias = (float(np.abs(d).max()), float(d.mean())) if d.size else (0.0, 0.0)
    if worst <= MAX_DIFF_LEVELS + 1e-3 and abs(bias) <= MEAN_DIFF_LEVELS:
        return
    if worst <= 1.5 and bias < -0.3:
        hint = ("the pixels are biased about half a grey level low: converting a float result "
                "with .astype(np.uint8) truncates (254.9 -> 254). Round to the nearest level "
                "first, or resize the uint8 image with OpenCV, which rounds for you.")
    elif worst > 100:
        hint = ("some pixels are far off: values outside 0..255 wrapped around when converted "
                "to uint8 (e.g. 256 -> 0). Clip to 0..255 before converting, or resize the "
                "uint8 image directly with OpenCV's bilinear resize, which saturates for you.")
    else:
        hint = ("use bilinear interpolation (cv2.INTER_LINEAR, or F.interpolate(mode='bilinear', "
                "align_corners=False, antialias=False)) on the image as it comes in: RGB, uint8.")
    raise _fail("`resize` returned the right shape but the wrong pixel values.", hint=hint,
                expected=f"within {MAX_DIFF_LEVELS:g} grey level of exact bilinear "
                         f"interpolation, mean error within {MEAN_DIFF_LEVELS:g}",
                seen=f"max |error| {worst:.2f} grey levels, mean error {bias:+.2f} levels")


def _check_crop(out: np.ndarray, resized: np.ndarray, c: int) -> None:
    if np.array_equal(out, center_crop(resized, c)):
        return
    where = ("that is the top-left corner. The centre crop starts at"
             if np.array_equal(out, resized[:c, :c]) else "slice `crop` rows and `crop` columns, starting at")
    raise _fail("`crop` did not return the centre square of the resized image.",
                expected=f"the centre {c}x{c} pixels", seen=describe(out),
                hint=f"{where} the top row and left column params.crop_box(height, width) "
                     f"gives for the resized image.")


def _check_flip(pipeline: Any, cropped: np.ndarray, shape: tuple[int, ...], flip: bool) -> Any:
    """``flip`` mirrors left-right exactly when asked, input untouched; its output for ``flip``."""
    cropped_copy, given = cropped.copy(), {}
    for do_flip in (False, True):
        given[do_flip] = _check_image_stage("flip", _call("flip", pipeline.flip, cropped, do_flip), shape)
        out = given[do_flip].copy()
        if not np.array_equal(cropped, cropped_copy):
            raise _fail("`flip` changed its input image in place.",
                        hint="return a new (or view) array; don't write into the input.")
        if np.array_equal(out, cropped[:, ::-1] if do_flip else cropped):
            continue
        known = ([(cropped[::-1], "`flip` mirrored the image upside down (axis 0, the height).",
                   "a horizontal flip reverses the width: axis 1 of an (H, W, 3) array (with "
                   "cv2.flip, read which flipCode is horizontal: 0 flips vertically)."),
                  (cropped[:, :, ::-1], "`flip` reversed the colour channels (RGB -> BGR), not "
                   "the image.", "reverse axis 1 (the width) of the (H, W, 3) array, not axis 2."),
                  (cropped, "`flip(image, True)` did not flip.",
                   "mirror left-right (reverse the width, axis 1) when do_flip is True.")]
                 if do_flip else [(cropped[:, ::-1], "`flip(image, False)` flipped anyway.",
                                   "return the image unchanged when do_flip is False.")])
        problem, hint = next(((p, h) for want, p, h in known if np.array_equal(out, want)), (
            f"`flip(image, {do_flip})` changed the pixels in an unexpected way.",
            "a flip only reorders pixels: the width reversed when do_flip, the image as it is otherwise."))
        raise _fail(problem, seen=describe(out), hint=hint, expected=(
            "the same image mirrored left-right" if do_flip else "the image unchanged"))
    return given[flip]


def _check_to_tensor(out: Any, flipped: np.ndarray, c: int) -> torch.Tensor:
    """A (3, c, c) uint8 tensor of ``flipped``'s pixels."""
    expected = f"torch.Tensor of shape (3, {c}, {c}), dtype torch.uint8"
    shown = dict(expected=expected, seen=describe(out))
    if not isinstance(out, torch.Tensor):
        raise _fail("`to_tensor` must return a torch tensor.", **shown,
                    hint="make a tensor of the NumPy pixels without converting them (torch can "
                         "wrap a contiguous array as it is), then put the channel axis first.")
    if out.dtype != torch.uint8:
        raise _not_uint8("to_tensor", out, expected)
    if tuple(out.shape) == (c, c, 3):
        raise _fail("`to_tensor` kept the channels last.", **shown,
                    hint="models take channels first: reorder the axes of the (H, W, 3) tensor "
                         "to (3, H, W) (a reshape or view would scramble the pixels).")
    if tuple(out.shape) != (3, c, c):
        raise _fail("`to_tensor` returned the wrong shape.", **shown,
                    hint="keep every pixel: only move the channel axis to the front.")
    if not torch.equal(out, torch.from_numpy(np.ascontiguousarray(flipped)).permute(2, 0, 1)):
        raise _fail("`to_tensor` changed the pixel values.", seen=describe(out),
                    expected="the same uint8 pixels, laid out (3, H, W)",
                    hint="only move the axes; don't reorder channels or scale.")
    return out


def _check_normalized(out: Any, reference: torch.Tensor, params: PipelineParams,
                      where: str = "normalize(batch)") -> Any:
    """Float32 and within tolerance of ``reference``, else the likely cause of the difference."""
    shown = dict(expected=f"torch.Tensor {tuple(reference.shape)} float32", seen=describe(out))
    if not isinstance(out, torch.Tensor):
        raise _fail("`normalize` must return a torch tensor.", **shown,
                    hint="the batch arrives as a uint8 torch tensor: do the arithmetic in torch.")
    if out.dtype != torch.float32:
        raise _fail(f"`normalize` returned {str(out.dtype)[6:]}.", **shown, hint=(
            "float64 doubles the bytes again: convert to float32, and keep mean/std float32 too."
            if out.dtype == torch.float64 else "normalize is where the conversion happens: to "
            "float32 first, then (x / 255 - mean) / std."))
    if out.shape != reference.shape:
        raise _fail("`normalize` returned the wrong shape.", **shown,
                    hint="keep the batch's (N, 3, H, W) shape.")
    diff = output_difference(out, reference, params)
    if diff.within_tolerance:
        return diff
    std = torch.tensor(params.std, dtype=torch.float64).view(1, 3, 1, 1) * 255
    mean = torch.tensor(params.mean, dtype=torch.float64).view(1, 3, 1, 1) * 255
    levels, ref_levels = out.detach().double() * std + mean, reference.double() * std + mean
    # the same pixels within 1.5 grey levels once reversed along dim (1: channels, 3: a mirror)
    same = {dim: bool((levels.flip(dim) - ref_levels).abs().max() <= 1.5) for dim in (1, 3)}
    if float((((levels - ref_levels).abs() - 256).abs() < 2).double().mean()) > 1e-3:
        hint = ("some values are about 256 grey levels off: uint8 arithmetic wrapped around "
                "(in uint8, 10 - 124 = 142). Convert to float before any arithmetic.")
    elif same[1]:
        hint = ("the channels are in reverse order (BGR). The images are RGB already "
                "(the dataset decodes to RGB): don't swap channels.")
    elif same[3]:
        hint = "every image is mirrored: check that only the flip stage flips."
    else:
        got = [round(v, 3) for v in out.detach().double().mean(dim=(0, 2, 3)).tolist()]
        want = [round(v, 3) for v in reference.double().mean(dim=(0, 2, 3)).tolist()]
        hint = (f"per-channel means are {got}, expected {want}. normalize should compute "
                f"(x / 255 - mean) / std with mean={params.mean} and std={params.std} shaped "
                f"(1, 3, 1, 1), so each channel gets its own values.")
    raise _fail(f"{where} gave the wrong values.", hint=hint,
                expected=f"within {MAX_DIFF_LEVELS:g} grey level of the reference (mean error "
                         f"within {MEAN_DIFF_LEVELS:g})",
                seen=f"{diff.max_abs_levels:.1f} grey levels off at worst, mean error "
                     f"{diff.mean_levels:+.2f} levels")


class _StagesDataset(Dataset):
    """Runs the learner's four worker stages on course JPEGs (sample i flipped when i is odd)."""

    def __init__(self, images: Any, pipeline: Any) -> None:
        self.images, self.pipeline = images, pipeline

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        p = self.pipeline
        return p.to_tensor(p.flip(p.crop(p.resize(self.images[i][0])), i % 2 == 1)), i


def _run_in_workers(pipeline: Any, images: Any, refs: list[torch.Tensor], params: Any,
                    num_workers: int, batch_size: int, timeout_s: float) -> dict:
    """The four stages in real workers (fork for a notebook's class, which spawn cannot import)."""
    context, note = None, start_method()
    if type(pipeline).__module__ == "__main__":
        if "fork" in multiprocessing.get_all_start_methods():
            context, note = "fork", "fork, because spawn cannot import a class defined in a notebook"
        else:
            num_workers, note = 0, ("main process, because this platform has no fork and spawn "
                                    "cannot import a class defined in a notebook")
    kwargs = dict(timeout=float(timeout_s), worker_init_fn=make_worker_init(1),
                  multiprocessing_context=context) if num_workers else {}
    loader = DataLoader(_StagesDataset(images, pipeline), batch_size=batch_size,
                        num_workers=num_workers, **kwargs)
    batch_bytes: list[int] = []
    try:
        for batch, index in loader:   # uint8: to_tensor's output was judged in this process
            batch_bytes.append(int(batch.nbytes))
            out = _call("normalize", pipeline.normalize, batch.clone())
            _check_normalized(out, torch.stack([refs[int(i)] for i in index]), params,
                              where="the pipeline run in DataLoader workers")
    except (ExerciseFailed, NotImplementedError):
        raise
    except Exception as exc:
        raise _fail(f"running the stages in DataLoader workers failed: {type(exc).__name__}: "
                    f"{exc}", hint=f"a worker gave no batch within {timeout_s:g} s: does a stage "
                    f"wait on something, or start threads? Keep the stages plain NumPy/OpenCV/"
                    f"torch calls." if "timed out" in str(exc) else _hint_for("", exc)) from exc
    return {"workers": num_workers, "start_method": note, "batch_bytes": batch_bytes}


@grader(EXERCISE)
def grade_uint8_pipeline(pipeline: Any, *, n_images: int = 8, num_workers: int = 2,
                         batch_size: int = 4, seed: int = 1, timeout_s: float = 60.0) -> CheckResult:
    """Check that ``pipeline``'s stages stay uint8 until ``normalize`` and match the reference."""
    if isinstance(pipeline, type):
        pipeline = call_answer(EXERCISE, pipeline, what=f"{pipeline.__name__}()",
                               hint="pass an instance, e.g. check(..., Uint8Pipeline()).")
    missing = [s for s in STAGES if not callable(getattr(pipeline, s, None))]
    if missing:
        raise _fail(f"the answer has no {', '.join(missing)} method(s).",
                    expected=f"an object with methods {', '.join(STAGES)}",
                    seen=f"{type(pipeline).__name__} with "
                         f"{sorted(a for a in dir(pipeline) if not a.startswith('_'))}",
                    hint="pass an instance of your class: Uint8Pipeline().")
    params = getattr(pipeline, "params", None)
    params = params if isinstance(params, PipelineParams) else PipelineParams()
    c = params.crop
    images = JpegDataset(n=n_images, seed=seed, progress=False)
    tensors: list[torch.Tensor] = []
    refs: list[torch.Tensor] = []
    for i in range(len(images)):
        image, _ = images[i]
        # each stage gets the previous stage's output as it is (views, strides and all), as in
        # a real pipeline; copies kept aside are what the outputs are compared with
        resized = _check_image_stage("resize", _call("resize", pipeline.resize, image.copy()),
                                     (*params.resized_hw(*image.shape[:2]), 3))
        _check_resize_values(resized, image)
        kept = resized.copy()
        cropped = _check_image_stage("crop", _call("crop", pipeline.crop, resized), (c, c, 3))
        _check_crop(cropped, kept, c)
        flipped = _check_flip(pipeline, cropped, (c, c, 3), i % 2 == 1)
        kept = flipped.copy()
        tensors.append(_check_to_tensor(_call("to_tensor", pipeline.to_tensor, flipped), kept, c))
        refs.append(exact_pipeline(image, i % 2 == 1, params))
    out = _call("normalize", pipeline.normalize, torch.stack(tensors))
    diff = _check_normalized(out, torch.stack(refs), params)

    run = _run_in_workers(pipeline, images, refs, params, num_workers, batch_size, timeout_s)
    per_batch = max(run.pop("batch_bytes"))
    where = (f"in {run['workers']} DataLoader workers (start method {run['start_method']})"
             if run["workers"] else f"in the {run['start_method']}")
    return CheckResult(EXERCISE, (
        f"every stage stays uint8 until normalize, and the output is within {diff.max_abs_levels:.2f} grey "
        f"levels (mean {diff.mean_levels:+.3f}) of the reference on {len(images)} real JPEGs. Run {where}, "
        f"each batch of {batch_size} crossed to the main process as {per_batch / 1e6:.2f} MB of uint8 "
        f"instead of {4 * per_batch / 1e6:.2f} MB of float32 (4x fewer bytes)."), {
        "max_abs_levels": diff.max_abs_levels, "mean_levels": diff.mean_levels,
        "images": len(images), **run, "bytes_per_batch": per_batch, "float32_bytes_per_batch": 4 * per_batch})
