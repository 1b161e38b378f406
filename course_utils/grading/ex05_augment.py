"""Grader for exercise 05: ``random_flip_brightness``'s per-sample flip and factor, read back from
asymmetric test images; also dtype, device ('meta' stands in for a GPU), reproducibility, and
torch calls that do not grow with the batch."""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from course_utils.lessons.l05_measure import count_torch_calls

from .checker import CheckResult, ExerciseFailed, call_answer, describe, grader, require_signature

EXERCISE = "05.batched_flip_brightness"

_DARK_MAX = 0.6       # test pixels <= this stay below 1 even at factor 1.6
_BRIGHT = 0.95        # the bright stripe: needs clamping at factors > 1.05
_SIGNATURE = "random_flip_brightness(batch, flip_p=0.5, brightness=0.4, generator=None)"


def make_test_batch(n: int = 64, side: int = 12, *, dtype: torch.dtype = torch.float32,
                    device: Any = "cpu") -> torch.Tensor:
    """The grader's input: (n, 3, side, side) in [0, 1], every image different and asymmetric."""
    h = torch.linspace(0, 1, side).view(1, 1, side, 1)
    w = torch.linspace(0, 1, side).view(1, 1, 1, side)
    per_sample = torch.linspace(0, 0.05, n).view(n, 1, 1, 1)
    per_channel = torch.tensor([0.0, 0.01, 0.02]).view(1, 3, 1, 1)
    x = 0.05 + 0.3 * w + 0.15 * h + per_sample + per_channel   # <= 0.57: the "dark" part
    x = x.expand(n, 3, side, side).clone()
    x[..., -2:] = _BRIGHT                                        # bright stripe, right edge
    return x.to(device=device, dtype=dtype)


def _call(fn: Callable, batch: torch.Tensor, seed: int | None = 0, flip_p: float = 0.5,
          brightness: float = 0.4) -> Any:
    """``fn`` on ``batch`` with a generator on its device seeded ``seed`` (None where none)."""
    try:
        generator = None if seed is None else torch.Generator(device=batch.device).manual_seed(seed)
    except (RuntimeError, TypeError):
        generator = None
    return call_answer(EXERCISE, fn, batch, signature=_SIGNATURE, seen=f"input {describe(batch)}",
                       flip_p=flip_p, brightness=brightness, generator=generator,
                       hint=lambda exc: "the generator lives on the batch's device: draw the "
                       "random numbers on batch.device, with the generator." if "generator" in
                       str(exc).lower() and "device" in str(exc).lower() else None)


def _fail(where: str, problem: str, **kw: str) -> ExerciseFailed:
    return ExerciseFailed(EXERCISE, f"{where}: {problem}", **kw)


def _basic(out: Any, batch: torch.Tensor, before: torch.Tensor, where: str) -> torch.Tensor:
    """Type, in-place, device, dtype, shape, finiteness, value range."""
    fail = functools.partial(_fail, where)
    if not isinstance(out, torch.Tensor):
        raise fail("your function must return a tensor.", seen=describe(out),
                   expected=f"a tensor like the input, {describe(batch)}", hint="did it forget a `return`?")
    if not torch.equal(batch, before):
        raise fail("your function changed the input batch in place.",
                   expected="the input batch unchanged, a new tensor returned",
                   hint="in-place ops (mul_, clamp_, batch[...] = ...) on `batch` overwrite the "
                        "caller's data (in training: the loader's batch, perhaps reused). "
                        "Compute into new tensors with out-of-place operations instead.")
    if out.device != batch.device:
        raise fail(f"the output is on {out.device}, the input was on {batch.device}.",
                   expected=f"the output on {batch.device}", seen=describe(out),
                   hint="keep everything on batch.device: no .cpu(), no NumPy; create random "
                        "numbers with device=batch.device.")
    if out.dtype != batch.dtype:
        raise fail(f"the output dtype is {out.dtype}, the input was {batch.dtype}.",
                   expected=f"dtype {batch.dtype}", seen=describe(out), hint=(
                       "float64 usually comes from NumPy (np.random.* gives float64) or a float64 "
                       "tensor: draw the random numbers with torch, on batch.device, and give the "
                       "factors the batch's dtype." if out.dtype == torch.float64 else
                       f"the input was {batch.dtype}, as in mixed-precision training. torch.rand "
                       f"makes float32, and float32 factors times a {batch.dtype} batch promote "
                       f"the result to float32 (twice the bytes). Give the factors the batch's "
                       f"dtype." if batch.dtype in (torch.float16, torch.bfloat16) else
                       "return the batch's dtype: convert the random factors to it."))
    if out.shape != batch.shape:
        raise fail("the output has the wrong shape.", expected=f"shape {tuple(batch.shape)}",
                   seen=describe(out),
                   hint="flip and brightness change pixels, not the shape; a factor of shape "
                        "(N,) must be viewed as (N, 1, 1, 1) to broadcast per sample.")
    o = out.detach().float()
    if not bool(torch.isfinite(o).all()):
        raise fail("the output has NaN or inf values.", seen=describe(out))
    lo, hi = float(o.min()), float(o.max())
    if hi > 1.0 + 1e-3:
        raise fail(f"values go up to {hi:.3f}, above 1.", seen=f"min {lo:.3f}, max {hi:.3f}",
                   expected="values in [0, 1] (the input's range)",
                   hint="a brightness factor above 1 pushes bright pixels past white (the test "
                        "images have a stripe at 0.95). Clamp to [0, 1] after multiplying.")
    if lo < -1e-3:
        raise fail(f"values go down to {lo:.3f}, below 0.", expected="values in [0, 1]",
                   seen=f"min {lo:.3f}, max {hi:.3f}",
                   hint="brightness multiplies by a positive factor; clamp to [0, 1].")
    return o


def _fit(out: torch.Tensor, hyp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: the factor f with out ~ clamp(f * hyp) (dark pixels), and the worst |error|."""
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
            raise _fail(where, problem, expected="left-right mirror images", seen=seen, hint=hint)
    others = torch.cat([x, x.flip(3)])
    if bool((_fit(o.expand_as(others), others)[1] <= tol).any()):
        raise _fail(
            where, f"sample {i}'s output was made from another sample's image.", seen=seen,
            expected="every output sample made from its own input sample",
            hint="did you flip the batch dimension (dim 0) instead of the width (dim 3)? Choosing "
                 "per sample between the image and its mirror (an element-wise selection with a "
                 "per-sample mask) keeps samples in place.")
    for hyp in (s, s.flip(3)):
        dark = hyp <= _DARK_MAX
        d = (o - hyp)[dark]
        if d.numel() and float(d.std()) < tol and abs(float(d.mean())) > 10 * tol:
            raise _fail(
                where, "brightness was added, not multiplied.",
                expected="out = clamp(factor * image): a factor in [1 - brightness, 1 + brightness]",
                seen=f"sample {i}: every pixel shifted by {float(d.mean()):+.3f}",
                hint="multiply by the factor (one per sample, broadcast over its pixels). Scaling "
                     "keeps black black; adding lifts it.")
        fits = [_fit(o[:, c:c + 1], hyp[:, c:c + 1]) for c in range(o.shape[1])]
        if all(float(e[0]) <= tol for _, e in fits):
            raise _fail(
                where, "each colour channel got its own brightness factor.",
                expected="one factor per sample, the same for its three channels",
                seen=f"sample {i}: factors {', '.join(f'{float(f[0]):.3f}' for f, _ in fits)}",
                hint="draw N factors, not N x C, and broadcast each over its sample's channels "
                     "and pixels.")
    raise _fail(
        where, "the output is not the input flipped (or not) and scaled by one factor per sample.",
        expected="out[i] = clamp(factor[i] * (batch[i] mirrored left-right, or not), 0, 1)",
        seen=seen, hint="check the order: flip, then multiply, then clamp; one factor per sample, "
                        "shaped (N, 1, 1, 1) to broadcast.")


def _check_values(fn: Callable, device: torch.device, *, n: int, side: int, seed: int) -> dict:
    """All value checks on one device (float32). Returns what was read back."""
    where, tol, b, p = f"on {device.type}", 2e-4, 0.4, 0.5
    fail = functools.partial(_fail, where)

    def run(flip_p: float, brightness: float, seed: int = seed) -> Any:
        return _call(fn, x, seed, flip_p, brightness)

    def read_back(out: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return _analyse(_basic(out, x, before, where).cpu(), x.cpu(), tol, where)

    x = make_test_batch(n, side, device=device)
    before = x.clone()
    out = run(p, b)
    flipped, factor = read_back(out)
    k = int(flipped.sum())
    if k in (0, n):
        raise fail(f"{'all' if k else 'none'} of the {n} samples were mirrored: one flip "
                   f"decision for the whole batch.", seen=f"{k} of {n} mirrored",
                   expected=f"each sample flipped with probability {p} on its own (about {n // 2} of {n})",
                   hint="torch.rand(1) < p (or random.random() < p) decides once per batch, so a "
                        "whole batch is flipped together. Draw one number per sample, compare "
                        "each with flip_p, and choose per sample between the image and its mirror.")
    lo, hi, mean = float(factor.min()), float(factor.max()), float(factor.mean())
    if hi - lo < 1e-4:
        raise fail(f"every sample got the same brightness factor ({float(factor[0]):.3f}): one "
                   f"draw for the whole batch.", seen=f"all {n} factors within {hi - lo:.1e} of each other",
                   expected=f"{n} different factors in [{1 - b:.1f}, {1 + b:.1f}]",
                   hint="draw N factors, one per sample, and broadcast them over (N, 1, 1, 1).")
    if lo < 1 - b - 2e-3 or hi > 1 + b + 2e-3:
        raise fail("brightness factors outside [1 - brightness, 1 + brightness].",
                   expected=f"factors in [{1 - b:.2f}, {1 + b:.2f}] for brightness={b}",
                   seen=f"factors from {lo:.3f} to {hi:.3f}",
                   hint="map a uniform number in [0, 1) onto the range: it is 2 * brightness wide "
                        "and starts at 1 - brightness.")
    if lo > 1 - b / 2 or hi < 1 + b / 2 or abs(mean - 1) > 0.12:
        raise fail("the brightness factors do not cover [1 - brightness, 1 + brightness] evenly.",
                   expected=f"{n} factors spread over [{1 - b:.2f}, {1 + b:.2f}], mean near 1",
                   seen=f"from {lo:.3f} to {hi:.3f}, mean {mean:.3f}",
                   hint="draw uniformly over the whole range [1 - brightness, 1 + brightness].")
    if not 0.2 <= k / n <= 0.8:
        raise fail(f"{k} of {n} samples were mirrored with flip_p={p}.", seen=f"{k / n:.0%} mirrored",
                   expected=f"about {p:.0%} mirrored (a sample is flipped when its number is < "
                            f"flip_p)", hint="flip a sample when its uniform number is below flip_p.")
    for p2, want in ((0.0, 0), (1.0, n)):   # the arguments are honoured
        k2 = int(read_back(run(p2, b))[0].sum())
        if k2 != want:
            raise fail(f"with flip_p={p2}, {k2} of {n} samples were mirrored.", seen=f"{k2}",
                       expected=f"{want} of {n} mirrored",
                       hint="use the flip_p argument (not a constant) in the flip decision.")
    for b2 in (0.0, 0.8):
        f2 = read_back(run(p, b2))[1]
        l2, h2 = float(f2.min()), float(f2.max())
        if l2 < 1 - b2 - 2e-3 or h2 > 1 + b2 + 2e-3 or (b2 > 0 and h2 - l2 < b2 / 2):
            raise fail(f"with brightness={b2} the factors ran from {l2:.3f} to {h2:.3f}.",
                       expected=f"factors in [{1 - b2:.2f}, {1 + b2:.2f}]"
                                + (" (exactly 1: no change)" if b2 == 0 else ""),
                       seen=f"{l2:.3f} .. {h2:.3f}",
                       hint="use the brightness argument (not a constant) for the range of the factors.")
    if not torch.equal(run(p, b), out):                 # reproducible with the generator
        raise fail("two calls with generators seeded alike gave different results.",
                   expected="the same output for the same seed (reproducible runs)",
                   hint="draw every random number with the generator (torch's random functions "
                        "take generator=...); without it, torch uses its global one.")
    if torch.equal(run(p, b, seed + 1), out):
        raise fail("a differently seeded generator gave exactly the same result.",
                   expected="different draws for a different seed",
                   hint="don't call torch.manual_seed(...) inside the function: it resets the random stream, "
                        "so every batch of every epoch would get the same augmentation.")
    return {"flipped": k, "n": n, "factor_min": lo, "factor_max": hi, "factor_mean": mean}


def _check_half(fn: Callable, device: torch.device, *, n: int, side: int, seed: int) -> None:
    where = f"on {device.type}, float16 input"
    x = make_test_batch(n, side, dtype=torch.float16, device=device)
    out = _call(fn, x, seed)
    _analyse(_basic(out, x, x.clone(), where).cpu(), x.float().cpu(), 4e-3, where)


def _check_batched(fn: Callable, *, side: int, seed: int) -> dict:
    """The number of torch calls must not grow with the batch size (no loop over samples)."""
    c_small, c_big = (count_torch_calls(_call, fn, make_test_batch(n, side), seed)[1] for n in (8, 64))
    if c_big > c_small + 8 and c_big > 1.5 * c_small:
        raise ExerciseFailed(
            EXERCISE, "the values are right, but the work is not batched: a Python loop over the "
                      "samples.", seen=f"{c_small} torch calls for 8 samples, {c_big} for 64",
            expected="the same number of torch operations whatever the batch size",
            hint="on a GPU every torch call is at least one kernel launch (a few microseconds "
                 "each, plus Python overhead), so a loop costs N x (launches) per batch while the "
                 "GPU idles between tiny kernels. Draw all N random numbers at once and let "
                 "broadcasting apply them to the whole batch: a per-sample mask for the flip, a "
                 "per-sample factor shaped (N, 1, 1, 1) for the brightness.")
    return {"calls": c_big}


_HOST_COPY = ("cannot copy out of meta", "to numpy", "tolist", "numpy()")
_DATA_DEPENDENT = ("item() cannot be called on meta", "nonzero", "data-dependent",
                   "data dependent", "masked_select", "meta tensors")
#: (words of torch's error on 'meta', the problem, what is expected, the hint)
_META_FAILURES = (
    (("not on the expected device", "same device", "expected all tensors", "device type cpu",
      "found at least two devices"),
     "on another device, your function mixes in tensors made on the CPU.",
     "every tensor created on batch.device", "torch.rand(n) and torch.tensor(...) create CPU tensors; on a "
     "GPU batch this fails the same way. Pass device=batch.device (and generator=generator)."),
    (_HOST_COPY, "your function copies the batch to the host (.cpu(), .numpy() or .tolist()).",
     "all the work on batch.device, the result on batch.device", "on a GPU that is two copies over PCIe per "
     "batch and CPU work in the training loop: do it all with torch ops on the batch where it is."))


def _check_meta(fn: Callable, *, n: int, side: int) -> str:
    """Run on 'meta' (no data): catches CPU tensors made or returned; a note if it could not run."""
    x = torch.empty(n, 3, side, side, device="meta")
    try:
        out = fn(x, flip_p=0.5, brightness=0.4, generator=None)
    except Exception as exc:  # noqa: BLE001 - the learner's code can raise anything
        low = str(exc).lower()
        if isinstance(exc, NotImplementedError) and not any(
                s in low for s in _HOST_COPY + _DATA_DEPENDENT):
            raise  # the stub itself
        seen = f"on the 'meta' device (a stand-in for a GPU): {type(exc).__name__}: {str(exc)[:160]}"
        for words, problem, expected, hint in _META_FAILURES:
            if any(w in low for w in words):
                raise ExerciseFailed(EXERCISE, problem, expected=expected, seen=seen, hint=hint) from exc
        if any(s in low for s in _DATA_DEPENDENT):
            return ("device check on 'meta' skipped: your function reads values back from the device "
                    "(.item(), bool(...), or boolean-mask indexing such as batch[mask]). That is correct, "
                    "but on a GPU each read waits for the GPU to finish its queue (a sync) every batch; "
                    "torch.where(mask.view(-1, 1, 1, 1), a, b) needs none.")
        raise ExerciseFailed(EXERCISE, f"on the 'meta' device (a stand-in for a GPU) your "
                                       f"function raised {type(exc).__name__}: {str(exc)[:200]}",
                             hint="keep to torch operations on batch.device.") from exc
    if not isinstance(out, torch.Tensor) or out.device.type != "meta":
        raise ExerciseFailed(
            EXERCISE, "on the 'meta' device your function did not return a tensor on it.",
            expected="the output on the input's device", seen=describe(out),
            hint="no .cpu() / .to('cpu') / NumPy: return the tensor where the batch was.")
    if out.dtype != x.dtype or out.shape != x.shape:
        raise ExerciseFailed(EXERCISE, "on the 'meta' device the output's dtype or shape changed.",
                             expected=describe(x), seen=describe(out))
    return ""


@grader(EXERCISE)
def grade_flip_brightness(fn: Callable[..., Any], *, n: int = 64, side: int = 12, seed: int = 0,
                          accelerators: bool = True) -> CheckResult:
    """Check a batched random flip + brightness with per-sample randomness on every device here."""
    require_signature(EXERCISE, fn, "your function does not take the arguments batch, flip_p, "
                      "brightness, generator.", _SIGNATURE, 0, flip_p=0.5, brightness=0.4, generator=None)
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
    if accelerators and torch.backends.mps.is_available():
        x = make_test_batch(n, side, device="mps")
        _basic(_call(fn, x, seed), x, x.clone(), "on mps")
        devices.append("mps")
    summary = (f"per-sample randomness ({found['flipped']} of {found['n']} mirrored, brightness "
               f"factors {found['factor_min']:.2f}..{found['factor_max']:.2f}), values clamped to "
               f"[0, 1], dtype kept (float32, float16), input untouched, reproducible with a "
               f"seeded generator, batched ({batched['calls']} torch calls for 64 samples, as many "
               f"as for 8), device kept on: {', '.join(devices)}.")
    if not torch.cuda.is_available() and not note:
        summary += (" No CUDA here: 'meta' tensors (shape and device, no data) stood in for a GPU, "
                    "so CPU tensors mixed in or copies to the host would have failed.")
    if note:
        summary += " Note: " + note
    return CheckResult(EXERCISE, summary, {**found, **batched, "devices": devices, "note": note})
