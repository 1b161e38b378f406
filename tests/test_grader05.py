"""Exercise 05 grader: right answers pass; plausible wrong answers fail with their message."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from course_utils.augment import AugmentTransform, augment_batch
from course_utils.grading.checker import CheckResult, ExerciseFailed, check, exercise_ids
from course_utils.grading.ex05_augment import EXERCISE, make_test_batch

pytestmark = pytest.mark.timeout(120)


# --- right answers -------------------------------------------------------------------------

def reference(batch, flip_p=0.5, brightness=0.4, generator=None):
    """The solution notebook's answer."""
    n = batch.shape[0]
    u = torch.rand(n, 2, generator=generator, device=batch.device)
    flip = (u[:, 0] < flip_p).view(n, 1, 1, 1)
    factor = (1 - brightness + 2 * brightness * u[:, 1]).to(batch.dtype).view(n, 1, 1, 1)
    out = torch.where(flip, batch.flip(3), batch)
    return (out * factor).clamp(0, 1)


def mask_indexing(batch, flip_p=0.5, brightness=0.4, generator=None):
    """Right, with boolean-mask indexing (a device sync on CUDA; not runnable on 'meta')."""
    n = batch.shape[0]
    flip = torch.rand(n, generator=generator, device=batch.device) < flip_p
    factor = torch.empty(n, device=batch.device, dtype=batch.dtype).uniform_(
        1 - brightness, 1 + brightness, generator=generator)
    out = batch.clone()
    out[flip] = out[flip].flip(-1)
    return out.mul_(factor.view(-1, 1, 1, 1)).clamp_(0, 1)


def drawn_on_cpu_then_moved(batch, flip_p=0.5, brightness=0.4, generator=None):
    """Right: random numbers drawn where the generator lives, then moved to the batch."""
    n = batch.shape[0]
    u = torch.rand(n, 2, generator=generator,
                   device=generator.device if generator is not None else "cpu").to(batch.device)
    flip = (u[:, 0] < flip_p).view(n, 1, 1, 1)
    factor = (1 - brightness + 2 * brightness * u[:, 1]).view(n, 1, 1, 1).to(batch.dtype)
    return (torch.where(flip, batch.flip(3), batch) * factor).clamp(0, 1)


@pytest.mark.parametrize("answer", [reference, mask_indexing, drawn_on_cpu_then_moved],
                         ids=lambda f: f.__name__)
def test_right_answers_pass(answer):
    result = check(EXERCISE, answer)
    assert isinstance(result, CheckResult) and "PASSED" in str(result)
    assert result.details["devices"][0] == "cpu"
    if answer is mask_indexing:
        assert "sync" in result.details["note"]
    else:
        assert result.details["note"] == ""


def test_registered():
    assert EXERCISE in exercise_ids()


def test_test_batch_is_asymmetric_and_in_range():
    x = make_test_batch(8, 12)
    assert x.shape == (8, 3, 12, 12) and x.dtype == torch.float32
    assert 0 <= float(x.min()) and float(x.max()) <= 1
    assert not torch.equal(x, x.flip(3)) and not torch.equal(x, x.flip(2))
    assert not torch.equal(x[0], x[1])


# --- wrong answers -------------------------------------------------------------------------

def one_flip_per_batch(batch, flip_p=0.5, brightness=0.4, generator=None):
    n = batch.shape[0]
    out = batch.flip(3) if float(torch.rand(1, generator=generator, device=batch.device)) < flip_p else batch
    factor = (1 - brightness + 2 * brightness * torch.rand(n, generator=generator, device=batch.device))
    return (out * factor.view(-1, 1, 1, 1).to(batch.dtype)).clamp(0, 1)


def one_brightness_per_batch(batch, flip_p=0.5, brightness=0.4, generator=None):
    n = batch.shape[0]
    flip = torch.rand(n, generator=generator, device=batch.device) < flip_p
    factor = 1 - brightness + 2 * brightness * torch.rand(1, generator=generator, device=batch.device)
    return (torch.where(flip.view(-1, 1, 1, 1), batch.flip(3), batch) * factor.to(batch.dtype)).clamp(0, 1)


def python_loop(batch, flip_p=0.5, brightness=0.4, generator=None):
    outs = []
    for i in range(batch.shape[0]):
        u = torch.rand(2, generator=generator, device=batch.device)
        x = batch[i].flip(-1) if u[0] < flip_p else batch[i]
        outs.append((x * (1 - brightness + 2 * brightness * u[1]).to(batch.dtype)).clamp(0, 1))
    return torch.stack(outs)


def no_clamp(batch, flip_p=0.5, brightness=0.4, generator=None):
    n = batch.shape[0]
    u = torch.rand(n, 2, generator=generator, device=batch.device)
    out = torch.where((u[:, 0] < flip_p).view(n, 1, 1, 1), batch.flip(3), batch)
    return out * (1 - brightness + 2 * brightness * u[:, 1]).to(batch.dtype).view(n, 1, 1, 1)


def random_on_cpu(batch, flip_p=0.5, brightness=0.4, generator=None):
    """Draws on the CPU with no device=: fine on CPU tensors, fails on a GPU batch."""
    n = batch.shape[0]
    g = generator if generator is not None and generator.device.type == "cpu" else None
    u = torch.rand(n, 2, generator=g)
    out = torch.where((u[:, 0] < flip_p).view(n, 1, 1, 1), batch.flip(3), batch)
    return (out * (1 - brightness + 2 * brightness * u[:, 1]).to(batch.dtype).view(n, 1, 1, 1)).clamp(0, 1)


def returns_cpu(batch, flip_p=0.5, brightness=0.4, generator=None):
    """Does the work on the CPU copy and returns it there."""
    return reference(batch.cpu(), flip_p, brightness,
                     generator if generator is None or generator.device.type == "cpu" else None)


def numpy_factors(batch, flip_p=0.5, brightness=0.4, generator=None):
    """NumPy draws: float64 factors promote the output to float64."""
    n = batch.shape[0]
    rng = np.random.default_rng(0 if generator is None else generator.initial_seed())
    flip = torch.from_numpy(rng.random(n) < flip_p).to(batch.device)
    factor = torch.from_numpy(rng.uniform(1 - brightness, 1 + brightness, n)).to(batch.device)
    out = torch.where(flip.view(-1, 1, 1, 1), batch.flip(3), batch)
    return (out * factor.view(-1, 1, 1, 1)).clamp(0, 1)


def float32_factors(batch, flip_p=0.5, brightness=0.4, generator=None):
    """Right for float32 batches; promotes a float16 batch to float32."""
    n = batch.shape[0]
    u = torch.rand(n, 2, generator=generator, device=batch.device)
    out = torch.where((u[:, 0] < flip_p).view(n, 1, 1, 1), batch.flip(3), batch)
    return (out * (1 - brightness + 2 * brightness * u[:, 1]).view(n, 1, 1, 1)).clamp(0, 1)


def flips_height(batch, flip_p=0.5, brightness=0.4, generator=None):
    n = batch.shape[0]
    u = torch.rand(n, 2, generator=generator, device=batch.device)
    out = torch.where((u[:, 0] < flip_p).view(n, 1, 1, 1), batch.flip(2), batch)
    return (out * (1 - brightness + 2 * brightness * u[:, 1]).to(batch.dtype).view(n, 1, 1, 1)).clamp(0, 1)


def flips_batch_dim(batch, flip_p=0.5, brightness=0.4, generator=None):
    n = batch.shape[0]
    u = torch.rand(n, 2, generator=generator, device=batch.device)
    out = torch.where((u[:, 0] < flip_p).view(n, 1, 1, 1), batch.flip(0), batch)
    return (out * (1 - brightness + 2 * brightness * u[:, 1]).to(batch.dtype).view(n, 1, 1, 1)).clamp(0, 1)


def ignores_generator(batch, flip_p=0.5, brightness=0.4, generator=None):
    return reference(batch, flip_p, brightness, None)


def reseeds_inside(batch, flip_p=0.5, brightness=0.4, generator=None):
    torch.manual_seed(0)
    return reference(batch, flip_p, brightness, None)


def additive(batch, flip_p=0.5, brightness=0.4, generator=None):
    n = batch.shape[0]
    u = torch.rand(n, 2, generator=generator, device=batch.device)
    out = torch.where((u[:, 0] < flip_p).view(n, 1, 1, 1), batch.flip(3), batch)
    return (out + (brightness * (2 * u[:, 1] - 1)).to(batch.dtype).view(n, 1, 1, 1) * 0.2).clamp(0, 1)


def per_channel(batch, flip_p=0.5, brightness=0.4, generator=None):
    n, c = batch.shape[:2]
    u = torch.rand(n, generator=generator, device=batch.device)
    f = 1 - brightness + 2 * brightness * torch.rand(n, c, generator=generator, device=batch.device)
    out = torch.where((u < flip_p).view(n, 1, 1, 1), batch.flip(3), batch)
    return (out * f.to(batch.dtype).view(n, c, 1, 1)).clamp(0, 1)


def in_place(batch, flip_p=0.5, brightness=0.4, generator=None):
    n = batch.shape[0]
    u = torch.rand(n, 2, generator=generator, device=batch.device)
    out = torch.where((u[:, 0] < flip_p).view(n, 1, 1, 1), batch.flip(3), batch)
    batch.mul_(1.0 + 0 * u[0, 0].to(batch.dtype)).clamp_(0, 0.9)
    return (out * (1 - brightness + 2 * brightness * u[:, 1]).to(batch.dtype).view(n, 1, 1, 1)).clamp(0, 1)


def ignores_flip_p(batch, flip_p=0.5, brightness=0.4, generator=None):
    return reference(batch, 0.5, brightness, generator)


def narrow_range(batch, flip_p=0.5, brightness=0.4, generator=None):
    """Factors only in [1, 1 + brightness]: never darker."""
    n = batch.shape[0]
    u = torch.rand(n, 2, generator=generator, device=batch.device)
    out = torch.where((u[:, 0] < flip_p).view(n, 1, 1, 1), batch.flip(3), batch)
    return (out * (1 + brightness * u[:, 1]).to(batch.dtype).view(n, 1, 1, 1)).clamp(0, 1)


def returns_nothing(batch, flip_p=0.5, brightness=0.4, generator=None):
    reference(batch, flip_p, brightness, generator)


def wrong_signature(batch):
    return batch


@pytest.mark.parametrize("answer, message", [
    (one_flip_per_batch, "one flip decision for the whole batch"),
    (one_brightness_per_batch, "same brightness factor"),
    (python_loop, "not batched"),
    (no_clamp, "above 1"),
    (random_on_cpu, "made on the CPU"),
    (returns_cpu, "copies the batch to the host"),
    (numpy_factors, "float64"),
    (float32_factors, "float16"),
    (flips_height, "upside down"),
    (flips_batch_dim, "another sample"),
    (ignores_generator, "seeded alike"),
    (reseeds_inside, "manual_seed"),
    (additive, "added, not multiplied"),
    (per_channel, "each colour channel"),
    (in_place, "in place"),
    (ignores_flip_p, "flip_p=0.0"),
    (narrow_range, "evenly"),
    (returns_nothing, "must return a tensor"),
    (wrong_signature, "does not take the arguments batch, flip_p"),
], ids=lambda v: getattr(v, "__name__", "msg"))
def test_wrong_answers_fail_with_a_teaching_message(answer, message):
    with pytest.raises(ExerciseFailed) as info:
        check(EXERCISE, answer)
    text = str(info.value)
    assert message in text, text
    assert info.value.exercise == EXERCISE and (info.value.hint or "signature" in info.value.seen), text


def test_python_loop_message_says_the_values_are_right():
    with pytest.raises(ExerciseFailed) as info:
        check(EXERCISE, python_loop)
    assert "values are right" in str(info.value) and "kernel launch" in str(info.value)


def test_the_stub_is_not_done_yet():
    def stub(batch, flip_p=0.5, brightness=0.4, generator=None):
        raise NotImplementedError("Exercise: replace this line with your code (see the instructions above).")

    with pytest.raises(ExerciseFailed, match="not done yet"):
        check(EXERCISE, stub)


def test_not_a_function():
    with pytest.raises(ExerciseFailed, match="not a function"):
        check(EXERCISE, 3)


# --- the course's own augmentation is refused ------------------------------------------------

@pytest.mark.parametrize("answer, name", [(augment_batch, "augment_batch"),
                                          (AugmentTransform(), "AugmentTransform")])
def test_the_course_augmentation_is_refused_with_a_teaching_message(answer, name):
    with pytest.raises(ExerciseFailed) as info:
        check(EXERCISE, answer)
    err = info.value
    assert f"course's own `{name}` (course_utils.augment)" in err.problem, str(err)
    assert "write this mechanism yourself" in err.hint, str(err)


def test_hints_do_not_print_the_solution_lines():
    for answer in (one_flip_per_batch, one_brightness_per_batch, python_loop, no_clamp):
        with pytest.raises(ExerciseFailed) as info:
            check(EXERCISE, answer)
        text = str(info.value)
        for line in ("torch.where(flip.view(-1, 1, 1, 1), batch.flip(3), batch)",
                     "(out * factor).clamp(0, 1)", "2 * brightness * torch.rand",
                     "torch.rand(n, generator=generator, device=batch.device) < flip_p"):
            assert line not in text, text
