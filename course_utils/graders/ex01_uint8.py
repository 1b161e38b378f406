"""Grader for exercise 01: a preprocessing pipeline that stays uint8 until the end.

The learner writes an object (usually a class instance) with five stages::

    resize(image)          (H, W, 3) uint8 RGB  -> (h, w, 3) uint8, shorter side = params.resize
    crop(image)            -> (crop, crop, 3) uint8, the centre square
    flip(image, do_flip)   -> (crop, crop, 3) uint8, mirrored left-right when do_flip
    to_tensor(image)       -> (3, crop, crop) uint8 torch tensor (the worker's output)
    normalize(batch)       (N, 3, crop, crop) uint8 -> float32 (x / 255 - mean) / std

The first four run per sample in DataLoader workers; ``normalize`` runs once per batch in the
main process (on the GPU in real training). The grader runs the stages on real course JPEGs
(:class:`course_utils.data.JpegDataset`), checks the type, dtype, shape and values after every
stage boundary, compares the final values with :func:`course_utils.transforms.exact_pipeline`
within the course tolerance, then runs the four worker stages in real DataLoader workers and
reports the bytes each batch moved from the workers to the main process. The course's own
pipelines and stages (:mod:`course_utils.transforms`, ``ToTensorUint8``), or an answer built on
them, are refused: the exercise is to write the stages (``PipelineParams`` is given).
"""
from __future__ import annotations

import multiprocessing
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .. import data, transforms
from ..data import JpegDataset
from ..grading import CheckResult, ExerciseFailed, grader, refuse_course_helper
from ..machine import start_method
from ..threads import make_worker_init
from ..transforms import (MAX_DIFF_LEVELS, MEAN_DIFF_LEVELS, PipelineParams, center_crop,
                          exact_pipeline, numpy_resize, output_difference)

EXERCISE = "01.uint8_pipeline"
#: the course's pipelines and stages, refused in an answer (PipelineParams is given)
COURSE_STAGES = (
    transforms.ReferenceTransform, transforms.Uint8Transform, transforms.ToFloat32,
    transforms.Stage, transforms.pipeline_stages, transforms.run_pipeline,
    transforms.numpy_pipeline, transforms.opencv_pipeline, transforms.torch_pipeline,
    transforms.exact_pipeline, transforms.normalize_batch,
    transforms.numpy_resize, transforms.opencv_resize, transforms.torch_resize,
    transforms.center_crop, transforms.torch_center_crop,
    transforms.numpy_hflip, transforms.opencv_hflip, transforms.torch_hflip,
    transforms.numpy_normalize, transforms.opencv_normalize, transforms.torch_normalize,
    transforms.numpy_to_chw, transforms.opencv_to_chw, transforms.torch_to_chw,
    transforms.torch_from_image, data.ToTensorUint8, data.CommonRecipeTransform)
_WRITE = ("write each stage yourself, with NumPy, OpenCV or torch calls on the image (or "
          "batch) it receives")
STAGES = ("resize", "crop", "flip", "to_tensor", "normalize")
WORKER_STAGES = ("resize", "crop", "flip", "to_tensor")

_WHY_UINT8 = ("uint8 is 1 byte per value and float32 is 4: every stage after the conversion "
              "reads and writes 4x the bytes, and the batch crosses from the worker to the main "
              "process (shared memory, collation) and later to the GPU 4x bigger")


def _describe(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"NumPy array {x.shape} {x.dtype}"
    if isinstance(x, torch.Tensor):
        return f"torch.Tensor {tuple(x.shape)} {x.dtype}"
    return f"{type(x).__name__}: {x!r:.80}"


def _flip_of(index: int) -> bool:
    """The flip decision the grader uses for sample ``index`` (every other sample)."""
    return index % 2 == 1


def _hint_for(stage: str, text: str) -> str:
    if "negative stride" in text:
        return ("torch.from_numpy cannot wrap a view with negative strides, such as a "
                "reversed slice: give it a contiguous copy of the array (NumPy has a function "
                "for exactly that), or flip with OpenCV, which returns a new array.")
    if "size" in text.lower() and stage == "normalize":
        return ("the batch is (N, 3, H, W): shape mean and std as (1, 3, 1, 1) so they "
                "broadcast over the channel axis.")
    return "run the stage on one image in a cell of its own and read the traceback."


def _call(stage: str, fn: Callable, *args: Any) -> Any:
    """Run one of the learner's stages; errors other than NotImplementedError become teaching
    failures (NotImplementedError goes up to check(), which says "not done yet")."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # the learner's code can raise anything
        text = str(exc)
        raise ExerciseFailed(EXERCISE, f"`{stage}` raised {type(exc).__name__}: {text}",
                             expected=f"`{stage}` to run on {_describe(args[0])}",
                             hint=_hint_for(stage, text)) from exc


def _not_uint8(stage: str, out: Any, expected: str) -> ExerciseFailed:
    dtype = getattr(out, "dtype", None)
    floaty = dtype is not None and (np.dtype(dtype).kind == "f" if isinstance(out, np.ndarray)
                                    else out.is_floating_point())
    if stage == "to_tensor" and floaty:
        hint = ("this looks like normalising per sample in the worker. to_tensor is the last "
                "stage in the worker: return the uint8 pixels as a (3, H, W) tensor and do the "
                "float conversion and normalisation in normalize(batch), once per batch (on the "
                f"GPU in training). Why: {_WHY_UINT8}.")
    elif floaty:
        hint = (f"keep the image uint8 here: {_WHY_UINT8}. cv2.resize, slicing and flipping all "
                "work on uint8 directly (cv2.resize rounds for you); convert to float only in "
                "normalize.")
    else:
        hint = f"return uint8 pixels (0..255) from `{stage}`; only normalize returns float32."
    return ExerciseFailed(
        EXERCISE, f"`{stage}` returned {dtype}: every stage before normalize must stay uint8.",
        expected=expected, seen=_describe(out), hint=hint)


def _check_image_stage(stage: str, out: Any, shape: tuple[int, ...], *, extra_hint: str = "") -> np.ndarray:
    expected = f"NumPy uint8 array of shape {shape}"
    if isinstance(out, torch.Tensor):
        raise ExerciseFailed(
            EXERCISE, f"`{stage}` returned a torch tensor; the image stays a NumPy (H, W, 3) "
                      f"array until to_tensor.", expected=expected, seen=_describe(out),
            hint="return a NumPy array here (cv2 and slicing give you one); make the tensor in "
                 "to_tensor.")
    if not isinstance(out, np.ndarray):
        raise ExerciseFailed(EXERCISE, f"`{stage}` must return a NumPy array.",
                             expected=expected, seen=_describe(out),
                             hint=f"did `{stage}` forget a `return`?")
    if out.dtype != np.uint8:
        raise _not_uint8(stage, out, expected)
    if out.shape != shape:
        hint = extra_hint or f"`{stage}` should give {shape}."
        if stage == "resize" and out.shape == (shape[1], shape[0], 3):
            hint = ("height and width are swapped: cv2.resize takes dsize=(width, height), "
                    "while NumPy shapes are (height, width, channels).")
        raise ExerciseFailed(EXERCISE, f"`{stage}` returned the wrong shape.",
                             expected=expected, seen=_describe(out), hint=hint)
    return out


def _levels(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    d = a.astype(np.float64) - b.astype(np.float64)
    return float(np.abs(d).max()) if d.size else 0.0, float(d.mean()) if d.size else 0.0


def _check_resize_values(out: np.ndarray, image: np.ndarray, params: Any) -> None:
    exact = numpy_resize(image.astype(np.float32), out.shape[:2])
    worst, bias = _levels(out, exact)
    if worst <= MAX_DIFF_LEVELS + 1e-3 and abs(bias) <= MEAN_DIFF_LEVELS:
        return
    seen = f"max |error| {worst:.2f} grey levels, mean error {bias:+.2f} levels"
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
    raise ExerciseFailed(
        EXERCISE, "`resize` returned the right shape but the wrong pixel values.",
        expected=f"within {MAX_DIFF_LEVELS:g} grey level of exact bilinear interpolation, mean "
                 f"error within {MEAN_DIFF_LEVELS:g}", seen=seen, hint=hint)


def _check_crop(out: np.ndarray, resized: np.ndarray, params: Any) -> None:
    c = params.crop
    if np.array_equal(out, center_crop(resized, c)):
        return
    if np.array_equal(out, resized[:c, :c]):
        hint = ("that is the top-left corner. The centre crop starts at the row and column "
                "params.crop_box(height, width) gives for the resized image.")
    else:
        hint = ("slice `crop` rows and `crop` columns, starting at the top row and left column "
                "params.crop_box(height, width) gives for the resized image.")
    raise ExerciseFailed(EXERCISE, "`crop` did not return the centre square of the resized image.",
                         expected=f"the centre {c}x{c} pixels", seen=_describe(out), hint=hint)


def _check_flip(pipeline: Any, cropped: np.ndarray, shape: tuple[int, ...]) -> None:
    cropped_copy = cropped.copy()
    for do_flip in (False, True):
        out = _check_image_stage("flip", _call("flip", pipeline.flip, cropped, do_flip), shape)
        out = out.copy()
        if not np.array_equal(cropped, cropped_copy):
            raise ExerciseFailed(EXERCISE, "`flip` changed its input image in place.",
                                 hint="return a new (or view) array; don't write into the input.")
        right = cropped[:, ::-1] if do_flip else cropped
        if np.array_equal(out, right):
            continue
        if do_flip and np.array_equal(out, cropped[::-1]):
            problem = "`flip` mirrored the image upside down (axis 0, the height)."
            hint = ("a horizontal flip reverses the width: axis 1 of an (H, W, 3) array "
                    "(with cv2.flip, read which flipCode is horizontal: 0 flips vertically).")
        elif do_flip and np.array_equal(out, cropped[:, :, ::-1]):
            problem = "`flip` reversed the colour channels (RGB -> BGR), not the image."
            hint = "reverse axis 1 (the width) of the (H, W, 3) array, not axis 2 (the channels)."
        elif do_flip and np.array_equal(out, cropped):
            problem = "`flip(image, True)` did not flip."
            hint = "mirror left-right (reverse the width, axis 1) when do_flip is True."
        elif not do_flip and np.array_equal(out, cropped[:, ::-1]):
            problem = "`flip(image, False)` flipped anyway."
            hint = "return the image unchanged when do_flip is False."
        else:
            problem = f"`flip(image, {do_flip})` changed the pixels in an unexpected way."
            hint = ("a flip only reorders pixels: the width reversed when do_flip, the image "
                    "as it is otherwise.")
        raise ExerciseFailed(EXERCISE, problem,
                             expected="the same image mirrored left-right" if do_flip
                             else "the image unchanged",
                             seen=_describe(out), hint=hint)


def _check_to_tensor(out: Any, flipped: np.ndarray, params: Any) -> torch.Tensor:
    c = params.crop
    expected = f"torch.Tensor of shape (3, {c}, {c}), dtype torch.uint8"
    if not isinstance(out, torch.Tensor):
        raise ExerciseFailed(EXERCISE, "`to_tensor` must return a torch tensor.", expected=expected,
                             seen=_describe(out),
                             hint="make a tensor of the NumPy pixels without converting them "
                                  "(torch can wrap a contiguous array as it is), then put the "
                                  "channel axis first.")
    if out.dtype != torch.uint8:
        raise _not_uint8("to_tensor", out, expected)
    if tuple(out.shape) == (c, c, 3):
        raise ExerciseFailed(EXERCISE, "`to_tensor` kept the channels last.", expected=expected,
                             seen=_describe(out),
                             hint="models take channels first: reorder the axes of the "
                                  "(H, W, 3) tensor to (3, H, W) (a reshape or view would "
                                  "scramble the pixels).")
    if tuple(out.shape) != (3, c, c):
        raise ExerciseFailed(EXERCISE, "`to_tensor` returned the wrong shape.", expected=expected,
                             seen=_describe(out))
    if not torch.equal(out, torch.from_numpy(np.ascontiguousarray(flipped)).permute(2, 0, 1)):
        raise ExerciseFailed(EXERCISE, "`to_tensor` changed the pixel values.",
                             expected="the same uint8 pixels, laid out (3, H, W)",
                             seen=_describe(out),
                             hint="only move the axes; don't reorder channels or scale.")
    return out


def _same_pixels(out: torch.Tensor, reference: torch.Tensor, params: Any, dim: int) -> bool:
    """True when ``out``, read back as pixels (x * 255 * std + 255 * mean) and reversed along
    ``dim``, is the reference's pixels within 1.5 grey levels (recognises a swapped channel
    order, dim=1, or a mirror, dim=3)."""
    std = torch.tensor(params.std, dtype=torch.float64).view(1, 3, 1, 1) * 255
    mean = torch.tensor(params.mean, dtype=torch.float64).view(1, 3, 1, 1) * 255
    a = (out.detach().double() * std + mean).flip(dim)
    b = reference.double() * std + mean
    return bool((a - b).abs().max() <= 1.5)


def _check_normalized(out: Any, reference: torch.Tensor, params: Any,
                      where: str = "normalize(batch)") -> Any:
    expected = f"torch.Tensor {tuple(reference.shape)} float32"
    if not isinstance(out, torch.Tensor):
        raise ExerciseFailed(EXERCISE, "`normalize` must return a torch tensor.",
                             expected=expected, seen=_describe(out))
    if out.dtype == torch.float64:
        raise ExerciseFailed(EXERCISE, "`normalize` returned float64.", expected=expected,
                             seen=_describe(out),
                             hint="float64 doubles the bytes again: convert to float32, and "
                                  "keep mean/std float32 too.")
    if out.dtype != torch.float32:
        raise ExerciseFailed(EXERCISE, f"`normalize` returned {out.dtype}.", expected=expected,
                             seen=_describe(out),
                             hint="normalize is where the conversion happens: to float32 "
                                  "first, then (x / 255 - mean) / std.")
    if out.shape != reference.shape:
        raise ExerciseFailed(EXERCISE, "`normalize` returned the wrong shape.", expected=expected,
                             seen=_describe(out), hint="keep the batch's (N, 3, H, W) shape.")
    diff = output_difference(out, reference, params)
    if diff.within_tolerance:
        return diff
    std = torch.tensor(params.std, dtype=torch.float64).view(1, 3, 1, 1) * 255
    levels = (out.detach().double() - reference.double()) * std
    wrapped = float(((levels.abs() - 256).abs() < 2).double().mean())
    seen = f"{diff.max_abs_levels:.1f} grey levels off at worst, mean error {diff.mean_levels:+.2f} levels"
    if wrapped > 1e-3:
        hint = ("some values are about 256 grey levels off: uint8 arithmetic wrapped around "
                "(in uint8, 10 - 124 = 142). Convert to float before any arithmetic.")
    elif _same_pixels(out, reference, params, 1):
        hint = ("the channels are in reverse order (BGR). The images are RGB already "
                "(the dataset decodes to RGB): don't swap channels.")
    elif _same_pixels(out, reference, params, 3):
        hint = "every image is mirrored: check that only the flip stage flips."
    else:
        got = out.detach().double().mean(dim=(0, 2, 3)).tolist()
        want = reference.double().mean(dim=(0, 2, 3)).tolist()
        hint = (f"per-channel means are {[round(v, 3) for v in got]}, expected "
                f"{[round(v, 3) for v in want]}. normalize should compute "
                f"(x / 255 - mean) / std with mean={params.mean} and std={params.std} shaped "
                f"(1, 3, 1, 1), so each channel gets its own values.")
    raise ExerciseFailed(EXERCISE, f"{where} gave the wrong values.",
                         expected=f"within {MAX_DIFF_LEVELS:g} grey level of the reference "
                                  f"(mean error within {MEAN_DIFF_LEVELS:g})",
                         seen=seen, hint=hint)


class _StagesDataset(Dataset):
    """Runs the learner's four worker stages on course JPEGs (sample i flipped when i is odd)."""

    def __init__(self, images: Any, pipeline: Any) -> None:
        self.images = images
        self.pipeline = pipeline

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        p = self.pipeline
        image, _ = self.images[i]
        x = p.to_tensor(p.flip(p.crop(p.resize(image)), _flip_of(i)))
        return x, i


def _worker_context(pipeline: Any) -> tuple[Optional[str], int, str]:
    """(multiprocessing context, workers factor, note): notebook classes need fork to reach
    workers (spawn cannot import __main__ of a notebook); without fork, run in the main process."""
    module = type(pipeline).__module__
    if module != "__main__":
        return None, 1, start_method()
    if "fork" in multiprocessing.get_all_start_methods():
        return "fork", 1, "fork, because spawn cannot import a class defined in a notebook"
    return None, 0, ("main process, because this platform has no fork and spawn cannot import a "
                     "class defined in a notebook")


def _run_in_workers(pipeline: Any, images: Any, refs: list[torch.Tensor], params: Any,
                    num_workers: int, batch_size: int, timeout_s: float) -> dict:
    context, factor, note = _worker_context(pipeline)
    workers = num_workers * factor
    kwargs: dict = {}
    if workers > 0:
        kwargs = dict(timeout=float(timeout_s), worker_init_fn=make_worker_init(1),
                      multiprocessing_context=context)
    loader = DataLoader(_StagesDataset(images, pipeline), batch_size=batch_size,
                        num_workers=workers, **kwargs)
    batch_bytes: list[int] = []
    try:
        for batch, index in loader:
            if batch.dtype != torch.uint8:
                raise ExerciseFailed(EXERCISE, "the batches the workers sent were not uint8.",
                                     expected="torch.uint8 batches", seen=_describe(batch))
            batch_bytes.append(int(batch.nbytes))
            out = _call("normalize", pipeline.normalize, batch.clone())
            reference = torch.stack([refs[int(i)] for i in index])
            _check_normalized(out, reference, params,
                              where="the pipeline run in DataLoader workers")
    except ExerciseFailed:
        raise
    except NotImplementedError:
        raise
    except Exception as exc:
        text = str(exc)
        hint = _hint_for("", text)
        if "timed out" in text:
            hint = (f"a worker gave no batch within {timeout_s:g} s: does a stage wait on "
                    f"something, or start threads? Keep the stages plain NumPy/OpenCV/torch calls.")
        raise ExerciseFailed(EXERCISE, f"running the stages in DataLoader workers failed: "
                                       f"{type(exc).__name__}: {text}", hint=hint) from exc
    return {"workers": workers, "start_method": note, "batch_bytes": batch_bytes}


@grader(EXERCISE)
def grade_uint8_pipeline(pipeline: Any, *, n_images: int = 8, num_workers: int = 2,
                         batch_size: int = 4, seed: int = 1, timeout_s: float = 60.0) -> CheckResult:
    """Check that ``pipeline``'s stages stay uint8 until ``normalize`` and match the reference."""
    refuse_course_helper(EXERCISE, pipeline, COURSE_STAGES, write=_WRITE)
    if isinstance(pipeline, type):
        try:
            pipeline = pipeline()
        except NotImplementedError:
            raise
        except Exception as exc:
            raise ExerciseFailed(EXERCISE, f"could not create {pipeline.__name__}(): {exc}",
                                 hint="pass an instance, e.g. check(..., Uint8Pipeline()).") from exc
        refuse_course_helper(EXERCISE, pipeline, COURSE_STAGES, write=_WRITE)
    missing = [s for s in STAGES if not callable(getattr(pipeline, s, None))]
    if missing:
        raise ExerciseFailed(EXERCISE, f"the answer has no {', '.join(missing)} method(s).",
                             expected=f"an object with methods {', '.join(STAGES)}",
                             seen=f"{type(pipeline).__name__} with "
                                  f"{sorted(a for a in dir(pipeline) if not a.startswith('_'))}",
                             hint="pass an instance of your class: Uint8Pipeline().")
    params = getattr(pipeline, "params", None)
    if not isinstance(params, PipelineParams):
        params = PipelineParams()
    c = params.crop

    images = JpegDataset(n=n_images, seed=seed, progress=False)
    tensors: list[torch.Tensor] = []
    refs: list[torch.Tensor] = []
    for i in range(len(images)):
        image, _ = images[i]
        flip = _flip_of(i)
        h, w = params.resized_hw(*image.shape[:2])
        # each stage gets the previous stage's output as it is (views, strides and all), as in
        # a real pipeline; copies kept aside are what the outputs are compared with
        resized = _check_image_stage("resize", _call("resize", pipeline.resize, image.copy()), (h, w, 3))
        _check_resize_values(resized, image, params)
        resized_copy = resized.copy()
        cropped = _check_image_stage("crop", _call("crop", pipeline.crop, resized), (c, c, 3))
        _check_crop(cropped, resized_copy, params)
        _check_flip(pipeline, cropped, (c, c, 3))
        flipped = _check_image_stage("flip", _call("flip", pipeline.flip, cropped, flip), (c, c, 3))
        flipped_copy = flipped.copy()
        tensor = _check_to_tensor(_call("to_tensor", pipeline.to_tensor, flipped), flipped_copy, params)
        tensors.append(tensor)
        refs.append(exact_pipeline(image, flip, params))

    batch = torch.stack(tensors)
    out = _call("normalize", pipeline.normalize, batch.clone())
    diff = _check_normalized(out, torch.stack(refs), params)

    run = _run_in_workers(pipeline, images, refs, params, num_workers, batch_size, timeout_s)
    per_batch = max(run["batch_bytes"])
    where = (f"in {run['workers']} DataLoader workers (start method {run['start_method']})"
             if run["workers"] else f"in the {run['start_method']}")
    summary = (f"every stage stays uint8 until normalize, and the output is within "
               f"{diff.max_abs_levels:.2f} grey levels (mean {diff.mean_levels:+.3f}) of the "
               f"reference on {len(images)} real JPEGs. Run {where}, each batch of {batch_size} "
               f"crossed to the main process as {per_batch / 1e6:.2f} MB of uint8 instead of "
               f"{4 * per_batch / 1e6:.2f} MB of float32 (4x fewer bytes).")
    details = {"max_abs_levels": diff.max_abs_levels, "mean_levels": diff.mean_levels,
               "images": len(images), "workers": run["workers"], "start_method": run["start_method"],
               "bytes_per_batch": per_batch, "float32_bytes_per_batch": 4 * per_batch}
    return CheckResult(EXERCISE, summary, details)
