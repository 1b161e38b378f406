"""The DALI row's loader (course_utils/tools/bench/dali.py): where it cannot run it says why, its
files and labels are ImageFolder's, bad arguments are named, and (where DALI is installed, as
make test installs it on Linux) its batches are the ImageNet recipe's shape, dtype and labels."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from torchvision import datasets

from course_utils import JpegDataset
from course_utils.tools.bench import dali as D
from course_utils.tools.bench.storage import write_image_folder

NEEDS_DALI = pytest.mark.skipif(D.dali_missing() is not None, reason=str(D.dali_missing()))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_image_folder(JpegDataset(n=40, progress=False), tmp_path_factory.mktemp("jpegs"))


def test_dali_missing_names_the_platform_or_the_install(monkeypatch):
    monkeypatch.setattr(D.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(D.platform, "machine", lambda: "arm64")
    assert "Linux x86_64 and aarch64 only; this is Darwin arm64" in D.dali_missing()
    monkeypatch.setattr(D.platform, "system", lambda: "Linux")
    monkeypatch.setattr(D.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "pip install -e .[dali]" in D.dali_missing()


def test_files_and_labels_are_numbered_as_imagefolder_numbers_them(folder):
    files, labels = D.folder_files_and_labels(folder)
    reference = dict(datasets.ImageFolder(str(folder)).samples)
    assert len(files) == len(reference) == 40
    assert all(reference[f] == label for f, label in zip(files, labels))


@pytest.mark.parametrize("kwargs, words", [
    (dict(files=["a.jpg"], labels=[0, 1]), "same, non-zero length"),
    (dict(files=[], labels=[]), "same, non-zero length"),
    (dict(files=["a.jpg"], labels=[0], device="gpu"), "device='gpu'"),
    (dict(files=["a.jpg"], labels=[0], num_threads=0), "num_threads"),
    (dict(files=["a.jpg"], labels=[0], batch_size=0), "batch_size"),
])
def test_bad_arguments_are_named(kwargs, words):
    with pytest.raises((ValueError, TypeError), match=words.replace("(", r"\(").replace("[", r"\[")):
        D.DaliLoader(**kwargs)


def test_without_dali_iterating_says_why(monkeypatch):
    monkeypatch.setattr(D, "dali_missing", lambda: "NVIDIA DALI is not installed: pip install -e .[dali]")
    loader = D.DaliLoader(["a.jpg"], [0])
    with pytest.raises(RuntimeError, match="not installed"):
        next(iter(loader))


@NEEDS_DALI
def test_batches_are_the_recipes_and_iteration_carries_on_across_epochs(folder):
    files, labels = D.folder_files_and_labels(folder)
    loader = D.DaliLoader(files, labels, batch_size=16, size=64, num_threads=1, seed=3)
    assert len(loader) == 3                                    # 40 files: 16 + 16 + 8
    first = list(loader)
    assert [tuple(x.shape) for x, _ in first] == [(16, 3, 64, 64), (16, 3, 64, 64), (8, 3, 64, 64)]
    assert all(x.dtype == torch.float32 and y.dtype == torch.int64 and y.shape == (len(x),)
               for x, y in first)
    seen = torch.cat([y for _, y in first])
    assert sorted(seen.tolist()) == sorted(labels)             # every file once in an epoch
    images = torch.cat([x for x, _ in first])
    assert -3 < float(images.mean()) < 3 and float(images.std()) > 0.2   # normalised, not [0, 255]
    second = list(loader)                                      # the next epoch, from the same pipeline
    assert sorted(torch.cat([y for _, y in second]).tolist()) == sorted(labels)
    assert "num_threads=1" in repr(loader)
