"""Augmentation and the reference pipeline: bad input names the function and the argument; the
settings are normalised as documented; a crop box is never empty, on both axes (a 4x1 and a 1x4
image whose drawn crop rounds one side to 0 pixels)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from course_utils.augment import AugmentParams, augment_batch, draw_batch, draw_sample
from course_utils.image_ops import numpy_to_chw
from course_utils.transforms import PipelineParams, ToFloat32, pipeline_stages


@pytest.mark.parametrize("height, width, ratio", [(4, 1, 0.2), (1, 4, 5.0)], ids=["4x1", "1x4"])
def test_a_crop_that_rounds_a_side_to_zero_pixels_is_never_taken(height, width, ratio):
    # area 4 x scale 0.08 = 0.32 px: at ratio 0.2 the width rounds to 0 (the height to 1), at 5 the
    # height does; every attempt fails the same way, so the box is the fallback, never empty
    params = AugmentParams(size=8, scale=(0.08, 0.08), ratio=(ratio, ratio))
    for seed in range(5):
        d = draw_sample(height, width, params, np.random.default_rng(seed))
        assert d.width >= 1 and d.height >= 1, d


def test_brightness_and_contrast_are_kept_as_floats():
    p = AugmentParams(brightness=1, contrast=0)
    assert (p.brightness, p.contrast) == (1.0, 0.0)
    assert type(p.brightness) is float and type(p.contrast) is float


@pytest.mark.parametrize("kwargs, words", [
    (dict(n=0, height=8, width=8), r"draw_batch: n\b"), (dict(n=2, height=0, width=8), "draw_batch: height"),
    (dict(n=2, height=8, width=0), "draw_batch: width"),
    (dict(n=2, height=8, width=8, generator="seed 3"), "got str")])
def test_draw_batch_names_what_it_refuses(kwargs, words):
    with pytest.raises((ValueError, TypeError), match=words):
        draw_batch(**kwargs)


def test_augment_batch_names_the_type_it_was_given():
    with pytest.raises(TypeError, match="got list"):
        augment_batch([[0]])


def test_the_pipeline_settings_say_what_a_size_is_and_allow_a_negative_mean():
    with pytest.raises(ValueError, match="It is a size in pixels"):
        PipelineParams(resize=0)
    assert PipelineParams(mean=(-0.5, 0.0, 0.25)).mean == (-0.5, 0.0, 0.25)


def test_bad_input_names_the_function():
    with pytest.raises(ValueError, match=r"\bpipeline_stages\b"):
        pipeline_stages("matlab")
    with pytest.raises((ValueError, TypeError), match=r"\bnumpy_to_chw\b"):
        numpy_to_chw(np.zeros((4, 4), np.uint8))


def test_to_float32_shows_as_its_constructor():
    assert repr(ToFloat32()) == "ToFloat32()"
    assert ToFloat32()(torch.tensor([3], dtype=torch.uint8)).dtype == torch.float32
