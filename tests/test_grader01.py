"""Exercise 01 grader: the reference answer passes; plausible wrong answers fail with their message."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_utils.grading.checker import CheckResult, ExerciseFailed, check, exercise_ids
from course_utils.transforms import PipelineParams, Uint8Transform

pytestmark = pytest.mark.timeout(120)

PARAMS = PipelineParams()
OPTIONS = dict(n_images=4, num_workers=2, batch_size=2)


class Reference:
    """The solution notebook's answer."""

    def __init__(self, params=PARAMS):
        self.params = params
        self.mean = torch.tensor(params.mean).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(params.std).view(1, 3, 1, 1) * 255

    def resize(self, image):
        h, w = self.params.resized_hw(*image.shape[:2])
        return cv2.resize(image, (w, h), interpolation=cv2.INTER_LINEAR)

    def crop(self, image):
        top, left = self.params.crop_box(*image.shape[:2])
        c = self.params.crop
        return image[top:top + c, left:left + c]

    def flip(self, image, do_flip):
        return image[:, ::-1] if do_flip else image

    def to_tensor(self, image):
        return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).contiguous()

    def normalize(self, batch):
        return (batch.float() - self.mean) / self.std


class TorchAnswer(Reference):
    """A correct answer done with torch ops (uint8 bilinear interpolate, torch.flip)."""

    def resize(self, image):
        h, w = self.params.resized_hw(*image.shape[:2])
        x = torch.from_numpy(image).permute(2, 0, 1)[None]
        y = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False, antialias=False)
        return y[0].permute(1, 2, 0).numpy()

    def flip(self, image, do_flip):
        return cv2.flip(image, 1) if do_flip else image


class Float32Original(Reference):
    """The exercise's starting point: float32 from the first stage, normalised per sample."""

    def resize(self, image):
        image = image.astype(np.float32) / 255
        h, w = self.params.resized_hw(*image.shape[:2])
        return cv2.resize(image, (w, h), interpolation=cv2.INTER_LINEAR)

    def to_tensor(self, image):
        mean = np.array(self.params.mean, np.float32)
        std = np.array(self.params.std, np.float32)
        return torch.from_numpy(np.ascontiguousarray(((image - mean) / std).transpose(2, 0, 1)))

    def normalize(self, batch):
        return batch


class WrapsAround(Reference):
    """Keeps uint8 too long: subtracts the mean in uint8, which wraps around."""

    def normalize(self, batch):
        mean = self.mean.round().to(torch.uint8)
        return (batch - mean).float() / self.std


class NormalisesInWorker(Reference):
    """uint8 stages, but to_tensor (in the worker) already normalises per sample."""

    def to_tensor(self, image):
        x = super().to_tensor(image)
        return (x.float()[None] - self.mean)[0] / self.std[0]

    def normalize(self, batch):
        return batch


class FlipsVertically(Reference):
    def flip(self, image, do_flip):
        return image[::-1] if do_flip else image


class IgnoresFlip(Reference):
    def flip(self, image, do_flip):
        return image


class Truncates(Reference):
    """Resizes in float and converts back with astype(np.uint8): truncation, a -0.5 level bias."""

    def resize(self, image):
        h, w = self.params.resized_hw(*image.shape[:2])
        out = cv2.resize(image.astype(np.float32), (w, h), interpolation=cv2.INTER_LINEAR)
        return out.astype(np.uint8)


class SwapsDsize(Reference):
    def resize(self, image):
        h, w = self.params.resized_hw(*image.shape[:2])
        return cv2.resize(image, (h, w), interpolation=cv2.INTER_LINEAR)


class TopLeftCrop(Reference):
    def crop(self, image):
        c = self.params.crop
        return image[:c, :c]


class ChannelsLast(Reference):
    def to_tensor(self, image):
        return torch.from_numpy(np.ascontiguousarray(image))


class NegativeStrides(Reference):
    def to_tensor(self, image):
        return torch.from_numpy(image).permute(2, 0, 1)


class Float64(Reference):
    def normalize(self, batch):
        return (batch.double() - self.mean.double()) / self.std.double()


class SwapsChannels(Reference):
    def normalize(self, batch):
        return super().normalize(batch.flip(1))


class ForgetsStd(Reference):
    def normalize(self, batch):
        return batch.float() / 255 - self.mean / 255


class NotDone(Reference):
    def normalize(self, batch):
        raise NotImplementedError("Exercise: replace this line with your code")


class MissingNormalize:
    def __init__(self):
        self.ref = Reference()
        self.resize, self.crop, self.flip, self.to_tensor = (
            self.ref.resize, self.ref.crop, self.ref.flip, self.ref.to_tensor)


def test_registered():
    assert "01.uint8_pipeline" in exercise_ids()


@pytest.mark.parametrize("answer", [Reference(), TorchAnswer(), Reference], ids=["cv2", "torch", "class"])
def test_right_answers_pass_and_report_bytes(answer):
    result = check("01.uint8_pipeline", answer, **OPTIONS)
    assert isinstance(result, CheckResult)
    assert "PASSED 01.uint8_pipeline" in str(result)
    d = result.details
    assert d["bytes_per_batch"] == OPTIONS["batch_size"] * 3 * 224 * 224
    assert d["float32_bytes_per_batch"] == 4 * d["bytes_per_batch"]
    assert d["workers"] == 2
    assert d["max_abs_levels"] <= 1.001 and abs(d["mean_levels"]) <= 0.25
    assert "4x fewer bytes" in result.summary


@pytest.mark.parametrize("answer, message", [
    (Float32Original(), r"`resize` returned float32: every stage before normalize must stay uint8"
                        r".*hint:.*4x the bytes"),
    (WrapsAround(), r"wrong values.*wrapped around"),
    (NormalisesInWorker(), r"`to_tensor` returned torch.float32.*normalising per sample in the worker"),
    (FlipsVertically(), r"upside down.*axis 1"),
    (IgnoresFlip(), r"did not flip"),
    (Truncates(), r"`resize` returned the right shape but the wrong pixel values.*truncates"),
    (SwapsDsize(), r"wrong shape.*dsize=\(width, height\)"),
    (TopLeftCrop(), r"centre square.*top-left corner"),
    (ChannelsLast(), r"kept the channels last"),
    (NegativeStrides(), r"`to_tensor` raised ValueError.*negative strides"),
    (Float64(), r"returned float64"),
    (SwapsChannels(), r"wrong values.*BGR"),
    (ForgetsStd(), r"wrong values.*per-channel means"),
    (NotDone(), r"not done yet"),
    (MissingNormalize(), r"no normalize method"),
])
def test_wrong_answers_fail_with_their_message(answer, message):
    with pytest.raises(ExerciseFailed, match=f"(?s){message}"):
        check("01.uint8_pipeline", answer, **OPTIONS)


def test_failure_message_teaches():
    with pytest.raises(ExerciseFailed) as info:
        check("01.uint8_pipeline", Float32Original(), **OPTIONS)
    text = str(info.value)
    assert "expected:" in text and "seen:" in text and "hint:" in text
    assert "float32" in text and "uint8" in text


# ---- the course's own pipeline is refused ------------------------------------------------------


@pytest.mark.parametrize("answer", [Uint8Transform, Uint8Transform()])
def test_the_course_pipeline_is_refused_with_a_teaching_message(answer):
    with pytest.raises(ExerciseFailed) as info:
        check("01.uint8_pipeline", answer, **OPTIONS)
    err = info.value
    assert "course's own `Uint8Transform` (course_utils.transforms)" in err.problem, str(err)
    assert "write this mechanism yourself" in err.hint, str(err)


def test_no_hint_is_the_solution_line():
    """The to_tensor hint teaches what to do without printing the reference's line."""
    class ReturnsArray(Reference):
        def to_tensor(self, image):
            return np.ascontiguousarray(image)

    with pytest.raises(ExerciseFailed, match="must return a torch tensor") as info:
        check("01.uint8_pipeline", ReturnsArray(), **OPTIONS)
    assert "from_numpy(np.ascontiguousarray" not in info.value.hint
    assert "permute(2, 0, 1)" not in str(info.value)
