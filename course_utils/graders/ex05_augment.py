"""Grader for exercise 05: a batched random flip + brightness with per-sample randomness.

The learner writes::

    random_flip_brightness(batch, flip_p=0.5, brightness=0.4, generator=None) -> Tensor

``batch`` is an (N, C, H, W) float tensor with values in [0, 1] on any device. Each sample, on
its own: mirrored left-right (the width, dim 3) with probability ``flip_p``, multiplied by a
factor drawn uniformly in ``[1 - brightness, 1 + brightness]``, clamped to [0, 1]. A new tensor
of the same shape, dtype and device comes back; ``batch`` is unchanged; every random number
comes from ``generator`` (a ``torch.Generator`` on ``batch.device``, or None).

What the grader checks, and how, without timing anything:

* **values**: on a test batch whose images are asymmetric left-right and top-bottom and
  different from each other, every output sample must be its own input (mirrored or not) times
  one factor, clamped. From that it reads each sample's flip and factor back;
* **per-sample randomness**: flips and factors vary across the batch (one draw per batch is
  the classic mistake), the flip rate and the factors' range match ``flip_p`` and
  ``brightness``; ``flip_p`` 0 and 1 and ``brightness`` 0 are honoured;
* **value range** [0, 1] (brightness without clamping goes above 1), **dtype** kept (float32
  and float16), the input not modified in place, reproducible with a seeded generator;
* **batched**: the number of torch calls (counted with ``torch.overrides.TorchFunctionMode``)
  must not grow with the batch size. A Python loop over samples gives right values but one
  kernel launch per op per sample on a GPU: it fails here, with a message saying so;
* **device kept**: on a CPU-only machine a CPU tensor cannot tell "stayed on the device" from
  "moved to the CPU", so the function also runs on PyTorch's ``meta`` device (tensors with a
  shape, a dtype and a device but no data): creating random numbers on the CPU, or copying to
  the host, fails there just as it would on a GPU. On CUDA (and MPS) the value checks run on
  the GPU itself too.

The course's own batched augmentation (``augment_batch`` and the pieces it is made of), handed in
or built on, is refused: the exercise is to write it.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch

from ..augment import (AugmentDraws, AugmentTransform, augment_batch, augment_sample, crop_grid,
                       draw_batch, draw_sample)
from ..grading import CheckResult, ExerciseFailed, grader, refuse_course_helper
from ..lessons.l05_measure import count_torch_calls

EXERCISE = "05.batched_flip_brightness"

#: the course's augmentation, refused in an answer
COURSE_AUGMENT = (augment_batch, draw_batch, draw_sample, crop_grid, augment_sample, AugmentDraws,
                  AugmentTransform)

_DARK_MAX = 0.6       # test pixels <= this stay below 1 even at factor 1.6
_BRIGHT = 0.95        # the bright stripe: needs clamping at factors > 1.05


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"torch.Tensor {tuple(x.shape)} {x.dtype} on {x.device}"
    return f"{type(x).__name__}: {x!r:.80}"


def make_test_batch(n: int = 64, side: int = 12, *, dtype: torch.dtype = torch.float32,
               device: Any = "cpu") -> torch.Tensor:
    """The grader's input: (n, 3, side, side) in [0, 1], every image different, asymmetric
    left-right (a ramp and a bright stripe on the right) and top-bottom (a ramp)."""
    h = torch.linspace(0, 1, side).view(1, 1, side, 1)
    w = torch.linspace(0, 1, side).view(1, 1, 1, side)
    per_sample = torch.linspace(0, 0.05, n).view(n, 1, 1, 1)
    per_channel = torch.tensor([0.0, 0.01, 0.02]).view(1, 3, 1, 1)
    x = 0.05 + 0.3 * w + 0.15 * h + per_sample + per_channel   # <= 0.57: the "dark" part
    x = x.expand(n, 3, side, side).clone()
    x[..., -2:] = _BRIGHT                                        # bright stripe, right edge
    return x.to(device=device, dtype=dtype)


def _call(fn: Callable, batch: torch.Tensor, **kwargs: Any) -> Any:
    try:
        return fn(batch, **kwargs)
    except NotImplementedError:
        raise
    except TypeError as exc:
        if "argument" in str(exc):
            raise ExerciseFailed(
                EXERCISE, f"calling your function failed: {exc}",
                expected="random_flip_brightness(batch, flip_p=0.5, brightness=0.4, generator=None)",
                hint="keep the signature of the stub: the check passes flip_p, brightness and "
                     "generator by name.") from exc
        raise ExerciseFailed(EXERCISE, f"your function raised TypeError: {exc}",
                             seen=f"input {_describe(batch)}",
                             hint="run it on a small batch in a cell of its own and read the traceback.") from exc
    except Exception as exc:
        text = str(exc)
        hint = "run it on a small batch in a cell of its own and read the traceback."
        if "generator" in text.lower() and "device" in text.lower():
            hint = ("the generator lives on the batch's device: draw the random numbers on "
                    "batch.device, with the generator.")
        raise ExerciseFailed(EXERCISE, f"your function raised {type(exc).__name__}: {text}",
                             seen=f"input {_describe(batch)}", hint=hint) from exc


def _generator(device: torch.device, seed: int) -> Optional[torch.Generator]:
    try:
        return torch.Generator(device=device).manual_seed(seed)
    except (RuntimeError, TypeError):  # a device without its own generators
        return None


def _basic(out: Any, batch: torch.Tensor, before: torch.Tensor, where: str) -> torch.Tensor:
    """Type, in-place, device, dtype, shape, finiteness, value range."""
    if not isinstance(out, torch.Tensor):
        raise ExerciseFailed(EXERCISE, f"{where}: your function must return a tensor.",
                             expected=f"a tensor like the input, {_describe(batch)}", seen=_describe(out),
                             hint="did it forget a `return`?")
    if not torch.equal(batch, before):
        raise ExerciseFailed(
            EXERCISE, f"{where}: your function changed the input batch in place.",
            expected="the input batch unchanged, a new tensor returned",
            hint="in-place ops (mul_, clamp_, batch[...] = ...) on `batch` overwrite the caller's "
                 "data (in training: the loader's batch, perhaps reused). Compute into new "
                 "tensors with out-of-place operations instead.")
    if out.device != batch.device:
        raise ExerciseFailed(
            EXERCISE, f"{where}: the output is on {out.device}, the input was on {batch.device}.",
            expected=f"the output on {batch.device}", seen=_describe(out),
            hint="keep everything on batch.device: no .cpu(), no NumPy; create random numbers with "
                 "device=batch.device.")
    if out.dtype != batch.dtype:
        if out.dtype == torch.float64:
            hint = ("float64 usually comes from NumPy (np.random.* gives float64) or a float64 "
                    "tensor: draw the random numbers with torch, on batch.device, and give the "
                    "factors the batch's dtype.")
        elif batch.dtype in (torch.float16, torch.bfloat16):
            hint = (f"the input was {batch.dtype}, as in mixed-precision training. torch.rand makes "
                    f"float32, and float32 factors times a {batch.dtype} batch promote the result "
                    f"to float32 (twice the bytes). Give the factors the batch's dtype.")
        else:
            hint = "return the batch's dtype: convert the random factors to it."
        raise ExerciseFailed(EXERCISE, f"{where}: the output dtype is {out.dtype}, the input was {batch.dtype}.",
                             expected=f"dtype {batch.dtype}", seen=_describe(out), hint=hint)
    if out.shape != batch.shape:
        raise ExerciseFailed(EXERCISE, f"{where}: the output has the wrong shape.",
                             expected=f"shape {tuple(batch.shape)}", seen=_describe(out),
                             hint="flip and brightness change pixels, not the shape; a factor of "
                                  "shape (N,) must be viewed as (N, 1, 1, 1) to broadcast per sample.")
    o = out.detach().float()
    if not bool(torch.isfinite(o).all()):
        raise ExerciseFailed(EXERCISE, f"{where}: the output has NaN or inf values.", seen=_describe(out))
    lo, hi = float(o.min()), float(o.max())
    if hi > 1.0 + 1e-3:
        raise ExerciseFailed(
            EXERCISE, f"{where}: values go up to {hi:.3f}, above 1.",
            expected="values in [0, 1] (the input's range)", seen=f"min {lo:.3f}, max {hi:.3f}",
            hint="a brightness factor above 1 pushes bright pixels past white (the test images "
                 "have a stripe at 0.95). Clamp to [0, 1] after multiplying.")
    if lo < -1e-3:
        raise ExerciseFailed(EXERCISE, f"{where}: values go down to {lo:.3f}, below 0.",
                             expected="values in [0, 1]", seen=f"min {lo:.3f}, max {hi:.3f}",
                             hint="brightness multiplies by a positive factor; clamp to [0, 1].")
    return o


def _fit(out: torch.Tensor, hyp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: the factor f with out ~ clamp(f * hyp) (fitted on dark pixels), and the
    largest |error| over all pixels. (N,) each."""
    mask = (hyp <= _DARK_MAX).float()
    f = (out * hyp * mask).sum(dim=(1, 2, 3)) / (hyp * hyp * mask).sum(dim=(1, 2, 3)).clamp_min(1e-12)
    pred = (f.view(-1, 1, 1, 1) * hyp).clamp(0, 1)
    return f, (pred - out).abs().amax(dim=(1, 2, 3))


def _analyse(out: torch.Tensor, x: torch.Tensor, tol: float, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Read each sample's flip and factor back from the output, or fail with what it did instead."""
    kept_f, kept_err = _fit(out, x)
    mirr_f, mirr_err = _fit(out, x.flip(3))
    flipped = mirr_err < kept_err
    factor = torch.where(flipped, mirr_f, kept_f)
    err = torch.minimum(kept_err, mirr_err)
    bad = (err > tol).nonzero().flatten()
    if bad.numel() == 0:
        return flipped, factor
    i = int(bad[0])
    o, s = out[i:i + 1], x[i:i + 1]
    seen = f"sample {i}: not its input (mirrored or not) times one factor (off by up to {float(err[i]):.3g})"
    for hyp, problem, hint in (
            (s.flip(2), "some samples were flipped upside down (along the height, dim 2).",
             "a horizontal (left-right) flip reverses the width: dim 3 of an (N, C, H, W) batch; "
             "dim 2 is the height."),
            (s.flip(2).flip(3), "some samples were flipped along both height and width.",
             "flip only the width (dim 3)."),
            (s.flip(1), "some samples had their colour channels reversed (dim 1).",
             "flip the width, dim 3, not the channels.")):
        if float(_fit(o, hyp)[1][0]) <= tol:
            raise ExerciseFailed(EXERCISE, f"{where}: {problem}", expected="left-right mirror images",
                                 seen=seen, hint=hint)
    others = torch.cat([x, x.flip(3)])
    if bool((_fit(o.expand_as(others), others)[1] <= tol).any()):
        raise ExerciseFailed(
            EXERCISE, f"{where}: sample {i}'s output was made from another sample's image.",
            expected="every output sample made from its own input sample",
            seen=seen, hint="did you flip the batch dimension (dim 0) instead of the width (dim 3)? "
                            "Choosing per sample between the image and its mirror (an "
                            "element-wise selection with a per-sample mask) keeps samples in place.")
    for hyp in (s, s.flip(3)):
        dark = hyp <= _DARK_MAX
        d = (o - hyp)[dark]
        if d.numel() and float(d.std()) < tol and abs(float(d.mean())) > 10 * tol:
            raise ExerciseFailed(
                EXERCISE, f"{where}: brightness was added, not multiplied.",
                expected="out = clamp(factor * image): a factor in [1 - brightness, 1 + brightness]",
                seen=f"sample {i}: every pixel shifted by {float(d.mean()):+.3f}",
                hint="multiply by the factor (one per sample, broadcast over its pixels). Scaling "
                     "keeps black black; adding lifts it.")
        per_channel = [(o[:, c:c + 1], hyp[:, c:c + 1]) for c in range(o.shape[1])]
        fits = [_fit(a, b) for a, b in per_channel]
        if all(float(e[0]) <= tol for _, e in fits):
            factors = ", ".join(f"{float(f[0]):.3f}" for f, _ in fits)
            raise ExerciseFailed(
                EXERCISE, f"{where}: each colour channel got its own brightness factor.",
                expected="one factor per sample, the same for its three channels",
                seen=f"sample {i}: factors {factors} for its channels",
                hint="draw N factors, not N x C, and broadcast each over its sample's channels "
                     "and pixels.")
    raise ExerciseFailed(
        EXERCISE, f"{where}: the output is not the input flipped (or not) and scaled by one factor per sample.",
        expected="out[i] = clamp(factor[i] * (batch[i] mirrored left-right, or not), 0, 1)",
        seen=seen, hint="check the order: flip, then multiply, then clamp; one factor per sample, "
                        "shaped (N, 1, 1, 1) to broadcast.")


def _check_values(fn: Callable, device: torch.device, *, n: int, side: int, seed: int) -> dict:
    """All value checks on one device (float32). Returns what was read back."""
    where = f"on {device.type}"
    tol = 2e-4
    x = make_test_batch(n, side, device=device)
    before = x.clone()
    b, p = 0.4, 0.5
    out = _call(fn, x, flip_p=p, brightness=b, generator=_generator(device, seed))
    o = _basic(out, x, before, where)
    flipped, factor = _analyse(o.cpu(), x.cpu(), tol, where)
    flipped, factor = flipped.cpu(), factor.cpu()
    k = int(flipped.sum())
    if k in (0, n):
        raise ExerciseFailed(
            EXERCISE, f"{where}: {'all' if k else 'none'} of the {n} samples were mirrored: one flip "
                      f"decision for the whole batch.",
            expected=f"each sample flipped with probability {p} on its own (about {n // 2} of {n})",
            seen=f"{k} of {n} mirrored",
            hint="torch.rand(1) < p (or random.random() < p) decides once per batch, so a whole "
                 "batch is flipped together. Draw one number per sample, compare each with "
                 "flip_p, and choose per sample between the image and its mirror.")
    spread = float(factor.max() - factor.min())
    if spread < 1e-4:
        raise ExerciseFailed(
            EXERCISE, f"{where}: every sample got the same brightness factor ({float(factor[0]):.3f}): "
                      f"one draw for the whole batch.",
            expected=f"{n} different factors in [{1 - b:.1f}, {1 + b:.1f}]",
            seen=f"all {n} factors within {spread:.1e} of each other",
            hint="draw N factors, one per sample, and broadcast them over (N, 1, 1, 1).")
    lo, hi = float(factor.min()), float(factor.max())
    if lo < 1 - b - 2e-3 or hi > 1 + b + 2e-3:
        raise ExerciseFailed(
            EXERCISE, f"{where}: brightness factors outside [1 - brightness, 1 + brightness].",
            expected=f"factors in [{1 - b:.2f}, {1 + b:.2f}] for brightness={b}",
            seen=f"factors from {lo:.3f} to {hi:.3f}",
            hint="map a uniform number in [0, 1) onto the range: it is 2 * brightness wide and "
                 "starts at 1 - brightness.")
    mean = float(factor.mean())
    if lo > 1 - b / 2 or hi < 1 + b / 2 or abs(mean - 1) > 0.12:
        raise ExerciseFailed(
            EXERCISE, f"{where}: the brightness factors do not cover [1 - brightness, 1 + brightness] evenly.",
            expected=f"{n} factors spread over [{1 - b:.2f}, {1 + b:.2f}], mean near 1",
            seen=f"from {lo:.3f} to {hi:.3f}, mean {mean:.3f}",
            hint="draw uniformly over the whole range [1 - brightness, 1 + brightness].")
    rate = k / n
    if not 0.2 <= rate <= 0.8:
        raise ExerciseFailed(
            EXERCISE, f"{where}: {k} of {n} samples were mirrored with flip_p={p}.",
            expected=f"about {p:.0%} mirrored (a sample is flipped when its number is < flip_p)",
            seen=f"{rate:.0%} mirrored",
            hint="flip a sample when its uniform number is below flip_p.")
    # the arguments are honoured
    for p2, want in ((0.0, 0), (1.0, n)):
        o2 = _basic(_call(fn, x, flip_p=p2, brightness=b, generator=_generator(device, seed)), x, before, where)
        k2 = int(_analyse(o2.cpu(), x.cpu(), tol, where)[0].sum())
        if k2 != want:
            raise ExerciseFailed(EXERCISE, f"{where}: with flip_p={p2}, {k2} of {n} samples were mirrored.",
                                 expected=f"{want} of {n} mirrored", seen=f"{k2}",
                                 hint="use the flip_p argument (not a constant) in the flip "
                                      "decision.")
    for b2 in (0.0, 0.8):
        o2 = _basic(_call(fn, x, flip_p=p, brightness=b2, generator=_generator(device, seed)), x, before, where)
        f2 = _analyse(o2.cpu(), x.cpu(), tol, where)[1]
        l2, h2 = float(f2.min()), float(f2.max())
        if l2 < 1 - b2 - 2e-3 or h2 > 1 + b2 + 2e-3 or (b2 > 0 and h2 - l2 < b2 / 2):
            raise ExerciseFailed(
                EXERCISE, f"{where}: with brightness={b2} the factors ran from {l2:.3f} to {h2:.3f}.",
                expected=f"factors in [{1 - b2:.2f}, {1 + b2:.2f}]" + (" (exactly 1: no change)" if b2 == 0 else ""),
                seen=f"{l2:.3f} .. {h2:.3f}",
                hint="use the brightness argument (not a constant) for the range of the factors.")
    # reproducible with the generator
    g_dev = _generator(device, seed)
    if g_dev is not None:
        again = _call(fn, x, flip_p=p, brightness=b, generator=_generator(device, seed))
        if not torch.equal(again, out):
            raise ExerciseFailed(
                EXERCISE, f"{where}: two calls with generators seeded alike gave different results.",
                expected="the same output for the same seed (reproducible runs)",
                hint="draw every random number with the generator (torch's random functions take "
                     "generator=...); without it, torch uses its global one.")
        other = _call(fn, x, flip_p=p, brightness=b, generator=_generator(device, seed + 1))
        if torch.equal(other, out):
            raise ExerciseFailed(
                EXERCISE, f"{where}: a differently seeded generator gave exactly the same result.",
                expected="different draws for a different seed",
                hint="don't call torch.manual_seed(...) inside the function: it resets the random "
                     "stream, so every batch of every epoch would get the same augmentation.")
    return {"flipped": k, "n": n, "factor_min": lo, "factor_max": hi, "factor_mean": mean}


def _check_half(fn: Callable, device: torch.device, *, n: int, side: int, seed: int) -> None:
    where = f"on {device.type}, float16 input"
    x = make_test_batch(n, side, dtype=torch.float16, device=device)
    before = x.clone()
    out = _call(fn, x, flip_p=0.5, brightness=0.4, generator=_generator(device, seed))
    o = _basic(out, x, before, where)
    _analyse(o.cpu(), x.float().cpu(), 4e-3, where)


def _count_calls(fn: Callable, n: int, side: int, seed: int) -> int:
    x = make_test_batch(n, side)
    return count_torch_calls(_call, fn, x, flip_p=0.5, brightness=0.4,
                             generator=torch.Generator().manual_seed(seed))[1]


def _check_batched(fn: Callable, *, side: int, seed: int) -> dict:
    small, big = 8, 64
    try:
        c_small, c_big = _count_calls(fn, small, side, seed), _count_calls(fn, big, side, seed)
    except ImportError:  # pragma: no cover - TorchFunctionMode exists in every supported torch
        return {"calls": None}
    if c_big > c_small + 8 and c_big > 1.5 * c_small:
        raise ExerciseFailed(
            EXERCISE, "the values are right, but the work is not batched: a Python loop over the samples.",
            expected="the same number of torch operations whatever the batch size",
            seen=f"{c_small} torch calls for {small} samples, {c_big} for {big}",
            hint="on a GPU every torch call is at least one kernel launch (a few microseconds each, "
                 "plus Python overhead), so a loop costs N x (launches) per batch while the GPU "
                 "idles between tiny kernels. Draw all N random numbers at once and let "
                 "broadcasting apply them to the whole batch: a per-sample mask for the flip, a "
                 "per-sample factor shaped (N, 1, 1, 1) for the brightness.")
    return {"calls": c_big}


_DEVICE_MIX = ("not on the expected device", "same device", "expected all tensors", "device type cpu",
               "found at least two devices")
_HOST_COPY = ("cannot copy out of meta", "to numpy", "tolist", "numpy()")
_DATA_DEPENDENT = ("item() cannot be called on meta", "nonzero", "data-dependent", "data dependent",
                   "masked_select", "meta tensors")


def _check_meta(fn: Callable, *, n: int, side: int) -> str:
    """Run on 'meta' (a device without data): catches CPU tensors made or returned. Returns a note."""
    x = torch.empty(n, 3, side, side, device="meta")
    try:
        out = fn(x, flip_p=0.5, brightness=0.4, generator=None)
    except NotImplementedError as exc:
        text = str(exc)
        if not any(s.lower() in text.lower() for s in _HOST_COPY + _DATA_DEPENDENT):
            raise  # the stub itself
        out = exc
    except Exception as exc:  # noqa: BLE001 - the learner's code can raise anything
        out = exc
    if isinstance(out, Exception):
        text = str(out)
        low = text.lower()
        if any(s.lower() in low for s in _DEVICE_MIX):
            raise ExerciseFailed(
                EXERCISE, "on another device, your function mixes in tensors made on the CPU.",
                expected="every tensor created on batch.device",
                seen=f"on the 'meta' device (a stand-in for a GPU): {type(out).__name__}: {text[:160]}",
                hint="torch.rand(n) and torch.tensor(...) create CPU tensors; on a GPU batch this "
                     "fails the same way. Pass device=batch.device (and generator=generator).") from out
        if any(s.lower() in low for s in _HOST_COPY):
            raise ExerciseFailed(
                EXERCISE, "your function copies the batch to the host (.cpu(), .numpy() or .tolist()).",
                expected="all the work on batch.device, the result on batch.device",
                seen=f"on the 'meta' device (a stand-in for a GPU): {type(out).__name__}: {text[:160]}",
                hint="on a GPU that is two copies over PCIe per batch and CPU work in the training "
                     "loop: do it all with torch ops on the batch where it is.") from out
        if any(s.lower() in low for s in _DATA_DEPENDENT):
            return ("device check on 'meta' skipped: your function reads values back from the device "
                    "(.item(), bool(...), or boolean-mask indexing such as batch[mask]). That is "
                    "correct, but on a GPU each read waits for the GPU to finish its queue (a sync) "
                    "every batch; torch.where(mask.view(-1, 1, 1, 1), a, b) needs none.")
        raise ExerciseFailed(
            EXERCISE, f"on the 'meta' device (a stand-in for a GPU) your function raised "
                      f"{type(out).__name__}: {text[:200]}",
            hint="keep to torch operations on batch.device.") from out
    if not isinstance(out, torch.Tensor):
        raise ExerciseFailed(EXERCISE, "on the 'meta' device your function did not return a tensor.",
                             seen=_describe(out))
    if out.device.type != "meta":
        raise ExerciseFailed(
            EXERCISE, f"the output came back on {out.device} for an input on the 'meta' device.",
            expected="the output on the input's device", seen=_describe(out),
            hint="no .cpu() / .to('cpu') / NumPy: return the tensor where the batch was.")
    if out.dtype != x.dtype or out.shape != x.shape:
        raise ExerciseFailed(EXERCISE, "on the 'meta' device the output's dtype or shape changed.",
                             expected=_describe(x), seen=_describe(out))
    return ""


@grader(EXERCISE)
def grade_flip_brightness(fn: Callable[..., Any], *, n: int = 64, side: int = 12, seed: int = 0,
                          accelerators: bool = True) -> CheckResult:
    """Check a batched random flip + brightness with per-sample randomness on every device here."""
    if not callable(fn):
        raise ExerciseFailed(EXERCISE, "the answer is not a function.",
                             expected="random_flip_brightness(batch, flip_p=0.5, brightness=0.4, generator=None)",
                             seen=_describe(fn))
    refuse_course_helper(EXERCISE, fn, COURSE_AUGMENT,
                         write="draw one random number per sample with torch and apply the flip "
                               "and the brightness to the whole batch at once")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    missing = [a for a in ("flip_p", "brightness", "generator") if params and a not in params
               and not any(q.kind is inspect.Parameter.VAR_KEYWORD for q in params.values())]
    if missing:
        raise ExerciseFailed(EXERCISE, f"your function has no {', '.join(missing)} argument(s).",
                             expected="random_flip_brightness(batch, flip_p=0.5, brightness=0.4, generator=None)",
                             seen=f"{getattr(fn, '__name__', 'function')}{inspect.signature(fn)}",
                             hint="keep the stub's signature.")
    cpu = torch.device("cpu")
    found = _check_values(fn, cpu, n=n, side=side, seed=seed)
    _check_half(fn, cpu, n=n, side=side, seed=seed)
    batched = _check_batched(fn, side=side, seed=seed)
    note = _check_meta(fn, n=n, side=side)
    devices = ["cpu", "meta (device kept)" if not note else "meta (skipped)"]
    if accelerators and torch.cuda.is_available():
        _check_values(fn, torch.device("cuda"), n=n, side=side, seed=seed)
        _check_half(fn, torch.device("cuda"), n=n, side=side, seed=seed)
        devices.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if accelerators and mps is not None and mps.is_available():
        x = make_test_batch(n, side, device="mps")
        _basic(_call(fn, x, flip_p=0.5, brightness=0.4, generator=_generator(torch.device("mps"), seed)),
               x, x.clone(), "on mps")
        devices.append("mps")
    summary = (f"per-sample randomness ({found['flipped']} of {found['n']} mirrored, brightness factors "
               f"{found['factor_min']:.2f}..{found['factor_max']:.2f}), values clamped to [0, 1], dtype kept "
               f"(float32, float16), input untouched, reproducible with a seeded generator, batched "
               f"({batched['calls']} torch calls for 64 samples, as many as for 8), device kept on: "
               f"{', '.join(devices)}.")
    if not torch.cuda.is_available() and not note:
        summary += (" No CUDA here: 'meta' tensors (shape and device, no data) stood in for a GPU, so "
                    "CPU tensors mixed in or copies to the host would have failed.")
    if note:
        summary += " Note: " + note
    return CheckResult(EXERCISE, summary, {**found, **batched, "devices": devices, "note": note})
