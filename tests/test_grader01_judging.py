"""Grader 01 (course_utils/grading/ex01_uint8_pipeline.py): its judging functions called directly
on made-up images and tensors, each threshold pinned just inside and just outside: the resize
tolerances (1 level + 1e-3, mean 0.25) and the truncation / wrap-around hints (1.5 levels and a
bias below -0.3; 100 levels), the normalised output's 256-level wrap share (above 1e-3) and its
1.5-level reversed-channels / mirrored tests, and which failure each stage's wrong output gets."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import course_utils.grading.ex01_uint8_pipeline as G
from course_utils.grading.checker import ExerciseFailed
from _helpers import teaches
from course_utils.transforms import PipelineParams

pytestmark = pytest.mark.timeout(60)

# ---- resize: the values judged against a made-up float reference --------------------------------
# The reference is 100.0 everywhere on a (10, 10, 3) image: 300 values, so k values off by one
# level give a mean error of k / 300 (75 -> 0.25, 78 -> 0.26, 90 -> 0.30, 93 -> 0.31, 120 -> 0.40).
SHAPE = (10, 10, 3)


@pytest.fixture
def reference(monkeypatch):
    """The float reference the grader compares the resize with, set by the test."""
    ref = {"value": np.full(SHAPE, 100.0)}
    monkeypatch.setattr(G, "numpy_resize", lambda image, hw: ref["value"])
    return ref


def uint8_with(offsets: dict[int, int], base: int = 100) -> np.ndarray:
    """A (10, 10, 3) uint8 image of ``base`` with the flat positions ``offsets`` moved by their value."""
    out = np.full(SHAPE, base, dtype=np.int64).reshape(-1)
    for i, d in offsets.items():
        out[i] += d
    return out.reshape(SHAPE).astype(np.uint8)


def first(k: int, d: int) -> dict[int, int]:
    return dict.fromkeys(range(k), d)


def resize_failure(out: np.ndarray) -> ExerciseFailed:
    with pytest.raises(ExerciseFailed) as info:
        G._check_resize_values(out, np.zeros(SHAPE, np.uint8))
    assert info.value.problem == "`resize` returned the right shape but the wrong pixel values."
    return teaches(info.value)                      # seen: the error in grey levels


@pytest.mark.parametrize("offsets", [{}, first(75, +1), first(75, -1)],
                         ids=["exact", "bias+0.25", "bias-0.25"])
def test_resize_within_one_level_and_a_quarter_level_of_bias_passes(reference, offsets):
    G._check_resize_values(uint8_with(offsets), np.zeros(SHAPE, np.uint8))   # no exception


@pytest.mark.parametrize("sign", [+1, -1], ids=["high", "low"])
def test_resize_with_a_bias_just_over_a_quarter_level_fails(reference, sign):
    err = resize_failure(uint8_with(first(78, sign)))           # 78 / 300 = 0.26 levels
    assert err.seen == f"max |error| 1.00 grey levels, mean error {sign * 0.26:+.2f} levels"


def test_resize_allows_a_float_hair_over_one_level_but_not_more(reference):
    ref = np.full(SHAPE, 100.0)
    ref.reshape(-1)[0] = 98.9995              # out 100 - 98.9995 = 1.0005 <= 1 + 1e-3: passes
    reference["value"] = ref
    G._check_resize_values(uint8_with({}), np.zeros(SHAPE, np.uint8))
    ref = np.full(SHAPE, 100.0)
    ref.reshape(-1)[0] = 98.998               # 1.002 > 1.001: fails, though the mean is tiny
    reference["value"] = ref
    err = resize_failure(uint8_with({}))
    assert err.seen.startswith("max |error| 1.00 grey levels, mean error +0.00")


def test_resize_one_value_two_levels_off_fails_on_the_maximum(reference):
    err = resize_failure(uint8_with({7: 2}))                    # bias 2 / 300, but max 2 > 1
    assert err.seen == "max |error| 2.00 grey levels, mean error +0.01 levels"
    assert "bilinear interpolation" in err.hint


@pytest.mark.parametrize("k, truncates", [(90, False), (93, True), (120, True)],
                         ids=["bias-0.30", "bias-0.31", "bias-0.40"])
def test_truncation_hint_needs_a_bias_below_minus_0_3(reference, k, truncates):
    err = resize_failure(uint8_with(first(k, -1)))
    assert ("truncates" in err.hint) is truncates, err.hint
    if not truncates:
        assert "bilinear interpolation" in err.hint


def test_truncation_hint_allows_errors_up_to_1_5_levels_not_1_75(reference):
    # 119 values one level low and one 1.5 (or 1.75) levels low: bias about -0.40
    ref = np.full(SHAPE, 100.0)
    ref.reshape(-1)[119] = 100.5
    reference["value"] = ref
    out = uint8_with(first(120, -1))
    assert "truncates" in resize_failure(out).hint               # max 1.5: still truncation
    ref.reshape(-1)[119] = 100.75
    assert "bilinear interpolation" in resize_failure(out).hint  # max 1.75: not truncation


@pytest.mark.parametrize("d, wraps", [(100, False), (101, True), (-101, True)],
                         ids=["100-levels", "101-levels", "101-below"])
def test_wrap_around_hint_needs_more_than_100_levels_off(reference, d, wraps):
    err = resize_failure(uint8_with({3: d}))
    assert ("wrapped around" in err.hint) is wraps, err.hint


def test_an_empty_resize_has_no_error(monkeypatch):
    monkeypatch.setattr(G, "numpy_resize", lambda image, hw: np.zeros((0, 0, 3)))
    G._check_resize_values(np.zeros((0, 0, 3), np.uint8), np.zeros(SHAPE, np.uint8))


# ---- normalize: made-up outputs against a made-up reference ---------------------------------------
# mean 0.5 and std 0.5 on every channel: value v is 127.5 * v + 127.5 grey levels, so one level
# is 1 / 127.5 of a value. The reference: channel means 0.5, 0.0, -0.5 plus a ramp across the
# width (-0.2 .. 0.2, mean 0), so neither reversing the channels nor mirroring gives it back.
HALF = PipelineParams(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
N, H, W = 2, 5, 100                    # 2 * 3 * 5 * 100 = 3000 values
LEVEL = 1 / 127.5


def reference_batch() -> torch.Tensor:
    ramp = torch.linspace(-0.2, 0.2, W, dtype=torch.float64)
    base = torch.tensor([0.5, 0.0, -0.5], dtype=torch.float64).view(1, 3, 1, 1)
    return (base + ramp.view(1, 1, 1, W)).expand(N, 3, H, W).contiguous()


def normalize_failure(out, ref=None) -> ExerciseFailed:
    ref = reference_batch().float() if ref is None else ref
    with pytest.raises(ExerciseFailed) as info:
        G._check_normalized(out, ref, HALF)
    return teaches(info.value)


def test_normalize_within_tolerance_returns_the_difference():
    ref = reference_batch()
    out = ref.clone()
    out[0, 0, 0, 0] += LEVEL                               # one value one level high
    diff = G._check_normalized(out.float(), ref.float(), HALF)
    assert diff.max_abs_levels == pytest.approx(1.0, abs=1e-4)
    assert diff.mean_levels == pytest.approx(1 / 3000, abs=1e-5)


def wrapped(k: int, levels: float) -> torch.Tensor:
    out = reference_batch().clone().view(-1)
    out[:k] += levels * LEVEL
    return out.view(N, 3, H, W).float()


@pytest.mark.parametrize("k, levels, wraps", [
    (3, 256, False),     # 3 / 3000 = 0.001: not more than 1e-3
    (4, 256, True),      # 4 / 3000 > 0.001
    (4, 257.8, True),    # |257.8 - 256| < 2: still "about 256"
    (4, 258.2, False),   # 2.2 levels from 256: not a wrap
    (4, -257.8, True),   # wrapped the other way
], ids=["3-values", "4-values", "257.8-levels", "258.2-levels", "below"])
def test_wrap_hint_needs_more_than_a_thousandth_of_values_about_256_levels_off(k, levels, wraps):
    err = normalize_failure(wrapped(k, levels))
    assert err.problem == "normalize(batch) gave the wrong values."
    assert ("wrapped around" in err.hint) is wraps, err.hint


@pytest.mark.parametrize("shift, reversed_", [(0.0, True), (1.4, True), (1.6, False)],
                         ids=["exact", "1.4-levels", "1.6-levels"])
def test_reversed_channels_are_recognised_within_1_5_levels(shift, reversed_):
    out = (reference_batch().flip(1) + shift * LEVEL).float()
    err = normalize_failure(out)
    assert ("reverse order (BGR)" in err.hint) is reversed_, err.hint
    if not reversed_:
        assert "per-channel means" in err.hint


@pytest.mark.parametrize("shift, mirrored", [(0.0, True), (-1.4, True), (-1.6, False)],
                         ids=["exact", "1.4-levels", "1.6-levels"])
def test_mirrored_images_are_recognised_within_1_5_levels(shift, mirrored):
    out = (reference_batch().flip(3) + shift * LEVEL).float()
    err = normalize_failure(out)
    assert ("every image is mirrored" in err.hint) is mirrored, err.hint


def test_other_wrong_values_show_each_channels_mean_against_the_reference():
    out = reference_batch().clone()
    out[:, 0] += 0.2                           # channel 0: 0.5 -> 0.7 (25.5 levels high)
    out[:, 2] -= 0.1                           # channel 2: -0.5 -> -0.6
    err = normalize_failure(out.float())
    assert "per-channel means are [0.7, 0.0, -0.6], expected [0.5, 0.0, -0.5]" in err.hint, err.hint
    assert "mean=(0.5, 0.5, 0.5) and std=(0.5, 0.5, 0.5)" in err.hint
    # worst 0.2 * 127.5 = 25.5 levels; mean (0.2 - 0.1) / 3 * 127.5 = +4.25 levels
    assert err.seen == "25.5 grey levels off at worst, mean error +4.25 levels"


def test_the_failure_names_where_the_output_came_from():
    ref = reference_batch().float()
    with pytest.raises(ExerciseFailed) as info:
        G._check_normalized(ref + 0.5, ref, HALF, where="the pipeline run in DataLoader workers")
    assert info.value.problem == "the pipeline run in DataLoader workers gave the wrong values."


@pytest.mark.parametrize("dtype, hint", [(torch.float64, "float64 doubles the bytes"),
                                         (torch.float16, "to float32 first"),
                                         (torch.uint8, "to float32 first")])
def test_a_normalize_output_of_another_dtype_fails_with_its_hint(dtype, hint):
    err = normalize_failure(reference_batch().to(dtype))
    assert err.problem == f"`normalize` returned {str(dtype)[6:]}."
    assert hint in err.hint


def test_a_normalize_output_that_is_not_a_tensor_or_has_the_wrong_shape_fails():
    assert "must return a torch tensor" in normalize_failure(reference_batch().numpy()).problem
    err = normalize_failure(reference_batch().float()[:, :, :, :50])
    assert err.problem == "`normalize` returned the wrong shape." and "(N, 3, H, W)" in err.hint


# ---- the per-sample stages --------------------------------------------------------------------

IMAGE = (np.arange(6 * 5 * 3) * 7 % 251).astype(np.uint8).reshape(6, 5, 3)   # no symmetry


def stage_failure(stage, out, shape) -> ExerciseFailed:
    with pytest.raises(ExerciseFailed) as info:
        G._check_image_stage(stage, out, shape)
    assert info.value.expected == f"NumPy uint8 array of shape {shape}", info.value.expected
    return teaches(info.value, out)


def test_an_image_stage_returns_its_uint8_array_of_the_right_shape():
    assert G._check_image_stage("crop", IMAGE, (6, 5, 3)) is IMAGE


def test_an_image_stage_failure_says_which_kind_of_wrong():
    assert "returned a torch tensor" in stage_failure("crop", torch.from_numpy(IMAGE), (6, 5, 3)).problem
    err = stage_failure("crop", [1, 2], (6, 5, 3))
    assert err.problem == "`crop` must return a NumPy array." and "forget a `return`" in err.hint
    err = stage_failure("crop", IMAGE.astype(np.float32), (6, 5, 3))
    assert err.problem == "`crop` returned float32: every stage before normalize must stay uint8."


def test_swapped_height_and_width_are_named_only_for_resize():
    swapped = IMAGE.transpose(1, 0, 2)                                  # (5, 6, 3) for (6, 5, 3)
    assert "dsize=(width, height)" in stage_failure("resize", swapped, (6, 5, 3)).hint
    assert stage_failure("crop", swapped, (6, 5, 3)).hint == "`crop` should give (6, 5, 3)."
    # another wrong shape at resize is not called a swap
    assert stage_failure("resize", IMAGE[:4], (6, 5, 3)).hint == "`resize` should give (6, 5, 3)."


@pytest.mark.parametrize("stage, out, hint", [
    ("to_tensor", torch.zeros(3, 2, 2), "normalising per sample in the worker"),
    ("resize", np.zeros((2, 2, 3), np.float32), "cv2.resize rounds for you"),
    ("to_tensor", torch.zeros(3, 2, 2, dtype=torch.int16), "return uint8 pixels (0..255) from `to_tensor`"),
    ("crop", np.zeros((2, 2, 3), np.int16), "return uint8 pixels (0..255) from `crop`"),
], ids=["float-tensor-at-to_tensor", "float-array-at-resize", "int16-tensor", "int16-array"])
def test_not_uint8_hint_follows_the_stage_and_whether_it_is_float(stage, out, hint):
    assert hint in G._not_uint8(stage, out, "x").hint


@pytest.mark.parametrize("stage, message, hint", [
    ("to_tensor", "At least one stride in the given numpy array is negative, and tensors with "
                  "negative strides are not currently supported.", "negative strides"),
    ("normalize", "The size of tensor a (3) must match", "(1, 3, 1, 1)"),
    ("resize", "The size of tensor a (3) must match", "read the traceback"),
], ids=["negative-stride", "size-at-normalize", "size-elsewhere"])
def test_stage_error_hints(stage, message, hint):
    assert hint in G._hint_for(stage, ValueError(message))


def test_crop_must_be_the_centre_square():
    resized = (np.arange(8 * 10 * 3) % 251).astype(np.uint8).reshape(8, 10, 3)
    # centre 4x4 of 8x10: top (8 - 4) // 2 = 2, left (10 - 4) // 2 = 3
    G._check_crop(resized[2:6, 3:7], resized, 4)
    with pytest.raises(ExerciseFailed, match="top-left corner"):
        G._check_crop(resized[:4, :4], resized, 4)
    with pytest.raises(ExerciseFailed) as info:
        G._check_crop(resized[2:6, 2:6], resized, 4)          # one column off
    assert "top-left" not in info.value.hint and "starting at" in info.value.hint
    assert teaches(info.value, resized[2:6, 2:6]).expected == "the centre 4x4 pixels"


class Flipper:
    def __init__(self, when_true, when_false=lambda im: im):
        self.when_true, self.when_false = when_true, when_false

    def flip(self, image, do_flip):
        return self.when_true(image) if do_flip else self.when_false(image)


@pytest.mark.parametrize("flip", [False, True])
def test_flip_returns_the_output_for_the_requested_flip(flip):
    got = G._check_flip(Flipper(lambda im: im[:, ::-1]), IMAGE, IMAGE.shape, flip)
    assert np.array_equal(got, IMAGE[:, ::-1] if flip else IMAGE)


@pytest.mark.parametrize("answer, problem", [
    (Flipper(lambda im: im[::-1]), "upside down"),
    (Flipper(lambda im: im[:, :, ::-1]), "reversed the colour channels"),
    (Flipper(lambda im: im), "`flip(image, True)` did not flip."),
    (Flipper(lambda im: im[:, ::-1], when_false=lambda im: im[:, ::-1]), "`flip(image, False)` flipped anyway."),
    (Flipper(lambda im: im[:, ::-1] // 2), "`flip(image, True)` changed the pixels in an unexpected way."),
    (Flipper(lambda im: im[:, ::-1], when_false=lambda im: im // 2),
     "`flip(image, False)` changed the pixels in an unexpected way."),
], ids=["vertical", "channels", "no-flip", "always", "odd-true", "odd-false"])
def test_wrong_flips_are_named(answer, problem):
    with pytest.raises(ExerciseFailed) as info:
        G._check_flip(answer, IMAGE.copy(), IMAGE.shape, True)
    assert problem in info.value.problem, str(info.value)
    asked = "False" not in problem                           # the flip the failure is about
    teaches(info.value, answer.flip(IMAGE.copy(), asked))
    assert info.value.expected == ("the same image mirrored left-right" if asked else "the image unchanged")


def test_a_flip_that_writes_into_its_input_fails():
    def in_place(image):
        image[:] = image[:, ::-1].copy()
        return image

    with pytest.raises(ExerciseFailed, match="changed its input image in place"):
        G._check_flip(Flipper(in_place), IMAGE.copy(), IMAGE.shape, True)


def test_to_tensor_is_the_same_pixels_channels_first():
    flipped = IMAGE[:4, :4]
    good = torch.from_numpy(np.ascontiguousarray(flipped)).permute(2, 0, 1)
    assert G._check_to_tensor(good, flipped, 4) is good
    cases = [(np.ascontiguousarray(flipped), "must return a torch tensor"),
             (torch.from_numpy(np.ascontiguousarray(flipped)), "kept the channels last"),
             (good[:, :3], "wrong shape"),
             (good.flip(0), "changed the pixel values"),
             (good.float(), "returned torch.float32")]
    for out, problem in cases:
        with pytest.raises(ExerciseFailed) as info:
            G._check_to_tensor(out, flipped, 4)
        assert problem in info.value.problem, (problem, str(info.value))
        teaches(info.value, out)


# ---- the run "in workers", with a DataLoader that runs in this process -----------------------------

class InProcessLoader:
    """Stands in for DataLoader: records how it was made, collates batches here."""
    made: list[dict] = []

    def __init__(self, dataset, batch_size, num_workers, **kwargs):
        self.dataset, self.batch_size = dataset, batch_size
        InProcessLoader.made.append({"num_workers": num_workers, **kwargs})

    def __iter__(self):
        n = len(self.dataset)
        for start in range(0, n, self.batch_size):
            items = [self.dataset[i] for i in range(start, min(n, start + self.batch_size))]
            yield torch.stack([x for x, _ in items]), torch.tensor([i for _, i in items])


class Failing(InProcessLoader):
    error: Exception = RuntimeError("DataLoader timed out after 7 seconds")

    def __iter__(self):
        raise Failing.error


SMALL = PipelineParams(resize=16, crop=8)


class SmallPipeline:
    """A right answer for SMALL (resize with the grader's own bilinear reference, rounded)."""
    params = SMALL

    def resize(self, image):
        h, w = SMALL.resized_hw(*image.shape[:2])
        from course_utils.transforms import numpy_resize
        return numpy_resize(image, (h, w))

    def crop(self, image):
        top, left = SMALL.crop_box(*image.shape[:2])
        return image[top:top + 8, left:left + 8]

    def flip(self, image, do_flip):
        return image[:, ::-1] if do_flip else image

    def to_tensor(self, image):
        return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).contiguous()

    def normalize(self, batch):
        mean = torch.tensor(SMALL.mean).view(1, 3, 1, 1) * 255
        std = torch.tensor(SMALL.std).view(1, 3, 1, 1) * 255
        return (batch.float() - mean) / std


def small_images(n=5):
    rng = np.random.default_rng(3)
    return [(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8), 0) for _ in range(n)]


@pytest.fixture
def in_process(monkeypatch):
    InProcessLoader.made = []
    monkeypatch.setattr(G, "DataLoader", InProcessLoader)
    return InProcessLoader.made


def run_small(pipeline, num_workers=2, timeout_s=7.0):
    images = small_images()
    refs = [G.exact_pipeline(image, i % 2 == 1, SMALL) for i, (image, _) in enumerate(images)]
    return G._run_in_workers(pipeline, images, refs, SMALL, num_workers, 2, timeout_s)


def test_a_module_answer_runs_in_workers_of_the_default_start_method(in_process):
    run = run_small(SmallPipeline())
    # 5 images in batches of 2: 2, 2, 1 images of 3 x 8 x 8 uint8 = 192 bytes each
    assert run == {"workers": 2, "start_method": G.start_method(), "batch_bytes": [384, 384, 192]}
    made = in_process[0]
    assert made["num_workers"] == 2 and made["multiprocessing_context"] is None
    assert made["timeout"] == 7.0 and isinstance(made["timeout"], float)
    assert callable(made["worker_init_fn"])


def test_a_notebook_answer_runs_in_forked_workers(in_process):
    notebook = type("Uint8Pipeline", (SmallPipeline,), {"__module__": "__main__"})
    run = run_small(notebook())
    assert run["workers"] == 2
    assert run["start_method"] == "fork, because spawn cannot import a class defined in a notebook"
    assert in_process[0]["multiprocessing_context"] == "fork"


def test_a_notebook_answer_without_fork_runs_in_the_main_process(in_process, monkeypatch):
    monkeypatch.setattr(G.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    notebook = type("Uint8Pipeline", (SmallPipeline,), {"__module__": "__main__"})
    run = run_small(notebook())
    assert run["workers"] == 0 and run["start_method"].startswith("main process, because")
    assert in_process[0] == {"num_workers": 0}                # no worker options without workers


def test_wrong_values_from_the_workers_are_named_as_such(in_process):
    class DriftsInWorkers(SmallPipeline):
        def to_tensor(self, image):
            return super().to_tensor(image) // 2            # only the run through the loader
    with pytest.raises(ExerciseFailed) as info:
        run_small(DriftsInWorkers())
    assert info.value.problem == "the pipeline run in DataLoader workers gave the wrong values."


@pytest.mark.parametrize("error, hint", [
    (RuntimeError("DataLoader timed out after 7 seconds"), "a worker gave no batch within 7 s"),
    (ValueError("At least one stride in the given numpy array is negative, and tensors with "
                "negative strides are not currently supported."), "negative strides"),
    (KeyError("x"), "read the traceback"),
], ids=["timeout", "negative-stride", "other"])
def test_a_loader_that_fails_is_reported_with_a_hint_for_its_error(monkeypatch, error, hint):
    monkeypatch.setattr(G, "DataLoader", Failing)
    Failing.error = error
    with pytest.raises(ExerciseFailed) as info:
        run_small(SmallPipeline())
    assert info.value.problem.startswith("running the stages in DataLoader workers failed: "
                                         f"{type(error).__name__}: ")
    assert hint in info.value.hint


def test_a_not_done_stage_in_the_workers_is_not_done_not_a_failure(monkeypatch):
    monkeypatch.setattr(G, "DataLoader", Failing)
    Failing.error = NotImplementedError("Exercise: replace this line")
    with pytest.raises(NotImplementedError):
        run_small(SmallPipeline())


def test_a_stage_that_raises_or_returns_floats_is_named_with_its_hint():
    def raising(image):
        raise ValueError("size mismatch in my flip")
    with pytest.raises(ExerciseFailed) as info:
        G._check_flip(Flipper(raising, raising), IMAGE.copy(), IMAGE.shape, True)
    err = info.value
    assert err.exercise == "01.uint8_pipeline" and "`flip` raised ValueError" in err.problem, str(err)
    assert err.hint == "run the stage on one image in a cell of its own and read the traceback."
    with pytest.raises(ExerciseFailed) as info:
        G._check_flip(Flipper(lambda im: im[:, ::-1].astype(np.float32), lambda im: im.astype(np.float32)),
                      IMAGE.copy(), IMAGE.shape, True)
    assert info.value.problem.startswith("`flip` returned float32"), str(info.value)
    # "size" in the error is the normalize stage's broadcasting hint, and only that stage's
    assert "(1, 3, 1, 1)" in G._hint_for("normalize", ValueError("size mismatch"))
    assert "(1, 3, 1, 1)" not in G._hint_for("flip", ValueError("size mismatch"))


@pytest.mark.parametrize("stage, message, hint", [
    ("normalize", "The size of tensor a (3) must match", "(1, 3, 1, 1)"),
    ("to_tensor", "tensors with negative strides are not currently supported", "negative strides")])
def test_a_stage_called_through_the_grader_gets_the_hint_for_its_stage_and_error(stage, message, hint):
    def raising(*args):
        raise ValueError(message)
    with pytest.raises(ExerciseFailed) as info:
        G._call(stage, raising, IMAGE)
    assert hint in info.value.hint and f"`{stage}` raised ValueError" in info.value.problem
