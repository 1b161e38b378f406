"""The in-memory common recipe and tuned pipeline, and `bench`'s argument errors."""
from __future__ import annotations

import os

import pytest
import torch

from course_utils.__main__ import main
from course_utils.data import JpegDataset
from course_utils.data import ToTensorUint8
from course_utils.pipelines import (BatchedJpegDataset,
                                    TransformedDataset,
                                    common_recipe_loader, recipe_process_settings,
                                    tuned_loader)


@pytest.fixture(scope="module")
def base():
    return JpegDataset(n=24, progress=False)


def test_recipe_is_float32_and_tuned_is_uint8_with_equal_content(base):
    recipe_images, _ = next(iter(common_recipe_loader(base, batch_size=4)))
    assert recipe_images.dtype == torch.float32 and recipe_images.shape == (4, 3, 224, 224)
    tuned = tuned_loader(base, batch_size=4, num_workers=0)
    images, labels = next(iter(torch.utils.data.DataLoader(
        tuned.dataset, batch_size=4, shuffle=False, collate_fn=tuned.collate_fn)))
    reference, _ = next(iter(torch.utils.data.DataLoader(
        common_recipe_loader(base).dataset, batch_size=4, shuffle=False)))
    assert images.dtype == torch.uint8
    assert torch.allclose(images.float() / 255, reference, atol=1e-6)


def test_batched_fetch_equals_per_sample_uint8(base):
    batched = BatchedJpegDataset(base, size=64)
    images, labels = batched.__getitems__([2, 0, 5])
    expected = torch.stack([ToTensorUint8(64)(base[i][0]) for i in (2, 0, 5)])
    assert images.dtype == torch.uint8 and torch.equal(images, expected)
    assert labels.tolist() == [base[i][1] for i in (2, 0, 5)]
    single, label = batched[5]
    assert torch.equal(single, expected[2]) and label == base[5][1]
    with pytest.raises(TypeError, match="base must be a JpegDataset"):
        BatchedJpegDataset([1, 2, 3])
    with pytest.raises(ValueError, match="size=0 is too small: size must be >= 1"):
        BatchedJpegDataset(base, size=0)


def test_tuned_loader_settings(base):
    loader = tuned_loader(base, batch_size=8, num_workers=2)
    assert loader.num_workers == 2 and loader.worker_init_fn is not None
    assert loader.pin_memory == torch.cuda.is_available()
    assert tuned_loader(base, num_workers=0).worker_init_fn is None


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size must be >= 1"),
    ({"num_workers": -1}, "num_workers must be >= 0"),
])
def test_bad_arguments(base, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tuned_loader(base, **kwargs)


def test_transformed_dataset_needs_a_callable(base):
    with pytest.raises(TypeError, match="transform must be callable"):
        TransformedDataset(base, "resize")


def test_recipe_settings_are_undone():
    before = (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))
    with recipe_process_settings():
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    assert (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")) == before


def test_bench_help_and_bad_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "--repeats", "0"])
    assert info.value.code == 2
    assert "must be 1 or more" in capsys.readouterr().err
