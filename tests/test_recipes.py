"""The recipes learners run, as written, and the course's loaders on the same files."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from course_utils.data import JpegDataset, ToTensorUint8, sample_photo
from course_utils.image_ops import IMAGENET_MEAN
from course_utils.tools.bench.recipes import (BatchedJpegFiles, DecodeOnlyFiles,
                                              files_loader, imagenet_recipe_loader,
                                              seed_recipe_loader, tuned_files_loader)
from course_utils.tools.bench.storage import write_image_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    base = JpegDataset(10, progress=False)
    return base, write_image_folder(base, tmp_path_factory.mktemp("recipes") / "jpegs")


def test_baselines_are_written_as_the_recipes(folder):
    _, root = folder
    seed = seed_recipe_loader(root, batch_size=4, size=32)
    imagenet = imagenet_recipe_loader(root, batch_size=4, size=32)
    for loader in (seed, imagenet):
        assert loader.num_workers == 4 and loader.pin_memory is True
        assert type(loader.dataset).__name__ == "ImageFolder"
    names = [type(t).__name__ for t in imagenet.dataset.transform.transforms]
    assert names == ["RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]
    assert imagenet.dataset.transform.transforms[-1].mean == IMAGENET_MEAN
    assert [type(t).__name__ for t in seed.dataset.transform.transforms] == ["Resize", "ToTensor"]
    image, label = imagenet.dataset[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and image.min() < 0


def test_tuned_files_equal_the_in_memory_pipeline(folder):
    base, root = folder
    files = BatchedJpegFiles(root, size=32, reduced=False)
    order = [int(p.rsplit("/", 1)[1].split(".")[0]) for p in files.paths]   # file name = index
    images, labels = files.__getitems__(list(range(len(files))))
    assert images.dtype == torch.uint8 and images.shape == (10, 3, 32, 32)
    for slot, i in enumerate(order):
        expected = ToTensorUint8(32)(base[i][0])       # full decode to RGB, then resize
        assert torch.equal(images[slot], expected), f"file {i}"
        assert int(labels[slot]) == int(base.labels[i])


def test_rgb_decode_and_reduced_decode_agree_with_bgr_then_swap(tmp_path, monkeypatch):
    big = cv2.resize(sample_photo(), (1000, 800))
    (tmp_path / "c0").mkdir()
    cv2.imwrite(str(tmp_path / "c0" / "000000.jpg"), big)
    fast = BatchedJpegFiles(tmp_path, size=224)[0][0]
    monkeypatch.setattr("course_utils.tools.bench.recipes._DECODE_RGB", None)     # OpenCV < 4.10 path
    assert torch.equal(BatchedJpegFiles(tmp_path, size=224)[0][0], fast)
    full = BatchedJpegFiles(tmp_path, size=224, reduced=False)[0][0]
    # decoding at half scale then resizing is close to (not equal to) full decode + resize
    assert (fast.float() - full.float()).abs().mean() < 6


def test_decode_only_counts_samples(folder):
    _, root = folder
    pixels, labels = next(iter(files_loader(DecodeOnlyFiles(root), batch_size=4, num_workers=0)))
    assert pixels.shape == (4,) and labels.shape == (4,) and int(pixels.min()) > 0


def test_loaders_name_bad_arguments(folder, tmp_path):
    _, root = folder
    with pytest.raises(FileNotFoundError, match="ImageFolder layout"):
        imagenet_recipe_loader(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="no .jpg"):
        BatchedJpegFiles(tmp_path)
    with pytest.raises(ValueError, match="batch_size"):
        tuned_files_loader(root, batch_size=0)
    with pytest.raises(TypeError, match="num_workers"):
        files_loader(DecodeOnlyFiles(root), num_workers="2")
    loader = tuned_files_loader(root, batch_size=4, size=16, num_workers=0)
    assert next(iter(loader))[0].shape == (4, 3, 16, 16)
    assert np.isin(next(iter(loader))[1].numpy(), np.arange(10)).all()


def test_worker_batches_in_shared_memory_equal_the_main_process_ones(folder):
    _, root = folder
    here = next(iter(files_loader(BatchedJpegFiles(root, 32), batch_size=5, num_workers=0, shuffle=False)))
    there = next(iter(files_loader(BatchedJpegFiles(root, 32), batch_size=5, num_workers=2, shuffle=False)))
    assert torch.equal(here[0], there[0]) and torch.equal(here[1], there[1])
